"""The commit log: segment files of checksummed records, addressed by global byte position. Plain blocking file
I/O; on open, a torn tail is cut back to the last good record, and an append refused for space (ENOSPC) leaves the
log ending at its last whole record, so the caller may append again once space returns."""

from __future__ import annotations

import bisect
import contextlib
import errno
import mmap
import os
import threading
from collections import OrderedDict
from collections.abc import Iterator
from pathlib import Path

from rocket import limits
from rocket.disk.direct import ALIGN, DirectTail
from rocket.disk.files import fsync_directory
from rocket.disk.record import (HEADER, HEADER_BYTES, LEGACY_MAGIC, MAGIC, Body, crc_of, record_at, record_parts,
                                 valid_record_after)
from rocket.errors import Code, RocketError, invariant

SUFFIX = ".log"
_iov_max = min(os.sysconf("SC_IOV_MAX"), 1024)
_fadvise = getattr(os, "posix_fadvise", None)  # not on macOS: there the OS alone decides what stays cached
_O_DIRECT = getattr(os, "O_DIRECT", 0)  # Linux; elsewhere a direct log writes through the page cache


def _drop_cached(descriptor: int, offset: int, length: int) -> None:
    """Let the kernel free the file's clean cached pages in this range (dirty ones stay until written)."""
    if _fadvise is not None and length > 0:
        _fadvise(descriptor, offset, length, os.POSIX_FADV_DONTNEED)


class CommitLog:
    """Segments, appends, syncs and reads in one class: they share the segment table, the tail and the reader cache,
    under one lock discipline. Writes and fsyncs run in a worker thread of the caller's. On open, damage with valid
    records after it is reported. The record format is record.py, the direct log's memory direct.py.

    With cached_bytes, only the log's newest cached_bytes stay in the page cache: older pages are dropped once
    written or read, so that the next writes and reads reuse them (0: the OS decides, as for any file). With direct,
    writes bypass the page cache (O_DIRECT, whole aligned blocks from memory of the log's own), and the newest
    cached_bytes are read from that memory; a segment's file may then end in zeros up to a block boundary until it
    is sealed or closed, which recovery cuts like any torn tail."""

    def __init__(self, directory: Path, segment_bytes_max: int, cached_bytes: int = 0, direct: bool = False):
        invariant(segment_bytes_max >= limits.segment_bytes_min, "segments must hold at least one big batch")
        invariant(not direct or cached_bytes > 0, "a direct log reads its newest bytes from memory of its own")
        self.directory = directory
        self.segment_bytes_max = segment_bytes_max
        self.cached_bytes = cached_bytes
        self._tail = DirectTail(cached_bytes) if direct and _O_DIRECT else None
        self._starts: list[int] = []
        self._active_fd = -1
        self._active_size = 0
        self._unsynced_fds: list[int] = []
        self._readers: OrderedDict[int, int] = OrderedDict()
        self._directory_dirty = False
        self._bookkeeping = threading.Lock()  # sync() may run beside append() in another thread
        self._syncing = threading.Lock()  # one sync() at a time: a second waits for the fdatasync in flight
        self._retired_fds: set[int] = set()  # sealed segments' write descriptors, closed once synced
        self._uncached_to = 0  # pages of the bytes before this position were dropped after their write

    @classmethod
    def open(cls, directory: Path, segment_bytes_max: int = limits.segment_bytes_default,
             cached_bytes: int = 0, direct: bool = False) -> "CommitLog":
        directory.mkdir(parents=True, exist_ok=True)
        log = cls(directory, segment_bytes_max, cached_bytes, direct)
        log._starts = sorted(int(path.name[: -len(SUFFIX)]) for path in directory.glob(f"*{SUFFIX}"))
        if not log._starts:
            log._starts = [0]
            log._path(0).touch()
            fsync_directory(directory)
        # A crash right after a roll leaves an empty newest segment while the one before may still have
        # an unsynced tail: drop the empty one and recover the tail where the data really ends.
        while len(log._starts) > 1 and log._path(log._starts[-1]).stat().st_size == 0:
            log._path(log._starts.pop()).unlink()
            fsync_directory(directory)
        log._check_sealed_segments()
        last = log._starts[-1]
        log._active_size = log._recover_tail(log._path(last))
        log._active_fd = log._open_active(last)
        if log._tail is not None:
            kept = log._active_size % ALIGN
            with open(log._path(last), "rb") as file:
                file.seek(log._active_size - kept)
                log._tail.start_segment(last, file.read(kept), log._active_size - kept)
        return log

    def _open_active(self, start: int, create: bool = False) -> int:
        """The write descriptor of the segment at start: appending, or direct (positioned writes)."""
        flags = os.O_WRONLY | (os.O_CREAT | os.O_EXCL if create else 0)
        if self._tail is None:
            return os.open(self._path(start), flags | os.O_APPEND, 0o644)
        try:
            return os.open(self._path(start), flags | _O_DIRECT, 0o644)
        except OSError as error:
            if error.errno != errno.EINVAL:
                raise
        # A file system without O_DIRECT (tmpfs): write through the page cache, as a log that is not direct.
        self._tail = None
        return os.open(self._path(start), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    @property
    def direct(self) -> bool:
        """Whether writes bypass the page cache (asked for and supported by the OS and the file system)."""
        return self._tail is not None

    def _check_sealed_segments(self) -> None:
        """Each sealed segment must end exactly where the next one starts; anything else is damage, but for
        the zeros a direct write pads its last block with, when a crash came before the seal's truncate."""
        for start, following in zip(self._starts, self._starts[1:]):
            size = self._path(start).stat().st_size
            if 0 < start + size - following < ALIGN:
                with open(self._path(start), "r+b") as file:
                    file.seek(following - start)
                    if not file.read().strip(b"\0"):
                        file.truncate(following - start)
                        os.fsync(file.fileno())
                        size = following - start
            if start + size != following:
                raise RocketError(Code.CORRUPT_DATA, f"{self._path(start)} holds {size} bytes but the next segment "
                                  f"starts at {following}: bytes were lost or added")

    def _path(self, start: int) -> Path:
        return self.directory / f"{start:020d}{SUFFIX}"

    def _recover_tail(self, path: Path) -> int:
        """Verify the last segment; cut a torn tail back; report damage followed by good records."""
        size = path.stat().st_size
        if size == 0:
            return 0
        with open(path, "r+b") as file:
            data = mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ)
            view = memoryview(data)
            try:
                position = 0
                while position < size:
                    found = record_at(view, position)
                    if found is None:
                        following = valid_record_after(view, data, position)
                        if following is not None:
                            raise RocketError(
                                Code.CORRUPT_DATA,
                                f"{path}: damaged record at byte {position} with valid records after it "
                                f"(next at byte {following}); refusing to cut acknowledged data",
                            )
                        break
                    position = found[1]
            finally:
                view.release()
                data.close()
            if position < size:
                file.truncate(position)
                file.flush()
                os.fsync(file.fileno())
        return position

    @property
    def end_position(self) -> int:
        return self._starts[-1] + self._active_size

    @property
    def start_position(self) -> int:
        return self._starts[0]

    @property
    def cached_from(self) -> int:
        """With cached_bytes, reads from here on find their bytes in memory (the page cache, or a direct log's
        own) and reads before it go to the disk; without, the OS keeps what it can, and every read is taken to
        find its bytes there."""
        if self._tail is not None:
            return self._tail.cached_from
        return self.end_position - self.cached_bytes if self.cached_bytes else self.start_position

    def segment_starts(self) -> list[int]:
        return list(self._starts)

    def segments(self) -> list[tuple[int, Path, int]]:
        return [(start, self._path(start), self._path(start).stat().st_size) for start in self._starts]

    def append(self, records: list[tuple[int, Body]]) -> list[int]:
        """Write records after the end (not synced), without copying their bodies; returns positions. One refused
        for space cuts the file, and a direct log's memory, back to the last whole record, so a retry follows it."""
        positions: list[int] = []
        pending: list[bytes | memoryview] = []
        pending_bytes = 0
        for kind, body in records:
            parts = record_parts(kind, body)
            size = sum(len(part) for part in parts)
            invariant(size <= self.segment_bytes_max, "a record must fit in a segment")
            if self._active_size + pending_bytes + size > self.segment_bytes_max and self._active_size + pending_bytes:
                self._write(pending)
                pending, pending_bytes = [], 0
                self._roll()
            positions.append(self.end_position + pending_bytes)
            pending.extend(parts)
            pending_bytes += size
        self._write(pending)
        return positions

    def _write(self, buffers: list[bytes | memoryview]) -> None:
        """writev everything, resuming after short writes, at most limits.log_write_bytes_max (and IOV_MAX
        buffers) a call. Linux (6.18, ext4) puts a big write in page-cache folios of up to 2 MiB (writes of 4 MiB
        went all into 2 MiB folios), and on a VM that hands free memory back to its host those are slow to fill:
        a round of eight producers' batches written in one call took 2.1 ms per MiB, in calls of 1 MiB 0.5
        (benchmarks/RESULTS.md, "Writes of at most 1 MiB")."""
        if self._tail is not None:
            return self._write_direct(self._tail, buffers)
        try:
            self._write_buffered(buffers)
        except OSError:
            # A full disk, say: what a short write left past the last whole record is cut, so that the log
            # ends at a record again and a retry's bytes follow it, not a torn one.
            os.ftruncate(self._active_fd, self._active_size)
            raise
        self._drop_written()

    def _write_buffered(self, buffers: list[bytes | memoryview]) -> None:
        step = limits.log_write_bytes_max
        views = (memoryview(buffer).cast("B") for buffer in buffers)
        buffers = [view[at : at + step] for view in views for at in range(0, len(view), step)]
        first = 0
        total_written = 0
        while first < len(buffers):
            last, size = first + 1, len(buffers[first])
            while last < len(buffers) and last - first < _iov_max and size + len(buffers[last]) <= step:
                size += len(buffers[last])
                last += 1
            written = os.writev(self._active_fd, buffers[first:last])
            total_written += written
            while written:
                if written >= len(buffers[first]):
                    written -= len(buffers[first])
                    first += 1
                else:
                    buffers[first] = buffers[first][written:]
                    written = 0
        self._written(total_written)

    def _write_direct(self, tail: DirectTail, buffers: list[bytes | memoryview]) -> None:
        """Copy into the tail's memory and write whole blocks from there, at their place in the segment."""
        size = sum(len(buffer) for buffer in buffers)
        if not size:
            return
        mark = tail.mark()
        blocks, offset = tail.stage(buffers, size)
        try:
            with blocks:
                while len(blocks):
                    written = os.pwrite(self._active_fd, blocks, offset)
                    if written % ALIGN:
                        raise OSError(errno.EIO, f"{self._path(self._starts[-1])}: direct write stopped off a block")
                    blocks, offset = blocks[written:], offset + written
        except OSError:
            # As in _write: memory and file end at the last whole record again, and a retry writes from there.
            tail.rewind(mark)
            os.ftruncate(self._active_fd, self._active_size)
            raise
        self._written(size)

    def _written(self, size: int) -> None:
        with self._bookkeeping:
            self._active_size += size
            if self._active_fd not in self._unsynced_fds:
                self._unsynced_fds.append(self._active_fd)

    def _drop_written(self) -> None:
        """Drop the cached pages of what lies more than cached_bytes behind the end: written and synced rounds
        ago, so the next writes reuse those pages."""
        until = self.cached_from
        if not self.cached_bytes or until <= self._uncached_to:
            return
        with self._bookkeeping:
            starts, active_fd = list(self._starts), self._active_fd
        for index in range(max(0, bisect.bisect_right(starts, self._uncached_to) - 1), len(starts)):
            start = starts[index]
            if start >= until:
                break
            begin = max(self._uncached_to, start) - start
            if index == len(starts) - 1:
                _drop_cached(active_fd, begin, until - start - begin)
                continue
            with self._detached(start) as descriptor:
                if descriptor is not None:
                    _drop_cached(descriptor, begin, min(until, starts[index + 1]) - start - begin)
        self._uncached_to = until

    @contextlib.contextmanager
    def _detached(self, start: int) -> Iterator[int | None]:
        """A read descriptor of the segment at start of its own, which nothing closes under it; None if the
        segment was deleted."""
        try:
            descriptor = os.open(self._path(start), os.O_RDONLY)
        except FileNotFoundError:
            yield None
            return
        try:
            yield descriptor
        finally:
            os.close(descriptor)

    def _roll(self) -> None:
        start = self.end_position
        if self._tail is not None:
            os.ftruncate(self._active_fd, self._active_size)  # the sealed segment ends at its last record
        descriptor = self._open_active(start, create=True)
        if self._tail is not None:
            self._tail.start_segment(start)
        with self._bookkeeping:
            # The sealed segment is closed by the sync that makes its last bytes durable.
            if self._active_fd not in self._unsynced_fds:
                self._unsynced_fds.append(self._active_fd)
            self._retired_fds.add(self._active_fd)
            self._starts.append(start)
            self._active_fd = descriptor
            self._active_size = 0
            self._directory_dirty = True

    def roll(self) -> int:
        """Start a new segment now (unless the active one is empty); returns where it starts."""
        if self._active_size:
            self._roll()
        return self.end_position

    def delete_before(self, position: int) -> int:
        """Delete the sealed segments that end at or before position; returns how many. The caller
        syncs first: what replaces those records must be durable before they go. The files are unlinked after the
        bookkeeping lock is let go, so that appends and syncs in other threads do not wait for a file system that
        takes its time freeing a big file (a worker thread calls it: roles/storage/reclaim.py)."""
        gone = []
        with self._bookkeeping:
            while len(self._starts) > 1 and self._starts[1] <= position:
                start = self._starts.pop(0)
                reader = self._readers.pop(start, None)
                if reader is not None:
                    os.close(reader)
                gone.append(self._path(start))
        for path in gone:
            path.unlink()
        if gone:
            with self._bookkeeping:
                self._directory_dirty = True
        return len(gone)

    def sync(self) -> int:
        """Make everything appended before the call durable (segment data and new file names), and
        return the position up to which that holds. May run in one thread while append runs in
        another: one fsync then overlaps the next write. Calls from several threads take turns, so
        that none returns while another's fdatasync of what it appended is still in flight."""
        with self._syncing:
            with self._bookkeeping:
                durable_end = self.end_position
                descriptors, self._unsynced_fds = self._unsynced_fds, []
                directory_dirty, self._directory_dirty = self._directory_dirty, False
            for descriptor in descriptors:
                os.fdatasync(descriptor)
            with self._bookkeeping:
                # A sealed segment written again after this sync began stays open for the next one.
                for descriptor in self._retired_fds.intersection(descriptors).difference(self._unsynced_fds):
                    os.close(descriptor)
                    self._retired_fds.discard(descriptor)
            if directory_dirty:
                fsync_directory(self.directory)
        return durable_end

    def _reader(self, start: int) -> int:
        descriptor = self._readers.get(start)
        if descriptor is None:
            descriptor = os.open(self._path(start), os.O_RDONLY)
            self._readers[start] = descriptor
            if len(self._readers) > limits.log_reader_fds_max:
                os.close(self._readers.popitem(last=False)[1])
        else:
            self._readers.move_to_end(start)
        return descriptor

    def read(self, position: int) -> tuple[int, bytes]:
        """The (kind, body) of the record at position, checked against its CRC."""
        index = bisect.bisect_right(self._starts, position) - 1
        if index < 0 or position >= self.end_position:
            raise RocketError(Code.OFFSET_OUT_OF_RANGE, f"log position {position} is outside the log")
        start = self._starts[index]
        head = self._pread(start, position, HEADER_BYTES)
        if len(head) < HEADER_BYTES:
            raise self._damage(start, position, "record header runs past the end of the segment")
        magic, length, crc, kind = HEADER.unpack(head)
        if magic not in (MAGIC, LEGACY_MAGIC) or length > limits.log_record_bytes_max:
            raise self._damage(start, position, "bad record header")
        body = self._pread(start, position + HEADER_BYTES, length)
        if len(body) != length or crc_of(magic, length, kind, body) != crc:
            raise self._damage(start, position, "record checksum mismatch")
        return kind, body

    def _from_tail(self, position: int, length: int) -> bytes | None:
        """The written bytes at position from a direct log's memory, if it holds them all (None: read the file)."""
        if self._tail is None or position + length > self.end_position:
            return None
        return self._tail.read(position, length)

    def _pread(self, start: int, position: int, length: int) -> bytes:
        """Up to length bytes at position, in the segment at start: from a direct log's memory if it holds
        them, else from the file (shorter if the file ends first)."""
        data = self._from_tail(position, length)
        if data is None:
            descriptor = self._reader(start)
            data = os.pread(descriptor, length, position - start)
            self._drop_read(descriptor, start, position, length)
        return data

    def read_slice(self, position: int, length: int, detached: bool = False) -> bytes:
        """length bytes from inside a record (a batch that its own CRC covers), without reading the
        rest of the record: the caller checks them. detached reads through a descriptor of its own, which
        nothing closes under it: for a read in another thread than the log's owner (whose shared
        descriptors it may close, as delete_before does)."""
        starts = list(self._starts)  # one snapshot: delete_before may drop the first meanwhile
        index = bisect.bisect_right(starts, position) - 1
        if index < 0 or position + length > self.end_position:
            raise RocketError(Code.OFFSET_OUT_OF_RANGE, f"log bytes {position}+{length} are outside the log")
        start = starts[index]
        data = self._from_tail(position, length)
        if data is not None:
            return data
        if not detached:
            return self._read_at(self._reader(start), start, position, length)
        with self._detached(start) as descriptor:
            if descriptor is None:
                raise RocketError(Code.OFFSET_OUT_OF_RANGE, f"log bytes {position}+{length} were deleted")
            return self._read_at(descriptor, start, position, length)

    def _read_at(self, descriptor: int, start: int, position: int, length: int) -> bytes:
        data = os.pread(descriptor, length, position - start)
        if len(data) != length:
            raise self._damage(start, position, "data runs past the end of the segment")
        self._drop_read(descriptor, start, position, length)
        return data

    def read_ahead(self, spans: list[tuple[int, int]]) -> None:
        """Have the kernel start reading these (position, length) spans into the page cache, for reads to
        come; from any thread. Spans no longer in the log are skipped."""
        if _fadvise is None:
            return
        starts = list(self._starts)
        for position, length in spans:
            index = bisect.bisect_right(starts, position) - 1
            if index < 0:
                continue
            with self._detached(starts[index]) as descriptor:
                if descriptor is not None:
                    _fadvise(descriptor, position - starts[index], length, os.POSIX_FADV_WILLNEED)

    def _drop_read(self, descriptor: int, start: int, position: int, length: int) -> None:
        """Bytes read from before cached_from keep no pages: a reader catching up reuses the same few."""
        if position + length <= self.cached_from:
            _drop_cached(descriptor, position - start, length)

    def _damage(self, start: int, position: int, problem: str) -> RocketError:
        return RocketError(Code.CORRUPT_DATA, f"{self._path(start)}: {problem} at byte {position - start}")

    def scan(self, from_position: int) -> Iterator[tuple[int, int, bytes]]:
        """Every record from from_position to the end as (position, kind, body), each verified.
        Segments are contiguous: each starts at the position where the previous one ended."""
        position = from_position
        while position < self.end_position:
            kind, body = self.read(position)
            yield position, kind, body
            position += HEADER_BYTES + len(body)

    def close(self) -> None:
        if self._tail is not None and self._active_fd >= 0:
            os.ftruncate(self._active_fd, self._active_size)
        for descriptor in self._retired_fds | {self._active_fd}:
            if descriptor >= 0:
                os.close(descriptor)
        self._retired_fds.clear()
        for descriptor in self._readers.values():
            os.close(descriptor)
        self._readers.clear()
        self._unsynced_fds = []
        self._active_fd = -1
