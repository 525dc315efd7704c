"""A running node takes the forecast model from its object store without a restart, places new queues by it (as
`rocket cluster placement --explain` shows), refuses a corrupt or stale model for the fallback, and adds queues to a
topic without moving the ones it has, or their data (issue 30)."""

from __future__ import annotations

import json
import re
import time

import pytest
import trio

from rocket import limits
from rocket.client import Admin, connect, open_consumer
from rocket.ml.forecast import FEATURES, MODEL_FORMAT, MODEL_VERSION, TARGET
from rocket.model import Message
from rocket.node import run_node
from rocket.serde import batch as batch_codec
from rocket.tier.local import LocalDirectoryStore
from rocket.transport.listen import free_ports
from tests.conftest import node_config
from tests.integration.test_cluster import Node, cluster_status

KEY = "models/forecast/latest.json"


def model(version: str, trained_at_ms: int) -> bytes:
    return json.dumps({
        "format": MODEL_FORMAT, "format_version": MODEL_VERSION, "features": list(FEATURES), "model_version": version,
        "horizon_steps": 10, "target": TARGET, "metrics": {"trained_at_ms": trained_at_ms},
        "trees": [{"weight": 1.0, "root": {"feature": 1, "threshold": 1000.0, "left": {"value": 5.0},
                                           "right": {"value": 9.0}}}]}).encode()


async def placement_state(admin: Admin, wanted: str) -> str:
    """The model's part of status' placement, once it starts with wanted; the planner's budget follows it."""
    with trio.fail_after(10):
        while not (state := (await admin.cluster_status())["placement"]).startswith(wanted):
            await trio.sleep(0.05)
    model_state, budget = state.rsplit("; ", 1)
    assert re.fullmatch(r"rebalancing: \d+ of 60 moves an hour left", budget), state
    return model_state


async def test_the_model_is_taken_without_a_restart_and_places_new_queues(nursery, tmp_path, monkeypatch):
    monkeypatch.setattr(limits, "model_poll_s", 0.1)  # before the node starts: its first wait is this long
    node = await nursery.start(lambda task_status: run_node(node_config(tmp_path / "data"), handle_signals=False,
                                                            task_status=task_status))
    now_ms = time.time_ns() // 1_000_000
    async with connect(f"127.0.0.1:{node.tcp_port}") as channel, \
            LocalDirectoryStore(tmp_path / "data" / "tier") as objects:
        admin = Admin(channel)
        await admin.create_topic("before", 4)
        assert await placement_state(admin, "no model") == "no model"
        explained = await admin.placement_explain("before")
        assert explained["predictor"] == "recent load (no model)"
        assert sorted({row["group"] for row in explained["queues"]}) == sorted(
            {row["group"] for row in explained["queues"]})  # every queue has a group
        assert len({row["group"] for row in explained["queues"]}) == 4, explained  # no history: spread out

        await objects.put(KEY, model("v1", now_ms))
        assert await placement_state(admin, "model v1") == "model v1"
        refusal = {"model_version": "v2", "promoted": False,
                   "reason": "rmse 12 on held-out data does not beat the served model's 10"}
        await objects.put("models/forecast/decision.json", json.dumps(refusal).encode())  # jobs/models.py's record
        assert await placement_state(admin, "model v1; last training") == (
            "model v1; last training: model v2 refused: rmse 12 on held-out data does not beat the served model's 10")
        await admin.create_topic("after", 3)
        explained = await admin.placement_explain("after")
        assert explained["predictor"] == "model v1" and explained["model"] == "model v1"
        for row in explained["queues"]:
            assert row["predicted"] >= 0 and row["node"] == 1 and row["runner_up"] != row["group"]
            assert row["score"] <= row["runner_up_score"]

        await objects.put(KEY, b'{"format": "rocket.forecast", "format_version": 99}')
        refused = await placement_state(admin, "model refused")
        assert "version 99" in refused
        await admin.create_topic("fallback", 2)
        assert (await admin.placement_explain("fallback"))["predictor"] == "recent load (no model)"

        await objects.put(KEY, model("v0", now_ms - int(30 * 86_400_000)))
        assert "stale" in await placement_state(admin, "model v0 is stale")

        losing = json.loads(model("v2", now_ms))
        losing["metrics"].update(rmse=2000.0, naive_rmse=1000.0)
        await objects.put(KEY, json.dumps(losing).encode())
        assert "worse than the last value" in await placement_state(admin, "model v2 refused")


async def test_added_queues_leave_the_old_ones_and_their_data_where_they_were(node):
    async with connect(f"127.0.0.1:{node.tcp_port}") as channel:
        admin = Admin(channel)
        await admin.create_topic("orders", 3)
        before = (await channel.call("GetRoute", {"topic": "orders"}))["queue_groups"]
        for queue in range(3):
            batch = batch_codec.encode([Message(f"{queue}-{n}".encode()) for n in range(10)], 1_700_000_000_000)
            await channel.call("Produce", {"topic": "orders", "queue": queue, "batch": batch})
        spec = await admin.update_topic("orders", queues=7)
        assert spec.queues == 7
        after = (await channel.call("GetRoute", {"topic": "orders"}))["queue_groups"]
        assert after[:3] == before and len(after) == 7
        explained = await admin.placement_explain("orders")
        assert [row["queue"] for row in explained["queues"]] == list(range(7))
        for queue in range(3, 7):
            batch = batch_codec.encode([Message(f"{queue}-0".encode())], 1_700_000_000_000)
            reply = await channel.call("Produce", {"topic": "orders", "queue": queue, "batch": batch})
            assert reply["base_offset"] == 0
        received: dict[int, list[bytes]] = {}
        async with open_consumer(channel, "orders", "check", start="earliest", wait_ms=200) as consumer:
            while messages := await consumer.poll():
                for message in messages:
                    received.setdefault(message.queue, []).append(message.body)
        assert {queue: len(bodies) for queue, bodies in received.items()} == {0: 10, 1: 10, 2: 10, 3: 1, 4: 1, 5: 1,
                                                                              6: 1}
        assert received[1] == [f"1-{n}".encode() for n in range(10)]  # in order, at the offsets they had
        for bad, code in ((5, "BAD_REQUEST"), (100_000, "BAD_REQUEST")):
            try:
                await admin.update_topic("orders", queues=bad)
            except Exception as error:  # noqa: BLE001 - the code is what is checked
                assert code in str(error)
            else:
                raise AssertionError(f"queues={bad} was accepted")


@pytest.fixture
def cluster(tmp_path):
    """Three all-role nodes with 12 storage groups (not started)."""
    ports = free_ports(3)
    nameservers = ",".join(f"{node}@127.0.0.1:{port}" for node, port in zip((1, 2, 3), ports))
    nodes = {node: Node(node, port, nameservers, tmp_path, environment={
        "ROCKET_STORAGE_GROUPS": "12", "ROCKET_REPLICATION": "3"}) for node, port in zip((1, 2, 3), ports)}
    try:
        yield nodes
    finally:
        for node in nodes.values():
            node.kill()


async def start_all(cluster: dict) -> list[str]:
    """Start every node, wait until each is ready; their servers."""
    for node in cluster.values():
        node.start()
    for node in cluster.values():
        await node.wait_ready()
    return [node.server for node in cluster.values()]


async def test_a_restarted_node_is_given_leaderships_back(cluster):
    """Node 3 of three is killed, so that nodes 1 and 2 lead every group; once it is back, the nameserver moves
    leaderships to it until the led load is even (idle groups weigh the same: leader counts even out)."""
    servers = await start_all(cluster)
    async with connect(servers[0]) as channel:
        await channel.call("CreateTopic", {"topic": "orders", "queues": 12}, timeout_s=30)

    def leads(status: dict) -> dict[int, int]:
        counts = {node: 0 for node in cluster}
        for group in status["groups"]:
            if group["leader"] in counts:
                counts[group["leader"]] += 1
        return counts

    cluster[3].kill()
    with trio.fail_after(60):
        while (status := await cluster_status(servers[:2])) is None or leads(status)[3] or \
                sum(leads(status).values()) < len(status["groups"]):
            await trio.sleep(0.5)
    cluster[3].start()
    await cluster[3].wait_ready()
    groups = len(status["groups"])
    with trio.fail_after(90):
        while True:
            status = await cluster_status(servers)
            if status is not None:
                counts = leads(status)
                if sum(counts.values()) == groups and max(counts.values()) - min(counts.values()) <= 2:
                    break
            await trio.sleep(0.5)
    assert counts[3] >= groups // 3 - 2, counts


async def test_storage_groups_are_created_as_storage_nodes_join(tmp_path):
    """Three nodes make 3 groups (ROCKET_STORAGE_GROUPS per 3 nodes); a fourth, storage-only node joins: the pool
    grows to ceil(3 x 4 / 3) = 4, the new group has a replica on the new node (it holds the fewest), it is served
    (it elects a leader), and a new topic's queues spread over it too."""
    ports = free_ports(4)
    nameservers = ",".join(f"{node}@127.0.0.1:{port}" for node, port in zip((1, 2, 3), ports))
    environment = {"ROCKET_STORAGE_GROUPS": "3", "ROCKET_REPLICATION": "3"}
    nodes = {node: Node(node, port, nameservers, tmp_path, roles="all" if node <= 3 else "storage",
                        environment=environment) for node, port in zip((1, 2, 3, 4), ports)}
    servers = [node.server for node in nodes.values()][:3]
    try:
        for node in list(nodes.values())[:3]:
            node.start()
        for node in list(nodes.values())[:3]:
            await node.wait_ready()
        async with connect(servers[0]) as channel:
            await channel.call("CreateTopic", {"topic": "orders", "queues": 3}, timeout_s=30)
        status = await cluster_status(servers)
        assert len(status["groups"]) == 3
        nodes[4].start()
        await nodes[4].wait_ready()
        with trio.fail_after(60):
            while (status := await cluster_status(servers)) is None or len(status["groups"]) < 4 or \
                    not all(group["leader"] for group in status["groups"]):
                await trio.sleep(0.5)
        new = status["groups"][-1]
        assert len(status["groups"]) == 4 and 4 in new["voters"] and len(new["voters"]) == 3, status["groups"]
        async with connect(servers[0]) as channel:
            await channel.call("CreateTopic", {"topic": "fresh", "queues": 4}, timeout_s=30)
            queue_groups = (await channel.call("GetRoute", {"topic": "fresh"}))["queue_groups"]
            reply = await channel.call("Produce", {"topic": "fresh", "queue": queue_groups.index(new["id"]),
                                                   "batch": batch_codec.encode([Message(b"x")], 1_700_000_000_000)})
        assert sorted(queue_groups) == sorted(group["id"] for group in status["groups"])
        assert reply["base_offset"] == 0
        await trio.sleep(3)  # a heartbeat or two: the pool stays at 4 (no node joined)
        assert len((await cluster_status(servers))["groups"]) == 4
    finally:
        for node in nodes.values():
            node.kill()


async def test_a_new_nameserver_leader_has_the_load_history_of_the_old_one(cluster):
    """The leader sends the traffic it records to the other nameservers: once the leader is killed (after the
    traffic stopped, so that no heartbeat brings any), the new leader still knows the groups and the topic."""
    servers = await start_all(cluster)
    async with connect(servers[0]) as channel:
        await channel.call("CreateTopic", {"topic": "orders", "queues": 3}, timeout_s=30)
        for queue in range(3):
            batch = batch_codec.encode([Message(b"x" * 1000) for _ in range(50)], 1_700_000_000_000)
            await channel.call("Produce", {"topic": "orders", "queue": queue, "batch": batch}, timeout_s=10)
    with trio.fail_after(30):  # 3 queues on 3 of the 12 groups, and the topic
        while (status := await cluster_status(servers)) is None or status["load_series"] < 4:
            await trio.sleep(0.2)
    await trio.sleep(2)  # a heartbeat interval or two: the leader has sent what it recorded
    status = await cluster_status(servers)
    before, leader = status["load_series"], status["nameserver_leader"]
    cluster[leader].kill()
    others = [node.server for number, node in cluster.items() if number != leader]
    with trio.fail_after(30):
        while (status := await cluster_status(others)) is None or status["nameserver_leader"] in (0, leader):
            await trio.sleep(0.2)
    assert status["load_series"] == before >= 2
