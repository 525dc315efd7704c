"""The raw disk probe that benchmarks report rocket against: buffered, and with O_DIRECT where allowed."""

from __future__ import annotations

import errno
import os

import pytest

from rocket.cli import disk_probe


def test_probes_write_what_they_report_and_leave_no_file(tmp_path):
    for probe in (disk_probe.raw_disk_bandwidth, disk_probe.raw_disk_bandwidth_direct):
        result = probe(tmp_path, 4 << 20)
        if result is None:  # this file system refuses O_DIRECT
            continue
        assert result["bytes"] == 4 << 20 and result["mb_per_s"] > 0 and result["fdatasync_ms_p50"] > 0
    assert list(tmp_path.iterdir()) == []


@pytest.mark.skipif(not hasattr(os, "O_DIRECT"), reason="O_DIRECT is Linux's")
def test_the_direct_probe_is_none_where_the_file_system_refuses_o_direct_and_other_errors_still_raise(
        tmp_path, monkeypatch):
    real_open = os.open
    failure = [errno.EINVAL]

    def refusing_open(path, flags, *arguments):
        if flags & os.O_DIRECT:
            raise OSError(failure[0], "refused")
        return real_open(path, flags, *arguments)

    monkeypatch.setattr(os, "open", refusing_open)
    assert disk_probe.raw_disk_bandwidth_direct(tmp_path, 1 << 20) is None
    assert disk_probe.raw_disk_bandwidth(tmp_path, 1 << 20)["bytes"] == 1 << 20
    failure[0] = errno.EIO
    with pytest.raises(OSError):
        disk_probe.raw_disk_bandwidth_direct(tmp_path, 1 << 20)
