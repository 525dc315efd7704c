"""The test disk of benchmarks/faults.py: a FUSE passthrough (pyfuse3, on trio) over a backing directory that
delays fsync and fdatasync, and optionally writes, by the DiskSettings its server is given (faults.py `slowfs`
polls a control file for them), as Scylla's CharybdeFS; that fills up, as a full disk (free_bytes); and, lazy,
loses what was not fsynced at a crash, as Jepsen's LazyFS: see UndoLog and SlowOperations.crash for what a crash
drops and what it keeps.
"""

from __future__ import annotations

import errno
import os
import stat
import sys
import time
from dataclasses import dataclass

import trio

FSYNC_DELAY_FLOOR_S_PER_FACTOR = 0.0005  # a slow fsync takes at least factor x 0.5 ms, even over a fast real one
UNDO_BYTES_MAX = 1 << 30  # a lazy disk keeps at most 1 GiB of overwritten synced bytes; past it writes fail (EIO)


@dataclass(frozen=True)
class DiskSettings:
    factor: float = 1.0  # fsync and fdatasync take this many times as long (1: untouched)
    write_delay_ms: float = 0.0  # added to every write
    lazy: bool = False  # track what is not fsynced, so that a crash can drop it (from when it is turned on)
    crash: int = 0  # a counter: each increase drops everything not fsynced, as a power loss would (when lazy)
    # A full disk: from when it is set, the disk has this many bytes free. statfs shows what is left; writes that grow
    # a file use it up, and one that would grow it past what is left fails with ENOSPC; deletes give their bytes
    # back. -1: the real disk's free space, untouched.
    free_bytes: int = -1

    def check(self) -> None:
        if self.factor < 1 or self.write_delay_ms < 0:
            raise ValueError("factor must be at least 1 and write_delay_ms not negative")


def fsync_delay_s(factor: float, real_s: float) -> float:
    if factor <= 1:
        return 0.0
    return max((factor - 1) * real_s, factor * FSYNC_DELAY_FLOOR_S_PER_FACTOR)


class UndoLog:
    """What one file held at its last fsync, for the changes made since: its size then, and the synced bytes that
    writes and truncations have overwritten since (each byte saved once, the first time). revert() puts the file
    back as it was at that fsync. It works on a descriptor of its own (O_RDWR), opened on the file's backing."""

    def __init__(self, descriptor: int):
        self.descriptor = descriptor
        self.synced_size = os.fstat(descriptor).st_size
        self.saved: list[tuple[int, bytes]] = []  # (offset, the synced bytes there); the ranges never overlap
        self.covered: list[tuple[int, int]] = []  # the saved ranges, [start, end), sorted and merged
        self.saved_bytes = 0

    def before_change(self, start: int, end: int) -> None:
        """Save the synced bytes of [start, end) not saved yet: call before writing or truncating them."""
        end = min(end, self.synced_size)
        for gap_start, gap_end in self._gaps(start, end):
            data = os.pread(self.descriptor, gap_end - gap_start, gap_start)
            if len(data) != gap_end - gap_start:  # the file is shorter than its synced size: a truncation
                raise AssertionError(f"read {len(data)} of {gap_end - gap_start} synced bytes at {gap_start}")
            self.saved.append((gap_start, data))
            self.saved_bytes += len(data)
            self._cover(gap_start, gap_end)

    def _gaps(self, start: int, end: int) -> list[tuple[int, int]]:
        gaps = []
        for covered_start, covered_end in self.covered:
            if covered_end <= start:
                continue
            if covered_start >= end:
                break
            if covered_start > start:
                gaps.append((start, covered_start))
            start = max(start, covered_end)
        if start < end:
            gaps.append((start, end))
        return gaps

    def _cover(self, start: int, end: int) -> None:
        merged = []
        for each_start, each_end in sorted(self.covered + [(start, end)]):
            if merged and each_start <= merged[-1][1]:
                merged[-1] = (merged[-1][0], max(merged[-1][1], each_end))
            else:
                merged.append((each_start, each_end))
        self.covered = merged

    def revert(self) -> int:
        """Back to the last fsync; the bytes this drops (written past the synced size, or over synced bytes)."""
        size = os.fstat(self.descriptor).st_size
        dropped = max(0, size - self.synced_size) + self.saved_bytes
        os.ftruncate(self.descriptor, self.synced_size)
        for offset, data in self.saved:
            os.pwrite(self.descriptor, data, offset)
        return dropped

    def close(self) -> None:
        os.close(self.descriptor)


def make_operations():
    import pyfuse3
    from pyfuse3 import FUSEError

    def fuse_error(error: OSError) -> FUSEError:
        return FUSEError(error.errno or errno.EIO)

    class SlowOperations(pyfuse3.Operations):
        """pyfuse3's passthroughfs example, with one backing descriptor per open (so a file opened for reading
        and then for writing works), directory renames that move the paths below them, and slow fsyncs.

        Lazy, it also keeps per file an UndoLog of its changes since its last fsync or fdatasync, and the files
        created since their directory's last fsync (or their own: as ext4 and XFS make a new file's entry durable
        with the file), and crash() drops both. Renames, unlinks, links and mkdir last at once (not modeled)."""

        def __init__(self, backing: str):
            super().__init__()
            self._settings = DiskSettings()
            self.grown = 0  # bytes files grew by (less those deleted) since free_bytes was set
            self.paths: dict[int, set[str]] = {pyfuse3.ROOT_INODE: {backing}}
            self.lookups: dict[int, int] = {}
            self.open_descriptors: dict[int, set[int]] = {}  # inode -> backing descriptors open on it
            self.descriptor_inodes: dict[int, int] = {}
            self.unsynced: dict[int, UndoLog] = {}  # lazy: inode -> its changes since its last fsync
            self.unsynced_entries: dict[int, str] = {}  # lazy: inode -> backing path of a file created, not durable

        @property
        def settings(self) -> DiskSettings:
            return self._settings

        @settings.setter
        def settings(self, settings: DiskSettings) -> None:
            if settings.free_bytes != self._settings.free_bytes:
                self.grown = 0  # the disk has free_bytes left from now on
            self._settings = settings

        # ---- full: a disk with free_bytes left

        def free_left(self) -> int | None:
            """Bytes the disk has left (free_bytes less what files grew by since), or None: the real disk's."""
            if self.settings.free_bytes < 0:
                return None
            return max(0, self.settings.free_bytes - self.grown)

        def growing(self, descriptor: int, end: int) -> None:
            """Before a write up to end of the file: ENOSPC if it would grow the file past what is left."""
            left = self.free_left()
            if left is None:
                return
            grow = max(0, end - os.fstat(descriptor).st_size)
            if grow > left:
                raise FUSEError(errno.ENOSPC)
            self.grown += grow

        # ---- lazy: what is not fsynced, and the crash that drops it

        def changing(self, inode: int, backing: int | str, start: int, end: int) -> None:
            """Before a write or truncation of [start, end) of the file (backing: a descriptor or path of it)."""
            if not self.settings.lazy:
                return
            undo = self.unsynced.get(inode)
            if undo is None:
                source = f"/proc/self/fd/{backing}" if isinstance(backing, int) else backing
                try:
                    undo = self.unsynced[inode] = UndoLog(os.open(source, os.O_RDWR | os.O_CLOEXEC))
                except OSError as error:
                    raise fuse_error(error) from None
            if sum(each.saved_bytes for each in self.unsynced.values()) + (end - start) > UNDO_BYTES_MAX:
                print(f"slowfs: more than {UNDO_BYTES_MAX} unsynced overwritten bytes; failing the write",
                      file=sys.stderr, flush=True)
                raise FUSEError(errno.EIO)
            undo.before_change(start, end)

        def synced(self, inode: int) -> None:
            undo = self.unsynced.pop(inode, None)
            if undo is not None:
                undo.close()
            self.unsynced_entries.pop(inode, None)

        def crash(self) -> dict:
            """Drop everything not fsynced, as a power loss would: every file back to its content at its last
            fsync, and files created since their last fsync or their directory's gone. The counts dropped."""
            bytes_dropped = 0
            for inode, undo in self.unsynced.items():
                bytes_dropped += undo.revert()
                undo.close()
                self.invalidate(inode)
            entries_dropped = 0
            for inode, path in self.unsynced_entries.items():
                try:
                    if os.lstat(path).st_ino == inode:
                        os.unlink(path)
                        print(f"slowfs: crash: removed {path}, created and not made durable", file=sys.stderr,
                              flush=True)
                        entries_dropped += 1
                        self.forget_path(inode, path)
                        self.invalidate(inode)
                except FileNotFoundError:
                    pass
            counts = {"files_reverted": len(self.unsynced), "bytes_dropped": bytes_dropped,
                      "files_removed": entries_dropped}
            self.unsynced.clear()
            self.unsynced_entries.clear()
            return counts

        @staticmethod
        def invalidate(inode: int) -> None:
            """The kernel forgets the inode's cached pages and attributes, which no longer hold after a crash."""
            try:
                pyfuse3.invalidate_inode(inode, attr_only=False)
            except OSError:
                pass  # an inode the kernel does not know: nothing cached

        def path(self, inode: int) -> str:
            try:
                return next(iter(self.paths[inode]))
            except (KeyError, StopIteration):
                raise FUSEError(errno.ENOENT) from None

        def remember(self, inode: int, path: str) -> None:
            self.lookups[inode] = self.lookups.get(inode, 0) + 1
            self.paths.setdefault(inode, set()).add(path)

        def forget_path(self, inode: int, path: str) -> None:
            paths = self.paths.get(inode)
            if paths is not None:
                paths.discard(path)

        async def forget(self, inode_list) -> None:
            for inode, count in inode_list:
                left = self.lookups.get(inode, 0) - count
                if left > 0:
                    self.lookups[inode] = left
                    continue
                self.lookups.pop(inode, None)
                if inode not in self.open_descriptors:
                    self.paths.pop(inode, None)

        def attributes(self, path: str | None = None, descriptor: int | None = None):
            try:
                status = os.lstat(path) if descriptor is None else os.fstat(descriptor)
            except OSError as error:
                raise fuse_error(error) from None
            entry = pyfuse3.EntryAttributes()
            for name in ("st_ino", "st_mode", "st_nlink", "st_uid", "st_gid", "st_rdev", "st_size", "st_atime_ns",
                         "st_mtime_ns", "st_ctime_ns", "st_blksize", "st_blocks"):
                setattr(entry, name, getattr(status, name))
            entry.generation = 0
            entry.entry_timeout = 0
            entry.attr_timeout = 0
            return entry

        async def lookup(self, parent_inode, name, ctx=None):
            name_text = os.fsdecode(name)
            path = os.path.join(self.path(parent_inode), name_text)
            entry = self.attributes(path=path)
            if name_text not in (".", ".."):
                self.remember(entry.st_ino, path)
            return entry

        async def getattr(self, inode, ctx=None):
            descriptors = self.open_descriptors.get(inode)
            if descriptors:
                return self.attributes(descriptor=next(iter(descriptors)))
            return self.attributes(path=self.path(inode))

        async def setattr(self, inode, attr, fields, fh, ctx):
            target = fh if fh is not None else self.path(inode)
            try:
                if fields.update_size:
                    size = os.fstat(fh).st_size if fh is not None else os.stat(target).st_size
                    self.changing(inode, target, attr.st_size, size)
                    os.truncate(target, attr.st_size)
                    self.grown -= max(0, size - attr.st_size)  # cut bytes are free again (growing is sparse)
                if fields.update_mode:
                    os.chmod(target, stat.S_IMODE(attr.st_mode))
                if fields.update_uid or fields.update_gid:
                    uid = attr.st_uid if fields.update_uid else -1
                    gid = attr.st_gid if fields.update_gid else -1
                    os.chown(target, uid, gid) if fh is not None else os.lchown(target, uid, gid)
                if fields.update_atime or fields.update_mtime:
                    old = os.fstat(fh) if fh is not None else os.lstat(target)
                    atime_ns = attr.st_atime_ns if fields.update_atime else old.st_atime_ns
                    mtime_ns = attr.st_mtime_ns if fields.update_mtime else old.st_mtime_ns
                    if fh is not None:
                        os.utime(fh, ns=(atime_ns, mtime_ns))
                    else:
                        os.utime(target, ns=(atime_ns, mtime_ns), follow_symlinks=False)
            except OSError as error:
                raise fuse_error(error) from None
            return await self.getattr(inode)

        async def readlink(self, inode, ctx):
            try:
                return os.fsencode(os.readlink(self.path(inode)))
            except OSError as error:
                raise fuse_error(error) from None

        async def opendir(self, inode, ctx):
            return inode

        async def readdir(self, fh, start_id, token):
            directory = self.path(fh)
            try:
                names = os.listdir(directory)
            except OSError as error:
                raise fuse_error(error) from None
            entries = []
            for name in names:
                try:
                    entry = self.attributes(path=os.path.join(directory, name))
                except FUSEError:
                    continue  # removed since listdir
                entries.append((entry.st_ino, name, entry))
            # Offsets are inode numbers, so a listing that changes between calls neither repeats nor skips
            # the entries that stay.
            for inode, name, entry in sorted(entries):
                if inode <= start_id:
                    continue
                if not pyfuse3.readdir_reply(token, os.fsencode(name), entry, inode):
                    break
                self.remember(inode, os.path.join(directory, name))

        async def fsyncdir(self, fh, datasync):
            def sync() -> None:
                descriptor = os.open(self.path(fh), os.O_RDONLY | os.O_DIRECTORY)
                try:
                    os.fsync(descriptor)
                finally:
                    os.close(descriptor)

            if self.settings.lazy:  # the entries of the directory are durable from now
                directory = self.path(fh)
                for inode in [each for each, path in self.unsynced_entries.items()
                              if os.path.dirname(path) == directory]:
                    del self.unsynced_entries[inode]
            await self.slow_sync(sync)

        def make_node(self, parent_inode, name, make, owner) -> pyfuse3.EntryAttributes:
            """make(path) a node in the parent, owner(path) give it the caller's uid and gid; its attributes."""
            path = os.path.join(self.path(parent_inode), os.fsdecode(name))
            try:
                make(path)
                owner(path)
            except OSError as error:
                raise fuse_error(error) from None
            entry = self.attributes(path=path)
            self.remember(entry.st_ino, path)
            return entry

        async def mkdir(self, parent_inode, name, mode, ctx):
            return self.make_node(parent_inode, name, lambda path: os.mkdir(path, mode & ~ctx.umask),
                               lambda path: os.chown(path, ctx.uid, ctx.gid))

        async def mknod(self, parent_inode, name, mode, rdev, ctx):
            return self.make_node(parent_inode, name, lambda path: os.mknod(path, mode & ~ctx.umask, rdev),
                               lambda path: os.chown(path, ctx.uid, ctx.gid))

        async def symlink(self, parent_inode, name, target, ctx):
            return self.make_node(parent_inode, name, lambda path: os.symlink(os.fsdecode(target), path),
                               lambda path: os.lchown(path, ctx.uid, ctx.gid))

        async def link(self, inode, new_parent_inode, new_name, ctx):
            path = os.path.join(self.path(new_parent_inode), os.fsdecode(new_name))
            try:
                os.link(self.path(inode), path, follow_symlinks=False)
            except OSError as error:
                raise fuse_error(error) from None
            self.remember(inode, path)
            return await self.getattr(inode)

        async def remove(self, parent_inode, name, remove) -> None:
            path = os.path.join(self.path(parent_inode), os.fsdecode(name))
            try:
                status = os.lstat(path)
                remove(path)
            except OSError as error:
                raise fuse_error(error) from None
            self.forget_path(status.st_ino, path)
            if status.st_nlink <= 1 and stat.S_ISREG(status.st_mode):
                self.grown -= status.st_size  # its space is free again
            if self.unsynced_entries.get(status.st_ino) == path:
                del self.unsynced_entries[status.st_ino]
            if status.st_nlink <= 1 and stat.S_ISREG(status.st_mode):
                self.synced(status.st_ino)  # the unlink lasts at once, so the file's content is gone for good

        async def unlink(self, parent_inode, name, ctx):
            await self.remove(parent_inode, name, os.unlink)

        async def rmdir(self, parent_inode, name, ctx):
            await self.remove(parent_inode, name, os.rmdir)

        async def rename(self, parent_inode_old, name_old, parent_inode_new, name_new, flags, ctx):
            if flags:
                raise FUSEError(errno.EINVAL)  # RENAME_NOREPLACE, RENAME_EXCHANGE: rocket does not use them
            old = os.path.join(self.path(parent_inode_old), os.fsdecode(name_old))
            new = os.path.join(self.path(parent_inode_new), os.fsdecode(name_new))
            try:
                replaced = os.lstat(new).st_ino
            except OSError:
                replaced = None
            try:
                os.rename(old, new)
                inode = os.lstat(new).st_ino
            except OSError as error:
                raise fuse_error(error) from None
            if replaced is not None and replaced != inode:
                self.forget_path(replaced, new)
                self.unsynced_entries.pop(replaced, None)
            self.unsynced_entries.pop(inode, None)  # a rename lasts at once, and with it the entry it moves
            for each, path in list(self.unsynced_entries.items()):  # files created below a renamed directory
                if path.startswith(old + os.sep):
                    self.unsynced_entries[each] = new + path[len(old):]
            for paths in self.paths.values():  # the path itself, and everything below a renamed directory
                moved = {each for each in paths if each == old or each.startswith(old + os.sep)}
                paths.difference_update(moved)
                paths.update(new + each[len(old):] for each in moved)

        async def statfs(self, ctx):
            root = self.path(pyfuse3.ROOT_INODE)
            try:
                status = os.statvfs(root)
            except OSError as error:
                raise fuse_error(error) from None
            data = pyfuse3.StatvfsData()
            for name in ("f_bsize", "f_frsize", "f_blocks", "f_bfree", "f_bavail", "f_files", "f_ffree", "f_favail"):
                setattr(data, name, getattr(status, name))
            data.f_namemax = status.f_namemax
            left = self.free_left()
            if left is not None:
                data.f_bfree = data.f_bavail = min(status.f_bavail, left // status.f_frsize)
            return data

        def opened(self, inode: int, descriptor: int):
            self.open_descriptors.setdefault(inode, set()).add(descriptor)
            self.descriptor_inodes[descriptor] = inode
            # Lazy, the kernel must not keep a file's pages from one open to the next: a crash changes them.
            return pyfuse3.FileInfo(fh=descriptor, keep_cache=not self.settings.lazy)

        @staticmethod
        def backing_flags(flags: int) -> int:
            # The kernel has already placed appends at the end; O_APPEND would make pwrite ignore the offset.
            # O_DIRECT would demand aligned buffers of this process; the delay is what we emulate, not the cache.
            return flags & ~(os.O_APPEND | getattr(os, "O_DIRECT", 0)) | os.O_CLOEXEC

        async def open(self, inode, flags, ctx):
            path = self.path(inode)
            try:
                if flags & os.O_TRUNC:
                    self.changing(inode, path, 0, os.stat(path).st_size)
                descriptor = os.open(path, self.backing_flags(flags))
            except OSError as error:
                raise fuse_error(error) from None
            return self.opened(inode, descriptor)

        async def create(self, parent_inode, name, mode, flags, ctx):
            path = os.path.join(self.path(parent_inode), os.fsdecode(name))
            new = not os.path.lexists(path)
            try:
                descriptor = os.open(path, self.backing_flags(flags) | os.O_CREAT, mode & ~ctx.umask)
                os.fchown(descriptor, ctx.uid, ctx.gid)
            except OSError as error:
                raise fuse_error(error) from None
            entry = self.attributes(descriptor=descriptor)
            self.remember(entry.st_ino, path)
            if new and self.settings.lazy:
                self.unsynced_entries[entry.st_ino] = path
                self.changing(entry.st_ino, descriptor, 0, 0)  # its synced content: none
            return self.opened(entry.st_ino, descriptor), entry

        async def read(self, fh, off, size):
            try:
                return os.pread(fh, size, off)
            except OSError as error:
                raise fuse_error(error) from None

        async def write(self, fh, off, buf):
            delay_ms = self.settings.write_delay_ms
            if delay_ms:
                await trio.sleep(delay_ms / 1000)
            self.growing(fh, off + len(buf))
            self.changing(self.descriptor_inodes[fh], fh, off, off + len(buf))
            try:
                return os.pwrite(fh, buf, off)
            except OSError as error:
                raise fuse_error(error) from None

        async def flush(self, fh):
            pass  # close() of one descriptor: nothing to do until release

        async def release(self, fh):
            inode = self.descriptor_inodes.pop(fh)
            descriptors = self.open_descriptors[inode]
            descriptors.discard(fh)
            if not descriptors:
                del self.open_descriptors[inode]
                if inode not in self.lookups:
                    self.paths.pop(inode, None)
            try:
                os.close(fh)
            except OSError as error:
                raise fuse_error(error) from None

        async def fsync(self, fh, datasync):
            # Synced as of the call: a write that comes in while the real sync runs is not in it.
            self.synced(self.descriptor_inodes[fh])
            await self.slow_sync(lambda: (os.fdatasync if datasync else os.fsync)(fh))

        async def slow_sync(self, sync) -> None:
            """Run the real sync in a thread (other requests go on), then stretch it by the factor in force."""
            started = time.monotonic()
            try:
                await trio.to_thread.run_sync(sync)
            except OSError as error:
                raise fuse_error(error) from None
            delay_s = fsync_delay_s(self.settings.factor, time.monotonic() - started)
            if delay_s:
                await trio.sleep(delay_s)

    return SlowOperations
