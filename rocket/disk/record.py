"""The commit log's record: a header (magic, body length, CRC over length, kind and body, kind) and the body. A
CRC-32C record, or an older zlib CRC-32 one (still read). Pure: it finds records in bytes and builds them.
"""

from __future__ import annotations

import mmap
import struct
import zlib

from crc32c import crc32c

from rocket import limits

MAGIC = 0x524B4C43  # "CLKR" on disk: a record whose CRC is CRC-32C (Castagnoli, computed in hardware)
LEGACY_MAGIC = 0x524B4C47  # "GLKR": a record written before, whose CRC is zlib's CRC-32; still read
MAGIC_BYTES = (struct.pack("<I", MAGIC), struct.pack("<I", LEGACY_MAGIC))
HEADER = struct.Struct("<IIIB")  # magic, body length, crc (over length, kind, body), kind
HEADER_BYTES = HEADER.size
LENGTH_KIND = struct.Struct("<IB")


Body = bytes | memoryview | tuple[bytes | memoryview, ...]  # a tuple is written as its parts, uncopied


def crc_of(magic: int, body_length: int, kind: int, body: bytes | memoryview) -> int | None:
    """The CRC of a record with this magic, or None for a magic that is not a record's."""
    if magic == MAGIC:
        return crc32c(body, crc32c(LENGTH_KIND.pack(body_length, kind)))
    if magic == LEGACY_MAGIC:
        return zlib.crc32(body, zlib.crc32(LENGTH_KIND.pack(body_length, kind)))
    return None


def record_parts(kind: int, body: Body) -> list[bytes | memoryview]:
    """A record as buffers for writev: its header, then the body's parts as they are."""
    parts = list(body) if isinstance(body, tuple) else [body]
    length = sum(len(part) for part in parts)
    crc = crc32c(LENGTH_KIND.pack(length, kind))
    for part in parts:
        crc = crc32c(part, crc)
    return [HEADER.pack(MAGIC, length, crc, kind), *parts]


def record_at(view: memoryview, position: int) -> tuple[int, int] | None:
    """(kind, end) of a valid record starting at position in view, or None."""
    if position + HEADER_BYTES > len(view):
        return None
    magic, length, crc, kind = HEADER.unpack_from(view, position)
    end = position + HEADER_BYTES + length
    if length > limits.log_record_bytes_max or end > len(view):
        return None
    if crc_of(magic, length, kind, view[position + HEADER_BYTES : end]) != crc:
        return None
    return kind, end


def valid_record_after(view: memoryview, data: mmap.mmap, position: int) -> int | None:
    """The position of any valid record after position (used to tell a torn tail from damage)."""
    for magic_bytes in MAGIC_BYTES:
        candidate = data.find(magic_bytes, position + 1)
        while candidate != -1:
            if record_at(view, candidate) is not None:
                return candidate
            candidate = data.find(magic_bytes, candidate + 1)
    return None
