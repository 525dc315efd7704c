"""The store's state at open (load: the machine's state as the indexes hold it), and the one-time migration of the
store's own log that earlier builds kept (migrate)."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import orjson

from rocket import limits
from rocket.disk.commitlog import HEADER_BYTES, CommitLog
from rocket.disk.files import fsync_directory
from rocket.errors import Code, RocketError
from rocket.model import SYSTEM_PREFIX
from rocket.store import pop, records
from rocket.store.machine import Snapshot, StorageMachine, replace_pops
from rocket.store.manifest import TierQueue
from rocket.store.producers import Producers
from rocket.store.queue_index import QueueIndex
from rocket.store.values import IndexEntry, QueueStats, Timer

log = logging.getLogger("rocket.store")


def load(index: QueueIndex, machine: StorageMachine) -> None:
    """Give the machine the state the index holds: queue positions, how far each group got, pop states, tier
    manifests, producers' answers, deleted topics, orderly consumers' locks and when each group's next timer is due."""
    machine.queues, machine.applied = index.all_stats(), index.groups_applied()
    machine.pops = index.pop_states()
    machine.tier = {key: TierQueue.from_wire(orjson.loads(state)) for key, state in index.tier_states().items()}
    machine.producers = Producers.load(index.producer_rows())
    machine.dropped = index.tombstones()
    machine.incarnations = index.incarnations()
    machine.locks = index.locks()
    machine.offload_candidates = {key for key in machine.queues if not key[0].startswith(SYSTEM_PREFIX)}
    machine.key_candidates = dict.fromkeys(machine.offload_candidates)
    for group in machine.applied:
        for halves in (False, True):
            upcoming = index.timers(group, limit=1, halves=halves)
            if upcoming:
                machine.next_due[(group, halves)] = upcoming[0].deliver_at_ms


def migrate(directory: Path, index: QueueIndex, machine: StorageMachine) -> None:
    """Bring the index up to the end of the store's own log in directory/log, if an earlier build left one, make it
    durable, and delete the log. Earlier builds (up to December 2026) kept a log of their own beside the WAL
    (records.py): every apply wrote its records there, and LevelDB was rebuilt from it. The store now writes LevelDB
    alone, and a lost tail of its writes is applied again from the WAL (see Store). Replay holds one handler per
    record kind. A crash before the log is renamed leaves it to be replayed again at the next open;
    one after, a renamed log that the next open deletes."""
    path, replayed = directory / "log", directory / "log.replayed"
    if replayed.exists():
        shutil.rmtree(replayed)
    if not path.exists():
        return
    commit_log = CommitLog.open(path, limits.segment_bytes_min)  # read, never rolled
    try:
        _match_index_to_log(index, commit_log)
        Replay(commit_log, index, machine).run()
    finally:
        commit_log.close()
    index.sync()
    path.rename(replayed)
    fsync_directory(directory)
    shutil.rmtree(replayed)
    log.info("the store's own log was replayed into the index and deleted: the store now writes the index alone")


def _match_index_to_log(index: QueueIndex, commit_log: CommitLog) -> None:
    """Make the index one that a replay of the log from where it reached brings up to date, or refuse to open.
    Checkpoints deleted the log below what LevelDB held durably: an index that needs the log from before its first
    segment cannot be rebuilt from it."""
    whole = commit_log.start_position == 0
    if not index.keeps_refs:
        if not whole:
            raise RocketError(Code.CORRUPT_DATA, f"the store's index in {index.path} predates WAL references and must "
                              f"be rebuilt, but its log starts at {commit_log.start_position} (checkpointed)")
        log.warning("index predates WAL references: rebuilding it from the log")
        index.destroy_and_reopen()
    elif index.applied_position > commit_log.end_position:
        # The log lost an unsynced tail that LevelDB kept (they were synced apart). The index is the newer state and
        # a consistent one: each of its writes is atomic and names the Raft entries it applied, so the groups
        # re-apply from the WAL only what came after. The replay starts at the log's end: nothing is left to replay.
        log.warning("index is ahead of the log (its unsynced tail was lost, at %d of %d): keeping the index",
                    commit_log.end_position, index.applied_position)
        index.rewind(commit_log.end_position)
    elif index.applied_position < commit_log.start_position:
        raise RocketError(Code.CORRUPT_DATA, f"the store's index in {index.path} reached position "
                          f"{index.applied_position} of its log, which starts at {commit_log.start_position} "
                          f"(checkpointed): the index was lost or replaced, and cannot be rebuilt from the log")


class Replay:
    def __init__(self, commit_log: CommitLog, index: QueueIndex, machine: StorageMachine):
        self.log, self.index, self.machine = commit_log, index, machine
        self.stats = index.all_stats()
        self.applied = index.groups_applied()
        self.pops = index.pop_states()
        self.tier = {key: TierQueue.from_wire(orjson.loads(state)) for key, state in index.tier_states().items()}
        # Changes not written to the index yet: they are written in chunks, and before a record that changes
        # what earlier ones may have added.
        self.entries: list[tuple[str, int, IndexEntry]] = []
        self.commits: list[tuple[str, str, dict[int, int]]] = []
        self.timers: list[tuple[int, Timer, bool]] = []
        self.pop_changes: list[pop.PopChange] = []
        self.producer_changes: list = []
        self._handlers = {records.BATCH: self._batch, records.OFFSETS: self._offsets, records.APPLIED: self._applied,
                          records.TIMERS: self._timers, records.POPS: self._pops, records.POSITIONS: self._positions,
                          records.TIER: self._tier, records.BACKFILLED: self._backfilled, records.MOVED: self._moved,
                          records.FORGOTTEN: self._forgotten, records.AVAILABLE: self._available,
                          records.PRODUCERS: self._producers}

    def run(self) -> None:
        """Replay the records past where the index reached into it."""
        replayed = 0
        for position, kind, body in self.log.scan(self.index.applied_position):
            replayed += 1
            handler = self._handlers.get(kind)
            if handler is None:
                raise RocketError(Code.CORRUPT_DATA, f"log record at {position} has unknown kind {kind}")
            handler(position, body)
            if (len(self.entries) + len(self.commits) + len(self.timers) + len(self.pop_changes)
                    + len(self.producer_changes) >= limits.index_replay_records_per_write_max):
                self._flush(position + HEADER_BYTES + len(body))
        self._flush(self.log.end_position)
        if replayed:
            log.info("replayed %d log records into the index", replayed)

    def _flush(self, position: int) -> None:
        """Write the pending changes to the index, which then holds the log up to position."""
        self.index.apply(self.entries, self.stats, self.commits, self.applied, position, self.timers, self.pop_changes,
                         producers=self.producer_changes)
        self.entries, self.commits, self.timers, self.pop_changes, self.producer_changes = [], [], [], [], []

    def _batch(self, position: int, body: bytes) -> None:
        topic, queue, group, entry = records.decode_batch(body)
        queue_stats = self.stats.setdefault((topic, queue), QueueStats(group=group))
        if entry.base_offset != queue_stats.next_offset:
            raise RocketError(Code.CORRUPT_DATA, f"log record at {position} has offset {entry.base_offset} "
                              f"for {topic}/{queue}, expected {queue_stats.next_offset}")
        self.entries.append((topic, queue, entry))
        queue_stats.next_offset += entry.count
        queue_stats.bytes += entry.batch_bytes
        queue_stats.last_append_ms = entry.append_ms

    def _backfilled(self, position: int, body: bytes) -> None:
        topic, queue, _, entry = records.decode_batch(body)
        self.entries.append((topic, queue, entry))

    def _offsets(self, position: int, body: bytes) -> None:
        self.commits.append(records.decode_offsets(body))

    def _applied(self, position: int, body: bytes) -> None:
        group, index = records.decode_applied(body)
        self.applied[group] = index

    def _timers(self, position: int, body: bytes) -> None:
        self.timers.extend(records.decode_timers(body))

    def _pops(self, position: int, body: bytes) -> None:
        for wire in orjson.loads(body):
            self._pop_change(pop.PopChange.from_wire(wire))

    def _pop_change(self, change: pop.PopChange) -> None:
        self.pop_changes.append(change)
        pop.apply_change(self.pops, change)

    def _positions(self, position: int, body: bytes) -> None:
        # Flush first: the snapshot's timers replace the group's, which earlier records may have set.
        self._flush(position)
        snapshot = Snapshot.decode(body)
        self.stats.update(snapshot.queues)
        self.applied[snapshot.group] = snapshot.applied
        self.tier.update(snapshot.tier)
        self.index.apply([], {}, [], {}, position, tier=snapshot.tier_changes())
        self.index.replace_producers(snapshot.group, Producers().restore(snapshot.group, snapshot.producers))
        self.timers.extend(self.machine.replace_timers(snapshot.group, snapshot.timers))
        for change in replace_pops(self.pops, snapshot.queues, snapshot.pops):
            self._pop_change(change)

    def _producers(self, position: int, body: bytes) -> None:
        self.producer_changes.extend(tuple(change) for change in orjson.loads(body))

    def _tier(self, position: int, body: bytes) -> None:
        # Flush first: the drops delete index entries that earlier records may have added.
        self._flush(position)
        changes = []
        for topic, queue, state, drop_below in orjson.loads(body):
            self.tier[(topic, queue)] = TierQueue.from_wire(state)
            changes.append((topic, queue, orjson.dumps(state), drop_below))
        self.index.apply([], {}, [], {}, position + HEADER_BYTES + len(body), tier=changes)

    def _moved(self, position: int, body: bytes) -> None:
        self._flush(position)  # these change index entries that earlier records may have added
        self.index.move([tuple(move) for move in orjson.loads(body)])

    def _forgotten(self, position: int, body: bytes) -> None:
        self._flush(position)
        self.index.forget([tuple(dropped) for dropped in orjson.loads(body)])

    def _available(self, position: int, body: bytes) -> None:
        topic, queue, offset = records.decode_available(body)
        self.stats[(topic, queue)].available_from = offset
