"""A storage node restarted while no nameserver answers rejoins its groups from the assignment it saved: with the
only nameserver killed, node 4 is killed and restarted (it becomes ready without a heartbeat's answer), then node 5
is killed too, so that every group's quorum needs node 4; produce and consume through node 6 still work."""

from __future__ import annotations

import trio

from rocket.client import Admin, Consumer, connect, open_producer
from rocket.errors import Code, RocketError
from rocket.model import Message
from rocket.roles.storage import assignment as stored_assignment
from rocket.transport.listen import free_ports
from tests.integration.test_cluster import Node, cluster_status, running

GROUPS = 3
RETRYABLE = (Code.CONNECTION_LOST, Code.UNAVAILABLE, Code.TIMEOUT, Code.NOT_ENOUGH_REPLICAS, Code.OVERLOADED)


async def send_retrying(producer, message: Message, timeout_s: float) -> None:
    with trio.fail_after(timeout_s):
        while True:
            try:
                await producer.send(message)
                return
            except RocketError as error:
                if error.code not in RETRYABLE:
                    raise
                await trio.sleep(0.2)


def test_a_storage_node_restarted_without_nameservers_rejoins_its_groups(tmp_path):
    """Node 4's groups serve with node 5 down only if node 4, restarted while no nameserver answers, hosts them."""
    ports = free_ports(4)
    nameservers = f"1@127.0.0.1:{ports[0]}"
    environment = {"ROCKET_STORAGE_GROUPS": str(GROUPS), "ROCKET_REPLICATION": "3"}
    nodes = {1: Node(1, ports[0], nameservers, tmp_path, roles="nameserver", environment=environment)}
    for node_id, port in zip((4, 5, 6), ports[1:]):
        nodes[node_id] = Node(node_id, port, nameservers, tmp_path, roles="storage,broker", environment=environment)

    async def scenario() -> None:
        with trio.fail_after(30):  # the groups get their 3 replicas at once, not 2 and a third added later
            while True:
                status = await cluster_status([nodes[1].server])
                up = {node["id"] for node in (status or {"nodes": []})["nodes"] if node.get("state") == "up"}
                if {4, 5, 6} <= up:
                    break
                await trio.sleep(0.3)
        async with connect(nodes[6].server) as channel:
            with trio.fail_after(30):  # the storage groups are made as the storage nodes join
                while True:
                    try:
                        await Admin(channel).create_topic("orders", GROUPS)
                        break
                    except RocketError as error:
                        if error.code not in RETRYABLE:
                            raise
                        await trio.sleep(0.3)
            async with open_producer(channel, "orders") as producer:
                for number in range(30):
                    await send_retrying(producer, Message(f"before-{number}".encode()), 20)
                saved_path = nodes[4].data_dir / stored_assignment.FILE_NAME
                with trio.fail_after(10):  # the heartbeat that brought the topic's groups saved them
                    while not saved_path.exists() or [len(group["voters"]) for group in stored_assignment.decode(
                            4, saved_path.read_bytes())["groups"]] != [3] * GROUPS:
                        await trio.sleep(0.2)

                nodes[1].kill()  # no nameserver answers from now on
                nodes[4].kill()
                nodes[4].start()
                await nodes[4].wait_ready(20)  # ready from its saved assignment: no heartbeat was answered
                nodes[5].kill()  # every group's quorum is now nodes 4 and 6
                for number in range(30):
                    await send_retrying(producer, Message(f"after-{number}".encode()), 30)

            consumer = Consumer(channel, "orders", "verify", start="earliest", wait_ms=300)
            await consumer.open()
            received: set[bytes] = set()
            with trio.fail_after(30):
                while messages := await consumer.poll():
                    received.update(message.body for message in messages)
        expected = {f"{when}-{number}".encode() for when in ("before", "after") for number in range(30)}
        assert expected <= received

    with running(nodes, ready_s=40):
        trio.run(scenario)
    log = nodes[4].log_path.read_text()
    assert "of the assignment saved at metadata version" in log
