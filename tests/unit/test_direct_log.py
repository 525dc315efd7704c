"""A commit log written with O_DIRECT: the same records at the same positions as a log written through the
page cache, the same files once sealed or closed, the same reads from its own memory and from the disk, zeros
past the end after a crash (never the old bytes of memory used again), and recovery of both."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rocket import limits
from rocket.errors import Code, RocketError
from rocket.disk import commitlog as commitlog_module
from rocket.disk.commitlog import HEADER_BYTES, CommitLog
from rocket.disk.direct import ALIGN

pytestmark = pytest.mark.skipif(not hasattr(os, "O_DIRECT"), reason="no O_DIRECT on this OS")

SEGMENT = limits.segment_bytes_min
CHUNK = 64 * 1024  # small chunks, so that a short test fills, drops and uses chunks again


@pytest.fixture(autouse=True)
def small_chunks(monkeypatch):
    monkeypatch.setattr(limits, "direct_log_chunk_bytes", CHUNK)


def open_pair(directory: Path, cached_bytes: int = 3 * CHUNK) -> tuple[CommitLog, CommitLog]:
    direct = CommitLog.open(directory / "direct", SEGMENT, cached_bytes, direct=True)
    if not direct.direct:
        pytest.skip("this file system has no O_DIRECT")
    return direct, CommitLog.open(directory / "buffered", SEGMENT)


def crash(log: CommitLog) -> None:
    """Stop using the log as a SIGKILL would: its descriptors go, nothing is truncated or synced."""
    for descriptor in log._retired_fds | {log._active_fd} | set(log._readers.values()):
        os.close(descriptor)


def files(directory: Path) -> list[tuple[str, bytes]]:
    return [(path.name, path.read_bytes()) for path in sorted(directory.iterdir())]


record_sizes = st.lists(st.sampled_from([1, 7, 100, 4_000, 4_096, 40_000, 70_000, 300_000]), min_size=1, max_size=4)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(appends=st.lists(st.tuples(record_sizes, st.booleans()), min_size=1, max_size=25))
def test_a_direct_log_holds_what_a_buffered_one_holds(tmp_path_factory, appends):
    """Random appends (records across blocks, chunks and segments; syncs now and then): the same positions,
    every record read back alike from memory and from the disk, shared or detached, and byte-identical files
    once closed. A crash instead leaves zeros past the end, and the reopened log ends where it ended."""
    directory = tmp_path_factory.mktemp("logs")
    direct, buffered = open_pair(directory)
    written: list[tuple[int, bytes]] = []
    for number, (sizes, sync) in enumerate(appends):
        records = [(1 + index % 3, os.urandom(size)) for index, size in enumerate(sizes)]
        positions = direct.append(records)
        assert positions == buffered.append(records)
        written += [(position, body) for position, (_, body) in zip(positions, records)]
        if sync:
            direct.sync()
    assert direct.end_position == buffered.end_position and direct.segment_starts() == buffered.segment_starts()
    assert direct.cached_from == 0 or direct.end_position - direct.cached_from >= 3 * CHUNK  # memory holds enough
    for position, body in written:
        assert direct.read(position)[1] == body
        for detached in (False, True):
            assert direct.read_slice(position + HEADER_BYTES, len(body), detached) == body

    direct.sync()
    active = direct.segments()[-1][1]
    size = active.stat().st_size
    assert size % ALIGN == 0 and not active.read_bytes()[direct.end_position - direct.segment_starts()[-1]:].strip(b"\0")
    crash(direct)
    reopened = CommitLog.open(directory / "direct", SEGMENT, 3 * CHUNK, direct=True)
    assert reopened.end_position == buffered.end_position
    assert [reopened.read(position)[1] for position, _ in written] == [body for _, body in written]
    more = reopened.append([(2, b"after the crash")])
    assert more == buffered.append([(2, b"after the crash")])
    reopened.close()
    buffered.close()
    assert files(directory / "direct") == files(directory / "buffered")


def test_reads_of_the_newest_bytes_come_from_memory_and_older_ones_from_the_disk(tmp_path, monkeypatch):
    direct, _ = open_pair(tmp_path, cached_bytes=2 * CHUNK)
    bodies = [os.urandom(10_000) for _ in range(60)]  # 600 KB: far more than the cached part
    positions = [direct.append([(1, body)])[0] for body in bodies]
    cached_from = direct.cached_from
    assert 2 * CHUNK <= direct.end_position - cached_from <= 4 * CHUNK
    preads = []
    real_pread = os.pread
    monkeypatch.setattr(commitlog_module.os, "pread", lambda *args: preads.append(args[2]) or real_pread(*args))
    for position, body in zip(positions, bodies):
        assert direct.read_slice(position + HEADER_BYTES, len(body)) == body
    assert len(preads) == sum(1 for position in positions if position < cached_from) > 0


def test_memory_used_again_never_reaches_the_disk_past_the_end(tmp_path):
    """Chunks dropped from the cache are used again for new bytes: what a write pads its last block with
    must be zeros, not what the chunk held before, or recovery would take old records for new ones."""
    direct, _ = open_pair(tmp_path, cached_bytes=CHUNK)
    body = bytes(256 - HEADER_BYTES)  # records of 256 bytes: old ones lie at every place a new one could
    for _ in range(8 * CHUNK // 256):
        direct.append([(1, body)])
    assert direct._tail._spare  # chunks went out of the cache, to be used again
    direct.append([(1, body)])
    direct.sync()
    end = direct.end_position
    crash(direct)
    reopened = CommitLog.open(tmp_path / "direct", SEGMENT, CHUNK, direct=True)
    assert reopened.end_position == end
    reopened.close()


def test_zeros_after_a_sealed_segment_are_cut_and_other_bytes_are_damage(tmp_path):
    """A crash between a roll and the sync of the sealed segment's truncate leaves its padding."""
    direct, _ = open_pair(tmp_path)
    for _ in range(30):
        direct.append([(1, os.urandom(100_000))])  # 3 MB over 1 MiB segments
    direct.close()
    first = CommitLog.open(tmp_path / "direct", SEGMENT).segments()[0][1]
    size = first.stat().st_size
    with open(first, "ab") as file:
        file.write(bytes(ALIGN - 1 - size % ALIGN))
    log = CommitLog.open(tmp_path / "direct", SEGMENT, CHUNK, direct=True)
    assert first.stat().st_size == size
    log.close()
    with open(first, "ab") as file:
        file.write(b"\0\1")
    with pytest.raises(RocketError) as caught:
        CommitLog.open(tmp_path / "direct", SEGMENT, CHUNK, direct=True)
    assert caught.value.code == Code.CORRUPT_DATA and first.name in caught.value.message


def test_without_o_direct_in_the_file_system_the_log_writes_through_the_page_cache(tmp_path, monkeypatch):
    real_open = os.open

    def refuse_direct(path, flags, *args):
        if flags & os.O_DIRECT:
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_open(path, flags, *args)

    monkeypatch.setattr(commitlog_module.os, "open", refuse_direct)
    log = CommitLog.open(tmp_path / "log", SEGMENT, CHUNK, direct=True)
    assert not log.direct
    positions = [log.append([(1, os.urandom(200_000))])[0] for _ in range(8)]
    assert len(log.segment_starts()) > 1 and log.read(positions[-1])[0] == 1
    log.close()
