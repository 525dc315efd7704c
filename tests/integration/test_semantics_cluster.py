"""Message semantics on a three-node cluster (all roles on each, every storage group on three replicas):
delayed messages, messages in flight of pop consumption and open transactions are state of the storage
groups, so they survive a SIGKILL of the node leading the most storage groups, served by the others."""

from __future__ import annotations

import time

import trio

from rocket.client import Admin, Outcome, SimpleConsumer, connect, open_producer, open_transaction_producer
from rocket.model import Message
from rocket.transport.listen import free_ports
from tests.integration.test_cluster import NODES, Node, leader_counts, wait_all_groups_led
from tests.integration.test_semantics import consume_until

GROUPS = 8


async def test_timers_pops_and_transactions_survive_the_loss_of_the_busiest_storage_leader(tmp_path):
    """Before the kill: 100 delayed messages scheduled, 60 of 100 jobs received and not acked, 20 half
    messages left open. After the SIGKILL of the node leading the most groups, through another node: every
    delayed message is delivered once, the 60 jobs come back after their invisible time and with the rest
    are each acked once, and the checker's commits (10 of 20) become visible once."""
    ports = free_ports(len(NODES))
    nameservers = ",".join(f"{node}@127.0.0.1:{port}" for node, port in zip(NODES, ports))
    environment = {"ROCKET_STORAGE_GROUPS": str(GROUPS), "ROCKET_REPLICATION": "3", "ROCKET_TRANSACTION_TIMEOUT_S": "1",
                   "ROCKET_TRANSACTION_CHECK_S": "1"}
    nodes = {node: Node(node, port, nameservers, tmp_path, environment=environment) for node, port in zip(NODES, ports)}
    try:
        for node in nodes.values():
            node.start()
        for node in nodes.values():
            await node.wait_ready()
        first = nodes[1].server
        due_ms = int(time.time() * 1000) + 8_000
        async with connect(first) as channel:
            admin = Admin(channel)
            await admin.create_topic("later", 4, "delay")
            await admin.create_topic("jobs", 4)
            await admin.create_topic("pay", 2, "transaction")
            async with open_producer(channel, "later") as producer:
                await producer.send_many([Message(f"t{i}".encode(), key=f"k{i}", deliver_at_ms=due_ms + 10 * i)
                                          for i in range(100)])
            async with open_producer(channel, "jobs") as producer:
                await producer.send_many([Message(f"j{i}".encode(), key=f"k{i}") for i in range(100)])
            async with open_transaction_producer(channel, "pay") as producer:
                for i in range(20):
                    await producer.send_half(Message(f"p{i}".encode(), key=f"k{i}"))
            jobs = SimpleConsumer(channel, "jobs", "workers", invisible_s=5)
            held: list[Message] = []
            while len(held) < 60:
                held.extend(await jobs.receive(max_messages=60 - len(held), wait_s=2))

        # every group led (right after startup a status may still show groups electing, with no leader)
        status = await wait_all_groups_led([node.server for node in nodes.values()], set(nodes), 30, groups=GROUPS)
        victim = leader_counts(status).most_common(1)[0][0]
        nodes[victim].kill()
        survivor = next(node.server for number, node in nodes.items() if number != victim)

        delivered = await consume_until(survivor, "later", "g", 100, timeout_s=60)
        bodies = [message.body for message, _ in delivered]
        assert sorted(bodies) == sorted(f"t{i}".encode() for i in range(100)), "each delayed message once"
        assert all(received_at * 1000 >= message.timestamp_ms for message, received_at in delivered)

        async with connect(survivor) as channel:
            jobs = SimpleConsumer(channel, "jobs", "workers", invisible_s=30)
            acked: list[bytes] = []
            with trio.move_on_after(60):
                while len(acked) < 100:
                    received = await jobs.receive(max_messages=100, wait_s=2)
                    if received:
                        await jobs.ack(*received)
                        acked.extend(m.body for m in received)
            assert sorted(acked) == sorted(f"j{i}".encode() for i in range(100))
            again = {m.body: m.attempt for m in held}
            assert set(again) <= set(acked)

            async def checker(transaction, messages: list[Message]) -> Outcome:
                return Outcome.COMMIT if int(messages[0].body[1:]) % 2 == 0 else Outcome.ROLLBACK

            async with open_transaction_producer(channel, "pay", checker):
                committed = await consume_until(survivor, "pay", "g", 10, timeout_s=60)
        assert sorted(m.body for m, _ in committed) == sorted(f"p{i}".encode() for i in range(0, 20, 2))
    finally:
        for node in nodes.values():
            node.kill()
