"""Store: the state of one group, a commit log (the only source of truth) plus a queue index derived from it.
Appends and offset commits are group-committed: one write + fdatasync per flush in a worker thread, and
nothing is acknowledged, indexed or readable before its fsync."""

from __future__ import annotations

import collections
import dataclasses
import logging
import shutil
import struct
import time
from pathlib import Path

import orjson
import plyvel
import trio

from rocket import limits
from rocket.errors import Code, RocketError, invariant
from rocket.serde import batch as batch_codec
from rocket.store.index import IndexEntry, QueueIndex
from rocket.store.log import HEADER_BYTES, CommitLog

logger = logging.getLogger("rocket.store")

BATCH = 1  # body: topic_len u16 | topic | queue u32 | base_offset u64 | append_time_ms u64 | batch
OFFSETS = 2  # body: orjson {"group", "topic", "offsets": {queue: offset}}
_topic_length = struct.Struct("<H")
_route = struct.Struct("<IQQ")  # queue, base offset, append time ms
_queue_max = 2**32 - 1


def encode_batch_route(topic: str, queue: int, base_offset: int, append_time_ms: int) -> bytes:
    """The head of a BATCH record body; the client's batch follows it verbatim."""
    name = topic.encode()
    return _topic_length.pack(len(name)) + name + _route.pack(queue, base_offset, append_time_ms)


def decode_batch_record(body: memoryview, position: int) -> tuple[str, int, int, int, memoryview]:
    """(topic, queue, base offset, append time ms, batch) of a BATCH record body."""
    try:
        (name_length,) = _topic_length.unpack_from(body)
        route_at = _topic_length.size + name_length
        queue, base_offset, append_time_ms = _route.unpack_from(body, route_at)
        topic = bytes(body[_topic_length.size:route_at]).decode()
    except (struct.error, UnicodeDecodeError):
        raise RocketError(Code.CORRUPT_DATA, f"batch record at log position {position} has a bad routing header") from None
    return topic, queue, base_offset, append_time_ms, body[route_at + _route.size:]


def _decode_offsets_record(body: memoryview, position: int) -> tuple[str, str, dict[int, int]]:
    try:
        record = orjson.loads(body)
        return record["group"], record["topic"], {int(queue): int(offset) for queue, offset in record["offsets"].items()}
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError):
        raise RocketError(Code.CORRUPT_DATA, f"offsets record at log position {position} is malformed") from None


def _check_name(what: str, name: str, bytes_max: int) -> None:
    encoded = name.encode()
    if not encoded or len(encoded) > bytes_max or b"\0" in encoded:
        raise RocketError(Code.BAD_REQUEST, f"{what} name {name!r} must be 1..{bytes_max} bytes without NUL")


def _check_queue(queue: int) -> None:
    if not 0 <= queue <= _queue_max:
        raise RocketError(Code.BAD_QUEUE, f"queue {queue} is outside 0..{_queue_max}")


@dataclasses.dataclass(slots=True)
class _Pending:
    """One record waiting for the flusher, and what to index once it is durable."""

    kind: int
    body: tuple[bytes, ...]
    size: int
    done: trio.Event = dataclasses.field(default_factory=trio.Event)
    entry: IndexEntry | None = None  # BATCH: position is filled in after the write
    append_time_ms: int = 0
    commit: tuple[str, str, dict[int, int]] | None = None  # OFFSETS
    error: RocketError | None = None


@dataclasses.dataclass(slots=True)
class _Assigned:
    """Per queue, what appends have been handed so far, including those not yet durable."""

    next_offset: int
    last_append_time_ms: int


class Store:
    def __init__(self, directory: Path, commit_log: CommitLog, index: QueueIndex, clock):
        self.directory = directory
        self.log = commit_log
        self.index = index
        self._clock = clock
        self._assigned: dict[tuple[str, int], _Assigned] = {}
        self._pending: collections.deque[_Pending] = collections.deque()
        self._pending_bytes = 0
        self._work = trio.Event()  # set when records are pending
        self._room = trio.Event()  # set (and replaced) whenever the flusher takes pending records
        self._watchers: dict[tuple[str, int], dict[trio.Event, int]] = {}  # long polls: event -> wanted offset
        self._failed: RocketError | None = None
        self._closing = False
        self._running = False
        self._stopped = trio.Event()
        self.flushes = 0

    @classmethod
    def open(cls, directory: Path, segment_bytes_max: int = limits.segment_bytes_max_default,
             clock=time.time) -> "Store":
        """Recover the log, bring the index up to its end (rebuilding it if needed) and load queue states."""
        directory.mkdir(parents=True, exist_ok=True)
        commit_log = CommitLog.open(directory / "log", segment_bytes_max)
        try:
            index = QueueIndex.open(directory / "index")
        # Only damage is repaired this way: an I/O error such as another process holding the lock is raised.
        except (plyvel.CorruptionError, ValueError, struct.error) as error:
            logger.warning("index at %s is unreadable (%s): rebuilding it from the log", directory / "index", error)
            shutil.rmtree(directory / "index", ignore_errors=True)
            index = QueueIndex.open(directory / "index")
        if index.applied_position > commit_log.end_position:
            logger.warning("index is ahead of the log (its tail was cut back): rebuilding it from the log")
            index.destroy_and_reopen()
        store = cls(directory, commit_log, index, clock)
        store._replay()
        return store

    def _replay(self) -> None:
        entries: list[tuple[IndexEntry, int]] = []
        commits: list[tuple[str, str, dict[int, int]]] = []
        replayed = 0
        for position, kind, body in self.log.scan(self.index.applied_position):
            if kind == BATCH:
                topic, queue, base_offset, append_time_ms, batch = decode_batch_record(body, position)
                try:
                    header = batch_codec.check_header(batch)
                except RocketError as error:
                    raise RocketError(Code.CORRUPT_DATA, f"batch at log position {position}: {error.message}") from None
                entries.append((IndexEntry(topic, queue, base_offset, position, header.count, len(batch),
                                           header.first_timestamp_ms), append_time_ms))
            elif kind == OFFSETS:
                commits.append(_decode_offsets_record(body, position))
            else:
                raise RocketError(Code.CORRUPT_DATA, f"record at log position {position} has unknown kind {kind}")
            replayed += 1
            if len(entries) + len(commits) >= limits.index_replay_records_per_write_max:
                self.index.apply(entries, commits, position + HEADER_BYTES + len(body))
                entries, commits = [], []
        self.index.apply(entries, commits, self.log.end_position)
        if replayed:
            logger.info("replayed %d log records into the index of %s", replayed, self.directory)
        self._assigned = {key: _Assigned(stats.next_offset, stats.last_append_time_ms)
                          for key, stats in self.index.all_stats().items()}

    # Writing.

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """The group-commit flusher. On exit (cancellation or aclose) it flushes what is pending."""
        invariant(not self._running, "one flusher per store")
        self._running = True
        task_status.started()
        try:
            while True:
                if self._pending:
                    await self._flush_once()
                elif self._closing:
                    return
                else:
                    self._work = trio.Event()
                    await self._work.wait()
        finally:
            with trio.CancelScope(shield=True):
                while self._pending and self._failed is None:
                    await self._flush_once()
            self._running = False
            self._stopped.set()

    def _check_writable(self) -> None:
        if self._failed is not None:
            raise RocketError(self._failed.code, self._failed.message)
        if self._closing:
            raise RocketError(Code.UNAVAILABLE, f"the store at {self.directory} is closing")

    async def _wait_for_room(self, size: int) -> None:
        """Backpressure: hold the caller while too many bytes wait for a flush."""
        self._check_writable()
        if self._pending_bytes + size <= limits.append_queue_bytes_max or not self._pending:
            return
        with trio.move_on_after(limits.append_queue_wait_s_max):
            while self._pending_bytes + size > limits.append_queue_bytes_max and self._pending:
                await self._room.wait()
                self._check_writable()
            return
        raise RocketError(Code.OVERLOADED, f"appends waited {limits.append_queue_wait_s_max}s for the store to flush")

    def _enqueue(self, pending: _Pending) -> None:
        self._pending.append(pending)
        self._pending_bytes += pending.size
        self._work.set()

    async def _durable(self, pending: _Pending) -> None:
        await pending.done.wait()
        if pending.error is not None:
            raise pending.error

    async def append(self, topic: str, queue: int, batch: bytes) -> tuple[int, int]:
        """Store a batch; returns (base offset, count) once it is durable."""
        header = batch_codec.check_header(batch)
        _check_name("topic", topic, limits.topic_name_bytes_max)
        _check_queue(queue)
        await self._wait_for_room(len(batch))
        # From here to _enqueue there is no checkpoint, so offsets are assigned in log order.
        key = (topic, queue)
        assigned = self._assigned.get(key)
        if assigned is None:
            assigned = self._assigned[key] = _Assigned(0, 0)
        base_offset = assigned.next_offset
        # Append times never go backwards within a queue, even if the wall clock does: search by time relies on it.
        append_time_ms = max(assigned.last_append_time_ms, int(self._clock() * 1000))
        assigned.next_offset += header.count
        assigned.last_append_time_ms = append_time_ms
        route = encode_batch_route(topic, queue, base_offset, append_time_ms)
        entry = IndexEntry(topic, queue, base_offset, -1, header.count, len(batch), header.first_timestamp_ms)
        pending = _Pending(BATCH, (route, batch), len(route) + len(batch), entry=entry, append_time_ms=append_time_ms)
        self._enqueue(pending)
        await self._durable(pending)
        return base_offset, header.count

    async def commit_offsets(self, group: str, topic: str, offsets: dict[int, int]) -> None:
        """Store a group's consumer offsets durably, through the same log and group commit as batches."""
        _check_name("group", group, limits.group_name_bytes_max)
        _check_name("topic", topic, limits.topic_name_bytes_max)
        if len(offsets) > limits.queues_per_topic_max:
            raise RocketError(Code.BAD_REQUEST, f"{len(offsets)} offsets exceed {limits.queues_per_topic_max} queues")
        for queue, offset in offsets.items():
            _check_queue(queue)
            if not 0 <= offset < 2**64:
                raise RocketError(Code.BAD_REQUEST, f"offset {offset} of queue {queue} is out of range")
        body = orjson.dumps({"group": group, "topic": topic, "offsets": {str(q): o for q, o in offsets.items()}})
        await self._wait_for_room(len(body))
        pending = _Pending(OFFSETS, (body,), len(body), commit=(group, topic, dict(offsets)))
        self._enqueue(pending)
        await self._durable(pending)

    def _take(self) -> list[_Pending]:
        taken: list[_Pending] = []
        taken_bytes = 0
        while self._pending and len(taken) < limits.group_commit_records_max:
            if taken and taken_bytes + self._pending[0].size > limits.group_commit_bytes_max:
                break
            pending = self._pending.popleft()
            taken.append(pending)
            taken_bytes += pending.size
        self._pending_bytes -= taken_bytes
        self._room.set()
        self._room = trio.Event()
        return taken

    def _write_durably(self, records: list[tuple[int, tuple[bytes, ...]]]) -> tuple[list[int], int]:
        """Runs in a worker thread: the one write + fdatasync of a flush."""
        positions = self.log.append(records)
        self.log.sync()
        return positions, self.log.end_position

    async def _flush_once(self) -> None:
        taken = self._take()
        try:
            positions, end_position = await trio.to_thread.run_sync(
                self._write_durably, [(pending.kind, pending.body) for pending in taken])
            self.flushes += 1
            self._apply(taken, positions, end_position)
        except (OSError, RocketError, plyvel.Error) as error:
            self._fail(taken, error)
        except BaseException as error:
            self._fail(taken, error)
            raise

    def _apply(self, taken: list[_Pending], positions: list[int], end_position: int) -> None:
        """Index exactly the records just made durable, then wake their appenders and long polls."""
        entries: list[tuple[IndexEntry, int]] = []
        commits: list[tuple[str, str, dict[int, int]]] = []
        for pending, position in zip(taken, positions, strict=True):
            if pending.kind == BATCH:
                entries.append((dataclasses.replace(pending.entry, position=position), pending.append_time_ms))
            else:
                commits.append(pending.commit)
        self.index.apply(entries, commits, end_position)
        for pending in taken:
            pending.done.set()
        for entry, _ in entries:
            watchers = self._watchers.get((entry.topic, entry.queue))
            if watchers:
                for event, wanted in watchers.items():
                    if entry.next_offset > wanted:
                        event.set()

    def _fail(self, taken: list[_Pending], error: BaseException) -> None:
        """After a failed write or fsync the log's state is unknown: fail every waiter and refuse appends."""
        self._failed = RocketError(Code.UNAVAILABLE, f"the store at {self.directory} failed to write its log "
                                   f"({error}); it refuses appends until it is reopened")
        logger.error("store at %s failed: %s", self.directory, error)
        for pending in [*taken, *self._pending]:
            if not pending.done.is_set():
                pending.error = self._failed
                pending.done.set()
        self._pending.clear()
        self._pending_bytes = 0
        self._room.set()

    # Reading: only durable (flushed and indexed) data.

    def _durable_next_offset(self, topic: str, queue: int) -> int:
        stats = self.index.stats(topic, queue)
        return stats.next_offset if stats else 0

    def read(self, topic: str, queue: int, offset: int, max_bytes: int) -> list[tuple[int, memoryview]]:
        """(base offset, batch) of stored batches from the one holding offset, within max_bytes but at least one."""
        invariant(max_bytes > 0, "max_bytes is positive")
        next_offset = self._durable_next_offset(topic, queue)
        if offset < 0 or offset > next_offset:
            raise RocketError(Code.OFFSET_OUT_OF_RANGE, f"offset {offset} of {topic}/{queue} is outside 0..{next_offset}")
        found: list[tuple[int, memoryview]] = []
        for entry in self.index.locate(topic, queue, offset, min(max_bytes, limits.read_bytes_max)):
            kind, body = self.log.read(entry.position)
            if kind != BATCH:
                raise RocketError(Code.CORRUPT_DATA, f"index entry {topic}/{queue}@{entry.base_offset} points at a "
                                  f"record of kind {kind} (log position {entry.position})")
            record_topic, record_queue, base_offset, _, batch = decode_batch_record(body, entry.position)
            if (record_topic, record_queue, base_offset) != (topic, queue, entry.base_offset):
                raise RocketError(Code.CORRUPT_DATA, f"index entry {topic}/{queue}@{entry.base_offset} points at "
                                  f"{record_topic}/{record_queue}@{base_offset} (log position {entry.position})")
            found.append((base_offset, batch))
        return found

    async def wait_for_data(self, wants: dict[tuple[str, int], int], timeout_s: float) -> bool:
        """Long poll: True as soon as any (topic, queue) has durable data at or past its wanted offset,
        False after timeout_s."""
        if any(self._durable_next_offset(topic, queue) > offset for (topic, queue), offset in wants.items()):
            return True
        event = trio.Event()
        for key, offset in wants.items():
            self._watchers.setdefault(key, {})[event] = offset
        try:
            with trio.move_on_after(timeout_s):
                await event.wait()
        finally:
            for key in wants:
                watchers = self._watchers.get(key)
                if watchers is not None:
                    watchers.pop(event, None)
                    if not watchers:
                        del self._watchers[key]
        return event.is_set()

    def fetch_offsets(self, group: str, topic: str) -> dict[int, int]:
        return self.index.offsets(group, topic)

    def queue_stats(self, topic: str, queue: int) -> dict[str, int]:
        stats = self.index.stats(topic, queue)
        if stats is None:
            return {"min_offset": 0, "next_offset": 0, "bytes": 0}
        first = self.index.first_entry(topic, queue)
        return {"min_offset": first.base_offset if first else stats.next_offset,
                "next_offset": stats.next_offset, "bytes": stats.bytes}

    def offset_for_time(self, topic: str, queue: int, timestamp_ms: int) -> int:
        """The first offset of the first batch appended at or after timestamp_ms, else the queue's next offset."""
        return self.index.offset_for_time(topic, queue, timestamp_ms)

    def topic_queues(self, topic: str) -> dict[int, dict[str, int]]:
        """queue -> queue_stats for every queue of the topic that holds data."""
        return {queue: self.queue_stats(topic, queue) for queue, _, _ in self.index.queues(topic)}

    # Shutting down.

    async def aclose(self) -> None:
        """Refuse new writes, let the flusher flush what is pending, then close the files."""
        self._closing = True
        self._work.set()
        if self._running:
            await self._stopped.wait()
        self.close()

    def close(self) -> None:
        """Close the files; the flusher must have stopped (see aclose). Anything still pending fails."""
        invariant(not self._running, "close() while the flusher runs; use aclose()")
        self._closing = True
        if self._pending:
            self._fail([], RocketError(Code.UNAVAILABLE, "closed before the flush"))
        self.log.close()
        self.index.close()
