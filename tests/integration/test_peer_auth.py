"""A cluster with a cluster secret: its nodes talk to each other (Raft links, metadata, storage calls) over
connections that said PeerHello, while a client that reaches a node's port gets UNAUTHENTICATED for every method
between nodes (and changes nothing), over TCP and HTTP/2, with a forged, skewed or replayed hello as without one."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
import trio

from rocket.client import connect
from rocket.errors import RocketError
from rocket.model import Message
from rocket.serde import batch as batch_codec
from rocket.transport.listen import free_ports
from rocket.transport.peer_auth import PeerAuth
from tests.integration.test_cluster import Node, running

SECRET = "0123456789abcdef-the-cluster-secret"
NODES = (1, 2, 3)


@pytest.fixture
def secured(tmp_path):
    ports = free_ports(len(NODES))
    nameservers = ",".join(f"{node}@127.0.0.1:{port}" for node, port in zip(NODES, ports))
    nodes = {node: Node(node, port, nameservers, tmp_path, environment={
        "ROCKET_STORAGE_GROUPS": "4", "ROCKET_REPLICATION": "3", "ROCKET_CLUSTER_SECRET": SECRET})
        for node, port in zip(NODES, ports)}
    with running(nodes):
        yield nodes


def rocket(node: Node, *args: str) -> str:
    return subprocess.run([sys.executable, "-m", "rocket", *args, "--server", node.server], check=True,
                          capture_output=True, text=True, timeout=90).stdout


async def refused(channel, method: str, request: dict) -> None:
    with pytest.raises(RocketError) as error:
        await channel.call(method, request)
    assert error.value.code.name == "UNAUTHENTICATED", (method, error.value)


def test_nodes_with_a_secret_serve_and_outsiders_cannot_call_between_nodes(secured):
    first = secured[1]
    rocket(first, "topic", "create", "orders", "--queues", "4")  # placed by the nameservers' Raft, over links
    for index in range(10):
        rocket(secured[1 + index % 3], "send", "orders", f"m{index}")  # brokers call storage nodes
    consumed = rocket(secured[2], "consume", "orders", "--group", "g", "--from", "earliest", "--count", "10",
                      "--format", "raw")
    assert sorted(consumed.split()) == sorted(f"m{index}" for index in range(10))

    async def outsider() -> None:
        good = batch_codec.encode([Message(b"forged")], int(time.time() * 1000))
        async with connect(first.server) as channel:
            group = (await channel.call("DescribeTopic", {"topic": "orders"}))["topic"]["name"]
            assert group == "orders"  # what clients call is served
            for method, request in (
                    ("StorageAppend", {"group": 1, "topic": "orders", "queue": 0, "batch": good}),
                    ("RaftStep", {"sender": 2, "payload": b"\x00" * 16}),
                    ("MetaCreateTopic", {"topic": "sneaky", "queues": 1}),
                    ("MetaUpdateTopic", {"topic": "orders", "queues": 64}),
                    ("NodeHeartbeat", {"node": 9, "address": "127.0.0.1:1", "roles": ["storage"],
                                       "load": {"groups": 0, "leads": [], "bytes": 0, "free_disk_bytes": 0,
                                                "lagging": []}}),
                    ("GetRoute", {"topic": "orders"})):
                await refused(channel, method, request)
            wrong = PeerAuth(b"not the cluster's secret at all", 9, lambda: int(time.time() * 1000)).hello()[1]
            await refused(channel, "PeerHello", wrong)
            await refused(channel, "GetRoute", {"topic": "orders"})  # a refused hello grants nothing
            skewed = PeerAuth(SECRET.encode(), 9, lambda: int(time.time() * 1000) - 120_000).hello()[1]
            await refused(channel, "PeerHello", skewed)
        right = PeerAuth(SECRET.encode(), 9, lambda: int(time.time() * 1000)).hello()[1]
        async with connect(first.server) as channel:
            await channel.call("PeerHello", right)
            assert (await channel.call("GetRoute", {"topic": "orders"}))["topic"]["name"] == "orders"
        async with connect(first.server) as channel:
            await refused(channel, "PeerHello", right)  # replayed on another connection
            await refused(channel, "GetRoute", {"topic": "orders"})

    trio.run(outsider)
    listed = rocket(first, "topic", "list")
    assert "sneaky" not in listed and "│ orders │ normal │ 4 " in listed  # nothing forged took effect
    assert "forged" not in rocket(secured[3], "consume", "orders", "--group", "h", "--from", "earliest", "--count",
                                  "10")


def test_http2_refuses_the_methods_between_nodes_to_a_connection_without_the_hello(server_process, monkeypatch):
    monkeypatch.setenv("ROCKET_CLUSTER_SECRET", SECRET)
    server = server_process().start()

    async def over_http2() -> None:
        async with connect(f"127.0.0.1:{server.http2_port}", "http2") as channel:
            await channel.call("CreateTopic", {"topic": "t", "queues": 1})
            await refused(channel, "GetRoute", {"topic": "t"})
            right = PeerAuth(SECRET.encode(), 9, lambda: int(time.time() * 1000)).hello()[1]
            await channel.call("PeerHello", right)  # accepted: this connection is a node's now, as over TCP
            assert (await channel.call("GetRoute", {"topic": "t"}))["topic"]["name"] == "t"
        async with connect(f"127.0.0.1:{server.http2_port}", "http2") as channel:
            await refused(channel, "GetRoute", {"topic": "t"})  # another connection has not said it

    trio.run(over_http2)
