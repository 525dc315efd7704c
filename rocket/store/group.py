"""The store of one group: its commit log is the source of truth; the queue index is derived from it.

Appends are group-committed: every pending record goes out in one write + fdatasync in a worker
thread, while new appends queue up. Nothing is acknowledged, indexed or readable before its fsync.
"""

from __future__ import annotations

import dataclasses
import logging
import struct
import time
from pathlib import Path

import orjson
import trio

from rocket import limits
from rocket.errors import Code, RocketError
from rocket.serde import batch as batch_codec
from rocket.store.commitlog import HEADER_BYTES, CommitLog
from rocket.store.queue_index import IndexEntry, QueueIndex, QueueStats

log = logging.getLogger("rocket.store")

BATCH = 1
OFFSETS = 2
_batch_head = struct.Struct("<H")  # topic length; then topic, then _batch_route, then the batch
_batch_route = struct.Struct("<IQQ")  # queue, base offset, append time ms


def encode_batch_record(topic: str, queue: int, base_offset: int, append_ms: int, batch: bytes) -> tuple[bytes, bytes]:
    """The record body as (routing header, batch): the log writes both parts without joining them."""
    name = topic.encode()
    return _batch_head.pack(len(name)) + name + _batch_route.pack(queue, base_offset, append_ms), batch


def decode_batch_record(body: bytes) -> tuple[str, int, int, int, memoryview]:
    (name_length,) = _batch_head.unpack_from(body)
    route_at = _batch_head.size + name_length
    queue, base_offset, append_ms = _batch_route.unpack_from(body, route_at)
    topic = body[_batch_head.size:route_at].decode()
    return topic, queue, base_offset, append_ms, memoryview(body)[route_at + _batch_route.size:]


@dataclasses.dataclass(slots=True)
class _Pending:
    kind: int
    body: bytes | tuple[bytes, bytes]
    size: int
    done: trio.Event
    topic: str = ""
    queue: int = 0
    entry: IndexEntry | None = None
    commit: tuple[str, str, dict[int, int]] | None = None
    error: RocketError | None = None


@dataclasses.dataclass(slots=True)
class _QueueState:
    durable: QueueStats  # what readers see: flushed and indexed
    assigned_next: int  # next offset to hand out, counting appends still pending
    assigned_append_ms: int


class Store:
    def __init__(self, commit_log: CommitLog, index: QueueIndex, clock):
        self.log = commit_log
        self.index = index
        self._clock = clock
        self._queues: dict[tuple[str, int], _QueueState] = {}
        self._pending: list[_Pending] = []  # waiting to be written
        self._written: list[tuple[_Pending, int]] = []  # written at a log position, waiting for fsync
        self._written_ready = trio.Event()
        self._pending_bytes = 0
        self._work = trio.Event()
        self._room = trio.Event()
        self._watchers: dict[tuple[str, int], set[trio.Event]] = {}
        self._failed: RocketError | None = None
        self.fsyncs = 0

    @classmethod
    def open(cls, directory: Path, segment_bytes_max: int = limits.segment_bytes_max_default, clock=time.time) -> "Store":
        commit_log = CommitLog.open(directory / "log", segment_bytes_max)
        index = QueueIndex(directory / "index")
        if index.applied_position > commit_log.end_position:
            log.warning("index is ahead of the log (its tail was cut back): rebuilding it from the log")
            index.destroy_and_reopen()
        store = cls(commit_log, index, clock)
        store._replay()
        return store

    def _replay(self) -> None:
        """Bring the index up to the end of the log, then load queue states from it."""
        stats = self.index.all_stats()
        entries: list[tuple[str, int, IndexEntry]] = []
        commits: list[tuple[str, str, dict[int, int]]] = []
        replayed = 0
        for position, kind, body in self.log.scan(self.index.applied_position):
            replayed += 1
            if kind == BATCH:
                topic, queue, base_offset, append_ms, batch = decode_batch_record(body)
                header = batch_codec.check_header(batch)
                queue_stats = stats.setdefault((topic, queue), QueueStats())
                if base_offset != queue_stats.next_offset:
                    raise RocketError(Code.CORRUPT_DATA, f"log record at {position} has offset {base_offset} for "
                                      f"{topic}/{queue}, expected {queue_stats.next_offset}")
                entries.append((topic, queue, IndexEntry(base_offset, position, header.count, len(batch),
                                                         header.first_timestamp_ms, append_ms)))
                queue_stats.next_offset += header.count
                queue_stats.bytes += len(batch)
                queue_stats.last_append_ms = append_ms
            elif kind == OFFSETS:
                record = orjson.loads(body)
                commits.append((record["group"], record["topic"], {int(q): o for q, o in record["offsets"].items()}))
            if len(entries) + len(commits) >= limits.index_replay_records_per_write_max:
                self.index.apply(entries, stats, commits, position + HEADER_BYTES + len(body))
                entries, commits = [], []
        self.index.apply(entries, stats, commits, self.log.end_position)
        if replayed:
            log.info("replayed %d log records into the index", replayed)
        self._queues = {key: _QueueState(value, value.next_offset, value.last_append_ms) for key, value in stats.items()}

    def _state(self, topic: str, queue: int) -> _QueueState:
        state = self._queues.get((topic, queue))
        if state is None:
            state = self._queues[(topic, queue)] = _QueueState(QueueStats(), 0, 0)
        return state

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """The group-commit loops: one writes pending records while the other fsyncs what was written,
        so that one fsync overlaps the next write. On cancellation, pending records are flushed."""
        task_status.started()
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._sync_loop)
                await self._write_loop()
        finally:
            with trio.CancelScope(shield=True):
                while self._failed is None and (self._pending or self._written):
                    if self._pending:
                        await self._write_once()
                    await self._sync_once()

    async def _enqueue(self, pending: _Pending) -> None:
        if self._failed is not None:
            raise self._failed
        with trio.move_on_after(limits.append_queue_wait_s_max) as waited:
            while self._pending_bytes > limits.append_queue_bytes_max:
                if self._room.is_set():
                    self._room = trio.Event()
                await self._room.wait()
        if waited.cancelled_caught:
            raise RocketError(Code.OVERLOADED, f"the store has {self._pending_bytes} bytes waiting for the disk; retry")
        self._pending.append(pending)
        self._pending_bytes += pending.size
        self._work.set()

    async def append(self, topic: str, queue: int, batch: bytes) -> tuple[int, int]:
        """Store a batch; returns (base offset, count) once it is durable."""
        header = batch_codec.check_header(batch)
        if self._failed is not None:
            raise self._failed
        state = self._state(topic, queue)
        base_offset = state.assigned_next
        append_ms = max(int(self._clock() * 1000), state.assigned_append_ms)
        state.assigned_next += header.count
        state.assigned_append_ms = append_ms
        entry = IndexEntry(base_offset, -1, header.count, len(batch), header.first_timestamp_ms, append_ms)
        body = encode_batch_record(topic, queue, base_offset, append_ms, batch)
        pending = _Pending(BATCH, body, len(body[0]) + len(batch), trio.Event(), topic, queue, entry)
        await self._enqueue(pending)
        await pending.done.wait()
        if pending.error is not None:
            raise pending.error
        return base_offset, header.count

    async def commit_offsets(self, group: str, topic: str, offsets: dict[int, int]) -> None:
        """Store a group's positions durably, through the same log and group commit as messages."""
        body = orjson.dumps({"group": group, "topic": topic, "offsets": {str(q): o for q, o in offsets.items()}})
        pending = _Pending(OFFSETS, body, len(body), trio.Event(), commit=(group, topic, dict(offsets)))
        await self._enqueue(pending)
        await pending.done.wait()
        if pending.error is not None:
            raise pending.error

    def _take(self) -> list[_Pending]:
        taken: list[_Pending] = []
        size = 0
        for pending in self._pending:
            if taken and (size + pending.size > limits.group_commit_bytes_max
                          or len(taken) >= limits.group_commit_records_max):
                break
            taken.append(pending)
            size += pending.size
        del self._pending[: len(taken)]
        self._pending_bytes -= size
        self._room.set()
        return taken

    async def _write_loop(self) -> None:
        while True:
            await self._work.wait()
            self._work = trio.Event()
            while self._pending and self._failed is None:
                await self._write_once()

    async def _write_once(self) -> None:
        taken = self._take()
        try:
            positions = await trio.to_thread.run_sync(self.log.append, [(p.kind, p.body) for p in taken])
        except OSError as error:
            self._fail(error, taken)
            return
        self._written.extend(zip(taken, positions))
        self._written_ready.set()

    async def _sync_loop(self) -> None:
        while True:
            await self._written_ready.wait()
            self._written_ready = trio.Event()
            while self._written and self._failed is None:
                await self._sync_once()

    async def _sync_once(self) -> None:
        try:
            durable_end = await trio.to_thread.run_sync(self.log.sync)
        except OSError as error:
            self._fail(error, [pending for pending, _ in self._written])
            return
        self.fsyncs += 1
        count = 0
        while count < len(self._written) and self._written[count][1] < durable_end:
            count += 1
        ready = self._written[:count]
        del self._written[:count]
        self._apply(ready)

    def _fail(self, error: OSError, taken: list[_Pending]) -> None:
        """After a failed write or fsync the file's state is unknown: refuse all writes (fsyncgate)."""
        self._failed = RocketError(Code.UNAVAILABLE, f"the store's disk failed ({error.strerror}); restart to recover")
        log.error("store write failed: %s", error)
        for pending in taken + [pending for pending, _ in self._written] + self._pending:
            if not pending.done.is_set():
                pending.error = self._failed
                pending.done.set()
        self._written.clear()
        self._pending.clear()

    def _apply(self, ready: list[tuple[_Pending, int]]) -> None:
        """Index durable records and wake their appenders and readers. ready is a prefix of the log's
        unapplied records, so the index's applied position is the end of the last one."""
        if not ready:
            return
        entries: list[tuple[str, int, IndexEntry]] = []
        touched: dict[tuple[str, int], QueueStats] = {}
        commits = []
        for pending, position in ready:
            if pending.kind == BATCH:
                entry = dataclasses.replace(pending.entry, position=position)
                entries.append((pending.topic, pending.queue, entry))
                durable = self._queues[(pending.topic, pending.queue)].durable
                durable.next_offset = entry.base_offset + entry.count
                durable.bytes += entry.batch_bytes
                durable.last_append_ms = entry.append_ms
                touched[(pending.topic, pending.queue)] = durable
            else:
                commits.append(pending.commit)
        last, last_position = ready[-1]
        self.index.apply(entries, touched, commits, last_position + HEADER_BYTES + last.size)
        for pending, _ in ready:
            pending.done.set()
        for key in touched:
            for event in self._watchers.get(key, ()):
                event.set()

    def fetch_offsets(self, group: str, topic: str) -> dict[int, int]:
        return self.index.offsets(group, topic)

    def read(self, topic: str, queue: int, offset: int, max_bytes: int, at_least_one: bool = True) -> list[tuple[int, bytes]]:
        """Stored batches from the one holding offset, up to max_bytes (and at least one if asked)."""
        state = self._queues.get((topic, queue))
        next_offset = state.durable.next_offset if state else 0
        if offset > next_offset:
            raise RocketError(Code.OFFSET_OUT_OF_RANGE, f"offset {offset} is past the end ({next_offset}) of {topic}/{queue}")
        if offset == next_offset:
            return []
        found = []
        for entry in self.index.locate(topic, queue, offset, max_bytes, at_least_one):
            kind, body = self.log.read(entry.position)
            record_topic, record_queue, base_offset, _, batch = decode_batch_record(body)
            if kind != BATCH or (record_topic, record_queue, base_offset) != (topic, queue, entry.base_offset):
                raise RocketError(Code.CORRUPT_DATA, f"index entry for {topic}/{queue}@{entry.base_offset} points "
                                  f"at a different record (log position {entry.position})")
            found.append((base_offset, bytes(batch)))
        return found

    async def wait_for_data(self, wants: dict[tuple[str, int], int], timeout_s: float) -> None:
        """Return when any queue has durable data at or past the wanted offset, or after the timeout."""
        for key, offset in wants.items():
            state = self._queues.get(key)
            if state is not None and state.durable.next_offset > offset:
                return
        event = trio.Event()
        for key in wants:
            self._watchers.setdefault(key, set()).add(event)
        try:
            with trio.move_on_after(timeout_s):
                await event.wait()
        finally:
            for key in wants:
                watchers = self._watchers.get(key)
                if watchers is not None:
                    watchers.discard(event)
                    if not watchers:
                        del self._watchers[key]

    def queue_stats(self, topic: str, queue: int) -> dict:
        state = self._queues.get((topic, queue))
        if state is None:
            return {"min_offset": 0, "next_offset": 0, "bytes": 0}
        first = self.index.first_offset(topic, queue)
        return {"min_offset": first or 0, "next_offset": state.durable.next_offset, "bytes": state.durable.bytes}

    def offset_for_time(self, topic: str, queue: int, timestamp_ms: int) -> int:
        found = self.index.offset_for_time(topic, queue, timestamp_ms)
        if found is not None:
            return found
        state = self._queues.get((topic, queue))
        return state.durable.next_offset if state else 0

    def close(self) -> None:
        self.log.close()
        self.index.close()
