"""The records of the store's own log that earlier builds kept (kind, body): where each applied batch lies in the WAL,
consumer offsets, how far each group got, and the other index changes. replay.py replays such a log into LevelDB once,
at the first open by this build, and deletes it; the encoders let tests write one. Pure codecs.
"""

from __future__ import annotations

import struct

import orjson

from rocket.model import ALL_TAGS
from rocket.store.values import IndexEntry, Timer

BATCH = 1
OFFSETS = 2
APPLIED = 3
POSITIONS = 4  # a snapshot installed without its batches: the group's queue positions (JSON)
BACKFILLED = 5  # a batch from before such a snapshot, fetched from another replica (as BATCH)
AVAILABLE = 6  # a queue's batches are on this replica from this offset on again: decode_available
TIMERS = 7  # timers set or done: JSON [group, [[deliver_at_ms, topic, queue, offset, set], ...]]
POPS = 8  # pop consumption changes: JSON [PopChange.to_wire(), ...]
TIER = 9  # tier manifest changes: JSON [[topic, queue, TierQueue.to_wire(), drop local entries below or None], ...]
MOVED = 10  # batches copied forward in the WAL (see Store.move_batches): JSON [[topic, queue, offset, old, new], ...]
FORGOTTEN = 11  # settled timer and half batches no one reads again: JSON [[topic, queue, offset], ...]
PRODUCERS = 12  # producers' answers remembered and forgotten, in order: JSON [producers.Change, ...]
_available = struct.Struct("<QH")  # offset, topic length; then topic, then the queue (u32)
_batch_head = struct.Struct("<H")  # topic length; then topic, then _batch_place
_batch_place = struct.Struct("<IQQQQIIqQ")  # queue, base offset, append ms, Raft group, where the batch lies
# in the WAL, its bytes, its message count, its first timestamp ms, its tag summary
_batch_place_untagged = struct.Struct("<IQQQQIIq")  # as written before the tag summary was recorded
_applied = struct.Struct("<QQ")  # Raft group, index of the last entry applied


def encode_batch(topic: str, queue: int, group: int, entry: IndexEntry) -> bytes:
    name = topic.encode()
    return _batch_head.pack(len(name)) + name + _batch_place.pack(
        queue, entry.base_offset, entry.append_ms, group, entry.position, entry.batch_bytes, entry.count,
        entry.first_timestamp_ms, entry.tag_summary)


def decode_batch(body: bytes) -> tuple[str, int, int, IndexEntry]:
    """(topic, queue, Raft group, index entry)"""
    (name_length,) = _batch_head.unpack_from(body)
    place_at = _batch_head.size + name_length
    tags = ALL_TAGS
    if len(body) - place_at == _batch_place_untagged.size:
        queue, base_offset, append_ms, group, position, size, count, first_ms = \
            _batch_place_untagged.unpack_from(body, place_at)
    else:
        queue, base_offset, append_ms, group, position, size, count, first_ms, tags = \
            _batch_place.unpack_from(body, place_at)
    topic = body[_batch_head.size:place_at].decode()
    return topic, queue, group, IndexEntry(base_offset, position, count, size, first_ms, append_ms, tags)


def decode_offsets(body: bytes | memoryview) -> tuple[str, str, dict[int, int]]:
    """(consumer group, topic, {queue: offset}) of an OFFSETS record: the body of its commit command."""
    record = orjson.loads(body)
    return record["group"], record["topic"], {int(q): o for q, o in record["offsets"].items()}


def encode_applied(group: int, index: int) -> bytes:
    return _applied.pack(group, index)


def decode_applied(body: bytes) -> tuple[int, int]:
    """(Raft group, index of its last entry applied)"""
    return _applied.unpack(body)


def encode_timers(group: int, timers: list[tuple[int, Timer, bool]]) -> bytes:
    return orjson.dumps([group, [[t.deliver_at_ms, t.topic, t.queue, t.offset, t.checks, pending]
                                 for _, t, pending in timers]])


def decode_timers(body: bytes | memoryview) -> list[tuple[int, Timer, bool]]:
    group, changes = orjson.loads(body)
    return [(group, Timer(deliver_at_ms, topic, queue, offset, checks), pending)
            for deliver_at_ms, topic, queue, offset, checks, pending in changes]


def decode_available(body: bytes) -> tuple[str, int, int]:
    """(topic, queue, offset)"""
    offset, name_length = _available.unpack_from(body)
    topic = body[_available.size:_available.size + name_length].decode()
    (queue,) = struct.unpack_from("<I", body, _available.size + name_length)
    return topic, queue, offset
