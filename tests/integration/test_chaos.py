"""The short form of benchmarks/chaos.py, as CI runs it: the 8-node example cluster under kills, partitions, slow and
full disks, clock jumps, a failing object store and a rolling restart at once for a few minutes, a fixed seed;
nothing acknowledged lost, duplicated or reordered, the KV history linearizable, replicas alike, no INTERNAL, no
traceback, flat memory."""

from __future__ import annotations

import glob
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FAKETIME_LIBRARIES = "/usr/lib/*/faketime/libfaketime.so.1"  # as benchmarks/chaos.py looks for libfaketime
MINUTES = 5
SEED = 20261206
SUMMARY = re.compile(r"^chaos: acked=(\d+) lost=(\S+) dup=(\S+) reordered=(\S+) early=(\S+) nonlinearizable=(\S+) "
                     r"faults=(\d+) rss_slope=(\S+)$")

pytestmark = pytest.mark.slow


def fuse_works() -> bool:
    try:
        import pyfuse3  # noqa: F401
    except ImportError:
        return False
    return os.path.exists("/dev/fuse")


def test_the_cluster_keeps_every_acknowledged_write_under_combined_faults(tmp_path):
    out = tmp_path / "chaos.json"
    command = [sys.executable, str(ROOT / "benchmarks" / "chaos.py"), "--minutes", str(MINUTES), "--seed", str(SEED),
               "--data-parent", str(tmp_path), "--out", str(out)]
    kinds = {"kill", "partition", "slow_disk", "full_disk", "clock", "store", "rolling"}
    if os.environ.get("CI") != "true":  # CI has FUSE and libfaketime (./test installs them): there they must work
        if not fuse_works():
            command.append("--no-slow-disk")
            kinds -= {"slow_disk", "full_disk"}
        if not glob.glob(FAKETIME_LIBRARIES):
            command.append("--no-clock")
            kinds.discard("clock")
    run = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=MINUTES * 60 + 600)
    lines = run.stdout.strip().splitlines()
    assert run.returncode == 0, "\n".join(lines[-40:]) + run.stderr[-3000:]
    found = SUMMARY.match(lines[-1])
    assert found, lines[-1]
    acked, lost, duplicated, reordered, early, nonlinear, faults, _ = found.groups()
    assert int(acked) > 10_000 and (lost, duplicated, reordered, early, nonlinear) == ("0",) * 5
    result = json.loads(out.read_text())
    assert int(faults) == sum(result["faults"].values()) >= 20
    assert set(result["faults"]) == kinds
    assert result["kv"]["ok"] is True and result["kv"]["operations"] > 1000
