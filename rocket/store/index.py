"""QueueIndex: the sparse queue index (one key per batch), search by append time and committed consumer offsets,
on LevelDB written without sync. It is derived state: m/applied says up to which log position it reflects
the commit log, and the store rebuilds it by replaying the log from there."""

from __future__ import annotations

import dataclasses
import shutil
import struct
from collections.abc import Iterator, Sequence
from pathlib import Path

import plyvel

from rocket.errors import Code, RocketError

_u32 = struct.Struct(">I")
_u64 = struct.Struct(">Q")
_entry_value = struct.Struct(">QIIq")  # log position, count, batch bytes, first timestamp ms
_stats_value = struct.Struct(">QQQ")  # next offset, batch bytes stored, last append time ms
_applied_key = b"m/applied"


@dataclasses.dataclass(slots=True, frozen=True)
class IndexEntry:
    """Where one stored batch lives: its first offset, log position and header summary."""

    topic: str
    queue: int
    base_offset: int
    position: int
    count: int
    batch_bytes: int
    first_timestamp_ms: int

    @property
    def next_offset(self) -> int:
        return self.base_offset + self.count


@dataclasses.dataclass(slots=True)
class QueueStats:
    next_offset: int = 0
    bytes: int = 0
    last_append_time_ms: int = 0


def _queue_prefix(kind: bytes, topic: str, queue: int) -> bytes:
    return kind + topic.encode() + b"\0" + _u32.pack(queue)


def _prefix_end(prefix: bytes) -> bytes:
    """The smallest key above every key that starts with prefix (our prefixes start with a letter)."""
    trimmed = prefix.rstrip(b"\xff")
    return trimmed[:-1] + bytes([trimmed[-1] + 1])


def _offsets_prefix(group: str, topic: str) -> bytes:
    return b"o" + group.encode() + b"\0" + topic.encode() + b"\0"


class QueueIndex:
    def __init__(self, path: Path):
        self.path = path
        self._db = plyvel.DB(str(path), create_if_missing=True)
        self._applied_position = 0
        # Durable per-queue state (also kept under s keys) so that opening does not walk every entry.
        self._stats: dict[tuple[str, int], QueueStats] = {}
        self._load()

    @classmethod
    def open(cls, path: Path) -> "QueueIndex":
        """Open or create the index; raises plyvel.Error or ValueError if it is unreadable."""
        return cls(path)

    def _load(self) -> None:
        raw = self._db.get(_applied_key)
        self._applied_position = _u64.unpack(raw)[0] if raw is not None else 0
        for key, value in self._db.iterator(prefix=b"s"):
            topic, queue = key[1:-5].decode(), _u32.unpack(key[-4:])[0]  # s, topic, NUL, queue u32
            self._stats[(topic, queue)] = QueueStats(*_stats_value.unpack(value))

    def destroy_and_reopen(self) -> None:
        """Drop everything (before a rebuild from the log)."""
        self._db.close()
        shutil.rmtree(self.path, ignore_errors=True)
        self._db = plyvel.DB(str(self.path), create_if_missing=True)
        self._applied_position = 0
        self._stats = {}

    @property
    def applied_position(self) -> int:
        return self._applied_position

    def apply(self, batch_entries: Sequence[tuple[IndexEntry, int]],
              offset_commits: Sequence[tuple[str, str, dict[int, int]]], applied_position: int) -> None:
        """Record (entry, append time ms) of flushed batches and offset commits, up to applied_position, in one write."""
        touched: dict[tuple[str, int], QueueStats] = {}
        with self._db.write_batch(sync=False) as batch:
            for entry, append_time_ms in batch_entries:
                key = (entry.topic, entry.queue)
                stats = touched.get(key) or dataclasses.replace(self._stats.get(key) or QueueStats())
                if entry.base_offset != stats.next_offset:
                    raise RocketError(Code.CORRUPT_DATA, f"batch at log position {entry.position} starts at offset "
                                      f"{entry.base_offset} of {entry.topic}/{entry.queue}; expected {stats.next_offset}")
                batch.put(_queue_prefix(b"q", *key) + _u64.pack(entry.base_offset),
                          _entry_value.pack(entry.position, entry.count, entry.batch_bytes, entry.first_timestamp_ms))
                batch.put(_queue_prefix(b"t", *key) + _u64.pack(append_time_ms) + _u64.pack(entry.base_offset), b"")
                stats.next_offset = entry.next_offset
                stats.bytes += entry.batch_bytes
                stats.last_append_time_ms = max(stats.last_append_time_ms, append_time_ms)
                touched[key] = stats
            for key, stats in touched.items():
                batch.put(_queue_prefix(b"s", *key), _stats_value.pack(stats.next_offset, stats.bytes,
                                                                         stats.last_append_time_ms))
            for group, topic, offsets in offset_commits:
                prefix = _offsets_prefix(group, topic)
                for queue, offset in offsets.items():
                    batch.put(prefix + _u32.pack(queue), _u64.pack(offset))
            batch.put(_applied_key, _u64.pack(applied_position))
        self._stats.update(touched)
        self._applied_position = applied_position

    def stats(self, topic: str, queue: int) -> QueueStats | None:
        return self._stats.get((topic, queue))

    def all_stats(self) -> dict[tuple[str, int], QueueStats]:
        return dict(self._stats)

    def _entry(self, key: bytes, value: bytes, topic: str, queue: int) -> IndexEntry:
        return IndexEntry(topic, queue, _u64.unpack(key[-8:])[0], *_entry_value.unpack(value))

    def locate(self, topic: str, queue: int, offset: int, max_bytes: int) -> list[IndexEntry]:
        """Entries from the batch that holds offset (or the first after it) on, within max_bytes but at least one."""
        prefix = _queue_prefix(b"q", topic, queue)
        start = prefix
        with self._db.iterator(start=prefix, stop=prefix + _u64.pack(offset + 1), reverse=True,
                               include_value=False) as backwards:
            for key in backwards:
                start = key
                break
        found: list[IndexEntry] = []
        total_bytes = 0
        with self._db.iterator(start=start, stop=_prefix_end(prefix)) as forwards:
            for key, value in forwards:
                entry = self._entry(key, value, topic, queue)
                if entry.next_offset <= offset:
                    continue  # the floor batch ends before offset: offset is the queue's end
                if found and total_bytes + entry.batch_bytes > max_bytes:
                    break
                found.append(entry)
                total_bytes += entry.batch_bytes
        return found

    def _edge_entry(self, topic: str, queue: int, reverse: bool) -> IndexEntry | None:
        with self._db.iterator(prefix=_queue_prefix(b"q", topic, queue), reverse=reverse) as entries:
            for key, value in entries:
                return self._entry(key, value, topic, queue)
        return None

    def first_entry(self, topic: str, queue: int) -> IndexEntry | None:
        return self._edge_entry(topic, queue, reverse=False)

    def last_entry(self, topic: str, queue: int) -> IndexEntry | None:
        return self._edge_entry(topic, queue, reverse=True)

    def offset_for_time(self, topic: str, queue: int, timestamp_ms: int) -> int:
        """Base offset of the first batch appended at or after timestamp_ms, else the queue's next offset."""
        prefix = _queue_prefix(b"t", topic, queue)
        start = prefix + _u64.pack(max(0, timestamp_ms))
        with self._db.iterator(start=start, stop=_prefix_end(prefix), include_value=False) as keys:
            for key in keys:
                return _u64.unpack(key[-8:])[0]
        stats = self._stats.get((topic, queue))
        return stats.next_offset if stats else 0

    def offsets(self, group: str, topic: str) -> dict[int, int]:
        prefix = _offsets_prefix(group, topic)
        return {_u32.unpack(key[len(prefix):])[0]: _u64.unpack(value)[0]
                for key, value in self._db.iterator(prefix=prefix)}

    def queues(self, topic: str) -> Iterator[tuple[int, IndexEntry | None, IndexEntry | None]]:
        """(queue, first entry, last entry) of every queue of the topic that holds data, in queue order."""
        prefix = b"s" + topic.encode() + b"\0"
        with self._db.iterator(prefix=prefix, include_value=False) as keys:
            queues = [_u32.unpack(key[len(prefix):])[0] for key in keys]
        for queue in queues:
            yield queue, self.first_entry(topic, queue), self.last_entry(topic, queue)

    def close(self) -> None:
        self._db.close()
