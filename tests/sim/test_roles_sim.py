"""The failover scenario of the cluster test, simulated with the roles' own code: every acknowledged
message is consumed once, at its offset, in queue order, whatever the seed."""

from __future__ import annotations

import functools
import shutil
import tempfile
from pathlib import Path

import outcome
import pytest
import trio
import trio.testing

from tests.sim.roles_sim import NetworkFaults, run_failover

ROLE_SEEDS = 20  # at most, unless --seed: each run simulates about 20 s of a three-node cluster


@pytest.fixture
def fast_disk():
    """A directory in memory when there is one: the simulation's fsyncs then cost nothing."""
    parent = "/dev/shm" if Path("/dev/shm").is_dir() else None
    directory = Path(tempfile.mkdtemp(prefix="rocket-sim-", dir=parent))
    yield directory
    shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture
def inline_threads(monkeypatch):
    """Blocking I/O runs inline: with a worker thread busy, the mock clock would jump ahead of it."""
    async def run_sync(function, *args, **_):
        return function(*args)

    def start_thread_soon(function, deliver, **_):
        deliver(outcome.capture(function))

    monkeypatch.setattr(trio.to_thread, "run_sync", run_sync)
    monkeypatch.setattr(trio.lowlevel, "start_thread_soon", start_thread_soon)


@pytest.mark.sim_seeds(ROLE_SEEDS)
@pytest.mark.parametrize("faults, partition", [
    (NetworkFaults(), False), (NetworkFaults(drop=0.02, call_loss=0.01), False), (NetworkFaults(drop=0.02), True),
], ids=["crashes", "crashes-losses", "partitions"])
def test_roles_survive_two_failures_without_losing_an_acknowledged_message(
        seed, faults, partition, fast_disk, inline_threads):
    clock = trio.testing.MockClock(autojump_threshold=0)
    try:
        report = trio.run(functools.partial(run_failover, seed, fast_disk, faults, partition=partition), clock=clock)
    except BaseException:
        print(f"roles simulation failed with seed {seed}: replay with pytest tests/sim --seed {seed}")
        raise
    print(report)
    assert report["acknowledged"] > 100 and len(report["kills"]) == 2
    assert report["replica_reads"] > 0  # followers in sync served some of the reads
