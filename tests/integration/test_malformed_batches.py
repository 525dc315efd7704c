"""A batch with a right CRC but records that cannot be read. The broker refuses one at produce now
(tests/integration/test_poison_batch.py), but older brokers checked only a batch's header and CRC, so a queue
may hold one: these tests store it as they did, with StorageAppend. It must not stop a queue's readers: a pull
consumer is told where it lies and steps past it with seek(), an SQL filter hands it on instead of failing the
pull, and pop consumption sends its messages to the dead letters at once while the rest of the queue is
delivered."""

from __future__ import annotations

import struct
import time
from types import SimpleNamespace

import msgspec
import pytest
import trio

from rocket.client import Admin, Consumer, SimpleConsumer, connect
from rocket.errors import Code, RocketError
from rocket.model import Message, dead_letter_topic
from rocket.serde import batch as batch_codec
from tests.e2e.test_cli import rocket


def unreadable_batch(count: int, flags: int = 0) -> bytes:
    """A version 3 batch whose CRC is right and whose count records are text where bodies must be bytes."""
    return sealed(msgspec.msgpack.encode([["text, not bytes"]] * count), count, flags)


def sealed(payload: bytes, count: int, flags: int = 0) -> bytes:
    """A batch of a version 3 payload as given, with a right header and CRC."""
    now_ms = int(time.time() * 1000)
    head = bytearray(batch_codec._header.pack(batch_codec.MAGIC, batch_codec.VERSION, flags, count, now_ms, now_ms,
                                              0, len(payload), 0))
    covered = batch_codec._crc_covered_header
    struct.pack_into("<I", head, covered, batch_codec.crc32c(payload, batch_codec.crc32c(bytes(head[:covered]))))
    return bytes(head) + payload


async def fill(channel, topic: str) -> None:
    """Queue 0 of a one-queue topic: m0-m2 at offsets 0-2, two unreadable messages at 3-4, m3-m4 at 5-6."""
    await Admin(channel).create_topic(topic, 1)
    now_ms = int(time.time() * 1000)
    batches = [batch_codec.encode([Message(f"m{i}".encode(), "k", properties={"n": str(i)}) for i in range(3)],
                                  now_ms),
               unreadable_batch(2),
               batch_codec.encode([Message(f"m{i}".encode(), "k", properties={"n": str(i)}) for i in (3, 4)], now_ms)]
    for encoded in batches:
        await store(channel, topic, encoded)


async def store(channel, topic: str, encoded: bytes, queue: int = 0) -> None:
    """Append a batch to a queue as a broker of an older version did: straight to its storage group, its records
    unchecked (a node without a cluster secret takes calls between nodes from anyone)."""
    group = (await channel.call("GetRoute", {"topic": topic}))["queue_groups"][queue]
    await channel.call("StorageAppend", {"group": group, "topic": topic, "queue": queue, "batch": encoded})


@pytest.mark.parametrize("bodies", [False, True])
async def test_a_pull_consumer_is_told_where_the_batch_lies_and_steps_past_it(node, bodies):
    """poll() hands out what lies before the batch, then raises BAD_BATCH naming its offsets and the seek that
    steps past it, again on every poll until that seek; then the rest comes, and a commit keeps the step."""
    async with connect(f"127.0.0.1:{node.tcp_port}") as channel:
        await fill(channel, "jobs")
        consumer = Consumer(channel, "jobs", "readers", start="earliest", wait_ms=100)
        await consumer.open()
        poll = consumer.poll_bodies if bodies else consumer.poll

        def as_bodies(found):
            return found if bodies else [message.body for message in found]

        assert as_bodies(await poll()) == [b"m0", b"m1", b"m2"]
        for _ in range(2):
            with pytest.raises(RocketError) as caught:
                await poll()
            assert caught.value.code == Code.BAD_BATCH
            assert "'jobs' queue 0, offsets 3-4" in caught.value.message and "seek(0, 5)" in caught.value.message
        with pytest.raises(RocketError) as caught:
            consumer.seek(1, 5)  # not a queue this consumer reads
        assert caught.value.code == Code.BAD_REQUEST
        consumer.seek(0, 5)
        assert as_bodies(await poll()) == [b"m3", b"m4"]
        await consumer.close()
        again = Consumer(channel, "jobs", "readers", start="earliest", wait_ms=100)
        await again.open()
        assert await again.poll() == []  # the group's position is past everything
        await again.close()


async def test_the_cli_moves_a_group_past_the_batch_as_the_error_says(node):
    """BAD_BATCH also names the `rocket group reset` that moves the group's position on that queue past the
    batch; the group's next consumer starts there. An offset without a queue is refused."""
    server = SimpleNamespace(server=f"127.0.0.1:{node.tcp_port}")
    async with connect(server.server) as channel:
        await fill(channel, "jobs")
        consumer = Consumer(channel, "jobs", "readers", start="earliest", wait_ms=100)
        await consumer.open()
        assert len(await consumer.poll()) == 3
        with pytest.raises(RocketError) as caught:
            await consumer.poll()
        await consumer.close()
        command = caught.value.message.split("closed: rocket ")[1].rstrip(")").split()
        assert command == ["group", "reset", "jobs", "--group", "readers", "--queue", "0", "--to", "5"]
        await trio.to_thread.run_sync(lambda: rocket(*command, server=server))
        refused = await trio.to_thread.run_sync(
            lambda: rocket("group", "reset", "jobs", "--group", "readers", "--to", "5", server=server, check=False))
        assert refused.returncode != 0 and b"names one queue" in refused.stderr
        again = Consumer(channel, "jobs", "readers", start="earliest", wait_ms=100)
        await again.open()
        assert [m.body for m in await again.poll()] == [b"m3", b"m4"]


async def test_a_limit_or_a_seek_back_cuts_before_the_batch_as_anywhere_else(node):
    """With a limit, poll stops at the limit first; seeking back reads the messages again."""
    async with connect(f"127.0.0.1:{node.tcp_port}") as channel:
        await fill(channel, "jobs")
        consumer = Consumer(channel, "jobs", "readers", start="earliest", wait_ms=100)
        await consumer.open()
        assert [m.body for m in await consumer.poll(limit=2)] == [b"m0", b"m1"]
        assert [m.body for m in await consumer.poll(limit=2)] == [b"m2"]
        with pytest.raises(RocketError):
            await consumer.poll(limit=2)
        consumer.seek(0, 1)
        assert [m.offset for m in await consumer.poll()] == [1, 2]


async def test_a_search_by_key_reads_around_the_batch_and_a_lookup_names_it(node):
    """find_messages finds the messages around a batch it cannot read (whose keys the index could not read either);
    get_message of a message in it is BAD_BATCH."""
    async with connect(f"127.0.0.1:{node.tcp_port}") as channel:
        await fill(channel, "jobs")
        admin = Admin(channel)
        assert [m.offset for m in await admin.find_messages("jobs", "k")] == [0, 1, 2, 5, 6]
        with pytest.raises(RocketError) as caught:
            await admin.get_message("jobs", 0, 4)
        assert caught.value.code == Code.BAD_BATCH
        assert (await admin.get_message("jobs", 0, 5)).body == b"m3"


async def test_an_sql_filter_hands_the_batch_on_instead_of_failing_the_pull(node):
    """The broker decodes batches for an SQL filter: one it cannot read reaches the client, which names it; the
    matches before and after it are delivered."""
    async with connect(f"127.0.0.1:{node.tcp_port}") as channel:
        await fill(channel, "jobs")
        consumer = Consumer(channel, "jobs", "readers", start="earliest", wait_ms=100, filter_type="sql",
                            filter="n IN ('1', '4')")
        await consumer.open()
        assert [m.body for m in await consumer.poll()] == [b"m1"]
        with pytest.raises(RocketError) as caught:
            await consumer.poll()
        assert caught.value.code == Code.BAD_BATCH and "seek(0, 5)" in caught.value.message
        consumer.seek(0, 5)
        assert [m.body for m in await consumer.poll()] == [b"m4"]


@pytest.mark.parametrize("sql", ["", "n IN ('1', '4')"])
async def test_pop_sends_unreadable_messages_to_the_dead_letters_at_once(node, sql):
    """A receiver gets the readable messages; the unreadable ones go to the dead letters on their first
    attempt, as empty messages that say why and where they came from; nothing is left in flight."""
    async with connect(f"127.0.0.1:{node.tcp_port}") as channel:
        await fill(channel, "jobs")
        options = {"filter_type": "sql", "filter": sql} if sql else {}
        consumer = SimpleConsumer(channel, "jobs", "workers", invisible_s=60, **options)
        received = []
        while found := await consumer.receive(max_messages=10, wait_s=0.5):
            received += found
            await consumer.ack(*found)
        assert [m.body for m in received] == ([b"m1", b"m4"] if sql else [b"m0", b"m1", b"m2", b"m3", b"m4"])
        [queue] = await Admin(channel).describe_group("jobs", "workers")
        assert (queue["dead_letters"], queue["in_flight"], queue["lag"]) == (2, 0, 0)
        letters = Consumer(channel, dead_letter_topic("workers", "jobs"), "inspect", start="earliest", wait_ms=100)
        await letters.open()
        dead = await letters.poll()
        assert [(m.body, m.properties["DLQ_ORIGIN_OFFSET"], m.properties["DLQ_ATTEMPTS"]) for m in dead] == \
            [(b"", "3", "1"), (b"", "4", "1")]
        assert all("malformed records" in m.properties["DLQ_MALFORMED"] for m in dead)
