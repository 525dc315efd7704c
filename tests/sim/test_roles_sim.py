"""The failover scenario of the cluster test, simulated with the roles' own code: every acknowledged
message is consumed exactly once, at its offset, in queue order, whatever the seed (resends included)."""

from __future__ import annotations

import functools
import os
import subprocess
import sys
from pathlib import Path

import pytest
import trio
import trio.testing

from rocket import limits
from rocket.disk.commitlog import CommitLog
from tests.sim.roles_sim import (Disk, NetworkFaults, failover_trace, run_controller_failover, run_delete,
                                 run_failover)

ROLE_SEEDS = 20  # at most, unless --seed: each run simulates about 20 s of a three-node cluster
DELETE_SEEDS = 10  # at most: a delete under writes and a crash
CONTROLLER_SEEDS = 10  # per scenario, at most (four scenarios; a deeper search runs with --sim-seeds)


@pytest.mark.sim_seeds(DELETE_SEEDS)
def test_a_topic_deleted_under_writes_and_a_crash_is_gone_everywhere(seed, fast_disk):
    """A topic deleted while its producers write and a storage leader crashes: each producer is refused with
    UNKNOWN_TOPIC after the delete, every node drops its queues, the topic made again is empty, and the topic beside
    it loses nothing."""
    clock = trio.testing.MockClock(autojump_threshold=0)
    try:
        report = trio.run(functools.partial(run_delete, seed, fast_disk, NetworkFaults(drop=0.01)), clock=clock)
    except BaseException:
        print(f"roles simulation failed with seed {seed}: replay with pytest tests/sim --seed {seed}")
        raise
    print(report)
    assert report["acknowledged"] > 100 and report["scratch_acknowledged"] > 0 and report["scratch_refusals"] == 4


@pytest.mark.sim_seeds(ROLE_SEEDS)
@pytest.mark.parametrize("faults, partition", [
    (NetworkFaults(), False), (NetworkFaults(drop=0.02, call_loss=0.01), False), (NetworkFaults(drop=0.02), True),
], ids=["crashes", "crashes-losses", "partitions"])
def test_roles_survive_two_failures_without_losing_an_acknowledged_message(
        seed, faults, partition, fast_disk):
    clock = trio.testing.MockClock(autojump_threshold=0)
    try:
        report = trio.run(functools.partial(run_failover, seed, fast_disk, faults, partition=partition), clock=clock)
    except BaseException:
        print(f"roles simulation failed with seed {seed}: replay with pytest tests/sim --seed {seed}")
        raise
    print(report)
    assert report["acknowledged"] > 100 and len(report["kills"]) == 2
    assert report["duplicates"] == 0, report  # resent batches are numbered by their producer: stored once
    assert report["replica_reads"] > 0  # followers in sync served some of the reads


def test_a_seed_replays_the_same_trace(fast_disk):
    """A seed replays exactly: run here, and again in another process under another hash seed (which orders sets of
    strings, and moves every id()), the network's traces are equal, every call, answer and Raft payload at the same
    time between the same nodes with the same bytes."""
    seed = 3
    here = failover_trace(seed, fast_disk / "here")
    hash_seed = "1" if os.environ.get("PYTHONHASHSEED") != "1" else "2"
    there = subprocess.run([sys.executable, "-m", "tests.sim.roles_sim", str(seed), str(fast_disk / "there")],
                           cwd=Path(__file__).resolve().parents[2], env={**os.environ, "PYTHONHASHSEED": hash_seed},
                           capture_output=True, text=True, timeout=600, check=True).stdout.splitlines()
    assert len(here) > 1000
    parted = next((index for index, (one, other) in enumerate(zip(here, there)) if one != other), min(len(here),
                                                                                                       len(there)))
    assert here == there, f"the traces part at event {parted} of {len(here)}: {here[parted:parted + 1]} against " \
                          f"{there[parted:parted + 1]}"


def test_a_crash_loses_what_was_written_after_the_last_sync(tmp_path):
    """The simulated power cut bites: records a log synced survive a crash, those appended after its last
    sync are gone when it reopens, a segment rolled since is deleted, and a sync after the cut makes nothing durable."""
    disk = Disk()
    log = CommitLog.open(tmp_path, limits.segment_bytes_min)
    disk.watch("log", log)
    synced = log.append([(1, b"synced")])
    log.sync()
    log.append([(1, b"a" * 100)])
    log.roll()
    log.append([(1, b"in a segment made after the sync")])
    disk.cut()
    log.sync()  # after the power went: too late
    log.close()
    disk.lose_unsynced()
    reopened = CommitLog.open(tmp_path, limits.segment_bytes_min)
    assert [body for _, _, body in reopened.scan(0)] == [b"synced"]
    assert reopened.segment_starts() == [synced[0]] and disk.lost_bytes["log"] > 100
    reopened.close()


@pytest.mark.sim_seeds(CONTROLLER_SEEDS)
@pytest.mark.parametrize("faults, scenario", [
    (NetworkFaults(), "crashes"), (NetworkFaults(drop=0.02, call_loss=0.01), "crashes"),
    (NetworkFaults(drop=0.02), "partitions"), (NetworkFaults(drop=0.01), "controller_cut"),
], ids=["crashes", "crashes-losses", "partitions", "controller-cut"])
def test_controller_mode_groups_lose_no_acknowledged_message(seed, faults, scenario, fast_disk):
    """Two-replica controller-mode groups (RIP-44) under the roles' own code: every acknowledged message is consumed
    once at its offset in queue order, committed log prefixes agree, and no epoch had two masters."""
    clock = trio.testing.MockClock(autojump_threshold=0)
    try:
        report = trio.run(functools.partial(run_controller_failover, seed, fast_disk, faults, scenario), clock=clock)
    except BaseException:
        print(f"controller-mode simulation failed with seed {seed}: replay with pytest tests/sim --seed {seed}")
        raise
    print(report)
    assert report["acknowledged"] > 100 and len(report["faults"]) == 2


@pytest.mark.sim_seeds(CONTROLLER_SEEDS)
@pytest.mark.parametrize("faults, scenario", [
    (NetworkFaults(drop=0.02, call_loss=0.01), "crashes"), (NetworkFaults(drop=0.01), "controller_cut"),
], ids=["crashes-losses", "controller-cut"])
def test_a_standalone_controller_loses_no_acknowledged_message(seed, faults, scenario, fast_disk):
    """The same with the standalone controller (`--role controller`) on the three nodes: its own Raft group, storage
    nodes heartbeating to it, the nameservers mirroring its word."""
    clock = trio.testing.MockClock(autojump_threshold=0)
    try:
        report = trio.run(functools.partial(run_controller_failover, seed, fast_disk, faults, scenario, True),
                          clock=clock)
    except BaseException:
        print(f"standalone controller simulation failed with seed {seed}: replay with pytest tests/sim --seed {seed}")
        raise
    print(report)
    assert report["acknowledged"] > 100 and len(report["faults"]) == 2
    assert not report["two_masters_in_an_epoch"] and report["elections"] > 0
    assert report["duplicates"] == 0, report
    assert not report["two_masters_in_an_epoch"], report
    assert report["compared_entries"] > 0
    if scenario == "crashes":
        assert report["elections"] >= 1  # the busiest master's crash had its slave elected
