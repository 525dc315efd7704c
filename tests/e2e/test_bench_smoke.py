"""The comparison harness (benchmarks/run.py) runs end to end with tiny counts on rocket and on every peer
whose server is installed, and writes sane figures for each; no figure is compared with a target."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

from peers import SYSTEMS  # noqa: E402

MESSAGES = 2000
SIZE = 1024
WORKLOADS = {"raw-disk", "raw-disk:direct", "produce", "raw-disk:after", "consume", "both:produce", "both:consume",
             "fixed-rate"}


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> dict:
    """One harness run over every system; the harness itself leaves out those not installed."""
    directory = tmp_path_factory.mktemp("bench")
    out = directory / "compare"
    finished = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "run.py"), "--messages", str(MESSAGES), "--sizes", str(SIZE),
         "--producers", "1", "--rate-seconds", "1", "--systems", ",".join(SYSTEMS), "--out", str(out),
         "--data-parent", str(directory)],
        capture_output=True, text=True, timeout=85, cwd=ROOT)
    assert finished.returncode == 0, finished.stdout[-3000:] + finished.stderr[-3000:]
    report = json.loads(out.with_suffix(".json").read_text())
    report["markdown"] = out.with_suffix(".md").read_text()
    return report


@pytest.mark.parametrize("name", list(SYSTEMS))
def test_system_has_sane_figures(report, name):
    """Every workload ran with positive rates and ordered latency percentiles, and the readers got every message;
    a system is left out only because its server is not installed, and then the report says why."""
    entry = report["systems"][name]
    reason = SYSTEMS[name].missing()
    if reason is not None:
        assert entry["skipped"] == reason
        pytest.skip(f"{name} not measured: {reason}")
    assert entry["durability"] and f"| {name} |" in report["markdown"]
    runs = {run["workload"]: run for run in entry["runs"]}
    assert set(runs) == WORKLOADS | ({"consume:bodies"} if SYSTEMS[name].reads_bodies else set())
    for workload, run in runs.items():
        assert run["mb_per_s"] > 0, run
        if not workload.startswith("raw-disk"):
            assert run["messages_per_s"] > 0 and run["seconds"] > 0, run
    for workload in {"consume", "both:consume", "consume:bodies"} & set(runs):
        assert runs[workload]["messages"] == MESSAGES, runs[workload]
    for workload in ("produce", "both:produce", "fixed-rate"):
        run = runs[workload]
        assert 0 < run["latency_ms_p50"] <= run["latency_ms_p99"] <= run["latency_ms_p999"], run
    assert 0 < runs["fixed-rate"]["target_messages_per_s"] < runs["produce"]["messages_per_s"]


def test_rocket_is_always_measured():
    """rocket needs nothing installed beyond this package, so it is never the one left out."""
    assert SYSTEMS["rocket"].missing() is None


def test_disk_modes_measures_every_mode(tmp_path):
    """benchmarks/disk_modes.py, tiny and without the idle waits: every write mode and both reads give a rate."""
    out = tmp_path / "disk-modes.json"
    finished = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "disk_modes.py"), "--dir", str(tmp_path), "--mib", "4",
         "--rounds", "1", "--settle-s", "0", "--out", str(out)], capture_output=True, text=True, timeout=60)
    assert finished.returncode == 0, finished.stdout[-3000:] + finished.stderr[-3000:]
    runs = json.loads(out.read_text())["runs"]
    modes = {run["mode"] for run in runs}
    assert {"buffered, cold, pipelined", "buffered, cold", "buffered, warm", "buffered, overwrite"} <= modes, modes
    if "direct" in modes:
        assert {"read, cold", "read, recycled"} <= modes, modes
    assert all(run["mb_per_s"] > 0 for run in runs), runs
    assert not list(tmp_path.glob("rocket-disk-modes-*")), "the probe files are deleted"


def test_produce_benchmark_writes_where_it_is_told(tmp_path):
    """benchmarks/produce.py, one tiny round on one node: produce and consume give rates beside the raw disk, in --out
    (not in benchmarks/results, where the committed figures live); with --floor, the bare echo servers' CPU per
    request and rocket's over it, the echo servers gone afterwards."""
    out = tmp_path / "out"
    finished = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "produce.py"), "--rounds", "1", "--messages", str(MESSAGES),
         "--batch-bytes", "65536", "--floor", "--data-parent", str(tmp_path), "--out", str(out)],
        capture_output=True, text=True, timeout=180, cwd=ROOT)
    assert finished.returncode == 0, finished.stdout[-3000:] + finished.stderr[-3000:]
    summary = json.loads((out / "produce-tcp-lane.json").read_text())["summary"]
    assert summary["produce_mb_per_s"][0] > 0 and summary["raw_disk_mb_per_s"][0] > 0, summary
    assert summary["consume_messages_per_s"][0] > 0, summary
    assert summary["floor_trio_echo_cpu_us"][0] > 0 and summary["floor_write_fdatasync_cpu_us"][0] > 0, summary
    assert summary["server_cpu_over_trio_echo"][0] > 1 and summary["floor_trio_durable_cpu_us"][0] > 0, summary
    left = [path for path in Path("/proc").glob("[0-9]*/cmdline") if b"floor.py" in _read_or_empty(path)]
    assert not left, "the echo servers are stopped"


def _read_or_empty(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError:  # the process ended meanwhile
        return b""


def test_mqtt_benchmark_measures_rocket_and_mosquitto():
    """benchmarks/mqtt.py, tiny: both servers publish, idle clients connect, and the last line compares them. Without
    Mosquitto it skips; on CI (./test installs it) it fails instead."""
    import os
    import shutil

    if shutil.which("mosquitto") is None and not os.path.exists("/usr/sbin/mosquitto"):
        if os.environ.get("CI") == "true":
            pytest.fail("CI: no mosquitto (apt-get install mosquitto)")
        pytest.skip("no mosquitto (apt-get install mosquitto)")
    finished = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "mqtt.py"), "--seconds", "1", "--publishers", "2", "--window", "10",
         "--idle", "50"], capture_output=True, text=True, timeout=180, cwd=ROOT)
    assert finished.returncode == 0, finished.stdout[-3000:] + finished.stderr[-3000:]
    last = finished.stdout.strip().splitlines()[-1]
    assert re.fullmatch(r"mqtt: qos1 rocket=\d+/s mosquitto=\d+/s ratio=[\d.]+ idle_bytes rocket=-?\d+ "
                        r"mosquitto=-?\d+ ratio=-?[\d.]+", last), last
