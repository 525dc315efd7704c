"""Message semantics against a real `rocket run`: topic message types, delayed messages that survive
SIGKILL and fire once, cancelled ones that never do, and tag and SQL92 filters on pull."""

from __future__ import annotations

import time

import pytest
import trio

from rocket.client import Admin, Consumer, SimpleConsumer, connect, open_consumer, open_producer
from rocket.errors import Code, RocketError
from rocket.model import Message
from rocket.serde import batch as batch_codec


async def consume_until(server: str, topic: str, group: str, wanted: int, timeout_s: float, **options) -> list[tuple[Message, float]]:
    """(message, when it was received) until wanted arrived or the timeout passed; then a short wait for extras."""
    received: list[tuple[Message, float]] = []
    async with connect(server) as channel:
        consumer = Consumer(channel, topic, group, start="earliest", wait_ms=200, **options)
        await consumer.open()
        with trio.move_on_after(timeout_s):
            while len(received) < wanted:
                received.extend((message, time.time()) for message in await consumer.poll())
                await consumer.commit()
        with trio.move_on_after(1.5):
            while True:
                received.extend((message, time.time()) for message in await consumer.poll())
    return received


async def test_each_topic_takes_only_sends_of_its_type(server_process):
    """A normal topic refuses delayed messages, a delay topic refuses undelayed ones, a transaction topic
    refuses sends until transactions exist, each with WRONG_MESSAGE_TYPE; a bad type is BAD_REQUEST."""
    server = server_process().start()
    async with connect(server.server) as channel:
        admin = Admin(channel)
        for name, message_type in (("plain", "normal"), ("later", "delay"), ("txn", "transaction")):
            assert (await admin.create_topic(name, 1, message_type)).message_type == message_type
        delayed = batch_codec.encode([Message(b"x", deliver_at_ms=int(time.time() * 1000) + 60_000)], 1)
        plain = batch_codec.encode([Message(b"x")], 1)
        for topic, batch in (("plain", delayed), ("later", plain), ("txn", plain)):
            with pytest.raises(RocketError) as caught:
                await channel.call("Produce", {"topic": topic, "queue": 0, "batch": batch})
            assert caught.value.code == Code.WRONG_MESSAGE_TYPE, topic
        with pytest.raises(RocketError) as caught:
            await admin.create_topic("odd", 1, "urgent")
        assert caught.value.code == Code.BAD_REQUEST
        with pytest.raises(RocketError) as caught:
            await admin.create_topic("%TIMER%plain", 1)
        assert caught.value.code == Code.BAD_REQUEST
        far = batch_codec.encode([Message(b"x", deliver_at_ms=int(time.time() * 1000) + 500 * 86_400_000)], 1)
        with pytest.raises(RocketError) as caught:
            await channel.call("Produce", {"topic": "later", "queue": 0, "batch": far})
        assert caught.value.code == Code.BAD_REQUEST and "days" in caught.value.message


async def test_delayed_messages_survive_sigkill_and_fire_once(server_process):
    """Delayed messages acknowledged before a SIGKILL are delivered once each after the restart, none
    before its time; cancelled ones never; a year-long delay is accepted and waits."""
    server = server_process().start()
    now_ms = int(time.time() * 1000)
    lead_ms = 6_000  # the first timer's delay: room for 150 sends and 10 cancels on a loaded machine
    async with connect(server.server) as channel:
        await Admin(channel).create_topic("later", 4, "delay")
        async with open_producer(channel, "later") as producer:
            sent = [await producer.send(Message(f"m{i}".encode(), key=f"k{i}", deliver_at_ms=now_ms + lead_ms + 20 * i))
                    for i in range(150)]
            year = await producer.send(Message(b"next year", deliver_at_ms=now_ms + 365 * 86_400_000))
        for message in sent[:10]:
            await Admin(channel).cancel_timer("later", f"{message.queue}.{message.offset}")
        with pytest.raises(RocketError) as caught:
            await Admin(channel).cancel_timer("later", f"{sent[0].queue}.{sent[0].offset}")
        assert caught.value.code == Code.NOT_FOUND
    server.kill()
    server.start()
    received = await consume_until(server.server, "later", "g", 140, timeout_s=30)
    bodies = [message.body for message, _ in received]
    assert sorted(bodies) == sorted(f"m{i}".encode() for i in range(10, 150)), "each once, none cancelled"
    for message, received_at in received:
        due_ms = now_ms + lead_ms + 20 * int(message.body[1:])
        assert message.timestamp_ms == due_ms and received_at * 1000 >= due_ms, "never before its time"
    async with connect(server.server) as channel:  # the year-long timer is still pending, and cancellable
        await Admin(channel).cancel_timer("later", f"{year.queue}.{year.offset}")


async def test_tag_and_sql_filters_deliver_exactly_the_matching_messages(server_process):
    """A tag filter and an SQL92 filter each deliver exactly the messages they match, across batches the
    broker skips; a malformed expression is refused with BAD_FILTER naming its position."""
    server = server_process().start()
    messages = [Message(f"m{i}".encode(), tag=("a", "b", "c")[i % 3], key=f"k{i}",
                        properties={"n": str(i), "region": ("eu", "us")[i % 2]}) for i in range(3_000)]
    async with connect(server.server) as channel:
        await Admin(channel).create_topic("orders", 2)
        async with open_producer(channel, "orders") as producer:
            for start in range(0, len(messages), 100):  # batches of one tag each too, so some are skipped whole
                await producer.send_many(messages[start:start + 100])
            await producer.send_many([Message(f"x{i}".encode(), tag="z") for i in range(500)])
        with pytest.raises(RocketError) as caught:
            await Consumer(channel, "orders", "bad", filter_type="sql", filter="n > 5 AND (region = 'eu'").open()
        assert caught.value.code == Code.BAD_FILTER and "position" in caught.value.message
    tagged = await consume_until(server.server, "orders", "tags", 2_000, 20, filter="a || c")
    assert sorted(m.body for m, _ in tagged) == sorted(m.body for m in messages if m.tag in ("a", "c"))
    sql = "n BETWEEN 100 AND 1999 AND region = 'eu' AND TAGS <> 'b'"
    wanted = [m.body for m in messages if 100 <= int(m.properties["n"]) <= 1999 and m.properties["region"] == "eu"
              and m.tag != "b"]
    matched = await consume_until(server.server, "orders", "sql", len(wanted), 20, filter_type="sql", filter=sql)
    assert sorted(m.body for m, _ in matched) == sorted(wanted)


async def test_clustering_members_split_the_queues_and_take_over_a_leaver(server_process):
    """Three pull consumers of one group split eight queues between them (each message read once); when
    one leaves, the others take its queues from its committed positions; broadcasting members each read
    everything and resume by their own positions."""
    server = server_process().start()
    async with connect(server.server) as channel:
        await Admin(channel).create_topic("orders", 8)
        async with open_producer(channel, "orders") as producer:
            await producer.send_many([Message(f"m{i}".encode(), key=f"k{i}") for i in range(800)])
        members = [Consumer(channel, "orders", "billing", start="earliest", wait_ms=100, member=name)
                   for name in ("a", "b", "c")]
        for consumer in members:
            await consumer.open()
        for _ in range(3):  # heartbeats settle the assignment
            for consumer in members:
                await trio.sleep(0.4)
                await consumer.poll(limit=0)
        assignments = [sorted(consumer.positions) for consumer in members]
        assert sorted(q for queues in assignments for q in queues) == list(range(8)), assignments
        read: list[bytes] = []
        for consumer in members[:2]:
            while messages := await consumer.poll():
                read.extend(m.body for m in messages)
            await consumer.commit()
        by_c = [m.body for m in await members[2].poll(limit=5)]  # c reads a little, commits, and leaves
        await members[2].close()
        await trio.sleep(1.1)  # the others' next heartbeat hands them c's queues
        for _ in range(5):
            for consumer in members[:2]:
                read.extend(m.body for m in await consumer.poll())
                await consumer.commit()
        assert len(by_c) == 5 and len(read) == len(set(read)) == 795
        assert set(read) | set(by_c) == {f"m{i}".encode() for i in range(800)}
        assert sorted(q for consumer in members[:2] for q in consumer.positions) == list(range(8))
        assert sum(q["lag"] for q in await Admin(channel).describe_group("orders", "billing")) == 0

        for name in ("x", "y"):
            async with open_consumer(channel, "orders", "audit", start="earliest", mode="broadcasting",
                                     member=name, wait_ms=0) as consumer:
                everything = []
                while messages := await consumer.poll():
                    everything.extend(messages)
            assert len(everything) == 800
        async with open_consumer(channel, "orders", "audit", mode="broadcasting", member="x", wait_ms=0) as again:
            assert await again.poll() == []


async def test_long_polls_longer_than_the_storage_retry_window_end_quietly(server_process):
    """A pull and a receive that wait longer than the broker's storage retry window (15 s) on an empty
    topic end with nothing, not with an error; a message sent meanwhile ends the wait."""
    server = server_process().start()
    async with connect(server.server) as channel:
        await Admin(channel).create_topic("quiet", 2)
        pulled = await channel.call("Pull", {"topic": "quiet", "queues": [{"queue": 0, "offset": 0}],
                                             "wait_ms": 17_000}, timeout_s=40)
        assert pulled["batches"] == []

        async def send_later() -> None:
            await trio.sleep(16)
            async with open_producer(channel, "quiet") as producer:
                await producer.send(Message(b"late"))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(send_later)
            received = await SimpleConsumer(channel, "quiet", "g").receive(wait_s=25)
        assert [m.body for m in received] == [b"late"]
