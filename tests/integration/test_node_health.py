"""Unhealthy nodes end to end (issue 31): three all-role nodes, node 3's data directory on benchmarks/faults.py's
FUSE slowfs; its fsyncs made 20 times slower degrade it, it then leads no group and new queues avoid it, and it comes
back once its disk is fast again. Pins act at once."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import trio

from rocket.client import connect
from rocket.model import Message
from rocket.serde import batch as batch_codec
from rocket.transport.listen import free_ports
from tests.integration.test_cluster import Node, cluster_status

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import faults  # noqa: E402

ENVIRONMENT = {"ROCKET_STORAGE_GROUPS": "6", "ROCKET_REPLICATION": "3", "ROCKET_HEALTH_WINDOW_S": "2"}
slowfs_missing = (not os.path.exists("/dev/fuse") and "no /dev/fuse on this machine: slowfs cannot mount") or (
    importlib.util.find_spec("pyfuse3") is None and "pyfuse3 is not installed")


def make_cluster(tmp_path: Path) -> dict[int, Node]:
    ports = free_ports(3)
    nameservers = ",".join(f"{node}@127.0.0.1:{port}" for node, port in zip((1, 2, 3), ports))
    return {node: Node(node, port, nameservers, tmp_path, environment=ENVIRONMENT)
            for node, port in zip((1, 2, 3), ports)}


async def start(nodes: dict[int, Node]) -> list[str]:
    for node in nodes.values():
        node.start()
    for node in nodes.values():
        await node.wait_ready()
    return [node.server for node in nodes.values()]


async def wait_for(servers: list[str], condition, what: str, timeout_s: float = 60.0) -> tuple[dict, float]:
    """Poll the cluster status until condition(status) holds; (the status, seconds taken)."""
    started = time.monotonic()
    status = None
    while time.monotonic() - started < timeout_s:
        status = await cluster_status(servers)
        if status is not None and condition(status):
            return status, time.monotonic() - started
        await trio.sleep(0.5)
    raise AssertionError(f"{what}: not within {timeout_s} s; last status {status}")


def health(status: dict, node: int) -> str:
    return next(entry["health"] for entry in status["nodes"] if entry["id"] == node)


def led_by(status: dict, node: int) -> list[int]:
    return [group["id"] for group in status["groups"] if group["leader"] == node]


async def produce_forever(server: str, topic: str, queues: int) -> None:
    """A steady load: a batch of 20 small messages to each queue in turn, as fast as they are acknowledged."""
    async with connect(server) as channel:
        number = 0
        while True:
            batch = batch_codec.encode([Message(b"x" * 100) for _ in range(20)], 1_700_000_000_000)
            try:
                await channel.call("Produce", {"topic": topic, "queue": number % queues, "batch": batch},
                                   timeout_s=20)
            except Exception:  # noqa: BLE001 - a load generator rides out leader changes
                await trio.sleep(0.1)
            number += 1


@pytest.fixture
def slow_cluster(tmp_path):
    """Three nodes (not started), node 3's data directory on a slowfs at factor 1; (nodes, control file)."""
    if slowfs_missing:
        pytest.skip(slowfs_missing)
    nodes = make_cluster(tmp_path)
    backing, control = tmp_path / "backing3", tmp_path / "slowfs.json"
    backing.mkdir()
    nodes[3].data_dir.mkdir()
    faults.write_control(control, {"factor": 1})
    process = faults.start_slowfs(backing, nodes[3].data_dir, control, tmp_path / "slowfs.log")
    try:
        yield nodes, control
    finally:
        for node in nodes.values():
            node.kill()
        faults.stop_process(process.pid)


async def test_a_slow_disk_degrades_its_node_which_then_leads_nothing_and_returns(slow_cluster):
    """Factor 20 on node 3's fsyncs: degraded within a few windows, its leaderships moved off, a new topic's queues
    on groups it does not lead; factor 1: healthy again."""
    nodes, control = slow_cluster
    servers = await start(nodes)
    async with connect(servers[0]) as channel:
        await channel.call("CreateTopic", {"topic": "load", "queues": 6}, timeout_s=30)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(produce_forever, servers[0], "load", 6)
        await trio.sleep(10)  # five windows at factor 1: FUSE alone must not degrade a node
        status, _ = await wait_for(servers, lambda status: len(status["groups"]) == 6, "groups")
        assert all(health(status, node) == "healthy" for node in nodes), status["nodes"]
        faults.write_control(control, {"factor": 20})
        status, degraded_s = await wait_for(servers, lambda status: health(status, 3) == "degraded", "degraded")
        print(f"node 3 degraded {degraded_s:.1f} s after its disk slowed")
        assert "slow disk" in next(entry["health_reason"] for entry in status["nodes"] if entry["id"] == 3)
        status, unled_s = await wait_for(servers, lambda status: not led_by(status, 3), "leads nothing")
        print(f"node 3 led nothing {unled_s:.1f} s after it was degraded")
        async with connect(servers[0]) as channel:
            await channel.call("CreateTopic", {"topic": "fresh", "queues": 6}, timeout_s=30)
            explained = await channel.call("PlacementExplain", {"topic": "fresh"})
        assert explained["queues"] and all(row["node"] != 3 for row in explained["queues"]), explained
        faults.write_control(control, {"factor": 1})
        _, healthy_s = await wait_for(servers, lambda status: health(status, 3) == "healthy", "healthy again", 90)
        print(f"node 3 healthy {healthy_s:.1f} s after its disk was fast again")
        nursery.cancel_scope.cancel()


@pytest.fixture
def cluster(tmp_path):
    nodes = make_cluster(tmp_path)
    try:
        yield nodes
    finally:
        for node in nodes.values():
            node.kill()


async def test_a_pin_degrades_a_node_at_once_and_auto_hands_it_back(cluster):
    """`cluster health --pin 2 degraded`: node 2 shows degraded (pinned) and its leaderships move off; `--pin 2
    auto` makes it healthy again. Bad pins are refused with BAD_REQUEST."""
    servers = await start(cluster)
    async with connect(servers[0]) as channel:
        await channel.call("CreateTopic", {"topic": "orders", "queues": 6}, timeout_s=30)
        for request, method in (({"node": 2, "pin": "sideways"}, "PinNodeHealth"), ({"node": 77}, "NodeHealth")):
            with pytest.raises(Exception, match="BAD_REQUEST"):
                await channel.call(method, request)
    command = [sys.executable, "-m", "rocket", "cluster", "health", "--server", servers[0]]
    pinned = await trio.to_thread.run_sync(lambda: subprocess.run(command + ["--pin", "2", "degraded"],
                                                                  capture_output=True, text=True, timeout=60))
    assert pinned.returncode == 0 and "node 2 pinned degraded" in pinned.stdout, pinned.stderr
    status, _ = await wait_for(servers, lambda status: health(status, 2) == "degraded" and not led_by(status, 2),
                               "pinned degraded and leading nothing")
    assert "pinned" in next(entry["health_reason"] for entry in status["nodes"] if entry["id"] == 2)
    shown = await trio.to_thread.run_sync(lambda: subprocess.run(command + ["--node", "2"], capture_output=True,
                                                                 text=True, timeout=60))
    assert shown.returncode == 0 and "threshold" in shown.stdout and "degraded" in shown.stdout, shown.stdout
    async with connect(servers[0]) as channel:
        await channel.call("PinNodeHealth", {"node": 2, "pin": "auto"})
    await wait_for(servers, lambda status: health(status, 2) == "healthy", "healthy once unpinned")
