"""The produce batch: a 40-byte header (count, flags, timestamps, tag summary, CRC) and its payload.

Pure codec: no I/O. The server only calls check_header(); clients encode and decode messages.
Payload is either per-message records or, with FLAG_DELIMITED, newline-terminated bodies.
"""

from __future__ import annotations

import dataclasses
import struct
import zlib

from crc32c import crc32c

from rocket import limits
from rocket.errors import Code, RocketError
from rocket.model import Message, tag_bit

MAGIC = 0x5242  # "RB"
VERSION = 2  # the batch CRC is CRC-32C (computed in hardware); version 1 batches, with zlib's CRC-32, still check
_crc_of_version = {1: zlib.crc32, 2: crc32c}
FLAG_DELIMITED = 0x01  # payload is bodies each ending in b"\n"; no keys, tags or properties
FLAG_TIMED = 0x02  # messages may carry a delivery time (DELIVER_AT_PROPERTY): for delay topics
FLAG_TRANSACTION = 0x04  # half messages of a transaction: invisible until committed
FLAGS_KNOWN = FLAG_DELIMITED | FLAG_TIMED | FLAG_TRANSACTION
DELIVER_AT_PROPERTY = "__deliver_at_ms"  # a timed message's delivery time, epoch ms, in its properties

_header = struct.Struct("<HBBIqqQII")
HEADER_BYTES = _header.size
_crc_covered_header = HEADER_BYTES - 4
_record = struct.Struct("<IHHIi")  # body, key, tag, properties lengths; timestamp delta ms


@dataclasses.dataclass(slots=True, frozen=True)
class BatchHeader:
    flags: int
    count: int
    first_timestamp_ms: int
    last_timestamp_ms: int
    tag_summary: int
    payload_bytes: int
    crc: int

    @property
    def total_bytes(self) -> int:
        return HEADER_BYTES + self.payload_bytes


def _bad(message: str) -> RocketError:
    return RocketError(Code.BAD_BATCH, message)


def check_header(batch: bytes | memoryview, crc: bool = True) -> BatchHeader:
    """Validate a whole batch by its header and CRC without decoding messages (with crc=False, the
    header alone: for a batch whose CRC was checked before it got here)."""
    view = memoryview(batch)
    if len(view) < HEADER_BYTES:
        raise _bad(f"batch of {len(view)} bytes is shorter than its {HEADER_BYTES}-byte header")
    if len(view) > limits.batch_bytes_max:
        raise _bad(f"batch of {len(view)} bytes exceeds the limit of {limits.batch_bytes_max}")
    magic, version, flags, count, first_ms, last_ms, tags, payload_bytes, stored_crc = _header.unpack_from(view)
    if magic != MAGIC or version not in _crc_of_version:
        raise _bad(f"unknown batch magic {magic:#x} or version {version}")
    if flags & ~FLAGS_KNOWN or bin(flags).count("1") > 1:  # the flags exclude each other
        raise _bad(f"unknown batch flags {flags:#x}")
    if payload_bytes != len(view) - HEADER_BYTES:
        raise _bad(f"header says {payload_bytes} payload bytes, batch has {len(view) - HEADER_BYTES}")
    if count < 1 or count > limits.batch_messages_max:
        raise _bad(f"batch count {count} is outside 1..{limits.batch_messages_max}")
    if last_ms < first_ms:
        raise _bad("batch last timestamp is before its first")
    if crc:
        checksum = _crc_of_version[version]
        actual = checksum(view[HEADER_BYTES:], checksum(view[:_crc_covered_header]))
        if actual != stored_crc:
            raise _bad(f"batch checksum mismatch (header {stored_crc:#010x}, payload {actual:#010x})")
    return BatchHeader(flags, count, first_ms, last_ms, tags, payload_bytes, stored_crc)


def peek_header(batch: bytes | memoryview) -> BatchHeader:
    """The header of a batch already checked on its way in (reads only the header, no CRC pass)."""
    _, _, flags, count, first_ms, last_ms, tags, payload_bytes, crc = _header.unpack_from(batch)
    return BatchHeader(flags, count, first_ms, last_ms, tags, payload_bytes, crc)


def peek_count(batch: bytes | memoryview) -> int:
    """The message count of a batch already checked on its way in (reads only the header)."""
    return _header.unpack_from(batch)[3]


def _seal(flags: int, count: int, first_ms: int, last_ms: int, tags: int, payload: bytes) -> bytes:
    head = _header.pack(MAGIC, VERSION, flags, count, first_ms, last_ms, tags, len(payload), 0)
    crc = crc32c(payload, crc32c(head[:_crc_covered_header]))
    return head[:_crc_covered_header] + struct.pack("<I", crc) + payload


def _encode_properties(message: Message) -> bytes:
    """A message's properties as the record carries them, its delivery time among them."""
    if DELIVER_AT_PROPERTY in message.properties:
        raise RocketError(Code.BAD_REQUEST, f"property {DELIVER_AT_PROPERTY!r} is reserved: set deliver_at_ms")
    properties = message.properties
    if message.deliver_at_ms:
        properties = {**properties, DELIVER_AT_PROPERTY: str(message.deliver_at_ms)}
    parts = []
    for name, value in properties.items():
        if "\0" in name or "\0" in value or not name:
            raise RocketError(Code.BAD_REQUEST, f"property {name!r} must be non-empty and free of NUL")
        parts.append(name)
        parts.append(value)
    return "\0".join(parts).encode()


def encode(messages: list[Message], timestamp_ms: int, transaction: bool = False) -> bytes:
    """Encode messages as one batch (of half messages, with transaction). Messages without a timestamp
    get timestamp_ms. This loop is a producer's cost per message: a message without properties or a
    delivery time takes its short path."""
    if not messages:
        raise RocketError(Code.BAD_REQUEST, "a batch holds at least one message")
    stamps = [m.timestamp_ms or timestamp_ms for m in messages]
    first_ms, last_ms = min(stamps), max(stamps)
    if last_ms - first_ms >= 2**31:
        raise RocketError(Code.BAD_REQUEST, "timestamps in one batch must lie within 24 days")
    key_max, tag_max = limits.key_bytes_max, limits.tag_bytes_max
    properties_max, body_max = limits.properties_bytes_max, limits.message_bytes_max
    tags = 0
    flags = 0
    chunks: list[bytes] = []
    extend = chunks.extend
    pack = _record.pack
    for message, stamp in zip(messages, stamps):
        key = message.key.encode()
        tag = message.tag.encode()
        body = message.body
        properties = b""
        if message.properties or message.deliver_at_ms:
            properties = _encode_properties(message)
            if message.deliver_at_ms:
                flags = FLAG_TIMED
        if len(key) > key_max or len(tag) > tag_max:
            raise RocketError(Code.BAD_REQUEST, "message key or tag is too long")
        if len(properties) > properties_max or len(body) > body_max:
            raise RocketError(Code.BAD_REQUEST, "message properties or body is too large")
        if tag:
            tags |= tag_bit(message.tag)
        extend((pack(len(body), len(key), len(tag), len(properties), stamp - first_ms), key, tag, properties, body))
    if transaction:
        if flags:
            raise RocketError(Code.BAD_REQUEST, "a transaction's messages have no delivery time")
        flags = FLAG_TRANSACTION
    return _seal(flags, len(messages), first_ms, last_ms, tags, b"".join(chunks))


def encode_lines(lines: bytes, timestamp_ms: int) -> bytes:
    """Encode a chunk of newline-terminated lines as one batch, without per-line Python work."""
    if not lines.endswith(b"\n"):
        raise RocketError(Code.BAD_REQUEST, "a delimited batch must end with a newline")
    return _seal(FLAG_DELIMITED, lines.count(b"\n"), timestamp_ms, timestamp_ms, 0, lines)


def _deliver_at(text: str, index: int) -> int:
    if not text.isdigit() or len(text) > 18:
        raise _bad(f"message {index} has a malformed delivery time {text[:32]!r}")
    return int(text)


def bodies(batch: bytes | memoryview) -> list[bytes]:
    """The bodies of a checked batch, in order, without keys, tags, properties or a Message each: for a
    consumer that needs only the payload. Less than half of decode()'s cost per message."""
    header = check_header(batch)
    if header.flags & FLAG_DELIMITED:
        return _lines(memoryview(batch)[HEADER_BYTES:], header.count)
    data = batch if isinstance(batch, bytes) else bytes(batch)
    found: list[bytes] = []
    append = found.append
    position = HEADER_BYTES
    size = len(data)
    unpack = _record.unpack_from
    record_bytes = _record.size
    for index in range(header.count):
        if position + record_bytes > size:
            raise _bad(f"message {index} header runs past the end of the batch")
        body_len, key_len, tag_len, props_len, delta = unpack(data, position)
        position += record_bytes + key_len + tag_len + props_len + body_len
        if position > size or delta < 0:
            raise _bad(f"message {index} runs past the end of the batch")
        append(data[position - body_len : position])
    if position != size:
        raise _bad(f"{size - position} bytes follow the last message of the batch")
    return found


def _lines(payload: memoryview, count: int) -> list[bytes]:
    """The bodies of a delimited batch's payload."""
    found = bytes(payload[:-1]).split(b"\n") if len(payload) else []
    if len(found) != count or payload[-1:] != b"\n":
        raise _bad(f"delimited batch holds {len(found)} lines, header says {count}")
    return found


def decode(batch: bytes | memoryview, base_offset: int = 0, queue: int = -1) -> list[Message]:
    """Decode every message of a checked batch, numbering them from base_offset."""
    header = check_header(batch)
    payload = memoryview(batch)[HEADER_BYTES:]
    if header.flags & FLAG_DELIMITED:
        stamp = header.first_timestamp_ms
        return [Message(body, timestamp_ms=stamp, queue=queue, offset=base_offset + i)
                for i, body in enumerate(_lines(payload, header.count))]
    # Slices of bytes are one copy each, with no memoryview made per field: the batch is copied once if it
    # came as a view. This loop is a consumer's cost per message, so it does no more than it must.
    data = batch if isinstance(batch, bytes) else bytes(batch)
    messages: list[Message] = []
    append = messages.append
    position = HEADER_BYTES
    size = len(data)
    unpack = _record.unpack_from
    record_bytes = _record.size
    timed = header.flags & FLAG_TIMED
    first_ms = header.first_timestamp_ms
    offset = base_offset
    for index in range(header.count):
        if position + record_bytes > size:
            raise _bad(f"message {index} header runs past the end of the batch")
        body_len, key_len, tag_len, props_len, delta = unpack(data, position)
        start = position + record_bytes
        position = start + key_len + tag_len + props_len + body_len
        if position > size or delta < 0:
            raise _bad(f"message {index} runs past the end of the batch")
        key = data[start : start + key_len].decode("utf-8", "replace") if key_len else ""
        if not (tag_len or props_len):
            append(Message(data[position - body_len : position], key, "", {}, first_ms + delta, queue, offset))
            offset += 1
            continue
        start += key_len
        tag = data[start : start + tag_len].decode("utf-8", "replace") if tag_len else ""
        start += tag_len
        properties: dict[str, str] = {}
        if props_len:
            parts = data[start : start + props_len].decode("utf-8", "replace").split("\0")
            if len(parts) % 2:
                raise _bad(f"message {index} has malformed properties")
            properties = dict(zip(parts[::2], parts[1::2]))
        deliver_at_ms = 0
        if timed and DELIVER_AT_PROPERTY in properties:
            deliver_at_ms = _deliver_at(properties.pop(DELIVER_AT_PROPERTY), index)
        append(Message(data[position - body_len : position], key, tag, properties, first_ms + delta, queue, offset,
                       deliver_at_ms))
        offset += 1
    if position != size:
        raise _bad(f"{size - position} bytes follow the last message of the batch")
    return messages
