"""Binary encodings of Raft entries, hard states, snapshots and messages, for the WAL and the wire.

Pure: no I/O. Every decoder checks lengths and raises RocketError(BAD_REQUEST) on malformed input.
"""

from __future__ import annotations

import struct

from rocket.errors import Code, RocketError
from rocket.raft.core import Entry, EntryKind, HardState, Message, MessageType, Snapshot

_entry = struct.Struct("<QQBI")  # term, index, kind, data length
ENTRY_HEAD_BYTES = _entry.size  # an entry's data follows its header: the WAL tells where it lies
_hard_state = struct.Struct("<QQQ")  # term, vote, commit
_snapshot_head = struct.Struct("<QQHHI")  # index, term, voter count, learner count, data length
_message_head = struct.Struct("<BQQQQQQBQQI")  # type, group, sender, to, term, log_term, index, reject,
# reject_hint, commit, entry count; then the tail
_message_tail = struct.Struct("<QBBQ")  # context, has snapshot, quiesce, leader commit
_u64 = struct.Struct("<Q")


def _bad(what: str) -> RocketError:
    return RocketError(Code.BAD_REQUEST, f"malformed Raft {what}")


def encode_entries(entries: list[Entry] | tuple[Entry, ...]) -> list[bytes]:
    parts: list[bytes] = []
    for entry in entries:
        parts.append(_entry.pack(entry.term, entry.index, entry.kind, len(entry.data)))
        parts.append(entry.data)
    return parts


def decode_entries(view: memoryview, position: int, count: int) -> tuple[list[Entry], int]:
    entries: list[Entry] = []
    for _ in range(count):
        if position + _entry.size > len(view):
            raise _bad("entry header")
        term, index, kind, length = _entry.unpack_from(view, position)
        position += _entry.size
        if position + length > len(view) or kind not in EntryKind._value2member_map_:
            raise _bad("entry")
        entries.append(Entry(term, index, bytes(view[position:position + length]), EntryKind(kind)))
        position += length
    return entries, position


def encode_hard_state(state: HardState) -> bytes:
    return _hard_state.pack(state.term, state.vote, state.commit)


def decode_hard_state(view: memoryview, position: int = 0) -> tuple[HardState, int]:
    if position + _hard_state.size > len(view):
        raise _bad("hard state")
    return HardState(*_hard_state.unpack_from(view, position)), position + _hard_state.size


def encode_snapshot(snapshot: Snapshot) -> bytes:
    members = struct.pack(f"<{len(snapshot.voters) + len(snapshot.learners)}Q", *snapshot.voters, *snapshot.learners)
    head = _snapshot_head.pack(snapshot.index, snapshot.term, len(snapshot.voters), len(snapshot.learners),
                               len(snapshot.data))
    return head + members + snapshot.data


def decode_snapshot(view: memoryview, position: int = 0) -> tuple[Snapshot, int]:
    if position + _snapshot_head.size > len(view):
        raise _bad("snapshot header")
    index, term, voters, learners, length = _snapshot_head.unpack_from(view, position)
    position += _snapshot_head.size
    members_bytes = 8 * (voters + learners)
    if position + members_bytes + length > len(view):
        raise _bad("snapshot")
    members = struct.unpack_from(f"<{voters + learners}Q", view, position)
    position += members_bytes
    data = bytes(view[position:position + length])
    return Snapshot(index, term, tuple(members[:voters]), tuple(members[voters:]), data), position + length


def encode_messages(messages: list[tuple[int, Message]]) -> bytes:
    """(group, message) pairs as one buffer: the unit sent from one node to another."""
    parts = [_u64.pack(len(messages))]
    for group, message in messages:
        parts.append(_message_head.pack(
            message.type, group, message.sender, message.to, message.term, message.log_term, message.index,
            message.reject, message.reject_hint, message.commit, len(message.entries)))
        parts.extend(encode_entries(message.entries))
        parts.append(_message_tail.pack(message.context, message.snapshot is not None, message.quiesce,
                                        message.leader_commit))
        if message.snapshot is not None:
            parts.append(encode_snapshot(message.snapshot))
    return b"".join(parts)


def decode_messages(data: bytes | memoryview) -> list[tuple[int, Message]]:
    view = memoryview(data)
    if len(view) < _u64.size:
        raise _bad("message batch")
    (count,) = _u64.unpack_from(view)
    position = _u64.size
    if count > len(view):
        raise _bad("message count")
    messages: list[tuple[int, Message]] = []
    for _ in range(count):
        if position + _message_head.size > len(view):
            raise _bad("message header")
        (kind, group, sender, to, term, log_term, index, reject, reject_hint, commit,
         entry_count) = _message_head.unpack_from(view, position)
        position += _message_head.size
        if kind not in MessageType._value2member_map_ or entry_count > len(view):
            raise _bad("message type")
        entries, position = decode_entries(view, position, entry_count)
        if position + _message_tail.size > len(view):
            raise _bad("message tail")
        context, has_snapshot, quiesce, leader_commit = _message_tail.unpack_from(view, position)
        position += _message_tail.size
        snapshot = None
        if has_snapshot:
            snapshot, position = decode_snapshot(view, position)
        elif kind == MessageType.SNAPSHOT:
            raise _bad("snapshot message without its snapshot")
        messages.append((group, Message(MessageType(kind), sender, to, term, log_term, index, tuple(entries), commit,
                                        bool(reject), reject_hint, context, snapshot, bool(quiesce), leader_commit)))
    if position != len(view):
        raise _bad("message batch length")
    return messages
