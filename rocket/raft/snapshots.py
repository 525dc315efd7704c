"""Group snapshots as files in a snapshots/ directory beside the WAL, so that a snapshot of any size stays out of the
WAL and out of Raft messages: those carry only its Descriptor (the file's size and checksum), as Snapshot.data.
Blocking file I/O: the Raft host calls this module from worker threads."""

from __future__ import annotations

import dataclasses
import os
import re
import struct
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from crc32c import crc32c

from rocket import limits
from rocket.disk.files import fsync_directory
from rocket.errors import Code, RocketError, invariant
from rocket.raft.core import Snapshot

DIRECTORY = "snapshots"  # in the WAL's directory
MAGIC = b"RKSN"
VERSION = 1
HEADER = struct.Struct("<4sHH")  # MAGIC, VERSION, reserved
FRAME = struct.Struct("<II")  # a chunk's length and CRC-32C; the chunk follows
FOOTER = struct.Struct("<IQQI")  # FOOTER_MARK, chunk count, file bytes, CRC-32C of every byte before the footer
FOOTER_MARK = 0xFFFF_FFFF  # where a frame has its length: no chunk is that long
DESCRIPTOR = struct.Struct("<4sQI")  # MAGIC, file bytes, file checksum
SUFFIX, PARTIAL_SUFFIX, TEMPORARY_SUFFIX = ".snap", ".part", ".tmp"
_NAME = re.compile(r"g(\d{1,20})-i(\d{1,20})-t(\d{1,20})-[0-9a-f]{8}\.snap")


def _corrupt(what: str) -> RocketError:
    return RocketError(Code.CORRUPT_DATA, what)


@dataclasses.dataclass(frozen=True, slots=True)
class Descriptor:
    """What the WAL and the Raft core keep of a snapshot: enough to name its file and check it."""

    size: int
    checksum: int

    def encode(self) -> bytes:
        return DESCRIPTOR.pack(MAGIC, self.size, self.checksum)

    @classmethod
    def decode(cls, data: bytes) -> "Descriptor":
        if len(data) != DESCRIPTOR.size or data[:len(MAGIC)] != MAGIC:
            raise _corrupt(f"a snapshot's data of {len(data)} bytes is not a snapshot file's descriptor")
        _, size, checksum = DESCRIPTOR.unpack(data)
        return cls(size, checksum)


def name_of(group: int, snapshot: Snapshot) -> str | None:
    """The file of a group's snapshot; None for the empty snapshot a group starts from."""
    return file_of(group, snapshot) if snapshot.data else None


def file_of(group: int, snapshot: Snapshot) -> str:
    """The file of a group's snapshot that has one (not the empty snapshot)."""
    return file_name(group, snapshot.index, snapshot.term, Descriptor.decode(snapshot.data).checksum)


def file_name(group: int, index: int, term: int, checksum: int) -> str:
    return f"g{group}-i{index}-t{term}-{checksum:08x}{SUFFIX}"


def write_file(path: Path, chunks: Iterable[bytes]) -> Descriptor:
    """Write the chunks as a snapshot file at path and fsync it (not its directory). A file is a header, the state
    machine's chunks each framed with its length and CRC-32C, and a footer with the chunk count, the file's size and
    the CRC-32C of every byte before the footer. Its name follows from the group and the snapshot's index, term and
    checksum (file_name)."""
    with open(path, "wb") as file:
        head = HEADER.pack(MAGIC, VERSION, 0)
        file.write(head)
        whole, size, count = crc32c(head), len(head), 0
        for chunk in chunks:
            invariant(len(chunk) < FOOTER_MARK, "a snapshot chunk is shorter than 4 GiB")
            frame = FRAME.pack(len(chunk), crc32c(chunk))
            file.write(frame)
            file.write(chunk)
            whole = crc32c(chunk, crc32c(frame, whole))
            size += len(frame) + len(chunk)
            count += 1
        size += FOOTER.size
        file.write(FOOTER.pack(FOOTER_MARK, count, size, whole))
        file.flush()
        os.fsync(file.fileno())
    return Descriptor(size, whole)


def read_file(path: Path, descriptor: Descriptor) -> Iterator[bytes]:
    """The chunks of a snapshot file, as written. Its size, header and footer are checked against the descriptor
    at once (a truncated file or a wrong total fails here), each chunk against its CRC before it is handed out,
    and the whole file's checksum once the last chunk is read."""
    try:
        file = open(path, "rb")
    except FileNotFoundError:
        raise _corrupt(f"snapshot file {path} is missing") from None
    try:
        size = os.fstat(file.fileno()).st_size
        if size != descriptor.size or size < HEADER.size + FOOTER.size:
            raise _corrupt(f"snapshot file {path} holds {size} bytes, not {descriptor.size}")
        head = file.read(HEADER.size)
        _check_header(head, path)
        file.seek(size - FOOTER.size)
        mark, count, total, whole = FOOTER.unpack(file.read(FOOTER.size))
        if mark != FOOTER_MARK or total != size or whole != descriptor.checksum:
            raise _corrupt(f"snapshot file {path}: its footer does not match its size and checksum")
        file.seek(HEADER.size)
    except BaseException:
        file.close()
        raise
    return _chunks(file, path, size - FOOTER.size, count, crc32c(head), whole)


def _chunks(file, path: Path, end: int, count: int, whole: int, checksum: int) -> Iterator[bytes]:
    with file:
        position = HEADER.size
        for number in range(count):
            frame = file.read(FRAME.size)
            if len(frame) < FRAME.size or position + FRAME.size > end:
                raise _corrupt(f"snapshot file {path}: chunk {number} of {count} is missing")
            length, crc = FRAME.unpack(frame)
            position += FRAME.size + length
            if position > end:
                raise _corrupt(f"snapshot file {path}: chunk {number} runs past the footer")
            chunk = file.read(length)
            if crc32c(chunk) != crc:
                raise _corrupt(f"snapshot file {path}: chunk {number} failed its checksum")
            whole = crc32c(chunk, crc32c(frame, whole))
            yield chunk
        if position != end or whole != checksum:
            raise _corrupt(f"snapshot file {path} failed its checksum")


def _check_header(head: bytes, path: Path) -> None:
    magic, version, _ = HEADER.unpack(head)
    if magic != MAGIC or version != VERSION:
        raise _corrupt(f"{path} is not a snapshot file of version {VERSION}")


class Download:
    """A snapshot file fetched into its .part file in byte ranges of any size, as they come. Each frame is checked
    as its last byte comes in; one that fails is cut off the file again, so the partial file's length is always
    where the fetch resumes. finish() checks the footer, fsyncs the file and renames it into place."""

    def __init__(self, path: Path, descriptor: Descriptor):
        self.path = path
        self.partial = path.with_name(path.name + PARTIAL_SUFFIX)
        self.descriptor = descriptor
        self.offset = 0  # bytes in the partial file: where the fetch goes on
        self.done = False  # the footer came and matched
        self._whole = 0  # CRC-32C of the bytes before offset (the footer's excepted)
        self._chunks = 0  # frames checked
        self._head = b""  # a header, frame head or footer begun and not complete
        self._remaining = 0  # bytes of the current chunk still to come
        self._crc = self._expected = 0  # the current chunk's CRC so far, and the one its frame gives
        self._checked = (0, 0, 0)  # (offset, whole, chunks) after the last complete frame: a failed one goes back there
        self._file = open(self.partial, "ab+")
        try:
            self._resume()
        except BaseException:
            self._file.close()
            raise

    def _resume(self) -> None:
        """Walk what an earlier fetch left in the partial file, and cut off a frame that fails."""
        self._file.seek(0)
        while True:
            piece = self._file.read(limits.snapshot_chunk_bytes_max)
            if not piece:
                return
            try:
                self._walk(piece)
            except RocketError:
                self._go_back()
                return

    def append(self, piece: bytes | memoryview) -> None:
        """The next bytes of the file, from offset on. CORRUPT_DATA if they complete a frame that fails its
        checksum (the partial file then ends before that frame again) or do not match the descriptor."""
        if not piece and not self.done:
            raise _corrupt(f"snapshot {self.path.name} ends at byte {self.offset}, before its {self.descriptor.size}")
        self._file.write(piece)
        self._file.flush()
        try:
            self._walk(piece)
        except RocketError:
            self._go_back()
            raise

    def finish(self) -> None:
        """Make the complete file durable under its own name."""
        invariant(self.done, "a snapshot download is finished once its footer checked")
        os.fsync(self._file.fileno())
        self._file.close()
        os.replace(self.partial, self.path)
        fsync_directory(self.path.parent)

    def close(self) -> None:
        """Stop, keeping the partial file for a later fetch of the same snapshot to resume."""
        self._file.close()

    def _go_back(self) -> None:
        self.offset, self._whole, self._chunks = self._checked
        self._head, self._remaining, self.done = b"", 0, False
        self._file.truncate(self.offset)
        self._file.seek(self.offset)

    def _walk(self, piece: bytes | memoryview) -> None:
        view = memoryview(piece)
        if self.offset + len(view) > self.descriptor.size:
            raise _corrupt(f"snapshot {self.path.name} runs past its {self.descriptor.size} bytes")
        at = 0
        while at < len(view):
            if self._remaining:
                part = view[at:at + self._remaining]
                self._crc = crc32c(part, self._crc)
                self._whole = crc32c(part, self._whole)
                self._remaining -= len(part)
                at += len(part)
                self.offset += len(part)
                if not self._remaining:
                    self._end_chunk()
                continue
            part = view[at:at + self._head_bytes() - len(self._head)]
            self._head += part
            at += len(part)
            self.offset += len(part)
            if len(self._head) == self._head_bytes():
                self._end_head()

    def _head_bytes(self) -> int:
        if self.offset - len(self._head) == 0:
            return HEADER.size
        if len(self._head) >= 4 and int.from_bytes(self._head[:4], "little") == FOOTER_MARK:
            return FOOTER.size
        return FRAME.size

    def _end_head(self) -> None:
        head, self._head = self._head, b""
        if self.offset == HEADER.size:
            _check_header(head, self.path)
            self._whole = crc32c(head)
            self._checked = (self.offset, self._whole, self._chunks)
        elif len(head) == FOOTER.size:
            _, count, total, whole = FOOTER.unpack(head)
            if (count, total, whole) != (self._chunks, self.descriptor.size, self.descriptor.checksum) \
                    or self.offset != total or whole != self._whole:
                raise _corrupt(f"snapshot {self.path.name}: its footer does not match the chunks or the descriptor")
            self.done = True
        else:
            length, self._expected = FRAME.unpack(head)
            if self.offset + length + FOOTER.size > self.descriptor.size:
                raise _corrupt(f"snapshot {self.path.name}: chunk {self._chunks} runs past the footer")
            self._whole = crc32c(head, self._whole)
            self._remaining, self._crc = length, 0
            if not length:
                self._end_chunk()

    def _end_chunk(self) -> None:
        if self._crc != self._expected:
            raise _corrupt(f"snapshot {self.path.name}: chunk {self._chunks} failed its checksum")
        self._chunks += 1
        self._checked = (self.offset, self._whole, self._chunks)


class SnapshotFiles:
    """The snapshot files of one node's groups, in one directory: written, read, served and fetched."""

    def __init__(self, directory: Path, clock: Callable[[], float] = time.monotonic):
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        self._clock = clock
        self._served: dict[str, float] = {}  # file name -> when a replica last read it (a fetch in progress)

    def write(self, group: int, index: int, term: int, chunks: Iterable[bytes]) -> bytes:
        """Write a snapshot taken at index (term) and fsync it; its descriptor, Snapshot.data. The caller fsyncs the
        directory (once for many files) before anything refers to it."""
        temporary = self.directory / f"g{group}-i{index}-t{term}{TEMPORARY_SUFFIX}"
        try:
            descriptor = write_file(temporary, chunks)
            os.replace(temporary, self.directory / file_name(group, index, term, descriptor.checksum))
        except BaseException:
            temporary.unlink(missing_ok=True)
            raise
        return descriptor.encode()

    def chunks(self, group: int, snapshot: Snapshot) -> Iterator[bytes]:
        """The chunks of a group's snapshot, checked as they are read (none for the empty snapshot)."""
        name = name_of(group, snapshot)
        if name is None:
            return iter(())
        return read_file(self.directory / name, Descriptor.decode(snapshot.data))

    def has(self, group: int, snapshot: Snapshot) -> bool:
        name = name_of(group, snapshot)
        return name is None or (self.directory / name).exists()

    def download(self, group: int, snapshot: Snapshot) -> Download:
        """Fetch a snapshot's file, resuming what an earlier fetch of it left; a group fetches one snapshot at a
        time, so the partial files of its others are deleted."""
        name = file_of(group, snapshot)
        for partial in self.directory.glob(f"g{group}-*{PARTIAL_SUFFIX}"):
            if partial.name != name + PARTIAL_SUFFIX:
                partial.unlink(missing_ok=True)
        return Download(self.directory / name, Descriptor.decode(snapshot.data))

    def read(self, group: int, name: str, offset: int) -> bytes:
        """At most limits.snapshot_chunk_bytes_max bytes of a snapshot file from offset (none at its end), for a
        replica fetching it."""
        found = _NAME.fullmatch(name)
        if found is None or int(found.group(1)) != group:
            raise RocketError(Code.BAD_REQUEST, f"{name[:limits.error_excerpt_chars_max]!r} is no snapshot of group "
                              f"{group}")
        try:
            descriptor = os.open(self.directory / name, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            raise RocketError(Code.NOT_FOUND, f"snapshot {name} is not on this node (any more)") from None
        self._served[name] = self._clock()
        try:
            if not 0 <= offset <= os.fstat(descriptor).st_size:
                raise RocketError(Code.BAD_REQUEST, f"offset {offset} is outside snapshot {name}")
            return os.pread(descriptor, limits.snapshot_chunk_bytes_max, offset)
        finally:
            os.close(descriptor)

    def delete(self, names: Iterable[str]) -> None:
        for name in names:
            (self.directory / name).unlink(missing_ok=True)

    def delete_older(self, group: int, index: int) -> None:
        """Delete the group's snapshot files from before index, once a snapshot at index is durable in the WAL:
        the group's commit is past theirs, so no core installs them again (one fetched and found stale too). A file
        a replica read within limits.snapshot_served_keep_s stays until the group's next snapshot: that replica is
        fetching it, and would otherwise start over with the next one, which a fast enough writer outdates again."""
        now = self._clock()
        for path in self.directory.glob(f"g{group}-i*{SUFFIX}"):
            found = _NAME.fullmatch(path.name)
            if found is not None and int(found.group(1)) == group and int(found.group(2)) < index:
                if now - self._served.get(path.name, float("-inf")) < limits.snapshot_served_keep_s:
                    continue
                path.unlink(missing_ok=True)
                self._served.pop(path.name, None)

    def keep_only(self, names: set[str]) -> None:
        """Delete every file but these: at a start, those the WAL refers to (what a crash left half-written or
        unreferenced goes)."""
        for path in self.directory.iterdir():
            if path.name not in names:
                path.unlink(missing_ok=True)
