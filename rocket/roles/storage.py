"""The storage role: hosts the Raft groups the nameservers assign to this node, with the node's store
as their state machine. The leader of a group serves appends (replicated before they are answered)
and reads; a follower in sync serves reads as a read replica; the leader carries out the membership
changes of replica moves.
"""

from __future__ import annotations

import logging
import shutil
import time

import trio

from rocket import limits
from rocket.config import Address, NodeConfig
from rocket.errors import Code, RocketError
from rocket.model import check_group_name, check_topic_name
from rocket.raft.core import NotLeader, Role
from rocket.raft.host import RaftHost
from rocket.roles.peers import Peers, address_of
from rocket.serde import batch as batch_codec
from rocket.serde.batch import FLAG_TIMED, check_header, peek_count
from rocket.store.group import (GroupMachine, Store, encode_append, encode_cancel, encode_fire, encode_offsets,
                                encode_timers)
from rocket.store.queue_index import ALL_TAGS
from rocket.transport.rpc import Dispatcher

log = logging.getLogger("rocket.storage")


class StorageRole:
    def __init__(self, config: NodeConfig, host: RaftHost, peers: Peers, addresses: dict[int, tuple[str, int]]):
        self.config = config
        self.host = host
        self.peers = peers
        self.addresses = addresses  # node id -> address, shared with the Raft links
        self.store = Store.open(config.data_dir / "storage", host.wal.log, segment_bytes_max=config.segment_bytes)
        self._last_append_ms: dict[tuple[str, int], int] = {}
        self.assigned = trio.Event()  # set once the first assignment arrived
        self._ask_now = trio.Event()  # a call named a group not hosted yet: ask for the assignment at once
        self.replica_reads = 0  # reads served as a follower in sync
        self._assignment_version = -1  # the metadata version of the assignment this node holds

    def register(self, dispatcher: Dispatcher) -> None:
        dispatcher.handle("StorageAppend", self.append)
        dispatcher.handle("StorageRead", self.read)
        dispatcher.handle("StorageCommitOffsets", self.commit_offsets)
        dispatcher.handle("StorageQueues", self.queues)
        dispatcher.handle("StorageMembers", self.members)
        dispatcher.handle("StorageCancelTimer", self.cancel_timer)

    async def serve(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Flush the store in the background and report to the nameservers until cancelled."""
        async with trio.open_nursery() as nursery:
            await nursery.start(self.store.run)
            nursery.start_soon(self._backfill_forever)
            nursery.start_soon(self._fire_timers_forever)
            task_status.started()
            while True:
                self._ask_now = trio.Event()
                await self._heartbeat()
                with trio.move_on_after(limits.node_heartbeat_s):
                    await self._ask_now.wait()
                    await trio.sleep(limits.assignment_ask_s_min)

    async def _heartbeat(self) -> None:
        groups = self._storage_groups()
        leads = [group for group in groups if self.host.groups[group].core.role == Role.LEADER]
        lagging = [{"group": group, "node": node, "entries": core.last_index - progress.match}
                   for group in leads for core in (self.host.groups[group].core,)
                   for node, progress in core.progress.items() if progress.match < core.last_index]
        load = {"groups": len(groups), "leads": leads, "bytes": self.host.wal.log.end_position,
                "free_disk_bytes": shutil.disk_usage(self.config.data_dir).free, "lagging": lagging}
        assignment = await self.peers.heartbeat(load, self._assignment_version)
        if assignment is None:
            return
        if not assignment["unchanged"]:
            self._assign(assignment)
        self.assigned.set()

    def _assign(self, assignment: dict) -> None:
        """Host the groups assigned to this node, and stop hosting the ones moved off it."""
        self._assignment_version = assignment["version"]
        for node in assignment["nodes"]:
            address = address_of(node["address"])
            self.addresses[node["id"]] = (address.host, address.port)
        assigned = {group["id"] for group in assignment["groups"]}
        for group in assignment["groups"]:
            if group["id"] not in self.host.groups:
                self.host.add_group(group["id"], tuple(group["voters"]), GroupMachine(self.store, group["id"]),
                                    tuple(group["learners"]))
        for group in self._storage_groups() - assigned:
            log.info("storage group %d moved off this node", group)
            self.host.remove_group(group)

    async def _backfill_forever(self) -> None:
        """A replica that installed a snapshot lacks the batches before it: fetch them from the other
        replicas, one queue at a time, until no gap is left."""
        while True:
            await trio.sleep(limits.node_heartbeat_s)
            for group, topic, queue, _ in self.store.gaps():
                if group in self.host.groups:
                    await self._backfill(group, topic, queue)

    async def _backfill(self, group: int, topic: str, queue: int) -> None:
        core = self.host.groups[group].core
        for source in sorted((core.voters | core.learners) - {self.config.node_id}):
            if source not in self.addresses:
                continue
            address = Address(*self.addresses[source])
            try:
                start = None  # the first chunk starts wherever the source's data starts
                while True:
                    request = {"group": group, "topic": topic, "queues": [{"queue": queue, "offset": start or 0}],
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

    def _storage_groups(self) -> set[int]:
        return {group for group, hosted in self.host.groups.items() if isinstance(hosted.machine, GroupMachine)}

    def _hosted(self, group: int) -> None:
        if group not in self.host.groups or not isinstance(self.host.groups[group].machine, GroupMachine):
            self._ask_now.set()
            raise RocketError(Code.UNAVAILABLE, f"storage group {group} is not hosted on node {self.config.node_id}")

    def _leads(self, group: int) -> None:
        """Reads are served by the group's leader, which holds everything committed: a follower may be
        behind (serving reads from followers in sync is for later)."""
        self._hosted(group)
        core = self.host.groups[group].core
        if core.role != Role.LEADER:
            raise NotLeader(core.leader)

    @staticmethod
    def _positions(entries: list[dict], field: str) -> dict[int, int]:
        """queue -> offset from a request, checked: what a group's log holds must apply on every replica."""
        positions = {}
        for entry in entries:
            queue, value = entry["queue"], entry[field]
            if not 0 <= queue < limits.queues_per_topic_max or not 0 <= value < 2**63:
                raise RocketError(Code.BAD_REQUEST, f"queue {queue} with {field} {value} is out of range")
            positions[queue] = value
        return positions

    async def append(self, request: dict) -> dict:
        """Stamp a batch, replicate it, answer with its offsets. The broker checked the batch's CRC; the
        header is checked again here, because the offsets given out depend on it."""
        group, topic, queue, batch = request["group"], request["topic"], request["queue"], request["batch"]
        self._hosted(group)
        check_topic_name(topic)
        self._positions([{"queue": queue, "offset": 0}], "offset")
        timed = bool(check_header(batch, crc=False).flags & FLAG_TIMED)
        append_ms = self._stamp(topic, queue)
        if timed:
            self._check_delivery_times(batch, append_ms)
            entry = encode_timers(topic, queue, append_ms, batch)
        else:
            entry = encode_append(topic, queue, append_ms, batch)
        base_offset, count = await self.host.propose(group, entry, limits.storage_append_wait_s_max)
        return {"queue": queue, "base_offset": base_offset, "count": count, "scheduled": timed}

    def _stamp(self, topic: str, queue: int) -> int:
        """Append times never go backwards within a queue on this leader; replicas take the stamp."""
        append_ms = max(int(time.time() * 1000), self._last_append_ms.get((topic, queue), 0))
        self._last_append_ms[(topic, queue)] = append_ms
        return append_ms

    @staticmethod
    def _check_delivery_times(batch, now_ms: int) -> None:
        """Delivery times must lie within limits.timer_delay_s_max; a time past is due at once."""
        latest_ms = now_ms + limits.timer_delay_s_max * 1000
        for message in batch_codec.decode(batch):
            if message.deliver_at_ms > latest_ms:
                raise RocketError(Code.BAD_REQUEST, f"message {message.offset} is due "
                                  f"{(message.deliver_at_ms - now_ms) / 86_400_000:,.0f} days from now; the most is "
                                  f"{limits.timer_delay_s_max // 86_400} days")

    # ---- timers --------------------------------------------------------------------------------------

    async def _fire_timers_forever(self) -> None:
        """On the groups this node leads, deliver due timers every limits.timer_tick_s."""
        while True:
            await trio.sleep(limits.timer_tick_s)
            now_ms = int(time.time() * 1000)
            for group in self.store.timer_groups(now_ms):
                hosted = self.host.groups.get(group)
                if hosted is None or hosted.core.role != Role.LEADER:
                    continue
                try:
                    await self.fire_due_timers(group, now_ms)
                except RocketError as error:  # lost leadership, or the proposal timed out: next round retries
                    log.info("group %d: delivering timers: %s", group, error)

    async def fire_due_timers(self, group: int, now_ms: int) -> int:
        """Deliver the group's timers due by now_ms to their queues. A fire applies only if all its timers
        are still pending, so a repeat after a lost answer or a change of leader delivers nothing twice.
        Returns how many were delivered."""
        delivered = 0
        for topic, queue, offsets, batch in self.store.due_deliveries(group, now_ms):
            fire = encode_fire(topic, queue, self._stamp(topic, queue), offsets, batch)
            if await self.host.propose(group, fire, limits.storage_append_wait_s_max) is not None:
                delivered += len(offsets)
        return delivered

    async def cancel_timer(self, request: dict) -> dict:
        self._hosted(request["group"])
        check_topic_name(request["topic"])
        queue, offset = next(iter(self._positions([request], "offset").items()))
        if not await self.host.propose(request["group"], encode_cancel(request["topic"], queue, offset)):
            raise RocketError(Code.NOT_FOUND, f"no pending timer {queue}.{offset} on topic {request['topic']!r}: "
                              "it was delivered or cancelled, or never existed")
        return {}

    async def members(self, request: dict) -> dict:
        """One membership change on this group's leader; a change already made answers at once, so a
        nameserver can repeat a move's steps after a failure."""
        group, action, node = request["group"], request["action"], request["node"]
        self._hosted(group)
        core = self.host.groups[group].core
        if core.role != Role.LEADER:
            raise NotLeader(core.leader)
        if action == "add_learner" and (node in core.learners or node in core.voters):
            return {}
        if action == "promote":
            if node in core.voters:
                return {}
            await self._caught_up(group, node)
        if action == "remove":
            if node not in core.voters and node not in core.learners:
                return {}
            if node == self.config.node_id:  # a leader does not remove itself: it hands over first
                successor = max((voter for voter in core.voters if voter != node),
                                key=lambda voter: core.progress[voter].match)
                self.host.transfer_leadership(group, successor)
                raise RocketError(Code.UNAVAILABLE, f"leadership of group {group} moves to node {successor}; retry there")
        if action not in ("add_learner", "promote", "remove"):
            raise RocketError(Code.BAD_REQUEST, f"unknown membership change {action!r}")
        await self.host.propose_conf_change(group, action, node, limits.storage_append_wait_s_max)
        return {}

    async def _caught_up(self, group: int, node: int) -> None:
        """Wait until a learner holds everything committed (bounded): only then may it vote."""
        with trio.move_on_after(limits.learner_catch_up_s_max):
            while True:
                core = self.host.groups[group].core
                progress = core.progress.get(node)
                if progress is not None and progress.match >= core.commit:
                    return
                await trio.sleep(0.1)
        raise RocketError(Code.TIMEOUT, f"node {node} has not caught up with group {group} yet; retry")

    async def commit_offsets(self, request: dict) -> dict:
        self._hosted(request["group"])
        consumer_group = check_group_name(request["consumer_group"])
        check_topic_name(request["topic"])
        offsets = self._positions(request["offsets"], "offset")
        await self.host.propose(request["group"], encode_offsets(consumer_group, request["topic"], offsets))
        return {}

    def _read(self, topic: str, positions: dict[int, int], max_bytes: int, at_least_one: bool,
              tag_mask: int = ALL_TAGS) -> dict:
        batches: list[dict] = []
        next_offsets: list[dict] = []
        budget = max_bytes
        for queue, offset in positions.items():
            # Past the first batch the budget is strict, so a response never exceeds a frame.
            first = at_least_one and not batches
            if budget > 0 or first:
                found, offset = self.store.read_from(topic, queue, offset, budget, first, tag_mask)
                for base_offset, data in found:
                    batches.append({"queue": queue, "base_offset": base_offset, "batch": data})
                    budget -= len(data)
            next_offsets.append({"queue": queue, "offset": offset})
        return {"batches": batches, "next_offsets": next_offsets}

    async def read(self, request: dict) -> dict:
        group = request["group"]
        self._hosted(group)
        core = self.host.groups[group].core
        in_sync = request["follower_ok"] and core.in_sync(limits.follower_read_lag_entries_max)
        if not (request["any_replica"] or in_sync):
            self._leads(group)
        if in_sync:
            self.replica_reads += 1
        topic = request["topic"]
        positions = self._positions(request["queues"], "offset")
        max_bytes = max(0, min(request["max_bytes"], limits.read_bytes_max))
        tag_mask = request["tag_mask"] & ALL_TAGS  # a signed long on the wire; -1 reads every batch
        response = self._read(topic, positions, max_bytes, request["at_least_one"], tag_mask)
        wait_ms = min(max(request["wait_ms"], 0), limits.pull_wait_ms_max)
        if not response["batches"] and wait_ms:  # wait past what the filter skipped
            positions = {entry["queue"]: entry["offset"] for entry in response["next_offsets"]}
            await self.store.wait_for_data({(topic, queue): offset for queue, offset in positions.items()},
                                           wait_ms / 1000)
            response = self._read(topic, positions, max_bytes, request["at_least_one"], tag_mask)
        return response

    async def queues(self, request: dict) -> dict:
        self._leads(request["group"])
        topic = request["topic"]
        self._positions([{"queue": queue, "offset": 0} for queue in request["queues"]], "offset")
        offsets = []
        if request["consumer_group"]:
            committed = self.store.fetch_offsets(request["consumer_group"], topic)
            offsets = [{"queue": queue, "offset": committed[queue]} for queue in request["queues"] if queue in committed]
        time_offsets = []
        if request["timestamp_ms"] >= 0:
            time_offsets = [{"queue": queue, "offset": self.store.offset_for_time(topic, queue, request["timestamp_ms"])}
                            for queue in request["queues"]]
        return {"queues": [{"queue": queue, **self.store.queue_stats(topic, queue)} for queue in request["queues"]],
                "offsets": offsets, "time_offsets": time_offsets}
