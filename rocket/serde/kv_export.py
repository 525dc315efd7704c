"""The KV export file (`rocket kv export`): a bucket's keys at one revision per shard, written and read as a stream.
Pure codec. A file that ends before END, or whose record fails its CRC, is refused whole (read).
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from typing import BinaryIO

import orjson
from crc32c import crc32c

from rocket.errors import Code, RocketError

# Layout, version 1:
#     magic b"RKVX", version u16, then records, each:
#         kind u8, length u32, payload (length bytes), CRC-32C u32 of kind, length and payload
#     kind 1 HEAD   (first): JSON {"bucket", "shards", "history", "ttl_ms", "created_ms", "exported_ms"}
#     kind 2 SHARD  (before a shard's keys): JSON {"shard", "revision"}
#     kind 3 KEY:   key length u16, key (UTF-8), revision u64, create_revision u64, version u64, expires_ms u64, value
#     kind 4 END    (last): JSON {"keys": the KEY records in the file, "shards": {shard: revision}}
# All integers are big-endian.
MAGIC = b"RKVX"
VERSION = 1
HEAD, SHARD, KEY, END = 1, 2, 3, 4
_start = struct.Struct(">4sH")
_record = struct.Struct(">BI")
_crc = struct.Struct(">I")
_key = struct.Struct(">HQQQQ")
RECORD_BYTES_MAX = 8 * 1024 * 1024  # a KEY record: a key and a value, well under the server's limits; bounds a read


def start() -> bytes:
    return _start.pack(MAGIC, VERSION)


def record(kind: int, payload: bytes) -> bytes:
    head = _record.pack(kind, len(payload))
    return head + payload + _crc.pack(crc32c(payload, crc32c(head)))


def json_record(kind: int, value: dict) -> bytes:
    return record(kind, orjson.dumps(value))


def key_record(key: str, value: bytes, revision: int, create_revision: int, version: int, expires_ms: int) -> bytes:
    name = key.encode()
    return record(KEY, _key.pack(len(name), revision, create_revision, version, expires_ms) + name + value)


def decode_key(payload: bytes) -> tuple[str, bytes, int, int, int, int]:
    """(key, value, revision, create_revision, version, expires_ms)"""
    length, revision, create_revision, version, expires_ms = _key.unpack_from(payload)
    name_end = _key.size + length
    return payload[_key.size:name_end].decode(), payload[name_end:], revision, create_revision, version, expires_ms


def read(source: BinaryIO) -> Iterator[tuple[int, bytes | dict]]:
    """(kind, payload) of each record: JSON kinds decoded, KEY payloads raw (decode_key). Raises CORRUPT_DATA on a
    bad magic, version, CRC or a file that ends before its END record."""
    magic, version = _start.unpack(_exactly(source, _start.size))
    if magic != MAGIC:
        raise RocketError(Code.CORRUPT_DATA, "not a rocket KV export (its first bytes are not RKVX)")
    if version != VERSION:
        raise RocketError(Code.CORRUPT_DATA, f"KV export version {version}; this rocket reads version {VERSION}")
    keys = 0
    while True:
        head = _exactly(source, _record.size)
        kind, length = _record.unpack(head)
        if length > RECORD_BYTES_MAX:
            raise RocketError(Code.CORRUPT_DATA, f"a KV export record of {length} bytes: damaged")
        payload = _exactly(source, length)
        (crc,) = _crc.unpack(_exactly(source, _crc.size))
        if crc != crc32c(payload, crc32c(head)):
            raise RocketError(Code.CORRUPT_DATA, f"a KV export record (kind {kind}) fails its CRC: the file is damaged")
        if kind == KEY:
            keys += 1
            yield kind, payload
            continue
        try:
            value = orjson.loads(payload)
        except orjson.JSONDecodeError:
            raise RocketError(Code.CORRUPT_DATA, f"a KV export record (kind {kind}) is not JSON") from None
        if kind == END:
            if value.get("keys") != keys:
                raise RocketError(Code.CORRUPT_DATA, f"the export says {value.get('keys')} keys and holds {keys}")
            yield kind, value
            return
        yield kind, value


def _exactly(source: BinaryIO, count: int) -> bytes:
    data = source.read(count)
    if len(data) != count:
        raise RocketError(Code.CORRUPT_DATA, "the KV export ends early: it was cut short")
    return data
