"""A replica that joins a group after its log was compacted gets a snapshot without the batches
before it, then fetches them from the other replicas: it ends up holding the whole queue."""

from __future__ import annotations

import trio

from rocket import limits
from rocket.client import connect
from rocket.errors import Code, RocketError
from rocket.model import Message
from rocket.serde import batch as batch_codec
from rocket.serde.batch import peek_count
from rocket.transport.listen import free_ports
from tests.integration.test_cluster import Node, cluster_status

BATCHES = limits.raft_log_entries_max + 300  # past the point where the group compacts its log


async def read_queue(server: str, group: int, replica_only: bool) -> list[tuple[int, bytes]]:
    """Every batch of orders/0 as one replica holds it (any_replica asks that node itself)."""
    found: list[tuple[int, bytes]] = []
    offset = 0
    async with connect(server) as channel:
        while True:
            response = await channel.call("StorageRead", {
                "group": group, "topic": "orders", "queues": [{"queue": 0, "offset": offset}], "max_bytes": 1 << 20,
                "wait_ms": 0, "at_least_one": True, "any_replica": replica_only})
            if not response["batches"]:
                return found
            for batch in response["batches"]:
                found.append((batch["base_offset"], bytes(batch["batch"])))
            offset = found[-1][0] + peek_count(found[-1][1])


async def test_a_replica_added_after_compaction_backfills_the_batches_it_lacks(tmp_path):
    ports = free_ports(4)
    nameservers = ",".join(f"{node}@127.0.0.1:{port}" for node, port in zip((1, 2, 3), ports))
    environment = {"ROCKET_STORAGE_GROUPS": "1", "ROCKET_REPLICATION": "3"}
    nodes = {node: Node(node, port, nameservers, tmp_path, environment=environment)
             for node, port in zip((1, 2, 3), ports)}
    nodes[4] = Node(4, ports[3], nameservers, tmp_path, "storage", environment)
    try:
        for node in (1, 2, 3):
            nodes[node].start()
        for node in (1, 2, 3):
            await nodes[node].wait_ready()
        server = nodes[1].server
        async with connect(server) as channel:
            await channel.call("CreateTopic", {"topic": "orders", "queues": 1})
            for index in range(BATCHES):
                batch = batch_codec.encode([Message(f"message-{index}".encode())], 1_700_000_000_000 + index)
                await channel.call("Produce", {"topic": "orders", "queue": 0, "batch": batch})
        nodes[4].start()
        await nodes[4].wait_ready()
        async with connect(server) as channel:
            await channel.call("DrainNode", {"node": 3, "draining": True})
        with trio.fail_after(60):  # node 3's replica moves to node 4, which installs a snapshot
            while True:
                status = await cluster_status([server])
                if status and status["groups"][0]["voters"] == [1, 2, 4] and not status["moving"]:
                    break
                await trio.sleep(0.5)
        group = status["groups"][0]["id"]
        expected = await read_queue(server, group, replica_only=True)  # node 1 never lacked any
        assert len(expected) == BATCHES
        with trio.fail_after(30):
            while True:
                try:
                    held = await read_queue(nodes[4].server, group, replica_only=True)
                except RocketError as error:  # UNAVAILABLE until the gap is filled
                    assert error.code == Code.UNAVAILABLE, error
                    held = []
                if held == expected:
                    break
                await trio.sleep(0.5)
        assert [offset for offset, _ in held] == list(range(BATCHES))
        log = nodes[4].log_path.read_text()
        assert "without its batches" in log and "backfilled from node" in log, "the test did not exercise a backfill"
    finally:
        for node in nodes.values():
            node.kill()
