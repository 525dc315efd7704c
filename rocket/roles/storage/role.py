"""The storage role: hosts the Raft groups the nameservers assign to this node, with the node's store
as their state machine. The leader of a group serves appends (replicated before they are answered)
and reads; a follower in sync serves reads as a read replica; the leader carries out the membership
changes of replica moves. With a tier (an ObjectStore), group leaders offload sealed runs of each queue
and apply retention (offload.py); reads of offsets no longer local go to the tier (rocket/tier/cold.py).
"""

from __future__ import annotations

import logging
import shutil
import time

import trio

from rocket import limits
from rocket.config import Address, NodeConfig
from rocket.errors import Code, RocketError
from rocket.model import (ALL_TAGS, Message, check_group_name, check_topic_name, half_topic, read_charge, timer_topic,
                          unresolved_topic)
from rocket.raft.core import NotLeader
from rocket.replication import Engine
from rocket.roles.peers import Peers, address_of
from rocket.serde import batch as batch_codec
from rocket.serde.batch import FLAG_TIMED, FLAG_TRANSACTION, check_header, peek_count
from rocket.filter import SqlFilter, compile_filter
from rocket.store.commands import (encode_append, encode_cancel, encode_half, encode_move, encode_offsets, encode_pop,
                                   encode_rearm, encode_timers)
from rocket.store.store import GroupMachine, Store
from rocket.store.values import IndexEntry
from rocket.tier.cold import ColdReader
from rocket.tier.objectstore import ObjectStore
from rocket.roles.storage.offload import Offloader, TierSettings
from rocket.transport.rpc import Dispatcher

log = logging.getLogger("rocket.storage")


class NotHosted(RocketError):
    def __init__(self, group: int, node: int):
        super().__init__(Code.UNAVAILABLE, f"storage group {group} is not hosted on node {node}")


class StorageRole:
    def __init__(self, config: NodeConfig, host: Engine, peers: Peers, addresses: dict[int, tuple[str, int]],
                 objects: ObjectStore | None = None):
        self.config = config
        self.host = host
        self.peers = peers
        self.addresses = addresses  # node id -> address, shared with the Raft links
        self.store = Store.open(config.data_dir / "storage", host.wal.log, segment_bytes_max=config.segment_bytes)
        host.sync_before_snapshots = self.store.sync  # a group's snapshot covers the store's log up to it
        self._last_append_ms: dict[tuple[str, int], int] = {}
        self.assigned = trio.Event()  # set once the first assignment arrived
        self._ask_now = trio.Event()  # a call named a group not hosted yet: ask for the assignment at once
        self._heartbeats_started = self._heartbeats_done = 0
        self._heartbeat_done = trio.Event()  # set (and replaced) as each heartbeat ends
        self.replica_reads = 0  # reads served as a follower in sync
        self._assignment_version = -1  # the metadata version of the assignment this node holds
        self._pop_locks: dict[tuple[str, str, int], trio.Lock] = {}  # one pop at a time per group and queue
        self._members: dict[tuple[str, str], dict[str, float]] = {}  # (consumer group, topic) -> member -> expiry
        self._members_swept_at = 0.0
        self.objects = objects
        self.cold = ColdReader(objects) if objects is not None else None
        self._retention: dict[str, tuple[float, float]] = {}  # topic -> its own (retention_s, local_retention_s)
        self._prefetching: set[str] = set()  # pieces being read ahead
        self._nursery: trio.Nursery | None = None
        self.wal_moved_bytes = 0  # batches copied forward so that old WAL segments could go
        self._wal_drops_seen, self._wal_rescan_at = -1, 0.0  # the store's drops at the last scan of the WAL's oldest
        settings = TierSettings(config.tier_s3_prefix if config.tier_backend == "s3" else "",
                                config.tier_piece_bytes, config.tier_piece_age_s, config.tier_retention_s,
                                config.tier_local_retention_s, config.tier_read_mode == "force")
        # Without an object store it applies total retention to local data only.
        self.offloader = Offloader(self.store, objects, settings, self._propose_tier, self._led_groups,
                                   self.retention_of)

    def register(self, dispatcher: Dispatcher) -> None:
        for method, handler in (("StorageAppend", self.append), ("StorageRead", self.read),
                                ("StorageCommitOffsets", self.commit_offsets), ("StorageQueues", self.queues),
                                ("StorageMembers", self.members), ("StorageCancelTimer", self.cancel_timer),
                                ("StoragePop", self.pop), ("StorageReceipt", self.receipt),
                                ("StorageEndTransaction", self.end_transaction),
                                ("StorageGroupHeartbeat", self.group_heartbeat),
                                ("StorageTransactionChecks", self.transaction_checks), ("StorageTier", self.tier_status)):
            dispatcher.handle(method, self._once_assigned(handler))

    def _once_assigned(self, handler):
        """A call that names a group this node does not host yet (a topic just created, a replica just added) asks
        the nameservers for this node's assignment and is served once the answer came, if it brought the group:
        the broker need not poll. Every handler checks its group before it changes anything."""
        async def call(request: dict) -> dict:
            try:
                return await handler(request)
            except NotHosted:
                asked = self._heartbeats_started + 1  # a heartbeat under way may have read the assignment before
                self._ask_now.set()
                with trio.move_on_after(limits.assignment_wait_s_max):
                    while self._heartbeats_done < asked:
                        await self._heartbeat_done.wait()
                return await handler(request)
        return call

    async def serve(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Flush the store in the background and report to the nameservers until cancelled."""
        async with trio.open_nursery() as nursery:
            await nursery.start(self.store.run)
            nursery.start_soon(self._backfill_forever)
            nursery.start_soon(self._fire_timers_forever)
            nursery.start_soon(self._reclaim_wal_forever)
            self._nursery = nursery
            nursery.start_soon(self._refresh_retention_forever)
            nursery.start_soon(self.offloader.run)
            task_status.started()
            while True:
                self._ask_now = trio.Event()
                asked_at = trio.current_time()
                self._heartbeats_started += 1
                try:
                    await self._heartbeat()
                finally:
                    self._heartbeats_done = self._heartbeats_started
                    self._heartbeat_done.set()
                    self._heartbeat_done = trio.Event()
                with trio.move_on_after(limits.node_heartbeat_s):
                    await self._ask_now.wait()  # a group not hosted yet: ask at once, but not twice within the minimum
                    await trio.sleep_until(asked_at + limits.assignment_ask_s_min)

    async def _heartbeat(self) -> None:
        groups = self._storage_groups()
        leads = [group for group in groups if self.host.leads(group)]
        lagging = [{"group": group, "node": node, "entries": entries}
                   for group in leads for node, entries in self.host.lagging(group).items()]
        wal = self.host.wal.log
        load = {"groups": len(groups), "leads": leads, "bytes": wal.end_position - wal.start_position,  # on disk
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
            if self.host.machine_of(group["id"]) is None:
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

    # ---- reclaiming the WAL ---------------------------------------------------------------------------

    async def _reclaim_wal_forever(self) -> None:
        while True:
            await trio.sleep(limits.wal_reclaim_s)
            await self.reclaim_wal()

    async def reclaim_wal(self) -> int:
        """Delete the WAL segments that nothing needs any more: the Raft groups' state lies after the last
        checkpoint, the entries not yet applied and the batches the store indexes lie wherever they do
        (batches go once retention dropped them locally or their timers settled). When the oldest few
        segments hold at most limits.wal_live_fraction_max of live batches, those of the oldest are copied
        forward first, so that data kept for long (a long timer, a topic without a tier) does not hold
        on to everything written after it. Returns how many segments went."""
        wal = self.host.wal
        raft_floor = min(position for position in (wal.replay_start(), self.host.unapplied_position_min())
                         if position is not None)
        starts = wal.log.segment_starts()
        ends = [end for end in starts[1:] if end <= raft_floor]  # of the sealed segments Raft no longer needs
        if not ends:
            return 0
        floor = self._wal_floor(raft_floor)
        drops = self.store.index.drops
        if floor < ends[0] and (drops != self._wal_drops_seen or trio.current_time() >= self._wal_rescan_at):
            # The oldest segment is pinned: look at what lives in the oldest few (a scan of their batches,
            # so not again for a while unless some local data went meanwhile).
            window = [starts[0]] + ends[:limits.wal_reclaim_window_segments]
            live, settled = await trio.to_thread.run_sync(self.store.wal_live, window[0], window[-1])
            self.store.forget(settled)
            oldest = [found for found in live if found[2].position < window[1]]
            if oldest and sum(entry.batch_bytes for _, _, entry in live) <= \
                    limits.wal_live_fraction_max * (window[-1] - window[0]):
                await self._move_forward(oldest)
            floor = self._wal_floor(raft_floor)
            self._wal_drops_seen, self._wal_rescan_at = drops, trio.current_time() + limits.wal_rescan_s
        if floor < ends[0]:
            return 0
        await trio.to_thread.run_sync(self.store.sync)  # the drops and moves counted on are durable first
        # A read of the WAL in a worker thread that finds its segment gone reads again (Store.fetch).
        removed = wal.log.delete_before(floor)
        if removed:
            log.info("WAL: deleted %d segments below position %d", removed, floor)
        return removed

    def _wal_floor(self, raft_floor: int) -> int:
        store_floor = self.store.wal_floor()
        return raft_floor if store_floor is None else min(raft_floor, store_floor)

    async def _move_forward(self, batches: list[tuple[str, int, IndexEntry]]) -> None:
        """Copy batches to the end of the WAL (durably), a bounded chunk at a time, and point the index at
        the copies."""
        while batches:
            size = 0
            for count, (_, _, entry) in enumerate(batches):
                size += entry.batch_bytes
                if size > limits.batch_bytes_max and count:
                    break
            else:
                count = len(batches)
            chunk, batches = batches[:count], batches[count:]
            positions = await self.host.write_data([self.store.read_entry(topic, queue, entry)
                                                    for topic, queue, entry in chunk])
            moved = self.store.move_batches(
                [(topic, queue, entry, position) for (topic, queue, entry), position in zip(chunk, positions)])
            self.wal_moved_bytes += moved
            log.info("WAL: copied %d bytes of %d batches forward from its oldest segment", moved, len(chunk))

    # ---- the tier ------------------------------------------------------------------------------------

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

    async def _read_queue(self, topic: str, queue: int, offset: int, budget: int, first: bool,
                          tag_mask: int) -> tuple[list[tuple[int, bytes]], int]:
        """A queue's batches from offset: from the tier for what is no longer local (or, in force mode,
        for all that is offloaded), else from the WAL."""
        force = self.offloader.settings.force_reads
        piece = self.store.tier_piece(topic, queue, offset, force) if self.cold is not None else None
        if piece is None:
            return await self.store.fetch(topic, queue, offset, budget, first, tag_mask)
        found, next_offset = await self.cold.read(piece, offset, budget, first, tag_mask)
        following = self.store.tier_piece(topic, queue, piece.to_offset, force)
        if following is not None and following.key not in self._prefetching and self._nursery is not None:
            self._nursery.start_soon(self._prefetch, following)
        return found, next_offset

    async def _prefetch(self, piece) -> None:
        self._prefetching.add(piece.key)
        try:
            await self.cold.prefetch(piece)
        finally:
            self._prefetching.discard(piece.key)

    def _storage_groups(self) -> set[int]:
        return {group for group in self.host.groups if isinstance(self.host.machine_of(group), GroupMachine)}

    def _hosted(self, group: int) -> None:
        if not isinstance(self.host.machine_of(group), GroupMachine):
            raise NotHosted(group, self.config.node_id)

    def _leads(self, group: int) -> None:
        """Reads are served by the group's leader, which holds everything committed: a follower may be
        behind (serving reads from followers in sync is for later)."""
        self._hosted(group)
        if not self.host.leads(group):
            raise NotLeader(self.host.leader_of(group))

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
        flags = check_header(batch, crc=False).flags
        append_ms = self._stamp(topic, queue)
        if flags & FLAG_TIMED:
            self._check_delivery_times(batch, append_ms)
            entry = encode_timers(topic, queue, append_ms, batch)
        elif flags & FLAG_TRANSACTION:
            batch_codec.decode(batch)  # its checks and its commit read the half messages: BAD_BATCH now, not then
            entry = encode_half(topic, queue, append_ms, append_ms + int(self.config.transaction_timeout_s * 1000), batch)
        else:
            entry = encode_append(topic, queue, append_ms, batch)
        base_offset, count = await self.host.propose(group, entry, limits.storage_append_wait_s_max)
        return {"queue": queue, "base_offset": base_offset, "count": count, "scheduled": bool(flags & FLAG_TIMED)}

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
                if not self.host.leads(group):
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
            fire = encode_move(topic, queue, self._stamp(topic, queue), timer_topic(topic), offsets, batch)
            if await self.host.propose(group, fire, limits.storage_append_wait_s_max):
                delivered += len(offsets)
        return delivered

    async def cancel_timer(self, request: dict) -> dict:
        self._hosted(request["group"])
        check_topic_name(request["topic"])
        queue, offset = next(iter(self._positions([request], "offset").items()))
        if not await self.host.propose(request["group"], encode_cancel(timer_topic(request["topic"]), queue, [offset])):
            raise RocketError(Code.NOT_FOUND, f"no pending timer {queue}.{offset} on topic {request['topic']!r}: "
                              "it was delivered or cancelled, or never existed")
        return {}

    async def members(self, request: dict) -> dict:
        """One membership change on this group's leader; a change already made answers at once, so a
        nameserver can repeat a move's steps after a failure."""
        group, action, node = request["group"], request["action"], request["node"]
        self._leads(group)
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
                await trio.sleep(0.1)
        raise RocketError(Code.TIMEOUT, f"node {node} has not caught up with group {group} yet; retry")

    # ---- consumer group membership -------------------------------------------------------------------

    async def group_heartbeat(self, request: dict) -> dict:
        """The live members of a consumer group on a topic, on the leader of the storage group of its
        queue 0. Soft state: after a change of leader the members are back within a heartbeat, and until
        then a member may read a queue another one reads too (duplicates, never a gap: positions are
        committed). No member leaving (member "") only reads who is live."""
        self._leads(request["group"])
        key = (check_group_name(request["consumer_group"]), check_topic_name(request["topic"]))
        member = request["member"]
        if len(member) > limits.group_name_bytes_max or not (member or request["leave"]):
            raise RocketError(Code.BAD_REQUEST, f"member id must be 1-{limits.group_name_bytes_max} characters")
        now = trio.current_time()
        if now - self._members_swept_at > limits.group_member_expiry_s:  # groups all of whose members left
            self._members_swept_at = now
            for gone in [name for name, members in self._members.items() if max(members.values()) < now]:
                del self._members[gone]
        members = self._members.setdefault(key, {})
        for gone in [name for name, expires in members.items() if expires < now]:
            del members[gone]
        if request["leave"]:
            members.pop(member, None)
        elif member in members or len(members) < limits.group_members_max:
            members[member] = now + limits.group_member_expiry_s
        else:
            raise RocketError(Code.OVERLOADED, f"group {key[0]!r} on {key[1]!r} has {len(members)} members already")
        if not members:
            del self._members[key]
        return {"members": sorted(members), "queues": []}

    # ---- transactions --------------------------------------------------------------------------------

    async def end_transaction(self, request: dict) -> dict:
        """Commit: the half messages are appended to their queue, once; roll back: they are dropped."""
        group = request["group"]
        self._hosted(group)
        topic = check_topic_name(request["topic"])
        queue, offset = next(iter(self._positions([request], "offset").items()))
        if not 1 <= request["count"] <= limits.batch_messages_max:
            raise RocketError(Code.BAD_REQUEST, f"a transaction holds 1..{limits.batch_messages_max} messages")
        offsets = list(range(offset, offset + request["count"]))
        if request["commit"]:
            try:
                messages = self.store.pending_messages(half_topic(topic), queue, offsets)
            except RocketError:  # never there: answered below like a second commit
                messages = []
            done = bool(messages) and bool(await self.host.propose(group, encode_move(
                topic, queue, self._stamp(topic, queue), half_topic(topic), offsets,
                batch_codec.encode(messages, int(time.time() * 1000))), limits.storage_append_wait_s_max))
        else:
            done = await self.host.propose(group, encode_cancel(half_topic(topic), queue, offsets))
        if not done:
            raise RocketError(Code.NOT_FOUND, f"no open transaction {queue}.{offset}+{request['count']} on "
                              f"{topic!r}: it was committed, rolled back or set aside as unresolved")
        return {}

    async def transaction_checks(self, request: dict) -> dict:
        """Open transactions of the topic's queues due for a check back: each is rescheduled by one check
        interval and counted as it is handed out (a conditional command, so only one asker gets it), or,
        checked transaction_checks_max times already, set aside in the unresolved queue."""
        group = request["group"]
        self._leads(group)
        topic = check_topic_name(request["topic"])
        queues = set(self._positions([{"queue": queue, "offset": 0} for queue in request["queues"]], "offset"))
        now_ms = int(time.time() * 1000)
        waiting = half_topic(topic)
        transactions: dict[tuple[int, int], list] = {}  # (queue, first half offset) -> due ms, checks, offsets
        for timer in self.store.due_timers(group, now_ms, limits.timer_fire_messages_max, halves=True):
            if timer.topic == waiting and timer.queue in queues:
                base_offset = self.store.batch_entry(waiting, timer.queue, timer.offset).base_offset
                transactions.setdefault((timer.queue, base_offset), [timer.deliver_at_ms, timer.checks, []])[2].append(
                    timer.offset)
        checks = []
        for (queue, base_offset), (due_ms, checked, offsets) in transactions.items():
            batch = batch_codec.encode(self.store.pending_messages(waiting, queue, offsets), now_ms)
            if checked >= self.config.transaction_checks_max:
                await self.host.propose(group, encode_move(unresolved_topic(topic), queue, now_ms, waiting, offsets,
                                                           batch))
                log.warning("transaction %d.%d on %s is unresolved after %d checks", queue, base_offset, topic, checked)
                continue
            next_ms = now_ms + int(self.config.transaction_check_s * 1000)
            if await self.host.propose(group, encode_rearm(waiting, queue, offsets, due_ms, next_ms, checked + 1)):
                checks.append({"topic": topic, "queue": queue, "offset": offsets[0], "count": len(offsets),
                               "batch": batch})
        return {"checks": checks}

    # ---- pop consumption -----------------------------------------------------------------------------

    async def pop(self, request: dict) -> dict:
        """Hand out up to max_messages from the group's queues: first those whose invisible time ran out
        (or, past max_attempts, to the dead-letter queue), then new ones the filter matches. With wait_ms,
        wait for new messages or the next reappearance when there is nothing yet."""
        group = request["group"]
        self._leads(group)
        consumer_group = check_group_name(request["consumer_group"])
        topic = check_topic_name(request["topic"])
        queues = list(self._positions([{"queue": queue, "offset": 0} for queue in request["queues"]], "offset"))
        chosen = compile_filter(request["filter_type"], request["filter"])
        invisible_ms = min(max(request["invisible_ms"], 1_000), limits.pop_invisible_s_max * 1000)
        wanted = min(max(request["max_messages"], 1), limits.pop_messages_max)
        attempts_max = max(1, request["max_attempts"])
        deadline = trio.current_time() + min(max(request["wait_ms"], 0), limits.pull_wait_ms_max) / 1000
        while True:
            response = {"batches": [], "handles": [], "cursors": [], "next_visible_ms": 0}
            for queue in queues:
                if len(response["handles"]) < wanted:
                    await self._pop_queue(group, consumer_group, topic, queue, chosen, invisible_ms,
                                          wanted - len(response["handles"]), attempts_max, request["fifo"], response)
            wake_s = deadline - trio.current_time()
            if response["handles"] or wake_s <= 0:
                return response
            if response["next_visible_ms"]:
                wake_s = min(wake_s, max(0.05, response["next_visible_ms"] / 1000 - time.time()))
            await self.store.wait_for_data({(topic, entry["queue"]): entry["offset"] for entry in response["cursors"]},
                                           wake_s)

    async def _pop_queue(self, group: int, consumer_group: str, topic: str, queue: int, chosen, invisible_ms: int,
                         wanted: int, attempts_max: int, fifo: bool, response: dict) -> None:
        """Expired messages again (or to the dead letters), then new ones. FIFO: nothing while a message
        is in flight, and nothing new until those that expired were handed out again, in order."""
        key = (consumer_group, topic, queue)
        lock = self._pop_locks.setdefault(key, trio.Lock())
        try:
            async with lock:
                now_ms = int(time.time() * 1000)
                state = self.store.pop_state(*key)
                again = []
                for offset, (visible_ms, attempt) in sorted(state.in_flight.items()):
                    if visible_ms > now_ms:
                        response["next_visible_ms"] = min(response["next_visible_ms"] or visible_ms, visible_ms)
                    elif attempt >= attempts_max:
                        await self._dead_letter(group, key, offset, attempt, visible_ms, now_ms)
                    elif len(again) < wanted:
                        again.append([offset, attempt, visible_ms])
                if fifo and any(visible_ms > now_ms for visible_ms, _ in state.in_flight.values()):
                    again = []  # the queue waits for its messages in flight, which come back in order
                new, next_cursor, batches = [], state.cursor, {}
                blocked = fifo and state.in_flight
                if not blocked:
                    new, next_cursor, batches = await self._new_for_pop(topic, queue, state.cursor,
                                                                        wanted - len(again), chosen)
                # A receive with nothing waits for new messages past the cursor, or, on a queue held by what is
                # in flight, for a change to it (an ack wakes waiting readers) or new messages past the end.
                wait_from = self.store.queue_stats(topic, queue)["next_offset"] if blocked else next_cursor
                response["cursors"].append({"queue": queue, "offset": wait_from})
                if not again and next_cursor == state.cursor:
                    return
                handed = await self.host.propose(group, encode_pop({
                    "op": "pop", "consumer_group": consumer_group, "topic": topic, "queue": queue,
                    "cursor": state.cursor, "next": next_cursor, "new": new, "again": again,
                    "visible_at_ms": now_ms + invisible_ms}), limits.storage_append_wait_s_max)
            if handed is False:  # the state moved on under a leader change: the next receive tries again
                return
            for offset, _, _ in again:
                found, _ = await self._read_queue(topic, queue, offset, 1, True, ALL_TAGS)
                batches.update(found)
            response["batches"].extend({"queue": queue, "base_offset": base_offset, "batch": batch}
                                       for base_offset, batch in sorted(batches.items()))
            response["handles"].extend({"queue": queue, "offset": offset, "attempt": attempt,
                                        "visible_at_ms": now_ms + invisible_ms} for offset, attempt in handed)
        finally:
            self._drop_pop_lock(key, lock)

    def _drop_pop_lock(self, key: tuple[str, str, int], lock: trio.Lock) -> None:
        if not lock.locked() and not lock.statistics().tasks_waiting:
            self._pop_locks.pop(key, None)  # locks are kept for queues being received from only

    async def _new_for_pop(self, topic: str, queue: int, cursor: int, wanted: int, chosen
                           ) -> tuple[list[int], int, dict]:
        """Up to wanted offsets from cursor whose messages the filter matches, where the cursor moves to
        (past what the filter skipped), and the batches holding them."""
        if wanted <= 0:
            return [], cursor, {}
        tag_mask = ALL_TAGS if chosen.tag_mask is None else chosen.tag_mask
        found, scanned_to = await self._read_queue(topic, queue, cursor, limits.read_bytes_max, True, tag_mask)
        new: list[int] = []
        batches = {}
        every_message = chosen.tag_mask is None and not isinstance(chosen, SqlFilter)  # no need to decode
        for base_offset, batch in found:
            messages = None if every_message else batch_codec.readable(batch, base_offset)
            if messages is None:  # every message, or a batch no filter can read: its receiver dead-letters it
                start = max(cursor, base_offset)
                end = min(base_offset + peek_count(batch), start + wanted - len(new))
                new.extend(range(start, end))
                batches[base_offset] = batch
                if len(new) >= wanted:
                    return new, end, batches
                continue
            for message in messages:
                if message.offset < cursor:
                    continue
                if len(new) >= wanted:
                    return new, message.offset, batches
                if chosen.matches(message):
                    new.append(message.offset)
                    batches[base_offset] = batch
        return new, scanned_to, batches

    async def _dead_letter(self, group: int, key: tuple[str, str, int], offset: int, attempt: int, visible_ms: int,
                           now_ms: int) -> bool:
        """A message that used up its attempts (or that its consumer gave up on) goes to the group's dead-letter
        queue, with its attempts; False if its state moved on meanwhile."""
        consumer_group, topic, queue = key
        [(base_offset, batch)], _ = await self._read_queue(topic, queue, offset, 1, True, ALL_TAGS)
        try:
            message = batch_codec.decode(batch, base_offset, queue)[offset - base_offset]
        except RocketError as error:  # it goes as an empty message that says why; its bytes stay where they are
            if error.code != Code.BAD_BATCH:
                raise
            message = Message(b"", properties={"DLQ_MALFORMED": error.message[:200]}, timestamp_ms=now_ms)
        message.properties = {**message.properties, "DLQ_ORIGIN_QUEUE": str(queue), "DLQ_ORIGIN_OFFSET": str(offset),
                              "DLQ_ATTEMPTS": str(attempt)}
        return bool(await self.host.propose(group, encode_pop({
            "op": "dead", "consumer_group": consumer_group, "topic": topic, "queue": queue, "offset": offset,
            "attempt": attempt, "visible_ms": visible_ms, "now_ms": now_ms}, batch_codec.encode([message], now_ms)),
            limits.storage_append_wait_s_max))

    async def receipt(self, request: dict) -> dict:
        """Ack received messages (invisible_ms -1), or make them visible again after invisible_ms: one
        conditional command per queue, proposed together; or (dead) move them to the dead-letter queue.
        Answers the receipts that were stale."""
        group = request["group"]
        self._hosted(group)
        consumer_group = check_group_name(request["consumer_group"])
        topic = check_topic_name(request["topic"])
        by_queue: dict[int, list[list[int]]] = {}
        for receipt in request["receipts"]:
            self._positions([receipt], "offset")
            by_queue.setdefault(receipt["queue"], []).append([receipt["offset"], receipt["attempt"]])
        if request["dead"]:
            self._leads(group)  # the in-flight state read here must be the group's latest
            return {"stale": await self._dead_letters(group, consumer_group, topic, by_queue)}
        stale: list[dict] = []

        async def one_queue(queue: int, receipts: list[list[int]]) -> None:
            command = {"op": "ack", "consumer_group": consumer_group, "topic": topic, "queue": queue, "receipts": receipts}
            if request["invisible_ms"] >= 0:
                invisible_ms = min(request["invisible_ms"], limits.pop_invisible_s_max * 1000)
                command.update(op="change", visible_at_ms=int(time.time() * 1000) + invisible_ms)
            current = await self.host.propose(group, encode_pop(command))
            stale.extend({"queue": queue, "offset": offset, "attempt": attempt}
                         for (offset, attempt), ok in zip(receipts, current) if not ok)

        async with trio.open_nursery() as nursery:
            for queue, receipts in by_queue.items():
                nursery.start_soon(one_queue, queue, receipts)
        return {"stale": stale}

    async def _dead_letters(self, group: int, consumer_group: str, topic: str, by_queue: dict[int, list[list[int]]]
                            ) -> list[dict]:
        """Move each received message (offset, attempt) to the dead-letter queue, under its queue's pop lock;
        returns those whose receipt was stale."""
        stale = []
        for queue, receipts in by_queue.items():
            key = (consumer_group, topic, queue)
            lock = self._pop_locks.setdefault(key, trio.Lock())
            try:
                async with lock:
                    for offset, attempt in receipts:
                        found = self.store.pop_state(*key).in_flight.get(offset)
                        if found is None or found[1] != attempt or not await self._dead_letter(
                                group, key, offset, attempt, found[0], int(time.time() * 1000)):
                            stale.append({"queue": queue, "offset": offset, "attempt": attempt})
            finally:
                self._drop_pop_lock(key, lock)
        return stale

    async def commit_offsets(self, request: dict) -> dict:
        self._hosted(request["group"])
        consumer_group = check_group_name(request["consumer_group"])
        check_topic_name(request["topic"])
        offsets = self._positions(request["offsets"], "offset")
        await self.host.propose(request["group"], encode_offsets(consumer_group, request["topic"], offsets))
        for queue, offset in offsets.items() if request["reset_pop"] else ():
            await self.host.propose(request["group"], encode_pop({
                "op": "reset", "consumer_group": consumer_group, "topic": request["topic"], "queue": queue,
                "cursor": offset}))
        return {}

    async def _read(self, topic: str, positions: dict[int, int], max_bytes: int, at_least_one: bool,
                    tag_mask: int = ALL_TAGS) -> dict:
        batches: list[dict] = []
        next_offsets: list[dict] = []
        budget = max_bytes
        for queue, offset in positions.items():
            # Past the first batch the budget is strict, so a response never exceeds a frame.
            first = at_least_one and not batches
            if budget > 0 or first:
                found, offset = await self._read_queue(topic, queue, offset, budget, first, tag_mask)
                for base_offset, data in found:
                    batches.append({"queue": queue, "base_offset": base_offset, "batch": data})
                    budget -= read_charge(len(data))
            next_offsets.append({"queue": queue, "offset": offset})
        return {"batches": batches, "next_offsets": next_offsets}

    async def read(self, request: dict) -> dict:
        group = request["group"]
        self._hosted(group)
        in_sync = request["follower_ok"] and self.host.in_sync(group, limits.follower_read_lag_entries_max)
        if not (request["any_replica"] or in_sync):
            self._leads(group)
        if in_sync:
            self.replica_reads += 1
        topic = request["topic"]
        positions = self._positions(request["queues"], "offset")
        max_bytes = max(0, min(request["max_bytes"], limits.read_bytes_max))
        tag_mask = request["tag_mask"] & ALL_TAGS  # a signed long on the wire; -1 reads every batch
        response = await self._read(topic, positions, max_bytes, request["at_least_one"], tag_mask)
        wait_ms = min(max(request["wait_ms"], 0), limits.pull_wait_ms_max)
        if not response["batches"] and wait_ms:  # wait past what the filter skipped
            positions = {entry["queue"]: entry["offset"] for entry in response["next_offsets"]}
            await self.store.wait_for_data({(topic, queue): offset for queue, offset in positions.items()},
                                           wait_ms / 1000)
            response = await self._read(topic, positions, max_bytes, request["at_least_one"], tag_mask)
        return response

    async def queues(self, request: dict) -> dict:
        self._leads(request["group"])
        topic = request["topic"]
        self._positions([{"queue": queue, "offset": 0} for queue in request["queues"]], "offset")
        offsets, pops = [], []
        if request["consumer_group"]:
            committed = self.store.fetch_offsets(request["consumer_group"], topic)
            offsets = [{"queue": queue, "offset": committed[queue]} for queue in request["queues"] if queue in committed]
            for queue in request["queues"]:
                state = self.store.pop_state(request["consumer_group"], topic, queue)
                pops.append({"queue": queue, "cursor": state.cursor, "done_before": state.done_before(),
                             "in_flight": len(state.in_flight)})
        time_offsets = []
        if request["timestamp_ms"] >= 0:
            time_offsets = [{"queue": queue, "offset": self.store.offset_for_time(topic, queue, request["timestamp_ms"])}
                            for queue in request["queues"]]
        return {"queues": [{"queue": queue, **self.store.queue_stats(topic, queue)} for queue in request["queues"]],
                "offsets": offsets, "time_offsets": time_offsets, "pops": pops}
