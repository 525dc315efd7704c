"""A group reset while the group's pull consumers run: each keeps its positions in memory, so its next commit
would silently undo the reset. The reset is refused with GROUP_ACTIVE, naming them, as Kafka refuses a reset
of an active group; once they have closed it goes through. `rocket group describe` shows who reads each queue. Pop consumers keep their positions in storage and
do not hold a reset back."""

from __future__ import annotations

import signal
import subprocess
import sys
from types import SimpleNamespace

import pytest
import trio

from rocket.client import Admin, Consumer, SimpleConsumer, connect, open_producer
from rocket.errors import Code, RocketError
from rocket.model import Message
from tests.e2e.test_cli import rocket


async def test_a_reset_waits_for_the_groups_pull_consumers_to_close(node):
    async with connect(f"127.0.0.1:{node.tcp_port}") as channel:
        admin = Admin(channel)
        await admin.create_topic("jobs", 2)
        async with open_producer(channel, "jobs") as producer:
            await producer.send_many([Message(f"m{i}".encode(), key=f"k{i}") for i in range(20)])
        consumer = Consumer(channel, "jobs", "readers", start="earliest", wait_ms=100, member="reader-1")
        await consumer.open()
        read = []
        while messages := await consumer.poll():
            read.extend(messages)
        await consumer.commit()
        assert len(read) == 20

        for reset in (lambda: admin.reset_group("jobs", "readers", "earliest"),
                      lambda: admin.seek_group("jobs", "readers", 0, 0)):
            with pytest.raises(RocketError) as refused:
                await reset()
            assert refused.value.code == Code.GROUP_ACTIVE and "reader-1" in refused.value.message
        await consumer.commit()
        described = await admin.describe_group("jobs", "readers")
        assert [(queue["lag"], queue["member"]) for queue in described] == [(0, "reader-1")] * 2

        await consumer.close()  # leaves the group at once
        described = await admin.reset_group("jobs", "readers", "earliest")
        assert sum(queue["lag"] for queue in described) == 20 and [queue["member"] for queue in described] == ["", ""]
        again = Consumer(channel, "jobs", "readers", wait_ms=100)
        await again.open()
        reread = []
        while messages := await again.poll():
            reread.extend(messages)
        await again.close()
        assert sorted(m.body for m in reread) == sorted(m.body for m in read)


async def test_pop_consumers_do_not_hold_a_reset_back(node):
    async with connect(f"127.0.0.1:{node.tcp_port}") as channel:
        admin = Admin(channel)
        await admin.create_topic("tasks", 1)
        async with open_producer(channel, "tasks") as producer:
            await producer.send_many([Message(f"t{i}".encode()) for i in range(5)])
        popper = SimpleConsumer(channel, "tasks", "workers", invisible_s=60)
        received = await popper.receive(max_messages=5, wait_s=1)
        assert len(received) == 5
        queues = await admin.reset_group("tasks", "workers", "earliest")
        assert queues[0]["in_flight"] == 0 and queues[0]["lag"] == 5


async def test_the_cli_names_the_live_consumers(node):
    server = SimpleNamespace(server=f"127.0.0.1:{node.tcp_port}")
    async with connect(server.server) as channel:
        await Admin(channel).create_topic("orders", 1)
        consumer = Consumer(channel, "orders", "billing", member="billing-7")
        await consumer.open()
        refused = await trio.to_thread.run_sync(lambda: rocket(
            "group", "reset", "orders", "--group", "billing", "--to", "earliest", server=server, check=False))
        assert refused.returncode != 0
        assert b"GROUP_ACTIVE" in refused.stderr and b"billing-7" in refused.stderr
        described = await trio.to_thread.run_sync(lambda: rocket("group", "describe", "orders", "--group", "billing",
                                                                 "--serde", "avro", server=server))
        assert b"billing-7" in described.stdout, described.stdout.decode()
        await consumer.close()
        await trio.to_thread.run_sync(lambda: rocket("group", "reset", "orders", "--group", "billing", "--to", "earliest",
                                                     server=server))


async def test_a_stopped_cli_consumer_leaves_its_group_at_once(node):
    """`rocket consume --follow` stopped by SIGTERM (systemd, timeout) commits and leaves the group, as Ctrl-C does:
    a reset right after it is not refused, and nothing it printed is read again."""
    server = f"127.0.0.1:{node.tcp_port}"
    async with connect(server) as channel:
        admin = Admin(channel)
        await admin.create_topic("audit", 2)
        async with open_producer(channel, "audit") as producer:
            await producer.send_many([Message(f"a{i}".encode(), key=f"k{i}") for i in range(10)])
        command = [sys.executable, "-m", "rocket", "consume", "audit", "--group", "auditors", "--follow",
                   "--format", "raw", "--server", server]
        follower = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        printed = [await trio.to_thread.run_sync(follower.stdout.readline) for _ in range(10)]
        assert sorted(printed) == sorted(f"a{i}\n".encode() for i in range(10))
        follower.send_signal(signal.SIGTERM)
        returncode = await trio.to_thread.run_sync(follower.wait, 30)
        assert returncode == 0 and b"consumed 10 messages" in follower.stderr.read()
        described = await admin.describe_group("audit", "auditors")
        assert [(queue["lag"], queue["member"]) for queue in described] == [(0, ""), (0, "")]
        assert sum(queue["lag"] for queue in await admin.reset_group("audit", "auditors", "earliest")) == 10
