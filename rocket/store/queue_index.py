"""The queue index, consumer offsets, timers, pop states, tier manifests and producers' answers on LevelDB (plyvel):
written without sync, one atomic write per round that names the Raft entries each group applied, so that what a
power cut takes is applied again from the WAL (see Store). Sparse: one key per batch, not per message."""

from __future__ import annotations

import shutil
import struct
from array import array
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import cast

import plyvel

from rocket import limits
from rocket.model import ALL_TAGS, ReadBudget
from rocket.store.pop import PopQueue
from rocket.store.values import HALF_PREFIX, IndexEntry, QueueStats, Timer

_u32 = struct.Struct(">I")
_u64 = struct.Struct(">Q")
_entry = struct.Struct(">QIIqQQ")  # log position, count, batch bytes, first timestamp ms, append time ms, tags
_entry_untagged = struct.Struct(">QIIqQ")  # as written before the tag summary was indexed
# Ends the entry of a batch whose keys the key indexer indexed (a k record holds their terms if it has any); a
# batch without it is read whole to find a key (find_keyed).
_KEYS_INDEXED = b"k"
_timer_place = struct.Struct(">QQI")  # due time ms, Raft group, check-backs so far (half messages)
_stats = struct.Struct(">QQQQQ")  # next offset, bytes, last append ms, Raft group, available from
_answer = struct.Struct(">QIQQ")  # a producer's batch: base offset, count; the entry index, append ms of its last use
_applied_key = b"m/applied"  # how far into the store's own log of an earlier build the index reached (replay.py)
_refs_key = b"m/refs"  # present once the index keeps WAL references (p keys); an older index is rebuilt
_synced_key = b"m/synced"  # written with sync=True by a checkpoint (see sync)


def _queue_prefix(kind: bytes, topic: str, queue: int) -> bytes:
    return kind + topic.encode() + b"\0" + _u32.pack(queue)


def _prefix_end(prefix: bytes) -> bytes:
    """The smallest key greater than every key that starts with prefix."""
    trimmed = prefix.rstrip(b"\xff")
    return trimmed[:-1] + bytes([trimmed[-1] + 1])


def _timer_key(topic: str, queue: int, offset: int) -> bytes:
    """x + where the timer's message lies (its system queue): its delivery time and group."""
    return _queue_prefix(b"x", topic, queue) + _u64.pack(offset)


def _due_key(group: int, deliver_at_ms: int, topic: str, queue: int, offset: int) -> bytes:
    """w (h for half messages) + group + due time + where the message lies: a group's timers in the order
    they fire, and its half messages in the order they are checked."""
    kind = b"h" if topic.startswith(HALF_PREFIX) else b"w"
    return kind + _u64.pack(group) + _u64.pack(deliver_at_ms) + _timer_key(topic, queue, offset)[1:]


def _ref_key(position: int) -> bytes:
    return b"p" + _u64.pack(position)


def _decode_entry(offset: int, value: bytes) -> IndexEntry:
    if len(value) == _entry_untagged.size:
        return IndexEntry(offset, *_entry_untagged.unpack(value))
    return IndexEntry(offset, *_entry.unpack_from(value))


def _holds(terms: bytes, wanted: bytes) -> bool:
    """Whether packed 32-bit terms hold the one packed in wanted: memmem, not a compare per term; a term lies at a
    multiple of 4."""
    at = terms.find(wanted)
    while at > 0 and at % 4:
        at = terms.find(wanted, at + 1)
    return at >= 0


def _lock_key(group: int, consumer_group: str, topic: str, queue: int) -> bytes:
    return b"L" + _u64.pack(group) + f"{consumer_group}\0{topic}".encode() + _u32.pack(queue)


def _pop_prefix(kind: bytes, key: tuple[str, str, int]) -> bytes:
    """P (cursor) or F (in flight) + consumer group, topic and queue of pop consumption."""
    consumer_group, topic, queue = key
    return kind + consumer_group.encode() + b"\0" + topic.encode() + b"\0" + _u32.pack(queue)


def _pop_key(prefix: bytes, kind: bytes) -> tuple[str, str, int]:
    consumer_group, topic, rest = prefix[1:].split(b"\0", 2)
    return consumer_group.decode(), topic.decode(), _u32.unpack_from(rest)[0]


_in_flight = struct.Struct(">QI")  # visible again at ms, delivery attempt


def _producer_key(group: int, producer: int, topic: str, queue: int, sequence: int) -> bytes:
    """r: Raft group, producer, queue, topic, sequence -> the batch's answer (store/producers.py)."""
    return b"r" + _u64.pack(group) + _u64.pack(producer) + _u32.pack(queue) + topic.encode() + b"\0" + _u64.pack(sequence)


def _offsets_prefix(group: str, topic: str) -> bytes:
    return b"o" + group.encode() + b"\0" + topic.encode() + b"\0"


class QueueIndex:
    """Besides each batch's entry (q: topic, queue, offset -> where it lies in the WAL), a reference key (p: WAL
    position -> the entry's q key) lists the batches in WAL order, so the WAL's lowest live position and the batches
    living in one WAL segment are found without a scan of every queue (see Reclaim: the WAL is reclaimed from its
    oldest segment on).

    The key index is sparse, one k record (topic, queue, offset -> the terms of its keys and message ids: see
    serde/batch.py's key_terms) per batch that has keys. The key indexer writes it behind the appends (unkeyed,
    mark_keyed), and it goes with the batch's entry; LevelDB's block checksums are verified where it is read
    (find_keyed), and a batch it names is read and matched in full."""

    def __init__(self, path: Path):
        self.path = path
        self._db = plyvel.DB(str(path), create_if_missing=True)
        self._mark_refs_if_empty()
        self.drops = 0  # calls that deleted entries (dropped local data, forgotten timers), since open

    def _mark_refs_if_empty(self) -> None:
        with self._db.iterator(include_value=False) as keys:
            if next(keys, None) is None:
                self._db.put(_refs_key, b"")

    @property
    def keeps_refs(self) -> bool:
        """False for an index written before WAL references were kept: it must be rebuilt."""
        return self._db.get(_refs_key) is not None

    def destroy_and_reopen(self) -> None:
        self._db.close()
        shutil.rmtree(self.path)
        self._db = plyvel.DB(str(self.path), create_if_missing=True)
        self._mark_refs_if_empty()

    @property
    def applied_position(self) -> int:
        """How far into the store's own log of an earlier build the index reached (replay.py's migration)."""
        raw = self._db.get(_applied_key)
        return _u64.unpack(raw)[0] if raw else 0

    def sync(self) -> None:
        """Make every write before the call durable: a synced write syncs LevelDB's log, which holds them all."""
        self._db.put(_synced_key, b"", sync=True)

    def rewind(self, position: int) -> None:
        """Durably say the index reached position of the store's old log (replay.py: an index ahead of that log)."""
        self._db.put(_applied_key, _u64.pack(position), sync=True)

    def apply(self, entries: list[tuple[str, int, IndexEntry]], stats: dict[tuple[str, int], QueueStats],
              commits: list[tuple[str, str, dict[int, int]]], groups_applied: dict[int, int],
              applied_position: int | None = None, timers: Sequence[tuple[int, Timer, bool]] = (), pops: Sequence = (),
              tier: Sequence[tuple[str, int, bytes, int | None]] = (), producers: Sequence = (), drops: Sequence = (),
              tombstones: Sequence[tuple[int, str, bool]] = (), incarnations: Sequence[tuple[int, str, int]] = (),
              locks: Sequence[tuple[int, str, str, int, str, int]] = ()) -> None:
        """Record stored batches, queue stats, offset commits, timers set or done (group, timer, set),
        pop consumption changes, tier states (topic, queue, state, drop the entries below this offset or
        None), producers' answers remembered and forgotten (store/producers.py's changes), orderly consumers' locks
        set or given up, and how far each Raft group got, in one write; and, in a migration, how far into the old log the index reached (applied_position).
        Drops (machine.DropChange: a deleted topic's or consumer group's state) go last, and delete what the index
        held before the write: the machine took what the same write adds of them out of it."""
        with self._db.write_batch(sync=False) as batch:
            for change in producers:
                if len(change) == 5:
                    batch.delete(_producer_key(*change))
                else:
                    batch.put(_producer_key(*change[:5]), _answer.pack(*change[5:]))
            for topic, queue, state, drop_below in tier:
                batch.put(_queue_prefix(b"T", topic, queue), state)
                if drop_below is not None:
                    self._drop_entries(batch, topic, queue, drop_below)
            for change in pops:
                flights = _pop_prefix(b"F", change.key)
                if change.reset:
                    for key in self._db.iterator(prefix=flights, include_value=False):
                        batch.delete(key)
                if change.cursor is not None:
                    batch.put(_pop_prefix(b"P", change.key), _u64.pack(change.cursor))
                for offset in change.dropped:
                    batch.delete(flights + _u64.pack(offset))
                for offset, state in change.set.items():
                    batch.put(flights + _u64.pack(offset), _in_flight.pack(*state))
            for group, timer, pending in timers:
                place = (timer.topic, timer.queue, timer.offset)
                if pending:
                    batch.put(_timer_key(*place), _timer_place.pack(timer.deliver_at_ms, group, timer.checks))
                    batch.put(_due_key(group, timer.deliver_at_ms, *place), b"")
                else:
                    batch.delete(_timer_key(*place))
                    batch.delete(_due_key(group, timer.deliver_at_ms, *place))
            for group, index in groups_applied.items():
                batch.put(b"g" + _u64.pack(group), _u64.pack(index))
            for topic, queue, entry in entries:
                key = _queue_prefix(b"q", topic, queue) + _u64.pack(entry.base_offset)
                batch.put(key, _entry.pack(entry.position, entry.count, entry.batch_bytes, entry.first_timestamp_ms,
                                           entry.append_ms, entry.tag_summary))
                batch.put(_ref_key(entry.position), key)
                batch.put(_queue_prefix(b"t", topic, queue) + _u64.pack(entry.append_ms) + _u64.pack(entry.base_offset), b"")
            for (topic, queue), queue_stats in stats.items():
                batch.put(_queue_prefix(b"s", topic, queue), _stats.pack(
                    queue_stats.next_offset, queue_stats.bytes, queue_stats.last_append_ms, queue_stats.group,
                    queue_stats.available_from))  # in _stats's order; dataclasses.astuple deep-copies, per batch
            for group, topic, offsets in commits:
                prefix = _offsets_prefix(group, topic)
                for queue, offset in offsets.items():
                    batch.put(prefix + _u32.pack(queue), _u64.pack(offset))
            if applied_position is not None:
                batch.put(_applied_key, _u64.pack(applied_position))
            for group, topic, dropped in tombstones:
                key = b"D" + _u64.pack(group) + topic.encode()
                if dropped:
                    batch.put(key, b"")
                else:
                    batch.delete(key)
            for group, topic, incarnation in incarnations:
                batch.put(b"I" + _u64.pack(group) + topic.encode(), _u64.pack(incarnation))
            for group, consumer_group, topic, queue, client, renewed_ms in locks:
                key = _lock_key(group, consumer_group, topic, queue)
                if client:
                    batch.put(key, _u64.pack(renewed_ms) + client.encode())
                else:
                    batch.delete(key)
            for drop in drops:
                self._drop(batch, drop)

    def _drop(self, batch, drop) -> None:
        """Delete dropped queues (entries, stats, manifest, pending timers), pop states and offsets."""
        for topic, queue in drop.queues:
            self._drop_entries(batch, topic, queue, 2**64 - 1)
            batch.delete(_queue_prefix(b"s", topic, queue))
            batch.delete(_queue_prefix(b"T", topic, queue))
            for key, value in self._db.iterator(prefix=_queue_prefix(b"x", topic, queue)):
                deliver_at_ms, group, _ = _timer_place.unpack(value)
                batch.delete(key)
                batch.delete(_due_key(group, deliver_at_ms, topic, queue, _u64.unpack(key[-8:])[0]))
        for key in drop.pops:
            batch.delete(_pop_prefix(b"P", key))
            for flight in self._db.iterator(prefix=_pop_prefix(b"F", key), include_value=False):
                batch.delete(flight)
        if drop.topic and drop.consumer_group:  # one group's: its keys alone (an MQTT device's, at each disconnect)
            for key in self._db.iterator(prefix=_offsets_prefix(drop.consumer_group, drop.topic), include_value=False):
                if drop.offsets_of is None or _u32.unpack(key[-4:])[0] in drop.offsets_of:
                    batch.delete(key)
        elif drop.topic:
            for group, topic, queue, _ in self.all_offsets():
                if topic == drop.topic and (drop.offsets_of is None or queue in drop.offsets_of):
                    batch.delete(_offsets_prefix(group, topic) + _u32.pack(queue))

    def _drop_entries(self, batch, topic: str, queue: int, below: int) -> None:
        """Delete the index entries (and their time keys) of the batches before offset below."""
        self.drops += 1
        prefix = _queue_prefix(b"q", topic, queue)
        times = _queue_prefix(b"t", topic, queue)
        for key, value in self._db.iterator(start=prefix, stop=prefix + _u64.pack(below)):
            entry = _decode_entry(_u64.unpack(key[-8:])[0], value)
            batch.delete(key)
            batch.delete(b"k" + key[1:])
            batch.delete(times + _u64.pack(entry.append_ms) + _u64.pack(entry.base_offset))
            batch.delete(_ref_key(entry.position))

    # ---- WAL references --------------------------------------------------------------------------------

    def referenced(self, start: int, stop: int | None = None) -> Iterator[tuple[str, int, IndexEntry]]:
        """The indexed batches that lie in the WAL from position start (to stop), in WAL order. A
        reference its entry no longer backs (the entry moved or went; only a crash leaves one) is
        deleted on the way."""
        stale = []
        try:
            with self._db.iterator(start=_ref_key(start), stop=_ref_key(stop) if stop is not None else _prefix_end(b"p")
                                   ) as refs:
                for ref, key in refs:
                    value = self._db.get(key)
                    position = _u64.unpack(ref[1:])[0]
                    entry = _decode_entry(_u64.unpack(key[-8:])[0], value) if value is not None else None
                    if entry is None or entry.position != position:
                        stale.append(ref)
                        continue
                    yield key[1:-13].decode(), _u32.unpack(key[-12:-8])[0], entry  # q, topic, NUL, queue, offset
        finally:
            if stale:
                with self._db.write_batch(sync=False) as batch:
                    for ref in stale:
                        batch.delete(ref)

    def first_referenced(self) -> int | None:
        """The lowest WAL position an indexed batch lies at."""
        for _, _, entry in self.referenced(0):
            return entry.position
        return None

    def move(self, moves: list[tuple[str, int, int, int, int]]) -> list[bool]:
        """Point entries (topic, queue, base offset) at a new WAL position where a copy of their batch
        lies, each only if it is still at the old position: [(topic, queue, offset, old, new)] -> moved."""
        moved = []
        with self._db.write_batch(sync=False) as batch:
            for topic, queue, offset, old, new in moves:
                key = _queue_prefix(b"q", topic, queue) + _u64.pack(offset)
                value = self._db.get(key)
                entry = _decode_entry(offset, value) if value is not None else None
                if value is not None and entry is not None and entry.position == old:
                    moved.append(True)
                    batch.put(key, _entry.pack(new, entry.count, entry.batch_bytes, entry.first_timestamp_ms,
                                               entry.append_ms, entry.tag_summary) + value[_entry.size:])
                    batch.delete(_ref_key(old))
                    batch.put(_ref_key(new), key)
                else:
                    moved.append(False)
        return moved

    def forget(self, dropped: list[tuple[str, int, int]]) -> None:
        """Delete the entries (topic, queue, base offset) of batches no one will read again."""
        self.drops += 1
        with self._db.write_batch(sync=False) as batch:
            for topic, queue, offset in dropped:
                key = _queue_prefix(b"q", topic, queue) + _u64.pack(offset)
                value = self._db.get(key)
                if value is not None:
                    entry = _decode_entry(offset, value)
                    batch.delete(key)
                    batch.delete(b"k" + key[1:])
                    batch.delete(_queue_prefix(b"t", topic, queue) + _u64.pack(entry.append_ms) + _u64.pack(offset))
                    batch.delete(_ref_key(entry.position))

    def pending_timer_in(self, topic: str, queue: int, offset: int, count: int) -> bool:
        """Whether a timer or half message of the batch at offset (count messages) is still pending."""
        prefix = _queue_prefix(b"x", topic, queue)
        with self._db.iterator(start=prefix + _u64.pack(offset), stop=prefix + _u64.pack(offset + count),
                               include_value=False) as keys:
            return next(keys, None) is not None

    def tier_states(self) -> dict[tuple[str, int], bytes]:
        """Every queue's tier state as stored (see Store: the manifest of offloaded pieces)."""
        return {(key[1:-5].decode(), _u32.unpack(key[-4:])[0]): value for key, value in self._db.iterator(prefix=b"T")}

    def replace_producers(self, group: int, rows: list) -> None:
        """Make a group's producers' answers these rows (a snapshot's)."""
        prefix = b"r" + _u64.pack(group)
        with self._db.write_batch(sync=False) as batch:
            for key in self._db.iterator(prefix=prefix, include_value=False):
                batch.delete(key)
            for row in rows:
                batch.put(_producer_key(*row[:5]), _answer.pack(*row[5:]))

    def producer_rows(self) -> Iterator[tuple]:
        """Every producer's answer the index holds, as store/producers.py's rows."""
        for key, value in self._db.iterator(prefix=b"r"):
            group, producer = _u64.unpack_from(key, 1)[0], _u64.unpack_from(key, 9)[0]
            (queue,) = _u32.unpack_from(key, 17)
            yield (group, producer, key[21:-9].decode(), queue, _u64.unpack_from(key, len(key) - 8)[0],
                   *_answer.unpack(value))

    def tombstones(self) -> set[tuple[int, str]]:
        """(Raft group, topic) of every deleted topic whose appends the group refuses."""
        return {(_u64.unpack_from(key, 1)[0], key[9:].decode())
                for key in self._db.iterator(prefix=b"D", include_value=False)}

    def incarnations(self) -> dict[tuple[int, str], int]:
        """(Raft group, topic) -> the newest incarnation a drop or reopen of the name named."""
        return {(_u64.unpack_from(key, 1)[0], key[9:].decode()): _u64.unpack(value)[0]
                for key, value in self._db.iterator(prefix=b"I")}

    def locks(self) -> dict[tuple[int, str, str, int], tuple[str, int]]:
        """(Raft group, consumer group, topic, queue) -> (client, renewed ms): the orderly consumers' queue locks."""
        found = {}
        for key, value in self._db.iterator(prefix=b"L"):
            consumer_group, topic = key[9:-4].decode().split("\0", 1)
            found[(_u64.unpack_from(key, 1)[0], consumer_group, topic, _u32.unpack(key[-4:])[0])] = (
                value[8:].decode(), _u64.unpack_from(value)[0])
        return found

    def groups_applied(self) -> dict[int, int]:
        return {_u64.unpack(key[1:])[0]: _u64.unpack(value)[0] for key, value in self._db.iterator(prefix=b"g")}

    def all_stats(self) -> dict[tuple[str, int], QueueStats]:
        result = {}
        for key, value in self._db.iterator(prefix=b"s"):
            topic, queue = key[1:-5].decode(), _u32.unpack(key[-4:])[0]  # topic, NUL, queue u32
            result[(topic, queue)] = QueueStats(*_stats.unpack(value))
        return result

    def locate(self, topic: str, queue: int, offset: int, max_bytes: int, at_least_one: bool = True,
               tag_mask: int = ALL_TAGS) -> tuple[list[IndexEntry], int | None]:
        """Entries from the batch holding offset onwards, until max_bytes (and at least one if asked),
        skipping batches whose tag summary shares no bit with tag_mask (at most skipped_entries_max of
        them); with the offset after the last entry looked at (None if none was)."""
        prefix = _queue_prefix(b"q", topic, queue)
        start = prefix
        with self._db.iterator(start=prefix, stop=prefix + _u64.pack(offset + 1), reverse=True) as backwards:
            for key, _ in backwards:
                start = key
                break
        found: list[IndexEntry] = []
        budget = ReadBudget(max_bytes, at_least_one)
        skipped = 0
        scanned_to = None
        with self._db.iterator(start=start, stop=_prefix_end(prefix)) as forwards:
            for key, value in forwards:
                entry = _decode_entry(_u64.unpack(key[-8:])[0], value)
                if tag_mask != ALL_TAGS and not entry.tag_summary & tag_mask:
                    skipped += 1
                    if skipped > limits.filter_skipped_batches_max:
                        break
                    scanned_to = entry.base_offset + entry.count
                    continue
                if not budget.take(entry.batch_bytes):
                    break
                found.append(entry)
                scanned_to = entry.base_offset + entry.count
        return found, scanned_to

    def unkeyed(self, topic: str, queue: int, start: int, max_bytes: int
                ) -> tuple[list[tuple[IndexEntry, bytes]], int, bool]:
        """The entries (and their stored values) of the first batches from offset start whose keys are not indexed,
        at most max_bytes of them (one at least), looking at no more than limits.key_index_scan_entries_max entries;
        with the offset to look from next time, and whether the queue's end was reached."""
        prefix = _queue_prefix(b"q", topic, queue)
        found: list[tuple[IndexEntry, bytes]] = []
        budget = ReadBudget(max_bytes)
        looked = 0
        with self._db.iterator(start=prefix + _u64.pack(start), stop=_prefix_end(prefix)) as forwards:
            for key, value in forwards:
                entry = _decode_entry(_u64.unpack(key[-8:])[0], value)
                if value[_entry.size:] != _KEYS_INDEXED:
                    if not budget.take(entry.batch_bytes):
                        return found, entry.base_offset, False
                    found.append((entry, value))
                start = entry.base_offset + entry.count
                looked += 1
                if looked >= limits.key_index_scan_entries_max:
                    return found, start, False
        return found, start, True

    def mark_keyed(self, topic: str, queue: int, indexed: list[tuple[IndexEntry, bytes, bytes]]) -> None:
        """Record the terms of batches whose keys were read (entry, its value as unkeyed found it, terms), in one
        write: each entry marked and, if it has terms, its k record written, unless the entry changed meanwhile (a
        WAL reclaim moved it, or it was dropped)."""
        prefix = _queue_prefix(b"q", topic, queue)
        with self._db.write_batch(sync=False) as batch:
            for entry, seen, terms in indexed:
                key = prefix + _u64.pack(entry.base_offset)
                if self._db.get(key) == seen:
                    batch.put(key, seen + _KEYS_INDEXED)
                    if terms:
                        batch.put(b"k" + key[1:], terms)

    def find_keyed(self, topic: str, queue: int, term: int, start: int, stop: int, batches_max: int
                   ) -> tuple[list[IndexEntry], int, int]:
        """The entries of the batches from the one holding offset start to offset stop that may hold a message
        with the term (serde/batch.py's key_term): those whose k record has it, and those whose keys are not
        indexed yet. At most batches_max of them, with the offset to go on from (stop when done) and how many k
        records were read. The entries and the k records are read side by side, both in offset order."""
        prefix = _queue_prefix(b"q", topic, queue)
        first = prefix + _u64.pack(start)
        with self._db.iterator(start=prefix, stop=first + b"\0", reverse=True, include_value=False) as backwards:
            for key in backwards:
                first = key
                break
        found: list[IndexEntry] = []
        end = prefix + _u64.pack(stop)
        wanted = array("I", (term,)).tobytes()  # as key_terms packs terms
        read = 0
        with self._db.iterator(start=first, stop=end, verify_checksums=True) as entries, \
                self._db.iterator(start=b"k" + first[1:], stop=b"k" + end[1:], verify_checksums=True) as records:
            record = next(records, None)
            for key, value in entries:
                if value[_entry.size:] == _KEYS_INDEXED:
                    while record is not None and record[0][1:] < key[1:]:
                        record = next(records, None)
                    if record is None or record[0][1:] != key[1:]:
                        continue  # indexed, and no keys
                    read += 1
                    if not _holds(record[1], wanted):
                        continue
                entry = _decode_entry(_u64.unpack(key[-8:])[0], value)
                found.append(entry)
                if len(found) >= batches_max:
                    return found, entry.base_offset + entry.count, read
        return found, stop, read

    def bytes_between(self, topic: str, queue: int, start: int, stop: int) -> int:
        prefix = _queue_prefix(b"q", topic, queue)
        return sum(_decode_entry(0, value).batch_bytes
                   for value in self._db.iterator(start=prefix + _u64.pack(start), stop=prefix + _u64.pack(stop),
                                                  include_key=False))

    def first_offset(self, topic: str, queue: int) -> int | None:
        with self._db.iterator(prefix=_queue_prefix(b"q", topic, queue), include_value=False) as keys:
            for key in keys:
                return _u64.unpack(key[-8:])[0]
        return None

    def offset_for_time(self, topic: str, queue: int, timestamp_ms: int) -> int | None:
        """Base offset of the first batch appended at or after timestamp_ms, if any."""
        prefix = _queue_prefix(b"t", topic, queue)
        start = prefix + _u64.pack(max(0, timestamp_ms))
        with self._db.iterator(start=start, stop=_prefix_end(prefix), include_value=False) as keys:
            for key in keys:
                return _u64.unpack(key[-8:])[0]
        return None

    def timer(self, topic: str, queue: int, offset: int) -> tuple[int, int, int] | None:
        """(due time ms, group, checks) of a pending timer or half message, or None if it is no longer
        (or never was) pending."""
        raw = self._db.get(_timer_key(topic, queue, offset))
        return _timer_place.unpack(raw) if raw is not None else None

    def timers(self, group: int, from_ms: int = 0, until_ms: int = 2**63 - 2, limit: int = 2**63 - 1,
               halves: bool = False) -> list[Timer]:
        """A group's pending timers (or half messages) due from from_ms to until_ms, earliest first, at
        most limit. (Fired timers leave deleted keys behind until LevelDB compacts them: a scan from where
        the last one found its first timer does not wade through them.)"""
        prefix = (b"h" if halves else b"w") + _u64.pack(group)
        found = []
        with self._db.iterator(start=prefix + _u64.pack(from_ms), stop=prefix + _u64.pack(until_ms + 1),
                               include_value=False) as keys:
            for key in keys:
                if len(found) >= limit:
                    break
                (deliver_at_ms,) = _u64.unpack_from(key, 9)
                topic, _, rest = key[17:].partition(b"\0")
                place = (topic.decode(), _u32.unpack_from(rest)[0], _u64.unpack_from(rest, 4)[0])
                # A due key is written and deleted in the same write as its timer key: the timer is there.
                checks = cast(tuple[int, int, int], self.timer(*place))[2] if halves else 0
                found.append(Timer(deliver_at_ms, *place, checks))
        return found

    def pop_states(self) -> dict[tuple[str, str, int], "PopQueue"]:
        """Every pop consumption state: consumer group, topic, queue -> cursor and messages in flight."""
        states: dict[tuple[str, str, int], PopQueue] = {}
        for key, value in self._db.iterator(prefix=b"P"):
            states.setdefault(_pop_key(key, b"P"), PopQueue()).cursor = _u64.unpack(value)[0]
        for key, value in self._db.iterator(prefix=b"F"):
            states.setdefault(_pop_key(key[:-8], b"F"), PopQueue()).in_flight[_u64.unpack(key[-8:])[0]] = \
                _in_flight.unpack(value)
        return states

    def offsets(self, group: str, topic: str) -> dict[int, int]:
        prefix = _offsets_prefix(group, topic)
        return {_u32.unpack(key[len(prefix):])[0]: _u64.unpack(value)[0]
                for key, value in self._db.iterator(prefix=prefix)}

    def all_offsets(self) -> Iterator[tuple[str, str, int, int]]:
        """Every committed offset, as (consumer group, topic, queue, offset): read once, when a node's metrics
        start (rocket.store.meter)."""
        for key, value in self._db.iterator(prefix=b"o"):
            group, topic = key[1:-5].split(b"\0", 1)  # see _offsets_prefix
            yield group.decode(), topic.decode(), _u32.unpack(key[-4:])[0], _u64.unpack(value)[0]

    def close(self) -> None:
        self._db.close()
