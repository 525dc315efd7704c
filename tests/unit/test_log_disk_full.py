"""A commit log whose write fails for want of space (ENOSPC) after writing part of a record ends at its last whole
record again, in memory and on disk: the next append succeeds after it, and a reopen finds every record, none torn."""

from __future__ import annotations

import errno
import os

import pytest

from rocket import limits
from rocket.disk import commitlog as commitlog_module
from rocket.disk.commitlog import CommitLog
from rocket.disk.files import out_of_space

SEGMENT = limits.segment_bytes_min


def refuse_after(monkeypatch, name: str, allowed_bytes: int) -> None:
    """os.<name> writes at most allowed_bytes in all (a short write), then fails with ENOSPC, as a full disk does."""
    real = getattr(os, name)
    left = [allowed_bytes]

    def write(descriptor, data, *rest):
        if left[0] <= 0:
            raise OSError(errno.ENOSPC, "No space left on device")
        if name == "writev":
            data = [bytes(memoryview(b).cast("B")) for b in data]
            flat = b"".join(data)[: left[0]]
            written = real(descriptor, [flat], *rest)
        else:
            cut = (min(left[0], len(data)) // 4096) * 4096  # O_DIRECT writes whole blocks
            if not cut:
                raise OSError(errno.ENOSPC, "No space left on device")
            written = real(descriptor, data[:cut], *rest)
        left[0] -= written
        return written

    monkeypatch.setattr(commitlog_module.os, name, write)


@pytest.mark.parametrize("direct", [False, True], ids=["page-cache", "direct-io"])
def test_enospc_mid_record_cuts_back_and_appends_after(tmp_path, monkeypatch, direct):
    """A short write then ENOSPC leaves no torn record: the failed append is written again whole once space returns."""
    log = CommitLog.open(tmp_path, SEGMENT, cached_bytes=1 << 20 if direct else 0, direct=direct)
    if direct and not log.direct:
        pytest.skip("this file system has no O_DIRECT")
    first = log.append([(1, b"a" * 5000)])
    end = log.end_position
    with monkeypatch.context() as patch:
        refuse_after(patch, "pwrite" if log.direct else "writev", 7000)
        with pytest.raises(OSError) as refused:
            log.append([(1, b"b" * 9000), (1, b"c" * 300)])
    assert out_of_space(refused.value)
    assert log.end_position == end
    assert os.path.getsize(log.segments()[-1][1]) == end  # the torn bytes were cut from the file too
    again = log.append([(1, b"b" * 9000), (1, b"c" * 300)])
    log.sync()
    assert again[0] == end
    log.close()
    reopened = CommitLog.open(tmp_path, SEGMENT)
    assert [(kind, body[:1], len(body)) for _, kind, body in reopened.scan(first[0])] == [
        (1, b"a", 5000), (1, b"b", 9000), (1, b"c", 300)]
    reopened.close()


def test_an_error_that_says_the_disk_is_full_in_words_is_taken_for_one():
    """LevelDB's IO errors (plyvel.IOError) carry no errno: `rocket run` knows a full disk by their words."""
    import plyvel

    from rocket.disk.files import says_out_of_space

    stopped = plyvel.IOError(b"IO error: /data/storage/index/000008.ldb: No space left on device")
    assert isinstance(stopped, OSError) and says_out_of_space(stopped) and not out_of_space(stopped)
    assert says_out_of_space(OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)))
    assert not says_out_of_space(plyvel.IOError(b"IO error: /data/storage/index/LOCK: Permission denied"))
    assert not says_out_of_space(ValueError(os.strerror(errno.ENOSPC)))
    from rocket.node import stop_reason

    assert stop_reason(stopped).startswith("stopped: the data disk is full (") and stop_reason(ValueError()) is None
    # Every task that wrote to the failed LevelDB at once (the rounds' apply and a backfill, in a chaos run): a group
    both = ExceptionGroup("nursery", [stopped, ExceptionGroup("inner", [plyvel.IOError(bytes(str(stopped), "utf-8"))])])
    assert stop_reason(both) == stop_reason(stopped)
    assert stop_reason(ExceptionGroup("nursery", [stopped, ValueError("a bug")])) is None


@pytest.mark.parametrize("several", [False, True], ids=["one-task", "several-tasks"])
def test_rocket_run_stops_with_one_line_when_the_disk_is_full(tmp_path, monkeypatch, capfd, several):
    """`rocket run` whose node stopped on a full disk, met by one task or by several at once (an exception group, as an
    hour-long chaos run met: the rounds' apply and a backfill), says so in one line and exits 1; no traceback."""
    import plyvel
    import typer

    from rocket import node
    from rocket.cli import run as run_module

    full = plyvel.IOError(b"IO error: /data/storage/index/000139.ldb: No space left on device")

    def stopped(*arguments, **options):
        raise ExceptionGroup("nursery", [ExceptionGroup("inner", [full, full])]) if several else full

    monkeypatch.setattr(run_module.trio, "run", stopped)
    monkeypatch.setattr(node, "keep_freed_memory", lambda **options: False)
    monkeypatch.setattr(node, "tune_collector", lambda: None)
    with pytest.raises(typer.Exit) as exited:
        run_module.run(data_dir=tmp_path / "data")
    assert exited.value.exit_code == 1
    assert capfd.readouterr().err.strip().startswith("error: stopped: the data disk is full (IO error: ")
