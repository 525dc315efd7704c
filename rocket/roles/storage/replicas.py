"""A storage group's replicas: the membership changes of replica moves (on its leader), a controller-mode master's
SyncStateSet requests, and the backfill of what a replica lacks after a snapshot. A part of StorageRole.
"""

from __future__ import annotations

import logging

import trio

from rocket import limits
from rocket.clock import sleep_periodic
from rocket.config import NodeConfig
from rocket.errors import Code, RocketError
from rocket.model import Address
from rocket.replication import Engine
from rocket.roles.peers import Peers
from rocket.roles.storage.gate import Gate
from rocket.serde.batch import peek_count
from rocket.store.store import Store

log = logging.getLogger("rocket.storage")


class Replicas:
    """Replica moves on a group's leader (members), the SyncStateSet changes a controller-mode master asks for, and
    the backfill of the batches a replica lacks after it installed a snapshot."""

    def __init__(self, store: Store, host: Engine, gate: Gate, peers: Peers, config: NodeConfig,
                 addresses: dict[int, tuple[str, int]]):
        self.store = store
        self.host = host
        self.gate = gate
        self.peers = peers
        self.config = config
        self.addresses = addresses  # node id -> address, shared with the Raft links

    async def sync_states_forever(self) -> None:
        """As master of controller-mode groups: ask the controller for the SyncStateSet changes each wants, one
        request per group until answered. Only the controller's answer changes the set: a master cut off from it
        keeps waiting for every member it had (ARCHITECTURE.md, "Controller mode")."""
        while True:  # every limits.controller_sync_state_s while this node hosts controller-mode groups
            controlled = [group for group in self.gate.storage_groups()
                          if self.host.controlled_position(group) is not None]
            await sleep_periodic(limits.controller_sync_state_s if controlled else limits.idle_recheck_s)
            for group in self.gate.storage_groups():
                request = self.host.sync_state_request(group)
                if request is None:
                    continue
                try:
                    ask = self.peers.controller if self.config.controller_members() else self.peers.nameserver
                    answer = await ask("ControllerAlterSyncStateSet", {
                        "group": group, "master": request.group_master, "master_epoch": request.master_epoch,
                        "sync_state_set_epoch": request.sync_state_set_epoch,
                        "sync_state_set": sorted(request.sync_state_set)})
                except RocketError as error:
                    if error.code == Code.BAD_REQUEST:
                        self.host.sync_state_refused(group, request)
                    else:  # FENCED, or no answer (the heartbeats warn of that): what holds comes with the next
                        # assignment; asked again meanwhile
                        log.debug("group %d: the SyncStateSet change %s: %s", group, sorted(request.sync_state_set),
                                  error)
                    continue
                log.info("group %d: SyncStateSet %s at epoch %d", group, answer["sync_state_set"],
                         answer["sync_state_set_epoch"])
                self.host.sync_state_granted(group, answer["master"], answer["master_epoch"],
                                             frozenset(answer["sync_state_set"]), answer["sync_state_set_epoch"])

    async def backfill_forever(self) -> None:
        """A replica that installed a snapshot lacks the batches before it: fetch them from the other
        replicas, one queue at a time, until no gap is left."""
        while True:
            await sleep_periodic(limits.node_heartbeat_s)
            for group, topic, queue, _ in self.store.gaps():
                if self.host.machine_of(group) is not None:
                    await self._backfill(group, topic, queue)

    async def _backfill(self, group: int, topic: str, queue: int) -> None:
        for source in sorted(self.host.replicas(group) - {self.config.node_id}):
            if source not in self.addresses:
                continue
            address = Address(*self.addresses[source])
            try:
                start = None  # the first chunk starts wherever the source's local data starts
                while True:
                    first = start if start is not None else self.store.reads.local_start(topic, queue)
                    request = {"group": group, "topic": topic, "queues": [{"queue": queue, "offset": first}],
                               "max_bytes": limits.read_bytes_max, "wait_ms": 0, "at_least_one": True,
                               "any_replica": True, "follower_ok": False}
                    gap_end = self.store.gap_end(topic, queue)
                    found = [(batch["base_offset"], bytes(batch["batch"]))
                             for batch in (await self.peers.call(address, "StorageRead", request))["batches"]
                             if batch["base_offset"] < gap_end]
                    last = not found or found[-1][0] + peek_count(found[-1][1]) >= gap_end
                    positions = await self.host.write_data([batch for _, batch in found])
                    start = self.store.backfill(topic, queue, found, positions, start, last)
                    if last:
                        log.info("group %d: %s/%d backfilled from node %d", group, topic, queue, source)
                        return
            except RocketError as error:
                log.warning("group %d: backfilling %s/%d from node %d: %s", group, topic, queue, source, error)

    async def members(self, request: dict) -> dict:
        """One membership change on this group's leader, or a transfer of its leadership; a change already made
        answers at once, so a nameserver can repeat a move's steps after a failure."""
        group, action, node = request["group"], request["action"], request["node"]
        self.gate.leads(group)
        voters = self.host.voters(group)
        if action == "add_learner" and node in self.host.replicas(group):
            return {}
        if action == "promote":
            if node in voters:
                return {}
            await self._caught_up(group, node)
        if action == "remove":
            if node not in self.host.replicas(group):
                return {}
            if node == self.config.node_id:  # a leader does not remove itself: it hands over first
                lagging = self.host.lagging(group)
                successor = min((voter for voter in voters if voter != node), key=lambda voter: lagging.get(voter, 0))
                self.host.transfer_leadership(group, successor)
                raise RocketError(Code.UNAVAILABLE, f"leadership of group {group} moves to node {successor}; retry there")
        if action == "transfer":  # leadership, to a voter that holds all this one committed
            if node == self.config.node_id:
                return {}
            if node not in voters or not self.host.caught_up(group, node):
                raise RocketError(Code.UNAVAILABLE, f"node {node} is not a caught-up voter of group {group}; retry")
            self.host.transfer_leadership(group, node)
            return {}
        if action not in ("add_learner", "promote", "remove"):
            raise RocketError(Code.BAD_REQUEST, f"unknown membership change {action!r}")
        await self.host.propose_conf_change(group, action, node, limits.storage_append_wait_s_max)
        return {}

    async def _caught_up(self, group: int, node: int) -> None:
        """Wait until a learner holds everything committed (bounded): only then may it vote."""
        with trio.move_on_after(limits.learner_catch_up_s_max):
            while True:
                if self.host.caught_up(group, node):
                    return
                await trio.sleep(limits.membership_poll_s)
        raise RocketError(Code.TIMEOUT, f"node {node} has not caught up with group {group} yet; retry")
