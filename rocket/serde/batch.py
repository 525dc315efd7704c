"""The produce batch: a 40-byte header (count, flags, timestamps, tag summary, CRC) and its payload; a pure codec.
Decoding raises RocketError(BAD_BATCH) on any malformed batch, never another error: a batch stored before records
were checked must not stop its readers.
"""

from __future__ import annotations

import itertools
import operator
import struct
import typing
import zlib
from array import array

import msgspec
from crc32c import crc32c

from rocket import limits
from rocket.errors import Code, RocketError
from rocket.model import ID_PROPERTY, KEYS_PROPERTY, Message, tag_bit

# The broker takes a batch into a queue after check_produced() (its header, CRC and records); storage checks headers;
# clients encode and decode messages. The payload is either per-message records or, with FLAG_DELIMITED,
# newline-terminated bodies. A version 3 batch's records are one msgpack array of records, each a Message's leading
# fields in order, so that msgspec decodes a batch into Messages in C; versions 1 and 2 (fixed record heads) are still
# read.
MAGIC = 0x5242  # "RB"
VERSION = 3  # records in msgpack; 2 had fixed record heads; 1 also had zlib's CRC-32 where 2 and 3 have CRC-32C
_crc_of_version = {1: zlib.crc32, 2: crc32c, 3: crc32c}
FLAG_DELIMITED = 0x01  # payload is bodies each ending in b"\n"; no keys, tags or properties
FLAG_TIMED = 0x02  # messages may carry a delivery time (deliver_at_ms): for delay topics
FLAG_TRANSACTION = 0x04  # half messages of a transaction: invisible until committed
FLAGS_KNOWN = FLAG_DELIMITED | FLAG_TIMED | FLAG_TRANSACTION
# A Produce request's "records" from a caller in the broker's process whose batch encode() wrote (a gateway): encode()
# checked each message as check_produced() would, so the broker checks the header alone. No wire serde makes it.
WRITTEN_HERE = object()
DELIVER_AT_PROPERTY = "__deliver_at_ms"  # reserved: where versions 1 and 2 kept a timed message's delivery time

_header = struct.Struct("<HBBIqqQII")
HEADER_BYTES = _header.size
_crc_covered_header = HEADER_BYTES - 4
_record = struct.Struct("<IHHIi")  # versions 1 and 2: body, key, tag, properties lengths; timestamp delta ms


class _Body(msgspec.Struct, array_like=True, gc=False):
    """A record read for its body alone: msgspec skips the fields after it."""

    body: bytes


def _record_struct(fields_max: int) -> type:
    """A Message's leading fields, as a record holds them, with their types and defaults (so decoding into it
    checks exactly what decoding into Messages checks), refusing a record with more fields than a writer writes."""
    hints = typing.get_type_hints(Message, include_extras=True)
    names = Message.__struct_fields__
    defaults = dict(zip(names[len(names) - len(Message.__struct_defaults__):], Message.__struct_defaults__))
    fields = [(name, hints[name], defaults[name]) if name in defaults else (name, hints[name])
              for name in names[:fields_max]]
    return msgspec.defstruct("Record", fields, array_like=True, gc=False, forbid_unknown_fields=True)


_RECORD_FIELDS = Message.__struct_fields__.index("deliver_at_ms") + 1  # what encode() writes at most
_Record = _record_struct(_RECORD_FIELDS)
_field_readers = {name: msgspec.msgpack.Decoder(typing.get_type_hints(Message, include_extras=True)[name]).decode
                  for name in Message.__struct_fields__}
_read_records = msgspec.msgpack.Decoder(list[Message]).decode
# _Record is a class made at run time (defstruct), which pyright cannot take as a type.
_read_produced = msgspec.msgpack.Decoder(list[_Record]).decode  # pyright: ignore[reportInvalidTypeForm]
_read_raw = msgspec.msgpack.Decoder(list[msgspec.Raw]).decode
_UNREADABLE = (msgspec.DecodeError, UnicodeDecodeError)  # msgspec raises the latter for a str that is not UTF-8
_read_bodies = msgspec.msgpack.Decoder(list[_Body]).decode
_write_records = msgspec.msgpack.Encoder().encode
_NOT_YET = object()  # encode()'s properties checked before the first message: none


class _Ids(msgspec.Struct, gc=False, rename={"keys": KEYS_PROPERTY, "id": ID_PROPERTY}):
    """A record's properties read for the key index: its RocketMQ keys and its client's message id; msgspec skips
    the others."""

    keys: str = ""
    id: str = ""


class _Keyed(msgspec.Struct, array_like=True, gc=False):
    """A record read for the key index: its body left unread (Raw), its key and its properties' ids."""

    body: msgspec.Raw
    key: str = ""
    tag: str = ""
    properties: _Ids = msgspec.field(default_factory=_Ids)


_read_keyed = msgspec.msgpack.Decoder(list[_Keyed]).decode
_ID_SEED = 0x1D  # the CRC-32C seed of a message id's term (key_term)
_key_of, _keys_of, _id_of = (operator.attrgetter(name) for name in ("key", "properties.keys", "properties.id"))


class BatchHeader(typing.NamedTuple):  # made for every batch checked or applied: a frozen dataclass costs 3x to make
    flags: int
    count: int
    first_timestamp_ms: int
    last_timestamp_ms: int
    tag_summary: int
    payload_bytes: int
    crc: int
    version: int

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
    return BatchHeader(flags, count, first_ms, last_ms, tags, payload_bytes, stored_crc, version)


def peek_header(batch: bytes | memoryview) -> BatchHeader:
    """The header of a batch already checked on its way in (reads only the header, no CRC pass)."""
    _, version, flags, count, first_ms, last_ms, tags, payload_bytes, crc = _header.unpack_from(batch)
    return BatchHeader(flags, count, first_ms, last_ms, tags, payload_bytes, crc, version)


def peek_count(batch: bytes | memoryview) -> int:
    """The message count of a batch already checked on its way in (reads only the header)."""
    return _header.unpack_from(batch)[3]


def _seal(flags: int, count: int, first_ms: int, last_ms: int, tags: int, payload: bytes) -> bytes:
    head = _header.pack(MAGIC, VERSION, flags, count, first_ms, last_ms, tags, len(payload), 0)
    crc = crc32c(payload, crc32c(head[:_crc_covered_header]))
    return head[:_crc_covered_header] + struct.pack("<I", crc) + payload


def _check_properties(properties: dict[str, str], properties_max: int) -> None:
    if not isinstance(properties, dict):
        raise RocketError(Code.BAD_REQUEST, "message properties must be a dict of str")
    if DELIVER_AT_PROPERTY in properties:
        raise RocketError(Code.BAD_REQUEST, f"property {DELIVER_AT_PROPERTY!r} is reserved: set deliver_at_ms")
    size = 0
    for name, value in properties.items():
        if not isinstance(name, str) or not isinstance(value, str):
            raise RocketError(Code.BAD_REQUEST, "message properties must be a dict of str")
        if "\0" in name or "\0" in value or not name:
            raise RocketError(Code.BAD_REQUEST, f"property {name!r} must be non-empty and free of NUL")
        size += len(name.encode()) + len(value.encode()) + 2
    if size > properties_max:
        raise RocketError(Code.BAD_REQUEST, "message properties are too large")


def encode(messages: list[Message], timestamp_ms: int, transaction: bool = False) -> bytes:
    """Encode messages as one batch (of half messages, with transaction). Messages without a timestamp
    get timestamp_ms. This loop is a producer's cost per message: it checks each message and makes it a
    tuple; msgspec writes the records in C."""
    if not messages:
        raise RocketError(Code.BAD_REQUEST, "a batch holds at least one message")
    stamps = [m.timestamp_ms or timestamp_ms for m in messages]
    try:
        first_ms, last_ms = min(array("q", stamps)), max(stamps)  # the array checks in C that each is an int64
    except (TypeError, OverflowError):
        first_ms = -1
    if first_ms < 0:
        raise RocketError(Code.BAD_REQUEST, "message timestamps must be whole milliseconds since the epoch")
    key_max, tag_max = limits.key_bytes_max, limits.tag_bytes_max
    key_quarter, tag_quarter = key_max // 4, tag_max // 4
    properties_max, body_max = limits.properties_bytes_max, limits.message_bytes_max
    tags = 0
    flags = 0
    records: list[tuple] = []
    append = records.append
    checked: object = _NOT_YET  # the properties last checked: messages often share one dict (the MQTT gateway's)
    for message, stamp in zip(messages, stamps):
        key, tag, body, properties = message.key, message.tag, message.body, message.properties
        if body.__class__ is not bytes or key.__class__ is not str or tag.__class__ is not str:
            body, key, tag = _plain(message)
        if len(body) > body_max:
            raise RocketError(Code.BAD_REQUEST, "message body is too large")
        if (len(key) > key_quarter and len(key.encode()) > key_max) or (
                len(tag) > tag_quarter and len(tag.encode()) > tag_max):  # UTF-8 takes at most 4 bytes a character
            raise RocketError(Code.BAD_REQUEST, "message key or tag is too long")
        if tag:
            tags |= tag_bit(tag)
        if properties is not checked and (properties or properties.__class__ is not dict):
            _check_properties(properties, properties_max)
            checked = properties
        if message.deliver_at_ms:  # the delivery time follows the queue and offset, which a reader sets
            _check_delivery_time(message.deliver_at_ms)
            flags = FLAG_TIMED
            append((body, key, tag, properties, stamp, -1, -1, message.deliver_at_ms))
        else:
            append((body, key, tag, properties, stamp))
    if transaction:
        if flags:
            raise RocketError(Code.BAD_REQUEST, "a transaction's messages have no delivery time")
        flags = FLAG_TRANSACTION
    try:
        payload = _write_records(records)
    except (UnicodeEncodeError, TypeError) as error:  # a lone surrogate; a property of a str subclass
        raise RocketError(Code.BAD_REQUEST, f"a message cannot be encoded: {error}") from None
    return _seal(flags, len(messages), first_ms, last_ms, tags, payload)


def _plain(message: Message) -> tuple[bytes, str, str]:
    """The body, key and tag of a message as plain bytes and str (msgspec writes no subclasses), or a
    refusal: a record that a reader could not decode must not reach a queue."""
    if not isinstance(message.body, (bytes, bytearray, memoryview)):
        raise RocketError(Code.BAD_REQUEST, f"a message body must be bytes, not {type(message.body).__name__}")
    if not isinstance(message.key, str) or not isinstance(message.tag, str):
        raise RocketError(Code.BAD_REQUEST, "a message key and tag must be str")
    return bytes(message.body), str.__str__(message.key), str.__str__(message.tag)


def _check_delivery_time(deliver_at_ms: int) -> None:
    if not isinstance(deliver_at_ms, int) or not 0 < deliver_at_ms < 2**63:
        raise RocketError(Code.BAD_REQUEST, "a delivery time must be whole milliseconds since the epoch")


def encode_lines(lines: bytes, timestamp_ms: int) -> bytes:
    """Encode a chunk of newline-terminated lines as one batch, without per-line Python work."""
    if not lines.endswith(b"\n"):
        raise RocketError(Code.BAD_REQUEST, "a delimited batch must end with a newline")
    return _seal(FLAG_DELIMITED, lines.count(b"\n"), timestamp_ms, timestamp_ms, 0, lines)


def _deliver_at(text: str, index: int) -> int:
    if not text.isdigit() or len(text) > 18:
        raise _bad(f"message {index} has a malformed delivery time {text[:32]!r}")
    return int(text)


def _records(read, batch: bytes | memoryview, header: BatchHeader, fields_max: int = len(Message.__struct_fields__)
             ) -> list:
    """A version 3 batch's records, read in C by msgspec; as many as the header counts."""
    payload = memoryview(batch)[HEADER_BYTES:]
    try:
        records = read(payload)
    except _UNREADABLE as error:  # ValidationError is a DecodeError too
        raise _bad(f"malformed records: {_unreadable_record(payload, fields_max) or error}") from None
    if len(records) != header.count:
        raise _bad(f"batch holds {len(records)} records, header says {header.count}")
    return records


def _unreadable_record(payload: memoryview, fields_max: int) -> str | None:
    """Which record and field of a payload the decoder refused, and why; the slow path, taken only after a refusal
    (None if the records are not even an array of values)."""
    try:
        records = _read_raw(payload)
    except _UNREADABLE:
        return None
    names = Message.__struct_fields__
    for index, record in enumerate(records):
        try:
            fields = _read_raw(record)
        except _UNREADABLE:
            return f"record {index} is not an array of fields"
        if not fields or len(fields) > fields_max:
            return f"record {index} has {len(fields)} fields, where a record has 1 to {fields_max}"
        for name, field in zip(names, fields):
            try:
                _field_readers[name](field)
            except _UNREADABLE as error:
                return f"record {index} field {name}: {_why(error)}"
    return None


def _why(error: Exception) -> str:
    """rocket's own words for a string that is not UTF-8, whatever msgspec's version says (older ones raised
    UnicodeDecodeError, 0.23 a DecodeError of its own); the decoder's text for anything else."""
    if isinstance(error, UnicodeDecodeError) or "utf-8" in str(error).lower():
        return "not valid UTF-8"
    return str(error)


def check_produced(batch: bytes | memoryview) -> BatchHeader:
    """check_header() and then every record as readers decode them, in C: what the broker checks before a batch
    joins a queue, so that no reader meets a record it cannot decode (BAD_BATCH naming the record and field)."""
    header = check_header(batch)
    if header.flags & FLAG_DELIMITED:
        data = batch if isinstance(batch, bytes) else bytes(batch)
        lines = data.count(b"\n", HEADER_BYTES)
        if lines != header.count or not data.endswith(b"\n"):
            raise _bad(f"delimited batch holds {lines} lines ending in a newline, header says {header.count}")
    elif header.version >= 3:
        _records(_read_produced, batch, header, _RECORD_FIELDS)
    else:  # an old writer's fixed record heads: decoded in Python, as readers do
        _legacy_decode(batch, header, 0, -1)
    return header


def bodies(batch: bytes | memoryview) -> list[bytes]:
    """The bodies of a checked batch, in order, without keys, tags, properties or a Message each: for a
    consumer that needs only the payload."""
    header = check_header(batch)
    if header.flags & FLAG_DELIMITED:
        return _lines(memoryview(batch)[HEADER_BYTES:], header.count)
    if header.version >= 3:
        return [record.body for record in _records(_read_bodies, batch, header)]
    return _legacy_bodies(batch, header)


def _legacy_bodies(batch: bytes | memoryview, header: BatchHeader) -> list[bytes]:
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
    if header.flags & FLAG_DELIMITED:
        stamp = header.first_timestamp_ms
        return [Message(body, timestamp_ms=stamp, queue=queue, offset=base_offset + i)
                for i, body in enumerate(_lines(memoryview(batch)[HEADER_BYTES:], header.count))]
    if header.version < 3:
        return _legacy_decode(batch, header, base_offset, queue)
    messages = _records(_read_records, batch, header)
    for offset, message in enumerate(messages, base_offset):  # the one pass in Python: where they are stored
        message.queue = queue
        message.offset = offset
    return messages


def key_term(term: str, message_id: bool = False) -> int:
    """What the key index keeps of a key (or of a client's message id): its CRC-32C (an id's with another seed, so
    that an id is not a key), which may collide; a batch it names is read, and its messages matched in full."""
    return crc32c(term.encode(), _ID_SEED if message_id else 0)


def key_terms(batch: bytes | memoryview) -> bytes:
    """The key index's terms of a checked batch, packed as 32-bit values: key_term of each distinct key (rocket's
    key, and each RocketMQ key a message has) and client message id; b"" if it has none, or its records cannot be
    read. Made in C, but for a pass over the distinct terms; per batch, by the key indexer, off the appends' path
    (Store.index_keys)."""
    header = peek_header(batch)
    if header.flags & FLAG_DELIMITED:
        return b""
    try:
        if header.version < 3:
            messages = _legacy_decode(batch, header, 0, -1)
            keys = {message.key for message in messages}
            keys.update(" ".join(message.properties.get(KEYS_PROPERTY, "") for message in messages).split())
            ids = {message.properties.get(ID_PROPERTY, "") for message in messages}
        else:
            records = _records(_read_keyed, batch, header)
            keys = set(map(_key_of, records))
            keys.update(" ".join(filter(None, map(_keys_of, records))).split())
            ids = set(map(_id_of, records))
    except RocketError:  # readers step past such a batch too (readable)
        return b""
    keys.discard("")
    ids.discard("")
    terms = array("I", map(crc32c, map(str.encode, keys)))
    terms.extend(map(crc32c, map(str.encode, ids), itertools.repeat(_ID_SEED)))
    return terms.tobytes()


def readable(batch: bytes | memoryview, base_offset: int = 0, queue: int = -1) -> list[Message] | None:
    """decode(), or None for a batch whose records cannot be read. The broker checks records before it stores
    a batch (check_produced), but older versions checked only its header and CRC, so a queue may hold such a
    batch: a reader that scans must step past it."""
    try:
        return decode(batch, base_offset, queue)
    except RocketError as error:
        if error.code != Code.BAD_BATCH:
            raise
        return None


def _legacy_decode(batch: bytes | memoryview, header: BatchHeader, base_offset: int, queue: int) -> list[Message]:
    """Versions 1 and 2: records with a fixed head of lengths, the delivery time among the properties."""
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
