"""LocalDirectoryStore: the tier as files under a root directory (dev mode's default and tests); an object is
written whole or not at all, with its MD5 in a footer; blocking I/O runs in threads."""

from __future__ import annotations

import errno
import hashlib
import os
import secrets
import stat
from functools import partial
from pathlib import Path

import trio

from rocket.disk.files import fsync_directory
from rocket.errors import Code, RocketError
from rocket.limits.tier import local_store_threads_max
from rocket.tier.objectstore import (ObjectInfo, check_data, check_key, check_prefix, check_range, data_md5,
                                     list_objects_max)


FOOTER_MAGIC = b"rktobj01"  # ends every object file: its format version, and proof the footer is one
FOOTER_BYTES = 16 + len(FOOTER_MAGIC)  # MD5 digest, then the magic
READ_CHUNK_BYTES = 1 << 30  # Linux returns at most ~2 GiB from one pread


class LocalDirectoryStore:
    """Objects as files under root. An object is the file root/<key> holding the bytes followed by a footer (MD5,
    magic), written to a hidden temporary file, fsynced, renamed over the key and the directory fsynced.
    Limitation: as in any file system, key 'a' and key 'a/b' cannot both exist (put of the second is BAD_REQUEST);
    S3 allows it. Directories emptied by delete are kept. durable=False skips the fsyncs, for a cache whose damaged
    file is fetched again (a crash may leave it torn, or not there)."""

    def __init__(self, root: Path | str, durable: bool = True):
        self.root = Path(root)
        self.durable = durable
        self._threads = trio.CapacityLimiter(local_store_threads_max)
        self._closed = False

    async def __aenter__(self) -> "LocalDirectoryStore":
        return self

    async def __aexit__(self, *exception) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        self._closed = True

    async def put(self, key: str, data: bytes, md5: str | None = None) -> ObjectInfo:
        check_key(key)
        data = check_data(key, data)
        return await self._run("put", key, partial(self._put, key, data, md5))

    async def get(self, key: str, start: int = 0, end: int | None = None) -> bytes:
        check_key(key)
        check_range(key, start, end)
        return await self._run("get", key, partial(self._get, key, start, end))

    async def head(self, key: str) -> ObjectInfo | None:
        check_key(key)
        return await self._run("head", key, partial(self._head, key))

    async def list(self, prefix: str = "") -> list[ObjectInfo]:
        check_prefix(prefix)
        return await self._run("list", prefix, partial(self._list, prefix))

    async def delete(self, key: str) -> None:
        check_key(key)
        await self._run("delete", key, partial(self._delete, key))

    async def _run(self, operation: str, key: str, function):
        if self._closed:
            raise RocketError(Code.UNAVAILABLE, f"local object store {self.root} is closed ({operation} {key!r})")
        try:
            return await trio.to_thread.run_sync(function, limiter=self._threads)
        except RocketError:
            raise
        except OSError as error:
            if error.errno == errno.ENOSPC:
                reason = "the disk is full"
            else:
                reason = error.strerror or str(error)
            raise RocketError(Code.UNAVAILABLE, f"local object store {operation} {key!r} under {self.root} "
                                                f"failed: {reason}") from None

    # The methods below run in a worker thread.

    def _path(self, key: str) -> Path:
        return self.root.joinpath(*key.split("/"))

    def _put(self, key: str, data: bytes, md5: str | None) -> ObjectInfo:
        path = self._path(key)
        digest = data_md5(key, data, md5)  # computed here, in a worker thread, when not given
        self._make_directories(path.parent, key)
        # Not named after the key: a 255-byte segment leaves no room in NAME_MAX for a suffix.
        temporary = path.parent / f".rocket-tmp-{secrets.token_hex(8)}"
        try:
            with open(temporary, "xb") as file:
                file.write(data)
                file.write(digest + FOOTER_MAGIC)
                file.flush()
                if self.durable:
                    os.fsync(file.fileno())
            os.replace(temporary, path)
        except IsADirectoryError:
            raise RocketError(Code.BAD_REQUEST, f"put {key!r}: other keys exist under {key!r}/, and the local "
                                                "store keeps a key and its sub-keys apart") from None
        finally:
            if temporary.exists():
                temporary.unlink()
        if self.durable:
            fsync_directory(path.parent)
        return ObjectInfo(key, len(data), digest.hex())

    def _make_directories(self, directory: Path, key: str) -> None:
        """Create the directories down to directory, fsyncing each new one's parent so it survives a crash."""
        self.root.mkdir(parents=True, exist_ok=True)
        current = self.root
        for part in directory.relative_to(self.root).parts:
            parent, current = current, current / part
            try:
                current.mkdir()
            except FileExistsError:
                if not current.is_dir():
                    raise RocketError(Code.BAD_REQUEST, f"put {key!r}: key {current.relative_to(self.root)} "
                                                        "exists, and the local store cannot hold keys under "
                                                        "it") from None
                continue
            if self.durable:
                fsync_directory(parent)

    def _get(self, key: str, start: int, end: int | None) -> bytes:
        descriptor = self._open_object(key)
        if descriptor is None:
            raise RocketError(Code.NOT_FOUND, f"no object {key!r} under {self.root}")
        try:
            size, digest = _read_footer(descriptor, key)
            stop = size if end is None else min(end, size)
            begin = min(start, stop)
            data = _pread_exactly(descriptor, stop - begin, begin, key)
        finally:
            os.close(descriptor)
        if begin == 0 and stop == size and hashlib.md5(data).digest() != digest:
            raise RocketError(Code.CORRUPT_DATA, f"object {key!r} under {self.root} fails its MD5 checksum")
        return data

    def _open_object(self, key: str) -> int | None:
        """A read descriptor on the object's file, or None when key names no file (a directory is none)."""
        try:
            descriptor = os.open(self._path(key), os.O_RDONLY | os.O_CLOEXEC)
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            return None
        if not stat.S_ISREG(os.fstat(descriptor).st_mode):
            os.close(descriptor)
            return None
        return descriptor

    def _head(self, key: str) -> ObjectInfo | None:
        descriptor = self._open_object(key)
        if descriptor is None:
            return None
        try:
            size, digest = _read_footer(descriptor, key)
        finally:
            os.close(descriptor)
        return ObjectInfo(key, size, digest.hex())

    def _list(self, prefix: str) -> list[ObjectInfo]:
        directory_key, _, name_prefix = prefix.rpartition("/")
        start = self._path(directory_key) if directory_key else self.root
        found: list[ObjectInfo] = []
        pending = [(start, directory_key, name_prefix)]
        while pending:
            directory, directory_key, name_prefix = pending.pop()
            try:
                entries = list(os.scandir(directory))
            except (FileNotFoundError, NotADirectoryError):
                continue
            for entry in entries:
                if entry.name.startswith(".") or not entry.name.startswith(name_prefix):
                    continue  # temporary files, and names the prefix excludes
                key = f"{directory_key}/{entry.name}" if directory_key else entry.name
                if entry.is_dir(follow_symlinks=False):
                    pending.append((Path(entry.path), key, ""))
                    continue
                info = self._head(key)
                if info is None:
                    continue  # deleted since the scan
                found.append(info)
                if len(found) > list_objects_max:
                    raise RocketError(Code.OVERLOADED, f"more than {list_objects_max} objects start with "
                                                       f"{prefix!r} under {self.root}; list a narrower prefix")
        found.sort(key=lambda info: info.key)
        return found

    def _delete(self, key: str) -> None:
        path = self._path(key)
        try:
            os.unlink(path)
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            return
        except PermissionError:
            if path.is_dir():
                return  # unlink of a directory is EPERM on some systems; a directory is no object
            raise
        fsync_directory(path.parent)


def _read_footer(descriptor: int, key: str) -> tuple[int, bytes]:
    """(data size, MD5 digest) from the object file's footer, or CORRUPT_DATA."""
    file_bytes = os.fstat(descriptor).st_size
    footer = os.pread(descriptor, FOOTER_BYTES, file_bytes - FOOTER_BYTES) if file_bytes >= FOOTER_BYTES else b""
    if len(footer) != FOOTER_BYTES or not footer.endswith(FOOTER_MAGIC):
        raise RocketError(Code.CORRUPT_DATA, f"object file for {key!r} has no valid footer "
                                             f"({file_bytes} bytes); it is damaged or was not written by rocket")
    return file_bytes - FOOTER_BYTES, footer[:16]


def _pread_exactly(descriptor: int, count: int, offset: int, key: str) -> bytes:
    chunks = []
    remaining = count
    while remaining > 0:
        chunk = os.pread(descriptor, min(remaining, READ_CHUNK_BYTES), offset)
        if not chunk:
            raise RocketError(Code.CORRUPT_DATA, f"object file for {key!r} shrank while being read")
        chunks.append(chunk)
        offset += len(chunk)
        remaining -= len(chunk)
    return b"".join(chunks)

