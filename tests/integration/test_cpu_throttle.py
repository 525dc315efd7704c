"""benchmarks/faults.py's cpu fault: a busy process throttled through its cgroup gets only its quota of CPU."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import faults  # noqa: E402


def cpu_seconds(pid: int) -> float:
    """User plus system time of the process, from /proc/PID/stat (fields 14 and 15, in clock ticks)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_cpu_max_bounds_a_busy_process():
    """At 10 ms of CPU per 100 ms, a spinning child uses well under 1 s of CPU in 2 s, and goes back to its
    own cgroup (the fault's cgroup removed) when the fault ends."""
    child = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        try:
            throttle = faults.throttle_cpu(child.pid, f"test-{child.pid}", quota_us=10_000, period_us=100_000)
        except faults.FaultError as error:
            pytest.skip(f"cgroup cpu control is not writable here: {error}")
        try:
            before = cpu_seconds(child.pid)
            time.sleep(2)
            used_s = cpu_seconds(child.pid) - before
        finally:
            throttle.release()
        assert used_s < 0.5, f"throttled to 10% of a CPU, the child still used {used_s:.2f} s of CPU in 2 s"
        assert not throttle.group.exists()
        assert str(child.pid) in (throttle.original / "cgroup.procs").read_text().split()
    finally:
        child.kill()
        child.wait()
