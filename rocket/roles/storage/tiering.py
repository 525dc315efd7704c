"""The tier on the storage role: each topic's retention as the nameservers know it, the proposals of the offloader
(offload.py), and the tier status call. A mixin of StorageRole.
"""

from __future__ import annotations

import logging

import trio

from rocket import limits
from rocket.errors import RocketError

log = logging.getLogger("rocket.storage")


class Tiering:
    def _led_groups(self) -> list[int]:
        return [group for group in self._storage_groups() if self.host.leads(group)]

    async def _propose_tier(self, group: int, payload: bytes):
        return await self.host.propose(group, payload, limits.storage_append_wait_s_max)

    def retention_of(self, topic: str) -> tuple[float, float]:
        """(retention_s, local_retention_s) of a topic: its own settings, else the node's defaults."""
        retention_s, local_retention_s = self._retention.get(topic, (-1.0, -1.0))
        return (self.config.tier_retention_s if retention_s < 0 else retention_s,
                self.config.tier_local_retention_s if local_retention_s < 0 else local_retention_s)

    async def _refresh_retention_forever(self) -> None:
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
        self._leads(request["group"])
        topic = request["topic"]
        queues = []
        for queue in self._positions([{"queue": queue, "offset": 0} for queue in request["queues"]], "offset"):
            stats = self.store.queue_stats(topic, queue)
            state = self.store.tier_state(topic, queue)
            offloaded = state.offloaded_bytes + state.truncated_bytes if state is not None else 0
            dropped = state.dropped_bytes + state.truncated_bytes if state is not None else 0
            queues.append({"queue": queue, "first_offset": stats["min_offset"],
                           "local_offset": max(stats["min_offset"], self.store.local_start(topic, queue)),
                           "tiered_offset": state.tiered_to if state is not None else stats["min_offset"],
                           "next_offset": stats["next_offset"], "local_bytes": stats["bytes"] - dropped,
                           "tiered_bytes": sum(piece.size for piece in state.pieces) if state is not None else 0,
                           "pending_bytes": stats["bytes"] - offloaded,
                           "pieces": len(state.pieces) if state is not None else 0})
        return {"queues": queues}
