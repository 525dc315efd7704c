"""A rolling upgrade from the previous release to this tree, under produce and consume load (issue 34).

Three all-role nodes of the previous release (BASELINE, checked out with `git worktree add` from this repository's
history) start a cluster; this tree's client produces to it (JSON) and consumes from it (Avro) throughout. Each
node in turn is stopped (SIGTERM) and started again on this tree, with the same data directory and port; between
phases produce and consume must both go on. At the end every node runs this tree's schema version (as `rocket
cluster status --json` reports it), and every acknowledged message was consumed, intact, at its offset.

The schemas differ between the two releases (schema version 2 adds schema_version to NodeHeartbeatRequest and
NodeStatus; rocket/serde/versions.py): while the cluster is mixed, new nodes read and write old nodes' schemas.
Node logs are in the test's tmp_path.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import trio

from rocket.client import Consumer, connect
from rocket.errors import RocketError
from rocket.serde.schema import SCHEMA_VERSION
from rocket.transport.listen import free_ports
from tests.integration.test_cluster import (FAILOVER, ROOT, SEQ_SPAN, Node, Writers, check_intact, cluster_status,
                                            verify_acknowledged, wait_all_groups_led)

BASELINE = "18caf45e6fa74941dbc3259eb03ca241be8f3030"  # the previous release: schema version 1 (it says no version)
NODES = (1, 2, 3)
GROUPS = 4
QUEUES = 8
WRITER_QUEUES = (0, 3, 5)
PHASE_BOUND_S = 45.0  # after a node is back, produce and consume each go on within this

pytestmark = pytest.mark.slow


class UpgradableNode(Node):
    def stop(self) -> None:
        """A graceful stop, as an operator upgrading would: SIGTERM, then wait (SIGKILL only if it hangs)."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


@pytest.fixture
def baseline(tmp_path):
    """This repository's BASELINE in a git worktree of its own, removed afterwards."""
    tree = tmp_path / "baseline"
    added = subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(tree), BASELINE],
                           capture_output=True, text=True)
    assert added.returncode == 0, f"git worktree add of {BASELINE} (the history must be there): {added.stderr}"
    try:
        yield tree
    finally:
        subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)], capture_output=True)
        subprocess.run(["git", "-C", str(ROOT), "worktree", "prune"], capture_output=True)


class LiveConsumer:
    """One group member consuming all the time, failing over between nodes and committing after each poll."""

    def __init__(self, servers: list[str]):
        self.servers = servers
        self.seqs: set[int] = set()
        self.polls = 0
        self.failovers = 0
        self.stop = trio.Event()

    async def run(self) -> None:
        index = 0
        while not self.stop.is_set():
            try:
                async with connect(self.servers[index % len(self.servers)], serde="avro") as channel:
                    consumer = Consumer(channel, "orders", "live", start="earliest", wait_ms=300, member="live-1")
                    await consumer.open()
                    while not self.stop.is_set():
                        for message in await consumer.poll():
                            self.seqs.add(check_intact(message))
                        self.polls += 1
                        await consumer.commit()
            except RocketError as error:
                if error.code not in FAILOVER and error.code.name not in ("UNKNOWN_GROUP", "NOT_MEMBER"):
                    raise
                self.failovers += 1
                index += 1
                await trio.sleep(0.2)


async def wait_going_on(writers: Writers, consumer: LiveConsumer, what: str, nodes: dict) -> None:
    """Wait until produce is acknowledged and consume gets new messages, both after now."""
    acks, consumed = len(writers.acks), len(consumer.seqs)
    started = trio.current_time()
    with trio.move_on_after(PHASE_BOUND_S):
        while len(writers.acks) < acks + 5 or len(consumer.seqs) < consumed + 20:
            await trio.sleep(0.2)
        print(f"{what}: produce and consume going on {trio.current_time() - started:.1f} s later", flush=True)
        return
    pytest.fail(f"{what}: in {PHASE_BOUND_S} s, {len(writers.acks) - acks} batches acknowledged and "
                f"{len(consumer.seqs) - consumed} messages consumed; writer errors {dict(writers.errors)}; "
                f"logs in {next(iter(nodes.values())).log_path.parent}")


async def wait_heartbeats(servers: list[str], restarted: int, restarted_at: float, upgraded: set[int]) -> None:
    """Wait until the nameserver leader has heard every node's heartbeat in the last seconds, the restarted one's
    since its restart, and every group has a leader. Heartbeats cross versions both ways: an upgraded node's to an
    old leader (in version 1's schema) and an old node's to an upgraded leader, which shows each node's schema
    version as the node said it (1: said none); an old leader knows no schema versions, so it shows 1 for all."""
    status: dict | None = None
    with trio.move_on_after(60):
        while True:
            status = await cluster_status(servers)
            if status is not None:
                since_ms = (trio.current_time() - restarted_at) * 1000
                ages = {entry["id"]: (entry["state"], entry["heartbeat_age_ms"]) for entry in status["nodes"]}
                if (all(state == "up" and 0 <= age_ms < 5000 for state, age_ms in ages.values())
                        and ages[restarted][1] < since_ms and len(status["groups"]) == GROUPS
                        and all(group["leader"] for group in status["groups"])):
                    leader_new = status["nameserver_leader"] in upgraded
                    assert {entry["id"]: entry["schema_version"] for entry in status["nodes"]} == {
                        node: SCHEMA_VERSION if leader_new and node in upgraded else 1 for node in NODES}, status
                    return
            await trio.sleep(0.2)
    pytest.fail(f"node {restarted} restarted on this tree: the cluster did not settle: {status}")


def cli_cluster_status(server: str) -> dict:
    """`rocket cluster status --json`, run with this tree's rocket."""
    done = subprocess.run([sys.executable, "-m", "rocket", "cluster", "status", "--server", server, "--json"],
                          capture_output=True, text=True, timeout=60, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


async def test_rolling_upgrade_from_the_previous_release_under_load(baseline: Path, tmp_path):
    ports = free_ports(len(NODES))
    nameservers = ",".join(f"{node}@127.0.0.1:{port}" for node, port in zip(NODES, ports))
    environment = {"ROCKET_STORAGE_GROUPS": str(GROUPS), "ROCKET_REPLICATION": "3"}
    nodes = {node: UpgradableNode(node, port, nameservers, tmp_path, environment=environment)
             for node, port in zip(NODES, ports)}
    servers = [node.server for node in nodes.values()]
    started = time.monotonic()
    try:
        for node in nodes.values():
            node.root = baseline
            node.start()
        for node in nodes.values():
            await node.wait_ready(90)
        async with connect(servers[0]) as channel:
            await channel.call("CreateTopic", {"topic": "orders", "queues": QUEUES}, timeout_s=30)
        await wait_all_groups_led(servers, set(nodes), timeout_s=60, groups=GROUPS)
        status = await cluster_status(servers)
        assert {node["id"]: node.get("schema_version") for node in status["nodes"]} == {1: 1, 2: 1, 3: 1}, status
        print(f"\nprevious release ({BASELINE[:7]}) up after {time.monotonic() - started:.1f} s; logs in {tmp_path}",
              flush=True)

        writers = Writers({node.node_id: node.server for node in nodes.values()})
        consumer = LiveConsumer(servers)
        async with trio.open_nursery() as nursery:
            for index, queue in enumerate(WRITER_QUEUES):
                nursery.start_soon(writers.write, queue, index)
            nursery.start_soon(consumer.run)
            await wait_going_on(writers, consumer, "all on the previous release", nodes)

            upgraded: set[int] = set()
            for number, node in enumerate(nodes.values(), 1):
                node.stop()
                node.root = ROOT
                restarted_at = trio.current_time()
                node.start()
                upgraded.add(node.node_id)
                await node.wait_ready(90)
                await wait_heartbeats(servers, node.node_id, restarted_at, upgraded)
                await wait_going_on(writers, consumer, f"phase {number}: node {node.node_id} upgraded", nodes)

            writers.stop.set()
            with trio.fail_after(60):
                while writers.done < len(WRITER_QUEUES):
                    await trio.sleep(0.1)
            acked = {seq for ack in writers.acks for seq in ack.seqs}
            with trio.move_on_after(60):
                while not acked <= consumer.seqs:
                    await trio.sleep(0.2)
            consumer.stop.set()
        for node in nodes.values():
            assert node.exited_by_itself() is None, f"node {node.node_id} died: {node.log_path.read_text()[-3000:]}"
        missing = sorted(acked - consumer.seqs)
        assert not missing, (f"{len(missing)} acknowledged messages never reached the live consumer (first "
                             f"{missing[:5]}, queues {sorted({seq // SEQ_SPAN for seq in missing})})")

        status = cli_cluster_status(servers[0])
        assert {node["id"]: node["schema_version"] for node in status["nodes"]} == {
            node: SCHEMA_VERSION for node in NODES}, status["nodes"]
        assert all(node["state"] == "up" for node in status["nodes"]), status["nodes"]

        result = await verify_acknowledged(writers, servers[0], tmp_path)
        print(f"totals: acknowledged {result['acknowledged']} messages in {result['batches']} batches, consumed "
              f"live {len(consumer.seqs)} ({consumer.polls} polls, {consumer.failovers} failovers), re-read "
              f"{result['consumed']}; writer failovers {writers.failovers} {dict(writers.errors)}; wall "
              f"{time.monotonic() - started:.1f} s", flush=True)
        assert result["acknowledged"] > 100
    finally:
        for node in nodes.values():
            node.kill()
