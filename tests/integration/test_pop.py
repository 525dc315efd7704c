"""Pop consumption against a real `rocket run`: many receivers on one queue share its messages, messages
in flight at a SIGKILL reappear after their invisible time, a push consumer's failures are retried and
then dead-lettered, and groups are described, reset and have their dead letters resent."""

from __future__ import annotations

import json

import pytest
import trio

from rocket.client import Admin, Consumer, PushConsumer, SimpleConsumer, connect, open_producer
from rocket.errors import Code, RocketError
from rocket.model import Message
from tests.e2e.test_cli import rocket


async def produce(server: str, topic: str, count: int, queues: int = 1) -> None:
    async with connect(server) as channel:
        await Admin(channel).create_topic(topic, queues)
        async with open_producer(channel, topic) as producer:
            await producer.send_many([Message(f"m{i}".encode(), key=f"k{i}") for i in range(count)])


async def test_many_receivers_on_one_queue_share_it_and_each_message_is_acked_once(server_process):
    """Four receivers on a one-queue topic together ack every message exactly once; none is handed to two."""
    server = server_process().start()
    await produce(server.server, "jobs", 2_000)
    acked: list[bytes] = []

    async def receiver() -> None:
        async with connect(server.server) as channel:
            consumer = SimpleConsumer(channel, "jobs", "workers", invisible_s=60)
            while True:
                messages = await consumer.receive(max_messages=37, wait_s=1)
                if not messages:
                    return
                for message in messages:
                    await consumer.ack(message)
                    acked.append(message.body)

    async with trio.open_nursery() as nursery:
        for _ in range(4):
            nursery.start_soon(receiver)
    assert sorted(acked) == sorted(f"m{i}".encode() for i in range(2_000))
    async with connect(server.server) as channel:
        queues = await Admin(channel).describe_group("jobs", "workers")
    assert queues[0]["lag"] == 0 and queues[0]["in_flight"] == 0 and queues[0]["pop_cursor"] == 2_000


async def test_messages_in_flight_at_a_sigkill_reappear_after_their_invisible_time(server_process):
    """Messages received but not acked when the server is killed come back after the restart, once their
    invisible time ran out, as attempt 2; a receipt from before is stale; after the acks nothing is left."""
    server = server_process().start()
    await produce(server.server, "jobs", 100, queues=2)
    async with connect(server.server) as channel:
        consumer = SimpleConsumer(channel, "jobs", "workers", invisible_s=3)
        first = await consumer.receive(max_messages=100, wait_s=2)
        for message in first[:40]:
            await consumer.ack(message)
    assert len(first) == 100
    server.kill()
    server.start()
    async with connect(server.server) as channel:
        consumer = SimpleConsumer(channel, "jobs", "workers", invisible_s=30)
        again: list[Message] = []
        with trio.move_on_after(20):
            while len(again) < 60:
                again.extend(await consumer.receive(max_messages=100, wait_s=2))
        assert sorted(m.body for m in again) == sorted(m.body for m in first[40:])
        assert {m.attempt for m in again} == {2}
        with pytest.raises(RocketError) as caught:
            await consumer.ack(first[50])
        assert caught.value.code == Code.NOT_FOUND
        for message in again:
            await consumer.ack(message)
        assert await consumer.receive(max_messages=100, wait_s=0.5) == []


async def test_a_push_consumer_retries_failures_then_dead_letters_them(server_process):
    """A listener that fails on some messages sees them again with backoff until max_attempts, then they
    go to the dead-letter queue; `rocket dlq resend` sends them to the topic once; `rocket group reset`
    lets a pull consumer read everything again."""
    server = server_process().start()
    await produce(server.server, "flaky", 40, queues=2)
    attempts: dict[bytes, list[int]] = {}

    async def listener(message: Message) -> None:
        attempts.setdefault(message.body, []).append(message.attempt)
        if int(message.body[1:]) % 10 == 0:
            raise ValueError("cannot process this one")

    async with connect(server.server) as channel:
        consumer = SimpleConsumer(channel, "flaky", "proc", max_attempts=3, backoff_s=(0.2,))
        async with trio.open_nursery() as nursery:
            await nursery.start(PushConsumer(consumer, listener, concurrency=4).run)
            with trio.move_on_after(30):
                while sum(q["dead_letters"] for q in await Admin(channel).describe_group("flaky", "proc")) < 4:
                    await trio.sleep(0.2)
            nursery.cancel_scope.cancel()
    failing = [f"m{i}".encode() for i in (0, 10, 20, 30)]
    assert all(attempts[body] == [1, 2, 3] for body in failing), attempts
    assert all(attempts[body] == [1] for body in attempts if body not in failing)

    listed = rocket("dlq", "list", "flaky", "--group", "proc", "--format", "json", server=server)
    letters = [json.loads(line) for line in listed.stdout.splitlines()]
    assert sorted(letter["body"].encode() for letter in letters) == sorted(failing)
    assert all(letter["properties"]["DLQ_ATTEMPTS"] == "3" for letter in letters)
    assert b"resent 4 dead letters" in rocket("dlq", "resend", "flaky", "--group", "proc", server=server).stdout
    assert b"resent 0 dead letters" in rocket("dlq", "resend", "flaky", "--group", "proc", server=server).stdout
    rocket("group", "reset", "flaky", "--group", "proc", "--to", "earliest", server=server)
    async with connect(server.server) as channel:
        reader = Consumer(channel, "flaky", "proc", start="latest", wait_ms=0)
        await reader.open()
        everything = []
        while messages := await reader.poll():
            everything.extend(messages)
        assert sorted(m.body for m in everything) == sorted([f"m{i}".encode() for i in range(40)] + failing)
        assert all("DLQ_ATTEMPTS" not in m.properties for m in everything)


async def test_a_message_given_up_on_goes_to_the_dead_letters_at_once(server_process):
    """dead_letter() moves a received message to the group's dead-letter queue on its first attempt; it is
    not delivered again, and its stale receipt (or one used twice) is NOT_FOUND."""
    server = server_process().start()
    await produce(server.server, "jobs", 3)
    async with connect(server.server) as channel:
        consumer = SimpleConsumer(channel, "jobs", "workers", invisible_s=1)
        received = await consumer.receive(max_messages=3, wait_s=2)
        assert [m.body for m in received] == [b"m0", b"m1", b"m2"]
        await consumer.dead_letter(received[1])
        with pytest.raises(RocketError) as caught:
            await consumer.dead_letter(received[1])
        assert caught.value.code == Code.NOT_FOUND
        await consumer.ack(received[0], received[2])
        assert await consumer.receive(max_messages=3, wait_s=2) == []  # after its invisible second, too
        [queue] = await Admin(channel).describe_group("jobs", "workers")
        assert (queue["dead_letters"], queue["in_flight"]) == (1, 0)
    listed = rocket("dlq", "list", "jobs", "--group", "workers", "--format", "json", server=server)
    [letter] = [json.loads(line) for line in listed.stdout.splitlines()]
    assert letter["body"] == "m1" and letter["properties"]["DLQ_ATTEMPTS"] == "1"


async def test_fifo_order_holds_across_failures_and_a_sigkill(server_process):
    """On a FIFO topic, a push consumer whose listener fails now and then, and whose server is killed and
    restarted midway, completes every message of each message group (key) once, in send order."""
    server = server_process().start()
    async with connect(server.server) as channel:
        await Admin(channel).create_topic("ordered", 4, "fifo")
        async with open_producer(channel, "ordered") as producer:
            for i in range(300):
                await producer.send(Message(f"{i % 10}:{i}".encode(), key=f"group-{i % 10}"))
    done: list[bytes] = []
    failed_once: set[bytes] = set()

    async def listener(message: Message) -> None:
        if hash(message.body) % 7 == 0 and message.body not in failed_once:
            failed_once.add(message.body)
            raise ValueError("fail the first time")
        done.append(message.body)

    async def consume(until_done: bool, seconds: float) -> None:
        async with connect(server.server) as channel:
            consumer = SimpleConsumer(channel, "ordered", "fifo-readers", invisible_s=2, backoff_s=(0.3,))
            with trio.move_on_after(seconds):
                async with trio.open_nursery() as nursery:
                    await nursery.start(PushConsumer(consumer, listener, concurrency=8).run)
                    while not until_done or len(set(done)) < 300:
                        await trio.sleep(0.1)
                    nursery.cancel_scope.cancel()

    await consume(until_done=False, seconds=2)
    server.kill()
    server.start()
    await consume(until_done=True, seconds=90)
    assert set(done) == {f"{i % 10}:{i}".encode() for i in range(300)}
    for key in range(10):
        sequence = [int(body.split(b":")[1]) for body in done if body.startswith(f"{key}:".encode())]
        firsts = list(dict.fromkeys(sequence))  # a message done twice (acked just before the kill) counts once
        assert firsts == sorted(firsts), f"group {key} out of order: {sequence}"
