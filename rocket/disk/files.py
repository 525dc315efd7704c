"""File helpers every durable writer needs."""

from __future__ import annotations

import errno
import os
from pathlib import Path


def fsync_directory(directory: Path) -> None:
    """Make a directory's entries durable: files created, renamed or removed in it survive a crash."""
    descriptor = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def replace_durably(path: Path, data: bytes) -> None:
    """Write a small file whole or not at all: a temporary beside it, fsynced, renamed over it, the directory fsynced.
    A crash leaves the old file or the new one, never a mix (a leftover temporary is overwritten next time)."""
    temporary = path.with_name(path.name + ".tmp")
    with open(temporary, "wb") as file:
        file.write(data)
        file.flush()
        os.fsync(file.fileno())
    os.replace(temporary, path)
    fsync_directory(path.parent)


def out_of_space(error: BaseException) -> bool:
    """Whether an error is the file system refusing bytes for want of space (or of quota): an operating
    error the writer survives, unlike damage."""
    return isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT)


def says_out_of_space(error: BaseException) -> bool:
    """out_of_space, or an error of a library that says so in words alone: LevelDB's (plyvel.IOError) carry no errno,
    and one that failed so refuses every write after it until it is opened again."""
    return out_of_space(error) or (isinstance(error, OSError) and os.strerror(errno.ENOSPC) in str(error))
