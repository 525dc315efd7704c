"""benchmarks/faults.py's slowfs, mounted for real over FUSE: a passthrough that files and a rocket node work on,
and that makes fsync slower when its control file says so."""

from __future__ import annotations

import importlib.util
import os
import sys
import time
from pathlib import Path

import pytest

from rocket.client import connect, open_consumer, open_producer
from rocket.model import Message
from tests.conftest import ServerProcess

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import faults  # noqa: E402
from slowfs import FSYNC_DELAY_FLOOR_S_PER_FACTOR  # noqa: E402

if not os.path.exists("/dev/fuse"):
    pytest.skip("no /dev/fuse on this machine: slowfs cannot mount", allow_module_level=True)
if importlib.util.find_spec("pyfuse3") is None:
    pytest.skip("pyfuse3 is not installed (pip install pyfuse3; needs Debian libfuse3-dev fuse3 pkg-config)",
                allow_module_level=True)


@pytest.fixture
def slowfs(tmp_path):
    """(mountpoint, backing, control file) of a slowfs at factor 1; unmounted after the test."""
    backing, mountpoint, control = tmp_path / "backing", tmp_path / "mount", tmp_path / "slowfs.json"
    backing.mkdir()
    mountpoint.mkdir()
    faults.write_control(control, {"factor": 1})
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
