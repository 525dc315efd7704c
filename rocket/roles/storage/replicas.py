"""Which groups this node hosts and with whom: the heartbeat that brings the nameservers' assignment, the membership
changes of replica moves (on a group's leader), and the backfill of the batches a replica lacks after it installed a
snapshot. A mixin of StorageRole.
"""

from __future__ import annotations

import logging
import shutil

import trio

from rocket import limits
from rocket.clock import sleep_periodic
from rocket.errors import Code, RocketError
from rocket.model import Address
from rocket.replication import Control
from rocket.roles.storage import assignment as stored_assignment
from rocket.serde.batch import peek_count
from rocket.store.store import GroupMachine

log = logging.getLogger("rocket.storage")


class Replicas:
    async def _heartbeat(self) -> None:
        groups = self.gate.storage_groups()
        if self.host.disk_refusal:
            self._hand_over_leadership(groups)
        leads = [group for group in groups if self.host.leads(group)]
        lagging = [{"group": group, "node": node, "entries": entries}
                   for group in leads for node, entries in self.host.lagging(group).items()]
        wal = self.host.wal.log
        group_bytes: dict[int, int] = {}
        topic_bytes: dict[str, int] = {}
        store = self.store
        taken = store.take_bytes_in()  # counted while this node led the group: it may have lost it since
        for (topic, group), count in taken.items():
            group_bytes[group] = group_bytes.get(group, 0) + count
            topic_bytes[topic] = topic_bytes.get(topic, 0) + count
        controlled = [{"group": group, "epoch": position[0], "last_index": position[1]}
                      for group in groups if (position := self.host.controlled_position(group)) is not None]
        load = {"groups": len(groups), "leads": leads, "bytes": wal.end_position - wal.start_position,  # on disk
                "free_disk_bytes": shutil.disk_usage(self.config.data_dir).free, "lagging": lagging,
                "group_bytes_in": [{"group": group, "bytes": count} for group, count in group_bytes.items()],
                "topic_bytes_in": [{"topic": topic, "bytes": count} for topic, count in topic_bytes.items()],
                "controlled": controlled}
        assignment = await self.peers.heartbeat(load, self._assignment_version)
        if assignment is None:
            store.give_back_bytes_in(taken)  # the next heartbeat carries them
            return
        if not assignment["unchanged"]:
            self._assign(assignment)
            self._save_assignment(assignment)
        self.assigned.set()

    def _hand_over_leadership(self, groups: list[int]) -> None:
        """While this node's disk is full it refuses new data: each Raft group it leads goes to the caught-up voter
        that lags least, so the group takes writes through the others (the nameservers, seeing the free disk in the
        heartbeat, lead nothing back here until there is room). Controller-mode groups follow their controller."""
        for group in groups:
            if not self.host.leads(group) or self.host.controlled_position(group) is not None:
                continue
            lagging = self.host.lagging(group)
            others = [voter for voter in self.host.voters(group)
                      if voter != self.config.node_id and self.host.caught_up(group, voter)]
            if others:
                successor = min(others, key=lambda voter: lagging.get(voter, 0))
                log.warning("group %d: this node's disk is full; leadership goes to node %d", group, successor)
                self.host.transfer_leadership(group, successor)

    def _restore_assignment(self) -> None:
        """Before any heartbeat: host the groups of the assignment saved last, with their members' addresses, so a
        node restarted while no nameserver answers rejoins its groups. The first answer reconciles (_assign). The node
        is ready (assigned is set) without waiting for it."""
        saved = stored_assignment.load(self.config.data_dir, self.config.node_id)
        if saved is None:
            return
        self._assign(saved)
        self._saved_assignment = (saved["groups"], saved["nodes"])
        log.info("hosting the %d storage groups of the assignment saved at metadata version %d, until a nameserver "
                 "answers", len(saved["groups"]), saved["version"])
        self.assigned.set()

    def _save_assignment(self, assignment: dict) -> None:
        """Keep the assignment on disk when its groups or nodes changed (a new metadata version alone is not worth an
        fsync: the next answer after a restart brings it). Written in the event loop's thread, which keeps the
        roles simulator deterministic; it is rare and small (a replica move, a new group, a node's new address)."""
        content = (assignment["groups"], assignment["nodes"])
        if content == self._saved_assignment:
            return
        try:
            stored_assignment.save(self.config.data_dir, self.config.node_id, assignment)
        except OSError as error:  # a full or failing disk: keep serving; a restart then waits for a nameserver
            log.error("cannot save this node's assignment to %s: %s", self.config.data_dir, error)
            return
        self._saved_assignment = content

    def _heartbeat_interval_s(self) -> float:
        """How long until the next heartbeat: sooner while a controller-mode replica here has heard nothing from its
        master for an election timeout, so that it learns of the controller's election (in the answer) soon."""
        if any(self.host.orphaned(group) for group in self.gate.storage_groups()):
            return limits.controller_orphan_heartbeat_s
        return limits.node_heartbeat_s

    def _assign(self, assignment: dict) -> None:
        """Host the groups assigned to this node, and stop hosting the ones moved off it."""
        self._assignment_version = assignment["version"]
        for node in assignment["nodes"]:
            address = Address.parse(node["address"])
            self.addresses[node["id"]] = (address.host, address.port)
        assigned = {group["id"] for group in assignment["groups"]}
        for group in assignment["groups"]:
            control = self._control_of(group)
            if self.host.machine_of(group["id"]) is None:
                self.host.add_group(group["id"], tuple(group["voters"]), GroupMachine(self.store, group["id"]),
                                    tuple(group["learners"]), control)
            elif control is not None:
                self.host.control(group["id"], control)
        for group in self.gate.storage_groups() - assigned:
            log.info("storage group %d moved off this node", group)
            self.host.remove_group(group)

    def _control_of(self, group: dict) -> Control | None:
        """The controller's word on a controller-mode group, from its assignment (None for a Raft group)."""
        if group.get("mode", "raft") != "controller":
            return None
        return Control(group["master"], group["master_epoch"], frozenset(group["sync_state_set"]),
                       group["sync_state_set_epoch"], group["min_in_sync_replicas"],
                       max(1, round(group["ha_max_lag_s"] / self.host.tick_s)))

    async def _sync_states_forever(self) -> None:
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
                    answer = await self.peers.nameserver("ControllerAlterSyncStateSet", {
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

    async def _backfill_forever(self) -> None:
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
                    first = start if start is not None else self.store.local_start(topic, queue)
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
