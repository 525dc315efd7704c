"""The tier on the storage role: each topic's retention as the nameservers know it, the offloader (offload.py) that
proposes through the groups this node leads, and the tier status call. A part of StorageRole.
"""

from __future__ import annotations

import logging

import trio

from rocket import limits
from rocket.clock import Clock
from rocket.config import NodeConfig
from rocket.errors import RocketError
from rocket.replication import Engine
from rocket.roles.peers import Peers
from rocket.roles.storage.gate import Gate
from rocket.roles.storage.offload import Offloader, TierSettings
from rocket.store.store import Store
from rocket.tier.objectstore import ObjectStore

log = logging.getLogger("rocket.storage")


class Tiering:
    def __init__(self, store: Store, host: Engine, gate: Gate, peers: Peers, config: NodeConfig,
                 objects: ObjectStore | None, clock: Clock):
        self.store = store
        self.host = host
        self.gate = gate
        self.peers = peers
        self.config = config
        # topic -> its own (retention_s, local_retention_s): replaced whole from the metadata's topics, so bounded by
        # limits.topics_max
        self._retention: dict[str, tuple[float, float]] = {}
        settings = TierSettings(config.tier_s3_prefix if config.tier_backend == "s3" else "",
                                config.tier_piece_bytes, config.tier_piece_age_s, config.tier_retention_s,
                                config.tier_local_retention_s, config.tier_read_mode == "force")
        # Without an object store it applies total retention to local data only.
        self.offloader = Offloader(store, objects, settings, self._propose, gate.led_terms, self.retention_of, clock)

    async def _propose(self, group: int, payload: bytes):
        return await self.host.propose(group, payload, limits.storage_append_wait_s_max)

    def retention_of(self, topic: str) -> tuple[float, float]:
        """(retention_s, local_retention_s) of a topic: its own settings, else the node's defaults."""
        retention_s, local_retention_s = self._retention.get(topic, (-1.0, -1.0))
        return (self.config.tier_retention_s if retention_s < 0 else retention_s,
                self.config.tier_local_retention_s if local_retention_s < 0 else local_retention_s)

    async def refresh_retention_forever(self) -> None:
        """Topics' retention settings from the nameservers; until the first answer, the defaults hold."""
        while True:
            try:
                topics = (await self.peers.nameserver("MetaListTopics", {}))["topics"]
                self._retention = {topic["name"]: (topic.get("retention_s", -1.0), topic.get("local_retention_s", -1.0))
                                   for topic in topics}
            except RocketError as error:
                log.info("tier: fetching topic retention: %s", error)
            await trio.sleep(limits.tier_topics_refresh_s)

    async def tier_status(self, request: dict) -> dict:
        """Per queue: first offset, where local data starts, how far the tier reaches, and bytes."""
        self.gate.leads(request["group"])
        topic = request["topic"]
        queues = []
        for queue in self.gate.positions([{"queue": queue, "offset": 0} for queue in request["queues"]], "offset"):
            stats = self.store.reads.queue_stats(topic, queue)
            state = self.store.reads.tier_state(topic, queue)
            offloaded = state.offloaded_bytes + state.truncated_bytes if state is not None else 0
            dropped = state.dropped_bytes + state.truncated_bytes if state is not None else 0
            queues.append({"queue": queue, "first_offset": stats["min_offset"],
                           "local_offset": max(stats["min_offset"], self.store.reads.local_start(topic, queue)),
                           "tiered_offset": state.tiered_to if state is not None else stats["min_offset"],
                           "next_offset": stats["next_offset"], "local_bytes": stats["bytes"] - dropped,
                           "tiered_bytes": sum(piece.size for piece in state.pieces) if state is not None else 0,
                           "pending_bytes": stats["bytes"] - offloaded,
                           "pieces": len(state.pieces) if state is not None else 0})
        return {"queues": queues}
