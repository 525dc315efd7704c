"""The store of one storage node: the shell around the state machine of every storage group the node hosts, which
persists what committed entries change in LevelDB, written without sync, and re-applies from the WAL what it lost."""

from __future__ import annotations

import contextlib
import itertools
import logging
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import trio

from rocket import limits
from rocket.clock import sleep_periodic
from rocket.disk.commitlog import CommitLog
from rocket.errors import Code, RocketError
from rocket.model import SYSTEM_PREFIX
from rocket.serde import batch as batch_codec
from rocket.store.kv_index import KvIndex
from rocket.store.machine import Effects, StorageMachine
from rocket.store.queue_index import QueueIndex
from rocket.store.reads import Reads
from rocket.store.reclaim import Reclaim
from rocket.store.replay import load, migrate
from rocket.store.timers import StoreTimers
from rocket.store.values import IndexEntry, QueueStats
from rocket.world import WORLD, World

log = logging.getLogger("rocket.store")


class GroupMachine:
    """One Raft group's view of the node's store (its replication.StateMachine): what the multi-raft host applies and
    snapshots. Its snapshot is a sequence of chunks (about limits.snapshot_chunk_bytes_max each): the store's head
    (the machine's JSON), then the group's KV records, read through a LevelDB snapshot. It is taken in the event
    loop's thread at one applied index, and iterated in the Raft host's snapshot worker thread while the group goes
    on applying, so it holds a copy, not live state. The Raft host writes the chunks to a snapshot file; restore gets
    back the same chunks, read from the file."""

    def __init__(self, store: "Store", group: int):
        self.store = store
        self.group = group

    def apply(self, entries, positions: list[int]) -> list:
        return self.store.apply(self.group, entries, positions)

    def snapshot(self) -> Iterator[bytes]:
        return self.store.snapshot(self.group)  # taken now, in the event loop's thread; iterated in a worker

    def restore(self, chunks: Iterable[bytes]) -> None:
        self.store.restore(self.group, chunks)


class Store:
    """A group's Raft log is its commit log: a produce batch is written once, inside its entry in the node's WAL,
    fsync'ed before anything is acknowledged. The state machine (machine.py) decides what committed entries change;
    this shell persists its effects in LevelDB (queue_index.py, kv_index.py), wakes long polls, and handles backfill,
    sync and close. Its reads, timers and WAL reclaim are its parts (reads.py, timers.py, reclaim.py).

    One log. The WAL is the only log: the store writes LevelDB without sync, one atomic write per Raft round that
    names the entry each group applied. A power cut takes LevelDB back to its last synced write, and the groups apply
    again from the WAL what came after (the Raft host re-applies from its snapshot, and the machine skips what it
    holds). So the WAL may drop an entry only once LevelDB holds it durably: the Raft host syncs the store (sync)
    before it writes a snapshot, in its persist thread, so the Raft log may then be compacted up to it; and WAL
    reclaim syncs it before it deletes a segment. What is not in a group's log (backfilled batches, batches moved
    forward, settled timer batches forgotten) is redone if a power cut loses it."""

    def __init__(self, index: QueueIndex, data: CommitLog, kv: KvIndex, world: World = WORLD):
        self.index = index
        self.world = world  # worker threads for blocking reads and syncs
        self.data = data  # the WAL: where batches lie
        self.kv = kv
        self.machine = StorageMachine(index, kv)
        self.machine.kv_shards, self.machine.kv_applied = kv.shards(), kv.applied()
        self.reads = Reads(self.machine, index, data, world)
        self._kv_watchers: dict[tuple[str, int], set[trio.Event]] = {}
        self.timers = StoreTimers(self.machine, index, self.reads.read)
        self._dirty = False  # written since the background sync last ran
        self.reclaim = Reclaim(index, self._wrote)
        self.fsyncs = 0
        self.traffic: dict[tuple[str, int], QueueStats] = {}  # queues appended to or read since take_traffic
        self.bytes_in: dict[tuple[str, int], int] = {}  # (topic, group) -> bytes appended since take_bytes_in
        # Whether this node leads a Raft group (the storage role sets it): only a group's leader counts its bytes in,
        # as it applies them, so that a load report moves with the leadership and nothing is counted twice.
        self.leads: Callable[[int], bool] = lambda group: True
        self.changed: set[tuple[str, int]] = set()  # queues appended to, read or committed since the meter looked
        # Set when an apply sets or takes timers, or changes KV: the loops that sleep until they have work (the timer
        # loop, KV expiry) put a new event here before they sleep.
        self.timers_changed = trio.Event()
        self.keys_changed = trio.Event()  # set as batches are applied: the key indexer has work (index_keys)
        # queue -> the offset before which the key indexer found every batch's keys indexed (index_keys)
        self._key_cursors: dict[tuple[str, int], int] = {}
        self.kv_changed = trio.Event()
        self._held: list[Effects] | None = None  # what applies changed, persisted at the end of holding()

    @classmethod
    def open(cls, directory: Path, data: CommitLog, world: World = WORLD) -> "Store":
        """data is the node's Raft WAL, where the batches of applied entries lie."""
        directory.mkdir(parents=True, exist_ok=True)
        index = QueueIndex(directory / "index")
        store = cls(index, data, KvIndex(directory / "kv"), world)
        migrate(directory, index, store.machine)  # the store's own log of an earlier build, if one is there
        load(index, store.machine)
        return store

    @property
    def offload_candidates(self) -> set[tuple[str, int]]:
        return self.machine.offload_candidates

    # ---- the state machine's effects -------------------------------------------------------------------

    def apply(self, group: int, entries, positions: list[int]) -> list:
        """Apply a group's committed entries (see StorageMachine.apply) and persist what they changed: now, or at the
        end of the holding() block this runs in."""
        results, effects = self.machine.apply(group, entries, positions)
        if effects is not None:
            if self._held is None:
                self._persist([effects])
            else:
                if any(held.group == group for held in self._held):
                    self._flush_held()  # a group's apply reads what its earlier ones wrote (timers, pops, KV keys)
                self._held.append(effects)
        return results

    @contextlib.contextmanager
    def holding(self) -> Iterator[None]:
        """Within the block, what applies change is persisted once, at its end: one write to each index for every
        group a Raft round applied, not one per group. Nothing reads the index in between:
        the block is the round loop's apply, in the trio thread, and snapshot and restore persist what is held
        first."""
        self._held = []
        try:
            yield
        finally:
            held, self._held = self._held, None
            if held:
                self._persist(held)

    def _flush_held(self) -> None:
        if self._held:
            held, self._held = self._held, []
            self._persist(held)

    def _persist(self, held: list[Effects]) -> None:
        applied = [effects for effects in held if effects.applied]
        if applied:
            for effects in applied:
                if effects.producers_restored is not None:
                    self.index.replace_producers(effects.group, effects.producers_restored)
            entries = [entry for effects in applied for entry in effects.index_entries]
            touched = {key: stats for effects in applied for key, stats in effects.touched.items()}
            commits = [commit for effects in applied for commit in effects.commits]
            timers = [timer for effects in applied for timer in effects.timers]
            pops = [change for effects in applied for change in effects.pop_changes]
            tier = [change for effects in applied for change in effects.tier_changes]
            producers = [change for effects in applied for change in effects.producer_changes]
            drops = [drop for effects in applied for drop in effects.drops]
            self.index.apply(entries, touched, commits, {effects.group: effects.applied for effects in applied},
                             timers=timers, pops=pops, tier=tier, producers=producers, drops=drops,
                             tombstones=[change for effects in applied for change in effects.tombstones],
                             incarnations=[change for effects in applied for change in effects.incarnations],
                             locks=[change for effects in applied for change in effects.lock_changes])
            for drop in drops:
                for place in drop.queues:
                    self.traffic.pop(place, None)
                    self.changed.discard(place)
                    self._key_cursors.pop(place, None)
            self._dirty = True
            self.traffic.update(touched)
            self.changed.update(touched)
            bytes_in = self.bytes_in
            for effects in applied:
                if effects.index_entries and self.leads(effects.group):
                    for topic, _, entry in effects.index_entries:
                        bytes_in[(topic, effects.group)] = bytes_in.get((topic, effects.group), 0) + entry.batch_bytes
                self.reads.wake(effects.woken.union(effects.touched))
            for consumer_group, topic, offsets in commits:
                self._count_commits(consumer_group, topic, offsets)
            if timers:
                self.timers_changed.set()
            if self.machine.key_candidates:
                self.keys_changed.set()
        kv = [(effects.kv_changes, effects.kv_shards, effects.group, effects.kv_applied) for effects in held
              if effects.kv_applied]
        if kv:
            self.kv.apply(kv)
            self._dirty = True
            self.kv_changed.set()
            for _, shards, _, _ in kv:
                for key in shards:
                    for event in self._kv_watchers.get(key, ()):
                        event.set()

    def count_read(self, topic: str, queue: int, batches: list[tuple[int, bytes]], messages: int | None = None) -> None:
        """Telemetry: a read of the queue returned these batches, with messages of theirs (all, by default; a
        receive hands out some of a batch's messages)."""
        stats = self.machine.queues.get((topic, queue))
        if stats is not None and batches:
            stats.out_messages += (sum(batch_codec.peek_count(data) for _, data in batches) if messages is None
                                   else messages)
            stats.out_bytes += sum(len(data) for _, data in batches)
            self.traffic[(topic, queue)] = stats
            self.changed.add((topic, queue))

    def _count_commits(self, consumer_group: str, topic: str, offsets: dict[int, int]) -> None:
        """Telemetry: a queue's backlog is what its slowest consumer group has yet to commit."""
        for queue, offset in offsets.items():
            stats = self.machine.queues.get((topic, queue))
            if stats is not None:
                if stats.committed is None:
                    stats.committed = {}
                stats.committed[consumer_group] = offset
                self.traffic[(topic, queue)] = stats
                self.changed.add((topic, queue))

    def take_bytes_in(self) -> dict[tuple[str, int], int]:
        """The nameserver's load history: bytes appended per (topic, group) since the last call, in the groups this
        node led as it applied them."""
        taken, self.bytes_in = self.bytes_in, {}
        return taken

    def give_back_bytes_in(self, taken: dict[tuple[str, int], int]) -> None:
        """What take_bytes_in gave, for the next call: no nameserver heard of it."""
        for key, count in taken.items():
            self.bytes_in[key] = self.bytes_in.get(key, 0) + count

    def take_traffic(self) -> list[tuple[str, int, int, tuple[int, int, int, int], tuple[int, int, int, int] | None]]:
        """Telemetry: the queues appended to, read or committed since the last call, as (topic, queue, group, totals,
        increases, backlog): totals are (messages in, bytes in, messages out, bytes out), in since the queue began, out
        since this node started; increases are since the last call, None on a queue's first; backlog is the messages
        its slowest consumer group has not committed, None before a group committed on it since this node started."""
        taken, self.traffic = self.traffic, {}
        result = []
        for (topic, queue), stats in taken.items():
            totals = (stats.next_offset, stats.bytes, stats.out_messages, stats.out_bytes)
            before, stats.sampled = stats.sampled, totals
            increases = None if before is None else tuple(now - then for now, then in zip(totals, before))
            backlog = None if not stats.committed else max(0, stats.next_offset - min(stats.committed.values()))
            result.append((topic, queue, stats.group, totals, increases, backlog))
        return result

    def snapshot(self, group: int) -> Iterator[bytes]:
        """The group's state as applied: a head (the machine's snapshot), then its KV records. What the head covers
        lies in the indexes, which must be made durable (sync) before the snapshot is,
        so that the group's Raft log may then be dropped: the Raft host does it in its persist thread
        (sync_before_snapshots). The KV records come from a LevelDB snapshot taken now: iterate them anywhere."""
        self._flush_held()
        head = self.machine.snapshot(group)
        shards = [place for place, (holder, *_) in self.machine.kv_shards.items() if holder == group]
        return itertools.chain((head,), self.kv.snapshot_chunks(group, shards))  # both taken now, not when iterated

    def restore(self, group: int, chunks: Iterable[bytes]) -> None:
        """Install a snapshot. On a restart the store already holds it; a replica that was sent one
        by its leader lacks the batches before it: it takes the queue positions, so offsets agree,
        refuses reads of the batches it lacks (UNAVAILABLE, so that a broker asks another replica)
        until the storage role has backfilled them (see backfill). The KV state is taken whole when the KV
        index is behind the snapshot (a new replica, or a KV directory lost)."""
        self._flush_held()
        chunks = iter(chunks)
        head = next(chunks, b"")
        if not head:
            return
        effects = self.machine.restore(group, head)
        if effects is None:
            return
        if effects.applied:
            log.warning("group %d: installed a snapshot at entry %d without its batches; they are fetched from the "
                        "other replicas", group, effects.applied)
        if effects.kv_applied:
            log.warning("group %d: the KV state of its shards is taken from the snapshot at entry %d", group,
                        effects.kv_applied)
            self.kv.restore(group, effects.kv_shards, chunks, effects.kv_applied)
            effects.kv_applied = 0  # written whole
        self._persist([effects])

    async def kv_wait(self, bucket: str, shard: int, revision: int, timeout_s: float) -> None:
        """Return when the shard's revision passes revision, or after the timeout."""
        place = (bucket, shard)
        found = self.machine.kv_shards.get(place)
        if found is not None and found[1] > revision:
            return
        event = trio.Event()
        self._kv_watchers.setdefault(place, set()).add(event)
        try:
            with trio.move_on_after(timeout_s):
                await event.wait()
        finally:
            watchers = self._kv_watchers[place]
            watchers.discard(event)
            if not watchers:
                del self._kv_watchers[place]

    # ---- backfill: the batches before an installed snapshot ---------------------------------------------

    # ---- the key index ---------------------------------------------------------------------------------

    async def index_keys(self) -> int:
        """One step of the key indexer, per batch and off the appends' path (the storage role runs it when the node
        is idle: Reads.index_keys_forever): read the batches of one queue whose keys are not indexed yet, at most
        limits.key_index_step_bytes of them (one at least), and record their terms (QueueIndex.mark_keyed). Queues
        take turns. Returns the bytes of the batches indexed."""
        candidates = self.machine.key_candidates
        if not candidates:
            return 0
        place = next(iter(candidates))
        del candidates[place]  # to the back of the line
        found, self._key_cursors[place], at_end = self.index.unkeyed(*place, self._key_cursors.get(place, 0),
                                                                     limits.key_index_step_bytes)
        if found:
            entries = [entry for entry, _ in found]
            try:
                batches = await self.reads.fetch_entries(*place, entries)
            except RocketError:  # moved by WAL reclaim meanwhile, or damaged: left unindexed, so read by lookups
                batches = []
            self.index.mark_keyed(*place, [(entry, value, batch_codec.key_terms(batch))
                                           for (entry, value), (_, batch) in zip(found, batches)])
        if found or not at_end:
            candidates[place] = None
        return sum(entry.batch_bytes for entry, _ in found)

    def gaps(self) -> list[tuple[int, str, int, int]]:
        """(group, topic, queue, offset) for every queue whose batches before offset are not here."""
        return [(stats.group, topic, queue, stats.available_from)
                for (topic, queue), stats in self.machine.queues.items() if stats.available_from > 0]

    def gap_end(self, topic: str, queue: int) -> int:
        return self.machine.queues[(topic, queue)].available_from

    def backfill(self, topic: str, queue: int, batches: list[tuple[int, bytes]], positions: list[int],
                 start: int | None, last: bool) -> int:
        """Index batches fetched from another replica for a queue's gap (their bytes now lie durably in
        the WAL at positions), in chunks that follow each other without holes: each starts where the
        previous one said the next starts (start; None for the first). With the last chunk, which must
        end where the gap did, the queue holds what that replica held."""
        stats = self.machine.queues[(topic, queue)]
        entries = []
        expected = start if start is not None else batches[0][0] if batches else stats.available_from
        for (base_offset, batch), position in zip(batches, positions):
            header = batch_codec.check_header(batch)
            if base_offset != expected:
                raise RocketError(Code.CORRUPT_DATA, f"backfill of {topic}/{queue}: batch at {base_offset}, "
                                  f"expected {expected}")
            expected = base_offset + header.count
            entry = IndexEntry(base_offset, position, header.count, len(batch), header.first_timestamp_ms,
                               stats.last_append_ms, header.tag_summary)
            entries.append((topic, queue, entry))
        if last:
            if expected != stats.available_from:
                raise RocketError(Code.CORRUPT_DATA, f"backfill of {topic}/{queue} ends at {expected}, the gap at "
                                  f"{stats.available_from}")
            stats.available_from = 0
        # The queue's bytes counted these already: the snapshot carried them. Lost to a power cut, the chunks are
        # fetched again: the queue's gap is written with them, in one write.
        self.index.apply(entries, {(topic, queue): stats}, [], {})
        if not topic.startswith(SYSTEM_PREFIX):  # the key indexer looks from the queue's start again
            self._key_cursors.pop((topic, queue), None)
            self.machine.key_candidates[(topic, queue)] = None
        self._dirty = True
        return expected

    # ---- durability ------------------------------------------------------------------------------------

    def _wrote(self) -> None:
        self._dirty = True

    def sync(self) -> None:
        """Make durable what the store wrote before the call: a synced write to each LevelDB makes every write before
        it durable, also those another thread's sync is still making durable. May run in any thread."""
        self.index.sync()
        self.kv.sync()
        self.fsyncs += 1

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Flush the store's writes in the background, so that a snapshot's sync has little left to do."""
        task_status.started()
        while True:
            await sleep_periodic(limits.store_sync_s)
            if self._dirty:
                self._dirty = False
                await self.world.run_sync(self.sync)

    def close(self) -> None:
        self.sync()
        self.index.close()
        self.kv.close()

