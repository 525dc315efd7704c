"""The offload unit: a piece is a run of consecutive batches [from, to) of one (topic, queue), copied out of the WAL
into one segment object plus a sidecar index (build), under deterministic keys (segment_key). Pure: no I/O.
"""

from __future__ import annotations

import dataclasses
import hashlib
import struct
import zlib
from collections.abc import Sequence

from rocket.errors import Code, RocketError
from rocket.serde import batch as batch_codec

_index_header = struct.Struct("<8sII")  # magic, batch count, CRC-32 of the entries
_index_entry = struct.Struct("<QIQIqQQ")  # base offset, count, position, length, first ts ms, append ms, tags
INDEX_MAGIC = b"rktidx01"


@dataclasses.dataclass(frozen=True, slots=True)
class PieceBatch:
    """Where one batch lies in a piece's segment object."""

    base_offset: int
    count: int
    position: int
    length: int
    first_timestamp_ms: int
    append_ms: int
    tag_summary: int


@dataclasses.dataclass(frozen=True, slots=True)
class Piece:
    """A manifest entry: an uploaded and verified piece [from_offset, to_offset) of a queue. The segment object holds
    the batches back to back, each keeping its own CRC header; the sidecar index (per batch: base offset, count, byte
    position, length, first timestamp, append time, tag summary) has a CRC of its own."""

    from_offset: int
    to_offset: int
    key: str  # the segment object; the sidecar index is key[:-4] + ".idx"
    size: int  # bytes of the segment object
    md5: str  # hex MD5 of the segment object, as its ETag
    index_size: int
    first_timestamp_ms: int
    last_append_ms: int

    @property
    def index_key(self) -> str:
        return index_key(self.key)

    def to_wire(self) -> list[object]:
        return [self.from_offset, self.to_offset, self.key, self.size, self.md5, self.index_size,
                self.first_timestamp_ms, self.last_append_ms]

    @classmethod
    def from_wire(cls, wire: list) -> "Piece":
        return cls(*wire)


def segment_key(prefix: str, topic: str, queue: int, from_offset: int, to_offset: int) -> str:
    """<prefix>/<topic>/<queue>/<from:020d>-<to:020d>.seg (the index: .idx). Keys are deterministic, so a new leader
    that uploads the same run writes the same objects, and a run cut differently is an orphan it can recognise and
    delete."""
    base = f"{topic}/{queue}/{from_offset:020d}-{to_offset:020d}.seg"
    return f"{prefix.rstrip('/')}/{base}" if prefix else base


def queue_prefix(prefix: str, topic: str, queue: int) -> str:
    base = f"{topic}/{queue}/"
    return f"{prefix.rstrip('/')}/{base}" if prefix else base


def index_key(key: str) -> str:
    return key[:-4] + ".idx"


def range_of_key(key: str) -> tuple[int, int] | None:
    """(from, to) of a segment or index key, or None for a key that is not one."""
    name = key.rsplit("/", 1)[-1]
    stem, _, suffix = name.rpartition(".")
    first, _, last = stem.partition("-")
    if suffix not in ("seg", "idx") or not first.isdigit() or not last.isdigit():
        return None
    return int(first), int(last)


def build(prefix: str, topic: str, queue: int, batches: Sequence[tuple[int, bytes | memoryview, int, int]]
          ) -> tuple[Piece, bytes, bytes]:
    """A piece from consecutive batches (base offset, batch, append ms, tag summary), each checked against its CRC
    as it was read (Reads.read_run): its manifest entry, segment bytes and sidecar index bytes."""
    entries = []
    position = 0
    expected = batches[0][0]
    for base_offset, batch, append_ms, tag_summary in batches:
        header = batch_codec.check_header(batch, crc=False)  # its CRC was checked as it was read
        if base_offset != expected:
            raise RocketError(Code.CORRUPT_DATA, f"{topic}/{queue}: batch at {base_offset}, expected {expected}")
        entries.append(PieceBatch(base_offset, header.count, position, len(batch), header.first_timestamp_ms,
                                  append_ms, tag_summary))
        position += len(batch)
        expected = base_offset + header.count
    segment = b"".join(batch for _, batch, _, _ in batches)  # one copy, of bytes or memoryviews alike
    index = encode_index(entries)
    piece = Piece(batches[0][0], expected, segment_key(prefix, topic, queue, batches[0][0], expected), len(segment),
                  hashlib.md5(segment).hexdigest(), len(index), entries[0].first_timestamp_ms, entries[-1].append_ms)
    return piece, segment, index


def encode_index(entries: list[PieceBatch]) -> bytes:
    body = b"".join(_index_entry.pack(*dataclasses.astuple(entry)) for entry in entries)
    return _index_header.pack(INDEX_MAGIC, len(entries), zlib.crc32(body)) + body


def decode_index(data: bytes, piece: Piece) -> list[PieceBatch]:
    """The sidecar index of piece, checked: its CRC, and that its batches tile [from, to) and the segment."""
    if len(data) < _index_header.size:
        raise RocketError(Code.CORRUPT_DATA, f"tier index {piece.index_key} is truncated ({len(data)} bytes)")
    magic, count, crc = _index_header.unpack_from(data)
    body = memoryview(data)[_index_header.size:]
    if magic != INDEX_MAGIC or len(body) != count * _index_entry.size or zlib.crc32(body) != crc:
        raise RocketError(Code.CORRUPT_DATA, f"tier index {piece.index_key} fails its checksum")
    entries = [PieceBatch(*_index_entry.unpack_from(body, at)) for at in range(0, len(body), _index_entry.size)]
    expected_offset, expected_position = piece.from_offset, 0
    for entry in entries:
        if entry.base_offset != expected_offset or entry.position != expected_position:
            raise RocketError(Code.CORRUPT_DATA, f"tier index {piece.index_key} does not tile its piece")
        expected_offset += entry.count
        expected_position += entry.length
    if expected_offset != piece.to_offset or expected_position != piece.size:
        raise RocketError(Code.CORRUPT_DATA, f"tier index {piece.index_key} does not cover its piece")
    return entries
