"""Scaling a running cluster under load, with real `rocket run` processes on 127.0.0.1.

1. Storage: three all-role nodes with 24 storage groups; a storage+broker node 4 joins and fills up
   (the nameserver moves replicas onto it), a second one, node 5, joins, node 4 is drained until it holds
   no replica and is then stopped with SIGTERM (it must exit 0). Writers produce through the brokers of
   nodes 1-3 the whole time.
2. Brokers: broker-only nodes come and go (node 6 from the start, node 7 mid-way, node 6 stopped with
   SIGTERM) while writers produce through them; writers fail over with retried calls only, and no storage
   replica moves (a broker holds no data).

Both end by consuming everything from earliest with a fresh consumer group and checking every acknowledged
message at the offset it was acknowledged at, offsets 0..next-1 per queue, per-queue order; duplicates
(resends after an unknown outcome) are counted and printed, not forbidden.

Run with -s to see the figures. Node logs are in the test's tmp_path (node<N>.log, stdout in node<N>.out).
"""

from __future__ import annotations

import collections
import signal
import time
from pathlib import Path

import pytest
import trio

from rocket.client import connect
from rocket.transport.listen import free_ports
from tests.integration.test_cluster import FAILOVER, Node, Writers, cluster_status, verify_acknowledged

NAMESERVERS = (1, 2, 3)  # all-role nodes; the nameserver group
GROUPS = 24
QUEUES = 24
REPLICATION = 3
WRITER_QUEUES = (0, 3, 6, 9, 12, 15, 18, 21)
STORAGE_ROLES = "storage,broker"


class RoleNode(Node):
    """A Node started with the given roles and this module's storage group count; it can be stopped."""

    def __init__(self, node_id: int, port: int, nameservers: str, base: Path, roles: str):
        super().__init__(node_id, port, nameservers, base, roles,
                         {"ROCKET_STORAGE_GROUPS": str(GROUPS), "ROCKET_REPLICATION": str(REPLICATION)})

    async def terminate(self, timeout_s: float = 30.0) -> tuple[int | None, float]:
        """SIGTERM and wait for the exit: (exit status or None if still running after timeout_s, seconds)."""
        started = trio.current_time()
        self.process.send_signal(signal.SIGTERM)
        with trio.move_on_after(timeout_s):
            while self.process.poll() is None:
                await trio.sleep(0.05)
        return self.process.poll(), trio.current_time() - started


@pytest.fixture
def scaling_cluster(tmp_path):
    """Nodes 1-7 on free ports (1-3 all-role nameservers); a node's process starts only when asked."""
    node_ids = (1, 2, 3, 4, 5, 6, 7)
    ports = dict(zip(node_ids, free_ports(len(node_ids))))
    nameservers = ",".join(f"{node}@127.0.0.1:{ports[node]}" for node in NAMESERVERS)
    roles = {1: "all", 2: "all", 3: "all", 4: STORAGE_ROLES, 5: STORAGE_ROLES, 6: "broker", 7: "broker"}
    nodes = {node: RoleNode(node, ports[node], nameservers, tmp_path, roles[node]) for node in node_ids}
    try:
        yield nodes
    finally:
        for node in nodes.values():
            node.kill()


# ---- helpers -------------------------------------------------------------------------------------------

def replica_counts(status: dict) -> dict[int, int]:
    """Node -> the number of groups whose voters or learners include it."""
    counts: collections.Counter = collections.Counter()
    for group in status["groups"]:
        for node in set(group["voters"]) | set(group["learners"]):
            counts[node] += 1
    return {node["id"]: counts.get(node["id"], 0) for node in status["nodes"]} | dict(counts)


def node_entry(status: dict, node_id: int) -> dict | None:
    return next((node for node in status["nodes"] if node["id"] == node_id), None)


async def start_nameservers(nodes: dict[int, RoleNode]) -> list[str]:
    for node in NAMESERVERS:
        nodes[node].start()
    for node in NAMESERVERS:
        await nodes[node].wait_ready()
    servers = [nodes[node].server for node in NAMESERVERS]
    async with connect(servers[0]) as channel:
        await channel.call("CreateTopic", {"topic": "orders", "queues": QUEUES}, timeout_s=30)
    with trio.fail_after(30):
        while True:
            status = await cluster_status(servers)
            if status is not None and len(status["groups"]) == GROUPS and all(
                    group["leader"] in NAMESERVERS for group in status["groups"]):
                return servers
            await trio.sleep(0.2)


async def wait_status(servers: list[str], condition, timeout_s: float, what: str) -> tuple[dict, float]:
    """Poll ClusterStatus until condition(status) holds; returns it and the seconds taken. Fails the test
    with the last status seen after timeout_s."""
    started = trio.current_time()
    status = None
    with trio.move_on_after(timeout_s):
        while True:
            seen = await cluster_status(servers)
            if seen is not None:
                status = seen
                if condition(status):
                    return status, trio.current_time() - started
            await trio.sleep(0.25)
    summary = None if status is None else {
        "replicas": replica_counts(status), "moving": status["moving"],
        "states": {node["id"]: node["state"] for node in status["nodes"]},
        "learners": {group["id"]: group["learners"] for group in status["groups"] if group["learners"]}}
    pytest.fail(f"{what}: not reached after {timeout_s} s; last cluster status {summary}")


def log_problems(nodes: dict[int, RoleNode]) -> dict[int, list[str]]:
    """Lines of each started node's log that look like an error (tracebacks, ERROR, CRITICAL)."""
    problems = {}
    for node in nodes.values():
        if node.starts and node.log_path.exists():
            lines = [line for line in node.log_path.read_text(errors="replace").splitlines()
                     if "Traceback" in line or "ERROR" in line or "CRITICAL" in line]
            if lines:
                problems[node.node_id] = lines
    return problems


def warning_counts(nodes: dict[int, RoleNode]) -> dict[int, int]:
    return {node.node_id: node.log_path.read_text(errors="replace").count("WARNING")
            for node in nodes.values() if node.starts and node.log_path.exists()}


async def stop_writers(writers: Writers, writer_count: int) -> None:
    writers.stop.set()  # each writer ends once its batch in flight is acknowledged
    with trio.fail_after(40):
        while writers.done < writer_count:
            await trio.sleep(0.1)


# ---- tests ---------------------------------------------------------------------------------------------

async def test_a_new_storage_node_fills_up_and_a_drained_one_leaves_without_loss(scaling_cluster, tmp_path):
    """Node 4 (storage, broker) joins and fills up, node 5 joins, node 4 is drained to empty and stops
    with SIGTERM (exit 0); writers produce throughout; nothing acknowledged is lost."""
    nodes: dict[int, RoleNode] = scaling_cluster
    started = time.monotonic()
    servers = await start_nameservers(nodes)
    status = await cluster_status(servers)
    print(f"\ncluster up: {GROUPS} groups on nodes {replica_counts(status)} after {time.monotonic() - started:.1f} s; "
          f"logs in {tmp_path}", flush=True)

    writers = Writers({node: nodes[node].server for node in NAMESERVERS})
    async with trio.open_nursery() as nursery:
        for index, queue in enumerate(WRITER_QUEUES):
            nursery.start_soon(writers.write, queue, index)
        await trio.sleep(2)

        # node 4 joins and fills up
        nodes[4].start()
        await nodes[4].wait_ready()
        want = GROUPS * REPLICATION // 4 - 1
        status, fill_s = await wait_status(
            servers, lambda status: replica_counts(status).get(4, 0) >= want and status["moving"] == 0,
            timeout_s=60, what=f"node 4 holding {want} replicas, no move running")
        print(f"node 4 filled up: {replica_counts(status)[4]} replicas (want >= {want}) after {fill_s:.1f} s; "
              f"replicas {replica_counts(status)}", flush=True)

        # node 5 joins; once the nameserver has seen it, node 4 is drained
        nodes[5].start()
        await nodes[5].wait_ready()
        await wait_status(servers, lambda status: (node_entry(status, 5) or {}).get("state") == "up", timeout_s=15,
                          what="node 5 up")
        async with connect(servers[0]) as channel:
            await channel.call("DrainNode", {"node": 4, "draining": True}, timeout_s=20)
        status, drain_s = await wait_status(
            servers, lambda status: replica_counts(status).get(4, 0) == 0 and status["moving"] == 0,
            timeout_s=60, what="node 4 drained to no replica, no move running")
        assert node_entry(status, 4)["state"] == "draining", node_entry(status, 4)
        print(f"node 4 drained: no replica after {drain_s:.1f} s; replicas {replica_counts(status)}", flush=True)

        exit_status, exit_s = await nodes[4].terminate()
        print(f"node 4 SIGTERM: exit status {exit_status} after {exit_s:.2f} s", flush=True)
        assert exit_status == 0, f"node 4 exit status {exit_status}: {nodes[4].log_path.read_text()[-3000:]}"
        acks_before = len(writers.acks)
        await trio.sleep(2)
        assert len(writers.acks) > acks_before, "nothing acknowledged after node 4 stopped"
        await stop_writers(writers, len(WRITER_QUEUES))
    for node in (1, 2, 3, 5):
        assert nodes[node].exited_by_itself() is None, \
            f"node {node} died: {nodes[node].log_path.read_text()[-3000:]}"

    final = await cluster_status(servers)
    totals = await verify_acknowledged(writers, nodes[1].server, tmp_path)
    print(f"final replicas per node {dict(sorted(replica_counts(final).items()))}; moving {final['moving']}; "
          f"node states {({node['id']: node['state'] for node in final['nodes']})}", flush=True)
    print(f"totals: acknowledged {totals['acknowledged']} messages in {totals['batches']} batches; consumed "
          f"{totals['consumed']} ({totals['distinct']} distinct); duplicates {totals['duplicates']}; stored but never "
          f"acknowledged {totals['never_acknowledged']}; writer failovers {writers.failovers} {dict(writers.errors)}, "
          f"resends {writers.resends}; log warnings {warning_counts(nodes)}; wall {time.monotonic() - started:.1f} s",
          flush=True)
    if totals["duplicated_batches"]:
        print(f"duplicated batches (queue, offsets of the copies, acknowledgement): {totals['duplicated_batches'][:5]}")
    assert totals["acknowledged"] > 1000
    assert all(len(group["voters"]) == REPLICATION and 4 not in group["voters"] for group in final["groups"]), \
        final["groups"]
    problems = log_problems(nodes)
    assert not problems, f"errors in node logs: { {node: lines[:5] for node, lines in problems.items()} }"


async def test_brokers_come_and_go_under_load(scaling_cluster, tmp_path):
    """Writers produce through broker-only node 6, then also through broker-only node 7 started mid-way;
    node 6 stops with SIGTERM and its writers fail over with retried calls only. No replica moves."""
    nodes: dict[int, RoleNode] = scaling_cluster
    started = time.monotonic()
    nodes[6].start()  # a broker-only node may start before the nameservers answer
    servers = await start_nameservers(nodes)
    await nodes[6].wait_ready()
    before = await cluster_status(servers)
    voters_before = {group["id"]: group["voters"] for group in before["groups"]}
    print(f"\ncluster up: {GROUPS} groups on nodes {replica_counts(before)} after {time.monotonic() - started:.1f} s; "
          f"logs in {tmp_path}", flush=True)

    order = (6, 7, *NAMESERVERS)  # a writer fails over to the next in this order
    writers = Writers({node: nodes[node].server for node in order})
    first, second = WRITER_QUEUES[:4], WRITER_QUEUES[4:]
    async with trio.open_nursery() as nursery:
        for queue in first:
            nursery.start_soon(writers.write, queue, 0)  # node 6
        await trio.sleep(3)
        assert set(writers.using.values()) == {6}, writers.using
        acks_on_6 = sum(ack.node == 6 for ack in writers.acks)
        assert acks_on_6 > 0

        nodes[7].start()
        await nodes[7].wait_ready()
        for queue in second:
            nursery.start_soon(writers.write, queue, 1)  # node 7
        status, _ = await wait_status(
            servers, lambda status: all((node_entry(status, node) or {}).get("state") == "up" for node in (6, 7)),
            timeout_s=15, what="nodes 6 and 7 up")
        for node in (6, 7):
            assert node_entry(status, node)["roles"] == ["broker"], node_entry(status, node)
        async with connect(nodes[7].server) as channel:  # a broker-only node forwards ClusterStatus
            through_7 = await channel.call("ClusterStatus", {}, timeout_s=15)
        assert [node["id"] for node in through_7["nodes"]] == [node["id"] for node in status["nodes"]]
        await trio.sleep(3)
        assert any(ack.node == 7 for ack in writers.acks), "nothing acknowledged through node 7"
        using_before_stop = dict(writers.using)

        failovers_before, resends_before = writers.failovers, writers.resends
        stopped_at = trio.current_time()
        exit_status, exit_s = await nodes[6].terminate()
        assert exit_status == 0, f"node 6 exit status {exit_status}: {nodes[6].log_path.read_text()[-3000:]}"
        moved: dict[int, float] = {}  # writer queue that used node 6 -> seconds until acknowledged elsewhere
        on_6 = [queue for queue, node in using_before_stop.items() if node == 6]
        with trio.move_on_after(20):
            while len(moved) < len(on_6):
                for ack in writers.acks:
                    if ack.queue in on_6 and ack.node != 6 and ack.at > stopped_at:
                        moved.setdefault(ack.queue, ack.at - stopped_at)
                await trio.sleep(0.1)
        print(f"node 6 SIGTERM: exit status {exit_status} after {exit_s:.2f} s; writers on it {on_6} acknowledged "
              f"elsewhere after {({queue: round(seconds, 2) for queue, seconds in sorted(moved.items())})} s, now on "
              f"{({queue: writers.using.get(queue) for queue in on_6})}; failovers {writers.failovers - failovers_before},"
              f" resends {writers.resends - resends_before}", flush=True)
        assert sorted(moved) == sorted(on_6), f"writers still not producing elsewhere: {writers.using}"
        await trio.sleep(2)
        status = await cluster_status(servers)
        assert node_entry(status, 6)["roles"] == ["broker"] and node_entry(status, 7)["roles"] == ["broker"]
        await stop_writers(writers, len(WRITER_QUEUES))
    for node in (1, 2, 3, 7):
        assert nodes[node].exited_by_itself() is None, \
            f"node {node} died: {nodes[node].log_path.read_text()[-3000:]}"

    after = await cluster_status(servers)
    voters_after = {group["id"]: group["voters"] for group in after["groups"]}
    totals = await verify_acknowledged(writers, nodes[1].server, tmp_path)
    by_node = collections.Counter(ack.node for ack in writers.acks)
    print(f"batches acknowledged per broker {dict(sorted(by_node.items()))}; node states "
          f"{({node['id']: node['state'] for node in after['nodes']})}; replicas {replica_counts(after)}", flush=True)
    print(f"totals: acknowledged {totals['acknowledged']} messages in {totals['batches']} batches; consumed "
          f"{totals['consumed']} ({totals['distinct']} distinct); duplicates {totals['duplicates']}; stored but never "
          f"acknowledged {totals['never_acknowledged']}; retried calls {writers.failovers} {dict(writers.errors)}, "
          f"resends {writers.resends}; log warnings {warning_counts(nodes)}; wall {time.monotonic() - started:.1f} s",
          flush=True)
    if totals["duplicated_batches"]:
        print(f"duplicated batches (queue, offsets of the copies, acknowledgement): {totals['duplicated_batches'][:5]}")
    assert set(writers.errors) <= {code.name for code in FAILOVER}, writers.errors  # others end the writer
    assert totals["acked"] == writers.sent, "a batch sent was never acknowledged"
    assert totals["acknowledged"] > 1000
    assert voters_after == voters_before, "storage replicas moved although only brokers came and went"
    assert after["moving"] == 0 and not any(group["learners"] for group in after["groups"])
    problems = log_problems(nodes)
    assert not problems, f"errors in node logs: { {node: lines[:5] for node, lines in problems.items()} }"
