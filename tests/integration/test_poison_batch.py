"""Issue 35, a poison batch: a right CRC and a record whose key is not UTF-8. Over a real socket to `rocket run`:
the broker refuses it at Produce and Bury with BAD_BATCH naming the record and field; one stored by an older broker
(StorageAppend, as test_malformed_batches.py stores them) is BAD_BATCH with its offsets for pull readers, SQL
filters included, and goes to the dead letters for pop; the server logs no traceback and the queue keeps serving."""

from __future__ import annotations

import msgspec
import pytest

from rocket.client import Admin, Consumer, SimpleConsumer, connect
from rocket.errors import Code, RocketError
from rocket.model import Message, dead_letter_topic
from rocket.serde import batch as batch_codec
from tests.integration.test_malformed_batches import sealed, store


def poison() -> bytes:
    """Two records: a good one, then one whose key is the bytes ff fe, a msgpack str that is not UTF-8."""
    good = msgspec.msgpack.encode([b"fine", "", "", {"n": "0"}, 1])
    bad = b"\x95" + msgspec.msgpack.encode(b"poison") + b"\xa2\xff\xfe" + b"\xa0" + b"\x81\xa1n\xa11" + b"\x01"
    return sealed(b"\x92" + good + bad, 2)


async def test_a_poison_batch_is_refused_at_produce_and_one_stored_before_stops_no_reader(server_process):
    server = server_process().start()
    async with connect(server.server) as channel:
        await Admin(channel).create_topic("jobs", 1)
        for method, extra in (("Produce", {}), ("Bury", {"group": "workers"})):
            with pytest.raises(RocketError) as caught:
                await channel.call(method, {"topic": "jobs", "queue": 0, "batch": poison(), **extra})
            assert caught.value.code == Code.BAD_BATCH
            assert "record 1 field key: not valid UTF-8" in caught.value.message
        assert (await channel.call("DescribeTopic", {"topic": "jobs"}))["queues"][0]["next_offset"] == 0

        # As an older broker stored it: m0 at 0, the poison batch at 1-2, m1 at 3.
        now_ms = 1_700_000_000_000
        await store(channel, "jobs", batch_codec.encode([Message(b"m0", properties={"n": "0"})], now_ms))
        await store(channel, "jobs", poison())
        await channel.call("Produce", {"topic": "jobs", "queue": 0,
                                       "batch": batch_codec.encode([Message(b"m1", properties={"n": "1"})], now_ms)})

        for options in ({}, {"filter_type": "sql", "filter": "n IN ('0', '1')"}):
            consumer = Consumer(channel, "jobs", "readers" + options.get("filter_type", ""), start="earliest",
                                wait_ms=100, **options)
            await consumer.open()
            assert [m.body for m in await consumer.poll()] == [b"m0"]
            with pytest.raises(RocketError) as caught:
                await consumer.poll()
            assert caught.value.code == Code.BAD_BATCH
            assert "'jobs' queue 0, offsets 1-2" in caught.value.message and "record 1 field key" in caught.value.message
            consumer.seek(0, 3)
            assert [m.body for m in await consumer.poll()] == [b"m1"]
            await consumer.close()

        receiver = SimpleConsumer(channel, "jobs", "workers", invisible_s=60)
        received = []
        while found := await receiver.receive(max_messages=10, wait_s=0.5):
            received += found
            await receiver.ack(*found)
        assert [m.body for m in received] == [b"m0", b"m1"]
        [queue] = await Admin(channel).describe_group("jobs", "workers")
        assert (queue["dead_letters"], queue["in_flight"], queue["lag"]) == (2, 0, 0)
        letters = Consumer(channel, dead_letter_topic("workers", "jobs"), "inspect", start="earliest", wait_ms=100)
        await letters.open()
        dead = await letters.poll()
        assert [m.properties["DLQ_ORIGIN_OFFSET"] for m in dead] == ["1", "2"]
        assert all("record 1 field key" in m.properties["DLQ_MALFORMED"] for m in dead)

        # The queue keeps serving.
        await channel.call("Produce", {"topic": "jobs", "queue": 0,
                                       "batch": batch_codec.encode([Message(b"m2")], now_ms)})
        assert [m.body for m in await receiver.receive(max_messages=10, wait_s=1)] == [b"m2"]
    server.terminate()
    log = server.log_path.read_text()
    assert "Traceback" not in log and "UnicodeDecodeError" not in log and "INTERNAL" not in log, log[-3000:]
