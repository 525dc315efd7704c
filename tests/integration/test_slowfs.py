"""benchmarks/faults.py's slowfs, mounted for real over FUSE: a passthrough that files and a rocket node work on,
that makes fsync slower when its control file says so, and that, lazy, drops every write not fsynced at a crash."""

from __future__ import annotations

import errno
import os
import sys
import time
from pathlib import Path

import pytest

from rocket.client import connect, open_consumer, open_producer
from rocket.model import Message
from tests.conftest import ServerProcess, skip_module_without_fuse

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import faults  # noqa: E402
from slowfs import FSYNC_DELAY_FLOOR_S_PER_FACTOR, UndoLog  # noqa: E402

skip_module_without_fuse("slowfs")


@pytest.fixture(params=[False], ids=["eager"])
def slowfs(tmp_path, request):
    """(mountpoint, backing, control file) of a slowfs at factor 1, lazy if the param says so; unmounted after
    the test."""
    backing, mountpoint, control = tmp_path / "backing", tmp_path / "mount", tmp_path / "slowfs.json"
    backing.mkdir()
    mountpoint.mkdir()
    faults.write_control(control, {"factor": 1, "lazy": request.param})
    process = faults.start_slowfs(backing, mountpoint, control, tmp_path / "slowfs.log")
    try:
        yield mountpoint, backing, control
    finally:
        faults.stop_process(process.pid)
        assert process.wait(5) == 0, (tmp_path / "slowfs.log").read_text()
        assert not faults.is_slowfs_mount(mountpoint)


def timed_fdatasyncs(path: Path, count: int) -> float:
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        started = time.monotonic()
        for _ in range(count):
            os.write(descriptor, b"x" * 4096)
            os.fdatasync(descriptor)
        return time.monotonic() - started
    finally:
        os.close(descriptor)


def test_files_pass_through(slowfs):
    """Writes, renames (of files and of a directory), truncation, fsync and reads through the mount land in
    the backing directory, byte for byte."""
    mountpoint, backing, _ = slowfs
    (mountpoint / "dir").mkdir()
    (mountpoint / "dir" / "a.tmp").write_bytes(b"alpha" * 1000)
    os.replace(mountpoint / "dir" / "a.tmp", mountpoint / "dir" / "a")
    (mountpoint / "dir" / "b").write_bytes(b"old")
    os.replace(mountpoint / "dir" / "a", mountpoint / "dir" / "b")  # over an existing file
    os.rename(mountpoint / "dir", mountpoint / "moved")
    with open(mountpoint / "moved" / "b", "r+b") as file:
        file.truncate(10)
        file.seek(0, os.SEEK_END)
        file.write(b"-tail")
        file.flush()
        os.fsync(file.fileno())
    directory = os.open(mountpoint / "moved", os.O_RDONLY | os.O_DIRECTORY)
    os.fsync(directory)
    os.close(directory)
    assert (mountpoint / "moved" / "b").read_bytes() == b"alphaalpha-tail"
    assert (backing / "moved" / "b").read_bytes() == b"alphaalpha-tail"
    assert sorted(os.listdir(backing)) == ["moved"] and os.listdir(backing / "moved") == ["b"]


def test_factor_makes_fsync_slower(slowfs):
    """At factor 10, each fdatasync takes at least 10 x 0.5 ms: 40 of them at least 0.2 s."""
    mountpoint, _, control = slowfs
    count = 40
    fast_s = timed_fdatasyncs(mountpoint / "log", count)
    faults.write_control(control, {"factor": 10})
    time.sleep(3 * faults.CONTROL_POLL_S)
    slow_s = timed_fdatasyncs(mountpoint / "log", count)
    print(f"{count} fdatasyncs: {fast_s:.3f} s at factor 1, {slow_s:.3f} s at factor 10")
    assert slow_s >= count * 10 * FSYNC_DELAY_FLOOR_S_PER_FACTOR
    assert (mountpoint / "log").stat().st_size == 2 * count * 4096


def test_a_full_disk_refuses_growth_and_takes_it_again_once_freed(slowfs):
    """With free_bytes set, statfs shows what is left; a write that would grow a file past it stops short, and the
    next fails with ENOSPC, while overwrites still pass; truncating and deleting give bytes back; -1 gives the real
    disk back."""
    mountpoint, _, control = slowfs
    (mountpoint / "ballast").write_bytes(b"b" * 1_000_000)
    faults.write_control(control, {"free_bytes": 2_000_000})
    time.sleep(3 * faults.CONTROL_POLL_S)
    status = os.statvfs(mountpoint)
    assert status.f_bavail * status.f_frsize <= 2_000_000
    with open(mountpoint / "log", "wb", buffering=0) as file:
        file.write(b"x" * 1_500_000)
        written = file.write(b"y" * 600_000)  # the kernel writes it in pieces: those that fit
        assert written is not None and written < 500_000
        with pytest.raises(OSError) as refused:
            file.write(b"y" * 600_000)
        assert refused.value.errno == errno.ENOSPC
        file.truncate(1_500_000)
        file.seek(0)
        file.write(b"z" * 100_000)  # within the file: no new space
    status = os.statvfs(mountpoint)
    assert status.f_bavail * status.f_frsize <= 500_000
    (mountpoint / "ballast").unlink()
    with open(mountpoint / "log", "ab", buffering=0) as file:
        file.write(b"y" * 600_000)  # the ballast's bytes were freed
    assert (mountpoint / "log").stat().st_size == 2_100_000
    faults.write_control(control, {"free_bytes": -1})
    time.sleep(3 * faults.CONTROL_POLL_S)
    with open(mountpoint / "log", "ab", buffering=0) as file:
        file.write(b"w" * 3_000_000)


async def produce_and_consume(server: str, group: str, bodies: list[bytes]) -> list[bytes]:
    async with connect(server) as channel:
        async with open_producer(channel, "orders") as producer:
            for body in bodies:
                await producer.send(Message(body))
        async with open_consumer(channel, "orders", group, start="earliest", wait_ms=300) as consumer:
            received: list[bytes] = []
            while messages := await consumer.poll():
                received.extend(message.body for message in messages)
            return received


@pytest.mark.parametrize("direct", [False, True], ids=["page-cache", "direct-io"])
async def test_rocket_node_on_slowfs(slowfs, tmp_path, monkeypatch, direct):
    """A dev node with its data dir on slowfs (WAL through the page cache or with O_DIRECT) takes messages,
    serves them back, and after a restart (recovery reads its files through FUSE) serves them again."""
    mountpoint, backing, _ = slowfs
    monkeypatch.setenv("ROCKET_WAL_DIRECT_IO", str(direct).lower())
    server = ServerProcess(mountpoint / "data", tmp_path / "server.log").start()
    try:
        async with connect(server.server) as channel:
            await channel.call("CreateTopic", {"topic": "orders", "queues": 2})
        bodies = [f"message-{index}".encode() for index in range(50)]
        assert sorted(await produce_and_consume(server.server, "first", bodies)) == sorted(bodies)
        assert server.terminate() == 0
        server.start()
        assert sorted(await produce_and_consume(server.server, "second", [])) == sorted(bodies)
        assert server.terminate() == 0
    finally:
        server.kill()
    assert any((backing / "data").iterdir())


lazy = pytest.mark.parametrize("slowfs", [True], ids=["lazy"], indirect=True)


def fsync_path(path: Path) -> None:
    descriptor = os.open(path, os.O_RDONLY | (os.O_DIRECTORY if path.is_dir() else 0))
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def test_undo_log_keeps_each_synced_byte_once(tmp_path):
    """An UndoLog saves the synced bytes that overlapping writes and a truncation overwrite, once each, and puts
    back exactly the synced content, whatever was written over or past it."""
    path = tmp_path / "file"
    path.write_bytes(b"0123456789")
    undo = UndoLog(os.open(path, os.O_RDWR))
    with open(path, "r+b") as file:
        for offset, data in ((2, b"ab"), (1, b"XYZW"), (8, b"tail-past-the-end")):
            undo.before_change(offset, offset + len(data))
            file.seek(offset)
            file.write(data)
            file.flush()
        undo.before_change(4, path.stat().st_size)
        file.truncate(4)
    assert undo.saved_bytes == 10 - 0 - 1 and undo.covered == [(1, 10)]
    assert path.read_bytes() == b"0XYZ"
    assert undo.revert() == 9
    undo.close()
    assert path.read_bytes() == b"0123456789"


@lazy
def test_lazy_crash_keeps_only_what_was_fsynced(slowfs):
    """Write, fsync, write more (past the end, over synced bytes, a truncation): a crash leaves exactly the synced
    content, read through the mount (no stale kernel cache) and in the backing file."""
    mountpoint, backing, control = slowfs
    (mountpoint / "dir").mkdir()
    log = mountpoint / "dir" / "log"
    descriptor = os.open(log, os.O_RDWR | os.O_CREAT, 0o644)
    os.write(descriptor, b"synced-" * 1000)
    os.fdatasync(descriptor)
    fsync_path(mountpoint / "dir")
    os.write(descriptor, b"appended-not-synced")
    os.pwrite(descriptor, b"OVERWRITE", 100)
    os.close(descriptor)
    rewritten = mountpoint / "dir" / "rewritten"
    rewritten.write_bytes(b"old content, synced")
    fsync_path(rewritten)
    with open(rewritten, "r+b") as file:
        file.truncate(3)
        file.write(b"-new and longer than before, unsynced")
    assert log.read_bytes().endswith(b"appended-not-synced")
    counts = faults.crash_slowfs(control)
    assert counts["files_reverted"] == 2 and counts["files_removed"] == 0
    assert counts["bytes_dropped"] >= len(b"appended-not-synced") + len(b"OVERWRITE")
    assert log.read_bytes() == b"synced-" * 1000 == (backing / "dir" / "log").read_bytes()
    assert rewritten.read_bytes() == b"old content, synced"
    descriptor = os.open(log, os.O_RDWR | os.O_APPEND)  # the file goes on from its synced end
    os.write(descriptor, b"after")
    os.fsync(descriptor)
    os.close(descriptor)
    assert faults.crash_slowfs(control)["files_reverted"] == 0
    assert log.read_bytes() == b"synced-" * 1000 + b"after"


@lazy
def test_lazy_crash_removes_files_whose_entry_was_not_synced(slowfs):
    """A file created since its directory's last fsync, and never fsynced itself, is gone after a crash; one
    whose directory or itself was fsynced stays (with its synced content only), and so does a renamed one."""
    mountpoint, backing, control = slowfs
    directory = mountpoint / "d"
    directory.mkdir()
    (directory / "directory-synced").write_bytes(b"content not synced")
    fsync_path(directory)
    (directory / "never-synced").write_bytes(b"lost")
    (directory / "file-synced").write_bytes(b"kept")
    fsync_path(directory / "file-synced")
    (directory / "created.tmp").write_bytes(b"renamed")
    os.replace(directory / "created.tmp", directory / "renamed")
    counts = faults.crash_slowfs(control)
    assert counts["files_removed"] == 1
    assert sorted(os.listdir(directory)) == ["directory-synced", "file-synced", "renamed"]
    assert sorted(os.listdir(backing / "d")) == ["directory-synced", "file-synced", "renamed"]
    assert (directory / "directory-synced").read_bytes() == b""
    assert (directory / "file-synced").read_bytes() == b"kept"
    assert (directory / "renamed").read_bytes() == b""
