"""The Raft entry payloads of a storage group: a command byte, then its body. Encoders for the proposers,
and decode() into typed commands, read once and applied by the state machine (store/machine.py). Pure.
"""

from __future__ import annotations

import dataclasses
import struct
from typing import Any

import orjson

from rocket.errors import Code, RocketError
from rocket.model import half_topic, timer_topic
from rocket.serde.piece import Piece
from rocket.store.kv import Compare, KvBatch, Op, Txn

APPEND_COMMAND = 1  # _append_head, topic, batch
OFFSETS_COMMAND = 2  # JSON {group, topic, offsets}
TIMER_COMMAND = 3  # as APPEND: a batch of timed messages for topic, kept in timer_topic(topic) until due
MOVE_COMMAND = 4  # _append_head, topic, _source_length, source, _fire_count, offsets (u64 each), batch
CANCEL_COMMAND = 5  # JSON {op: cancel|rearm, topic (a system topic), queue, offsets[, due_ms, next_ms]}
POP_COMMAND = 6  # _json_length, JSON (see pop.decide), then for 'dead' the message's batch
HALF_COMMAND = 7  # _append_head, topic, _check_at, batch: half messages, kept in half_topic(topic)
TIER_COMMAND = 8  # JSON {op: offloaded|drop_local|expire|truncate, topic, queue, piece | to}: see manifest.decide
KV_COMMAND = 9  # _json_length, JSON (see encode_kv), then the transactions' values one after the other
SEQUENCED_COMMAND = 10  # _sequenced, then an APPEND, TIMER or HALF entry: a producer's numbered batch (producers.py)
SEQUENCED_SINCE_SCHEMA = 3  # the first release (by schema version) whose replicas apply SEQUENCED entries
DROP_COMMAND = 11  # JSON {op, topic, queues, consumer_group, incarnation}: a deleted topic's or group's state
DROP_SINCE_SCHEMA = 7  # the first release whose replicas apply DROP entries
# seal: appends, commits and pops refused, the data kept (a topic moving to another class is read here until it moved);
# moved: as topic, its objects in the tier kept (the queues' new groups own them now)
DROP_OPS = ("topic", "group", "reopen", "seal", "moved")
# _append_head, topic, _import_head, each batch as _batch_length, batch, then optionally _json_length and JSON: a
# queue's copy, and the answers its producers were given
IMPORT_COMMAND = 12
IMPORT_SINCE_SCHEMA = 8  # the first release whose replicas apply IMPORT entries and seal and moved drops
LOCK_COMMAND = 13  # JSON {op: lock|unlock, consumer_group, topic, client, queues, now_ms}: orderly consumers' locks
LOCK_SINCE_SCHEMA = 8  # the first release whose replicas apply LOCK entries
_append_head = struct.Struct("<BIQH")  # command, queue, append time ms, topic length
_source_length = struct.Struct("<H")
_fire_count = struct.Struct("<I")
_check_at = struct.Struct("<Q")  # when the half messages are first checked back, epoch ms
_json_length = struct.Struct("<I")
_sequenced = struct.Struct("<BQQ")  # command, producer id, sequence
_import_head = struct.Struct("<QI")  # the first batch's base offset, the number of batches
_batch_length = struct.Struct("<I")


# ---- typed commands ---------------------------------------------------------------------------------

@dataclasses.dataclass(slots=True)
class Append:
    """A batch appended to a queue: produced (APPEND), timed (TIMER, kept in the timer queue), half messages
    of a transaction (HALF, kept in the half queue) or pending messages moved out of a system queue (MOVE,
    only if every one of them is still pending there). batch_at: where the batch starts in the entry."""

    command: int
    topic: str
    queue: int
    append_ms: int
    batch_at: int
    batch: memoryview
    source: str = ""  # MOVE: the system queue the messages leave
    moved: tuple[int, ...] = ()  # MOVE: their offsets there
    check_at_ms: int = 0  # HALF: when they are first checked back
    producer: int = 0  # SEQUENCED: the producer's id (0: a batch without one) and the batch's sequence
    sequence: int = 0

    @property
    def stored_topic(self) -> str:
        """The topic the batch is stored in."""
        if self.command == TIMER_COMMAND:
            return timer_topic(self.topic)
        if self.command == HALF_COMMAND:
            return half_topic(self.topic)
        return self.topic


@dataclasses.dataclass(slots=True)
class CommitOffsets:
    body: memoryview  # the JSON, logged as it came
    consumer_group: str
    topic: str
    offsets: dict[int, int]


@dataclasses.dataclass(slots=True)
class Cancel:
    """Drop pending messages of a system queue, if all are pending."""

    topic: str
    queue: int
    offsets: list[int]


@dataclasses.dataclass(slots=True)
class Rearm:
    """Move pending messages due at due_ms to next_ms, counting a check-back, if all are pending and due then."""

    topic: str
    queue: int
    offsets: list[int]
    due_ms: int
    next_ms: int
    checks: int


@dataclasses.dataclass(slots=True)
class PopCommand:
    """A pop consumption change (see pop.decide); a 'dead' one carries the message's batch at batch_at."""

    request: dict[str, Any]
    batch_at: int
    batch: memoryview


@dataclasses.dataclass(slots=True)
class TierCommand:
    """A tier manifest change (see manifest.decide)."""

    request: dict[str, Any]


@dataclasses.dataclass(slots=True)
class Drop:
    """A deleted topic's queues in the group (op topic: its data, timers, half messages, dead letters, offsets and
    pop states, and appends refused from then on), a consumer group's state on a topic (op group: its offsets, pop
    states and dead letters), or a deleted topic's name open again for appends (op reopen: the topic was made anew);
    for a topic moving to another storage class, op seal refuses appends, commits and pops and keeps the data, and
    op moved drops it as topic does.
    queues: the topic's queues in the group. incarnation: when the topic deleted (op topic), or the one made anew
    (reopen), was made: a drop older than what the group last heard of the name is a deposed nameserver's late one,
    and changes nothing."""

    op: str
    topic: str
    queues: tuple[int, ...]
    consumer_group: str = ""
    incarnation: int = 0


@dataclasses.dataclass(slots=True)
class Import:
    """Batches copied from a queue's old group (its topic moving to another storage class): they join the queue at
    base_offset, the first one's offset there, so that offsets stay. batches: (where each starts in the entry, it).
    producers: (producer, sequence, base offset, count), the answers the old group remembers of the queue's
    producers, so that a batch it stored, sent again to the new group, gets its first answer there."""

    topic: str
    queue: int
    append_ms: int
    base_offset: int
    batches: list[tuple[int, memoryview]]
    producers: list[tuple[int, int, int, int]]


@dataclasses.dataclass(slots=True)
class Lock:
    """An orderly consumer's queue locks taken or renewed (op lock) or given back (unlock) by client, for its
    consumer group, at now_ms (the leader's time)."""

    op: str
    consumer_group: str
    topic: str
    client: str
    queues: tuple[int, ...]
    now_ms: int


Command = Append | CommitOffsets | Cancel | Rearm | PopCommand | TierCommand | KvBatch | Drop | Import | Lock


def decode(data: bytes | memoryview) -> Command:
    """A storage group's entry payload as its command. The leader proposed it, so a payload that does not decode
    is damage: CORRUPT_DATA."""
    view = memoryview(data)
    command = view[0]
    try:
        if command == SEQUENCED_COMMAND:
            _, producer, sequence = _sequenced.unpack_from(view)
            if view[_sequenced.size] not in (APPEND_COMMAND, TIMER_COMMAND, HALF_COMMAND):
                raise ValueError(f"a sequenced entry holds command {view[_sequenced.size]}")
            append = _decode_append(view[_sequenced.size], view[_sequenced.size:])
            append.batch_at += _sequenced.size
            append.producer, append.sequence = producer, sequence
            return append
        if command in (APPEND_COMMAND, TIMER_COMMAND, MOVE_COMMAND, HALF_COMMAND):
            return _decode_append(command, view)
        if command == POP_COMMAND:
            (length,) = _json_length.unpack_from(view, 1)
            batch_at = 1 + _json_length.size + length
            return PopCommand(orjson.loads(view[1 + _json_length.size:batch_at]), batch_at, view[batch_at:])
        if command == TIER_COMMAND:
            return TierCommand(orjson.loads(view[1:]))
        if command == KV_COMMAND:
            return _decode_kv(view)
        if command == CANCEL_COMMAND:
            request = orjson.loads(view[1:])
            if request["op"] == "rearm":
                return Rearm(request["topic"], request["queue"], request["offsets"], request["due_ms"],
                             request["next_ms"], request["checks"])
            return Cancel(request["topic"], request["queue"], request["offsets"])
        if command == IMPORT_COMMAND:
            return _decode_import(view)
        if command == LOCK_COMMAND:
            request = orjson.loads(view[1:])
            if request["op"] not in ("lock", "unlock"):
                raise ValueError(f"unknown lock operation {request['op']!r}")
            return Lock(request["op"], request["consumer_group"], request["topic"], request["client"],
                        tuple(request["queues"]), request["now_ms"])
        if command == DROP_COMMAND:
            request = orjson.loads(view[1:])
            if request["op"] not in DROP_OPS:
                raise ValueError(f"unknown drop {request['op']!r}")
            return Drop(request["op"], request["topic"], tuple(request["queues"]), request["consumer_group"],
                        request.get("incarnation", 0))
        if command == OFFSETS_COMMAND:
            record = orjson.loads(view[1:])
            return CommitOffsets(view[1:], record["group"], record["topic"],
                                 {int(queue): offset for queue, offset in record["offsets"].items()})
    except (struct.error, orjson.JSONDecodeError, KeyError, UnicodeDecodeError, ValueError, TypeError) as error:
        raise RocketError(Code.CORRUPT_DATA, f"storage command {command} does not decode: {error}") from None
    raise RocketError(Code.CORRUPT_DATA, f"unknown storage command {command}")


def _decode_append(command: int, view: memoryview) -> Append:
    _, queue, append_ms, name_length = _append_head.unpack_from(view)
    batch_at = _append_head.size + name_length
    topic = bytes(view[_append_head.size:batch_at]).decode()
    source, moved, check_at_ms = "", (), 0
    if command == MOVE_COMMAND:
        (source_length,) = _source_length.unpack_from(view, batch_at)
        source = bytes(view[batch_at + _source_length.size:batch_at + _source_length.size + source_length]).decode()
        batch_at += _source_length.size + source_length
        (count,) = _fire_count.unpack_from(view, batch_at)
        moved = struct.unpack_from(f"<{count}Q", view, batch_at + _fire_count.size)
        batch_at += _fire_count.size + 8 * count
    elif command == HALF_COMMAND:
        (check_at_ms,) = _check_at.unpack_from(view, batch_at)
        batch_at += _check_at.size
    return Append(command, topic, queue, append_ms, batch_at, view[batch_at:], source, moved, check_at_ms)


def _decode_import(view: memoryview) -> Import:
    _, queue, append_ms, name_length = _append_head.unpack_from(view)
    at = _append_head.size + name_length
    topic = bytes(view[_append_head.size:at]).decode()
    base_offset, count = _import_head.unpack_from(view, at)
    at += _import_head.size
    batches: list[tuple[int, memoryview]] = []
    for _ in range(count):
        (length,) = _batch_length.unpack_from(view, at)
        at += _batch_length.size
        if at + length > len(view):
            raise ValueError("an imported batch runs past the entry")
        batches.append((at, view[at:at + length]))
        at += length
    producers: list[tuple[int, int, int, int]] = []
    if at < len(view):
        (length,) = _json_length.unpack_from(view, at)
        at += _json_length.size
        producers = [(producer, sequence, base, count)
                     for producer, sequence, base, count in orjson.loads(view[at:at + length])]
    return Import(topic, queue, append_ms, base_offset, batches, producers)


def _decode_kv(view: memoryview) -> KvBatch:
    (length,) = _json_length.unpack_from(view, 1)
    at = 1 + _json_length.size + length
    request = orjson.loads(view[1 + _json_length.size:at])

    def value(length: int) -> bytes:
        nonlocal at
        at += length
        return bytes(view[at - length:at])

    txns: list[Txn] = []
    for bucket, shard, history, compare, success, failure in request["txns"]:
        compares = [Compare(key, target, op, number, value(length)) for key, target, op, number, length in compare]
        txns.append(Txn(bucket, shard, request["now_ms"], history, compares,
                        *([Op(op, key, value(length), ttl_ms) for op, key, length, ttl_ms in branch]
                          for branch in (success, failure))))
    if at != len(view):
        raise ValueError(f"values end at {at}, the entry at {len(view)}")
    return KvBatch(txns)


# ---- encoders ----------------------------------------------------------------------------------------

def _sequence_head(sequence: tuple[int, int] | None) -> bytes:
    """A produced batch's entry starts with its producer's id and its sequence, when it has them."""
    return _sequenced.pack(SEQUENCED_COMMAND, *sequence) if sequence else b""


def encode_append(topic: str, queue: int, append_ms: int, batch: bytes | memoryview,
                  sequence: tuple[int, int] | None = None) -> bytes:
    """A produce batch as one Raft entry. The leader stamps the append time, so replicas agree. sequence: the
    producer's id and the batch's sequence, so that the batch is stored once however often it is sent."""
    name = topic.encode()
    return b"".join((_sequence_head(sequence), _append_head.pack(APPEND_COMMAND, queue, append_ms, len(name)), name,
                     batch))


def encode_timers(topic: str, queue: int, append_ms: int, batch: bytes | memoryview,
                  sequence: tuple[int, int] | None = None) -> bytes:
    """A batch for a delay topic: stored in its timer queue, each message indexed by its delivery time."""
    name = topic.encode()
    return b"".join((_sequence_head(sequence), _append_head.pack(TIMER_COMMAND, queue, append_ms, len(name)), name,
                     batch))


def encode_move(topic: str, queue: int, append_ms: int, source: str, offsets: list[int], batch: bytes) -> bytes:
    """Pending messages of a system queue (source: due timers, committed half messages) appended to
    topic's queue as one batch, on condition that every one is still pending (so a move proposed twice,
    or racing a cancel, delivers nothing twice)."""
    name, source_name = topic.encode(), source.encode()
    return b"".join((_append_head.pack(MOVE_COMMAND, queue, append_ms, len(name)), name,
                     _source_length.pack(len(source_name)), source_name,
                     _fire_count.pack(len(offsets)), struct.pack(f"<{len(offsets)}Q", *offsets), batch))


def encode_half(topic: str, queue: int, append_ms: int, check_at_ms: int, batch: bytes | memoryview,
                sequence: tuple[int, int] | None = None) -> bytes:
    """Half messages of a transaction: kept in half_topic(topic) until committed or rolled back."""
    name = topic.encode()
    return b"".join((_sequence_head(sequence), _append_head.pack(HALF_COMMAND, queue, append_ms, len(name)), name,
                     _check_at.pack(check_at_ms), batch))


def encode_import(topic: str, queue: int, append_ms: int, base_offset: int, batches: list[bytes],
                  producers: list[tuple[int, int, int, int]] | None = None) -> bytes:
    """Batches copied from another group's queue, the first at base_offset there, and its producers' answers (see
    Import)."""
    name = topic.encode()
    answers = orjson.dumps(producers) if producers else b""
    return b"".join((_append_head.pack(IMPORT_COMMAND, queue, append_ms, len(name)), name,
                     _import_head.pack(base_offset, len(batches)),
                     *(part for batch in batches for part in (_batch_length.pack(len(batch)), batch)),
                     _json_length.pack(len(answers)) + answers if answers else b""))


def encode_lock(op: str, consumer_group: str, topic: str, client: str, queues: list[int], now_ms: int) -> bytes:
    """Lock or unlock an orderly consumer's queues (see Lock)."""
    return bytes([LOCK_COMMAND]) + orjson.dumps({"op": op, "consumer_group": consumer_group, "topic": topic,
                                                 "client": client, "queues": queues, "now_ms": now_ms})


def encode_cancel(source: str, queue: int, offsets: list[int]) -> bytes:
    """Drop pending messages of a system queue (a cancelled timer, a rolled-back transaction), if all are."""
    return bytes([CANCEL_COMMAND]) + orjson.dumps({"op": "cancel", "topic": source, "queue": queue,
                                                   "offsets": offsets})


def encode_rearm(source: str, queue: int, offsets: list[int], due_ms: int, next_ms: int, checks: int) -> bytes:
    """Move pending messages due at due_ms to next_ms, counting checks (half messages checked back), if
    all still are pending and due then."""
    return bytes([CANCEL_COMMAND]) + orjson.dumps({"op": "rearm", "topic": source, "queue": queue, "offsets": offsets,
                                                   "due_ms": due_ms, "next_ms": next_ms, "checks": checks})


def encode_pop(command: dict[str, Any], batch: bytes = b"") -> bytes:
    body = orjson.dumps(command)
    return b"".join((bytes([POP_COMMAND]), _json_length.pack(len(body)), body, batch))


def encode_offsets(group: str, topic: str, offsets: dict[int, int]) -> bytes:
    body = orjson.dumps({"group": group, "topic": topic, "offsets": {str(q): o for q, o in offsets.items()}})
    return bytes([OFFSETS_COMMAND]) + body


def encode_offloaded(topic: str, queue: int, piece: Piece) -> bytes:
    """A piece uploaded and verified: it joins the queue's manifest if it starts where the manifest ends."""
    return bytes([TIER_COMMAND]) + orjson.dumps({"op": "offloaded", "topic": topic, "queue": queue,
                                                 "piece": piece.to_wire()})


def encode_drop_local(topic: str, queue: int, to_offset: int) -> bytes:
    """Local data before to_offset goes (its index entries): only if the manifest holds all of it."""
    return bytes([TIER_COMMAND]) + orjson.dumps({"op": "drop_local", "topic": topic, "queue": queue, "to": to_offset})


def encode_expire(topic: str, queue: int, to_offset: int) -> bytes:
    """Pieces ending at or before to_offset leave the manifest (total retention); the queue starts there."""
    return bytes([TIER_COMMAND]) + orjson.dumps({"op": "expire", "topic": topic, "queue": queue, "to": to_offset})


def encode_truncate(topic: str, queue: int, from_offset: int, to_offset: int, size: int) -> bytes:
    """Local data [from_offset, to_offset), size bytes, that was never offloaded goes (total retention
    without a tier): only if the queue's local data still starts at from_offset and nothing offloaded
    lies after it."""
    return bytes([TIER_COMMAND]) + orjson.dumps({"op": "truncate", "topic": topic, "queue": queue, "from": from_offset,
                                                 "to": to_offset, "bytes": size})


def encode_drop(op: str, topic: str, queues: list[int], consumer_group: str = "", incarnation: int = 0) -> bytes:
    """Drop a deleted topic's state in the group, or a consumer group's on a topic, or reopen a deleted topic's
    name (see Drop)."""
    return bytes([DROP_COMMAND]) + orjson.dumps({"op": op, "topic": topic, "queues": queues,
                                                 "consumer_group": consumer_group, "incarnation": incarnation})


def encode_kv(txns: list[Txn]) -> bytes:
    """KV transactions (each on one shard of the group) as one Raft entry, applied one after the other. The leader
    stamps now_ms (the first's is the entry's), so replicas expire alike."""
    body = orjson.dumps({"now_ms": txns[0].now_ms, "txns": [
        [txn.bucket, txn.shard, txn.history, [[c.key, c.target, c.op, c.number, len(c.value)] for c in txn.compare],
         [[o.op, o.key, len(o.value), o.ttl_ms] for o in txn.success],
         [[o.op, o.key, len(o.value), o.ttl_ms] for o in txn.failure]] for txn in txns]})
    return b"".join((bytes([KV_COMMAND]), _json_length.pack(len(body)), body,
                     *(part.value for txn in txns for part in (*txn.compare, *txn.success, *txn.failure))))
