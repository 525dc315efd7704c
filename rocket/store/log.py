"""CommitLog: segment files of checksummed records, addressed by global byte position; plain blocking I/O.
open() cuts a torn tail of the last segment back to its last good record and reports any other damage
as CORRUPT_DATA. append() writes without syncing; sync() makes everything appended so far durable."""

from __future__ import annotations

import bisect
import mmap
import os
import re
import struct
import threading
import zlib
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from pathlib import Path

from rocket import limits
from rocket.errors import Code, RocketError, invariant

MAGIC = 0x52434C47  # "RCLG"
_magic_bytes = struct.pack("<I", MAGIC)
_header = struct.Struct("<IIIB")  # magic, body length, crc32 (over body length, kind and body), kind
HEADER_BYTES = _header.size
_length_kind = struct.Struct("<IB")
_segment_name = re.compile(r"(\d{20})\.log")

Buffer = bytes | bytearray | memoryview
Body = Buffer | tuple[Buffer, ...]  # a tuple is encoded as the concatenation of its parts, without joining them first


def _crc(length: int, kind: int, parts: Sequence[Buffer]) -> int:
    crc = zlib.crc32(_length_kind.pack(length, kind))
    for part in parts:
        crc = zlib.crc32(part, crc)
    return crc


def _encode(kind: int, body: Body) -> tuple[list[Buffer], int]:
    """A record as a list of buffers (header first) and its total size."""
    invariant(0 <= kind <= 255, "a record kind is one byte")
    parts = list(body) if isinstance(body, tuple) else [body]
    length = sum(len(part) for part in parts)
    invariant(length <= limits.log_record_bytes_max, "callers bound record bodies by log_record_bytes_max")
    return [_header.pack(MAGIC, length, _crc(length, kind, parts), kind), *parts], HEADER_BYTES + length


def _record_end(view: memoryview, position: int) -> int | None:
    """The end of the valid record starting at position in a whole-segment view, or None."""
    if position + HEADER_BYTES > len(view):
        return None
    magic, length, crc, kind = _header.unpack_from(view, position)
    end = position + HEADER_BYTES + length
    if magic != MAGIC or length > limits.log_record_bytes_max or end > len(view):
        return None
    if _crc(length, kind, (view[position + HEADER_BYTES:end],)) != crc:
        return None
    return end


def _next_valid_record(data: mmap.mmap, view: memoryview, after: int) -> int | None:
    """Where a valid record starts after a bad one, if anywhere: that tells damage from a torn tail."""
    candidate = data.find(_magic_bytes, after + 1)
    while candidate != -1:
        if _record_end(view, candidate) is not None:
            return candidate
        candidate = data.find(_magic_bytes, candidate + 1)
    return None


def _fsync_directory(directory: Path) -> None:
    descriptor = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


class CommitLog:
    def __init__(self, directory: Path, segment_bytes_max: int):
        invariant(segment_bytes_max >= limits.segment_bytes_min, "segment_bytes_max is below segment_bytes_min")
        self.directory = directory
        self.segment_bytes_max = segment_bytes_max
        self._starts: list[int] = []
        self._active_fd = -1
        self._active_size = 0
        self._rolled_fds: list[int] = []  # sealed segments' write descriptors, closed after their last fdatasync
        self._directory_dirty = False  # a new segment's name is durable only after the directory is synced
        self._readers: OrderedDict[int, int] = OrderedDict()
        # Reads run on the event loop thread while appends run in a worker: guard the shared lists.
        self._lock = threading.Lock()
        self._broken: str | None = None

    @classmethod
    def open(cls, directory: Path, segment_bytes_max: int) -> "CommitLog":
        """Open (or create) the log in directory, recovering its tail."""
        directory.mkdir(parents=True, exist_ok=True)
        log = cls(directory, segment_bytes_max)
        names = (_segment_name.fullmatch(path.name) for path in directory.iterdir())
        log._starts = sorted(int(match.group(1)) for match in names if match)
        if not log._starts:
            log._path(0).touch()
            _fsync_directory(directory)
            log._starts = [0]
        log._recover()
        log._active_fd = os.open(log._path(log._starts[-1]), os.O_WRONLY | os.O_APPEND)
        return log

    def _path(self, start: int) -> Path:
        return self.directory / f"{start:020d}.log"

    def _recover(self) -> None:
        while True:
            size = self._recover_segment(self._starts[-1])
            if size or len(self._starts) == 1:
                break
            # A crash right after a roll leaves a newest segment with nothing durable in it; nothing
            # in it was acknowledged, so it goes and the previous segment is the tail to verify.
            self._path(self._starts.pop()).unlink()
            _fsync_directory(self.directory)
        self._active_size = size
        for start, next_start in zip(self._starts, self._starts[1:]):
            sealed_size = self._path(start).stat().st_size
            if start + sealed_size != next_start:
                raise RocketError(Code.CORRUPT_DATA, f"{self._path(start)}: sealed segment holds {sealed_size} bytes "
                                  f"but the next segment starts {next_start - start} bytes after it")

    def _recover_segment(self, start: int) -> int:
        """Verify every record of the segment; cut a torn tail; raise on damage with valid records after it."""
        path = self._path(start)
        size = path.stat().st_size
        if size == 0:
            return 0
        with open(path, "r+b") as file:
            data = mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ)
            view = memoryview(data)
            try:
                position = 0
                while (end := _record_end(view, position)) is not None:
                    position = end
                following = _next_valid_record(data, view, position) if position < size else None
            finally:
                view.release()
                data.close()
            if following is not None:
                raise RocketError(Code.CORRUPT_DATA, f"{path}: bad record at byte {position} (log position "
                                  f"{start + position}) with valid records after it (first at byte {following}); "
                                  f"refusing to cut records that may have been acknowledged")
            if position < size:
                file.truncate(position)
                os.fsync(file.fileno())
        return position

    @property
    def end_position(self) -> int:
        return self._starts[-1] + self._active_size

    @property
    def start_position(self) -> int:
        return self._starts[0]

    def segments(self) -> list[tuple[int, Path, int]]:
        """(start position, path, size in bytes) of every segment, oldest first."""
        with self._lock:
            starts = list(self._starts)
        return [(start, self._path(start), self._path(start).stat().st_size) for start in starts]

    def append(self, records: Sequence[tuple[int, Body]]) -> list[int]:
        """Write (kind, body) records after the end without syncing; returns each record's position."""
        self._check_usable()
        positions: list[int] = []
        chunk: list[Buffer] = []
        chunk_bytes = 0
        try:
            for kind, body in records:
                parts, size = _encode(kind, body)
                # Records never span segments; one larger than a segment gets a segment of its own.
                if self._active_size + chunk_bytes + size > self.segment_bytes_max and self._active_size + chunk_bytes:
                    self._write(chunk)
                    chunk, chunk_bytes = [], 0
                    self._roll()
                positions.append(self.end_position + chunk_bytes)
                chunk.extend(parts)
                chunk_bytes += size
            self._write(chunk)
        except OSError as error:
            self._broken = f"a write failed ({error})"
            raise
        return positions

    def _write(self, parts: list[Buffer]) -> None:
        """One write call per segment touched (more only after a short write)."""
        data = memoryview(b"".join(parts))
        while len(data):
            written = os.write(self._active_fd, data)
            with self._lock:
                self._active_size += written
            data = data[written:]

    def _roll(self) -> None:
        start = self.end_position
        descriptor = os.open(self._path(start), os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_EXCL, 0o644)
        with self._lock:
            self._rolled_fds.append(self._active_fd)
            self._starts.append(start)
            self._active_fd = descriptor
            self._active_size = 0
            self._directory_dirty = True

    def sync(self) -> None:
        """fdatasync every segment written since the last sync, and the directory if a segment was added."""
        self._check_usable()
        try:
            while self._rolled_fds:
                os.fdatasync(self._rolled_fds[0])
                os.close(self._rolled_fds.pop(0))
            os.fdatasync(self._active_fd)
            if self._directory_dirty:
                _fsync_directory(self.directory)
                self._directory_dirty = False
        except OSError as error:
            # After a failed fsync the page cache may have dropped the dirty pages: the file's content
            # is unknown, so the log refuses writes until it is reopened (and recovered) (fsyncgate).
            self._broken = f"an fsync failed ({error})"
            raise

    def _check_usable(self) -> None:
        invariant(self._active_fd >= 0, "the log is closed")
        if self._broken is not None:
            raise RocketError(Code.UNAVAILABLE, f"{self.directory}: {self._broken}; the log must be reopened")

    def _reader(self, start: int) -> int:
        descriptor = self._readers.get(start)
        if descriptor is not None:
            self._readers.move_to_end(start)
            return descriptor
        descriptor = os.open(self._path(start), os.O_RDONLY)
        self._readers[start] = descriptor
        if len(self._readers) > limits.log_reader_fds_max:
            os.close(self._readers.popitem(last=False)[1])
        return descriptor

    def read(self, position: int) -> tuple[int, memoryview]:
        """The (kind, body) of the record at position, verified against its CRC."""
        with self._lock:
            index = bisect.bisect_right(self._starts, position) - 1
            if index < 0 or position >= self.end_position:
                raise RocketError(Code.CORRUPT_DATA, f"{self.directory}: log position {position} is outside the log "
                                  f"[{self._starts[0]}, {self.end_position})")
            start = self._starts[index]
            descriptor = self._reader(start)
            head = os.pread(descriptor, HEADER_BYTES, position - start)
            if len(head) < HEADER_BYTES:
                raise self._damage(start, position, "record header runs past the end of the segment")
            magic, length, crc, kind = _header.unpack(head)
            if magic != MAGIC or length > limits.log_record_bytes_max:
                raise self._damage(start, position, "bad record header")
            body = os.pread(descriptor, length, position - start + HEADER_BYTES)
        if len(body) != length or _crc(length, kind, (body,)) != crc:
            raise self._damage(start, position, "record checksum mismatch")
        return kind, memoryview(body)

    def _damage(self, start: int, position: int, problem: str) -> RocketError:
        return RocketError(Code.CORRUPT_DATA, f"{self._path(start)}: {problem} at byte {position - start} "
                           f"(log position {position})")

    def scan(self, from_position: int) -> Iterator[tuple[int, int, memoryview]]:
        """Every record from from_position (a record boundary) to the end, as (position, kind, body), verified."""
        position = from_position
        end = self.end_position
        while position < end:
            kind, body = self.read(position)
            yield position, kind, body
            position += HEADER_BYTES + len(body)

    def close(self) -> None:
        with self._lock:
            for descriptor in [*self._rolled_fds, self._active_fd, *self._readers.values()]:
                if descriptor >= 0:
                    os.close(descriptor)
            self._rolled_fds.clear()
            self._readers.clear()
            self._active_fd = -1
