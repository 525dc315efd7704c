"""Both transports and the three serdes pass the same produce/consume test; HTTP/2 serves real clients."""

from __future__ import annotations

import json
import subprocess

import pytest
import trio

from rocket.client import Consumer, connect, open_producer
from rocket.errors import Code, RocketError
from rocket.model import Message
from rocket.serde import batch as batch_codec

MATRIX = [("tcp", "json"), ("tcp", "avro"), ("tcp", "lane"), ("http2", "json"), ("http2", "avro"), ("http2", "lane")]


def server_of(node, transport: str) -> str:
    return f"127.0.0.1:{node.tcp_port if transport == 'tcp' else node.http2_port}"


@pytest.mark.parametrize("transport, serde", MATRIX)
async def test_produce_and_consume(node, transport, serde):
    """Messages with keys, tags and properties, sent one by one and in bulk, come back intact and in order."""
    async with connect(server_of(node, transport), transport, serde) as channel:
        await channel.call("CreateTopic", {"topic": "orders", "queues": 4})
        async with open_producer(channel, "orders") as producer:
            single = await producer.send(Message(b"first", key="k1", tag="paid", properties={"region": "eu"}))
            bulk = [Message(b"bulk-%d" % i + bytes(i % 300), key=f"k{i % 13}", properties={"i": str(i)})
                    for i in range(5000)]
            receipts = await producer.send_many(bulk)
        assert single.offset == 0 and sum(r.count for r in receipts) == 5000
        consumer = Consumer(channel, "orders", "g", start="earliest", wait_ms=100)
        await consumer.open()
        received: list[Message] = []
        while messages := await consumer.poll():
            received.extend(messages)
            await consumer.commit()
    assert len(received) == 5001
    first = [m for m in received if m.body == b"first"][0]
    assert (first.key, first.tag, first.properties) == ("k1", "paid", {"region": "eu"})
    by_index = {int(m.properties["i"]): m for m in received if "i" in m.properties}
    assert sorted(by_index) == list(range(5000))
    for index, message in by_index.items():
        assert message.body == b"bulk-%d" % index + bytes(index % 300) and message.key == f"k{index % 13}"
    for queue in range(4):
        in_queue = [int(m.properties["i"]) for m in received if m.queue == queue and "i" in m.properties]
        assert in_queue == sorted(in_queue)


async def test_the_same_workload_over_the_lane_and_over_avro_stores_the_same_log(node):
    """Differential: one workload, produced (one message per request and in batches, with producer sequences) and put
    into KV over the lane and over Avro, reads back the same, batch for batch and byte for byte, over either serde:
    the same answers and offsets, the same stored batches, the same KV entries, and revisions as far apart."""
    produced = [batch_codec.encode([Message(b"m-%d" % number + bytes(number % 97), key=f"k{number % 5}",
                                            tag="t" if number % 2 else "", properties={"n": str(number)})
                                    for number in range(first, first + size)], first)
                for first, size in ((0, 1), (1, 40), (41, 1), (42, 300), (342, 2))]
    logs = {}
    for serde in ("lane", "avro"):
        async with connect(server_of(node, "tcp"), "tcp", serde) as channel:
            topic = f"log-{serde}"
            await channel.call("CreateTopic", {"topic": topic, "queues": 2})
            answers = [await channel.call("Produce", {"topic": topic, "queue": number % 2, "batch": batch,
                                                      "producer_id": 7, "sequence": number})
                       for number, batch in enumerate(produced)]
            await channel.call("KvCreateBucket", {"bucket": f"kv-{serde}"})
            revisions = [await channel.call("KvPut", {"bucket": f"kv-{serde}", "key": f"key-{number % 3}",
                                                      "value": b"v%d" % number}) for number in range(6)]
            logs[serde] = {"answers": answers, "revisions": revisions, "reads": {}}
        for reader in ("lane", "avro"):
            async with connect(server_of(node, "tcp"), "tcp", reader) as channel:
                pulled = await channel.call("Pull", {"topic": topic, "queues": [{"queue": 0, "offset": 0},
                                                                                {"queue": 1, "offset": 0}]})
                entries = [await channel.call("KvGet", {"bucket": f"kv-{serde}", "key": f"key-{number}"})
                           for number in range(3)]
            logs[serde]["reads"][reader] = {"batches": [(b["queue"], b["base_offset"], bytes(b["batch"]))
                                                        for b in pulled["batches"]],
                                            "next": pulled["next_offsets"], "entries": entries}
    lane, avro = logs["lane"], logs["avro"]
    assert lane["answers"] == avro["answers"] and lane["reads"]["lane"] == lane["reads"]["avro"]
    assert lane["reads"]["lane"]["batches"] == avro["reads"]["avro"]["batches"]
    assert sorted(batch for _, _, batch in lane["reads"]["lane"]["batches"]) == sorted(produced)
    assert lane["reads"]["lane"]["next"] == avro["reads"]["avro"]["next"]
    apart = [[r["revision"] - log["revisions"][0]["revision"] for r in log["revisions"]] for log in (lane, avro)]
    assert apart[0] == apart[1]
    for mine, theirs in zip(lane["reads"]["lane"]["entries"], avro["reads"]["avro"]["entries"]):
        assert [(e["key"], bytes(e["value"]), e["version"]) for e in mine["entries"]] == \
            [(e["key"], bytes(e["value"]), e["version"]) for e in theirs["entries"]]
        assert mine["entries"] and bytes(mine["entries"][0]["value"]).startswith(b"v")


@pytest.mark.parametrize("transport", ["tcp", "http2"])
async def test_pulls_fetched_ahead_lose_and_repeat_nothing(node, transport):
    """A consumer reading a backlog fetches its next pull while it decodes one; polls with a limit (which
    move positions back and so discard what was fetched ahead) mixed in still see every message once, in
    queue order, and a fetch-ahead never waits for new data."""
    async with connect(server_of(node, transport), transport, "avro") as channel:
        await channel.call("CreateTopic", {"topic": "backlog", "queues": 2})
        async with open_producer(channel, "backlog", batch_bytes=4096) as producer:
            await producer.send_many([Message(b"%06d" % i + bytes(500), key=f"k{i % 7}") for i in range(3000)])
        consumer = Consumer(channel, "backlog", "g", start="earliest", wait_ms=100, max_bytes=16384)
        await consumer.open()
        received: list[Message] = []
        fetched_ahead = 0
        for round_number in range(10_000):
            fetched_ahead += consumer._ahead is not None
            messages = await consumer.poll(limit=7 if round_number % 5 == 4 else None)
            if not messages:
                break
            received.extend(messages)
        with trio.fail_after(2):  # caught up: the poll waits its wait_ms, the fetch-ahead adds no wait
            assert await consumer.poll() == []
    assert fetched_ahead > 10
    assert sorted(int(m.body[:6]) for m in received) == list(range(3000))
    for queue in range(2):
        offsets = [m.offset for m in received if m.queue == queue]
        assert offsets == list(range(len(offsets)))


@pytest.mark.parametrize("transport", ["tcp", "http2"])
async def test_batches_for_a_queue_are_stored_in_the_order_they_were_handed_over(node, transport):
    """Many small batches for the same queues handed over at once, by send_many() and send_encoded(), are
    stored in that order, though the server may take concurrent requests in any order."""
    async with connect(server_of(node, transport), transport, "avro") as channel:
        await channel.call("CreateTopic", {"topic": "ordered", "queues": 2})
        async with open_producer(channel, "ordered", batch_bytes=256) as producer:
            await producer.send_many([Message(b"%06d" % i, key=f"k{i % 5}") for i in range(1500)])
            for first in range(1500, 1700, 10):
                lines = b"".join(b"%06d\n" % i for i in range(first, first + 10))
                await producer.send_encoded(batch_codec.encode_lines(lines, 1), 1)
        consumer = Consumer(channel, "ordered", "g", start="earliest", wait_ms=100)
        await consumer.open()
        received: list[Message] = []
        while messages := await consumer.poll():
            received.extend(messages)
    assert len(received) == 1700
    for queue in range(2):
        indexes = [int(m.body) for m in sorted(received, key=lambda m: m.offset) if m.queue == queue]
        assert indexes == sorted(indexes)


@pytest.mark.parametrize("transport", ["tcp", "http2"])
async def test_polls_for_bodies_and_for_messages_read_one_sequence(node, transport):
    """poll_bodies() and poll() move the same positions: mixed, with and without limits, they read every
    message once and each key's messages in order; with a filter, poll_bodies() is refused."""
    async with connect(server_of(node, transport), transport, "avro") as channel:
        await channel.call("CreateTopic", {"topic": "mixed", "queues": 3})
        async with open_producer(channel, "mixed", batch_bytes=4096) as producer:
            await producer.send_many([Message(b"%06d" % i + bytes(300), key=f"k{i % 7}") for i in range(3000)])
            await producer.send_encoded(batch_codec.encode_lines(b"".join(b"%06d\n" % i for i in range(3000, 3100)), 1), 0)
        consumer = Consumer(channel, "mixed", "g", start="earliest", wait_ms=100, max_bytes=16384)
        await consumer.open()
        bodies: list[bytes] = []
        for round_number in range(10_000):
            limit = (None, 5, None, 11)[round_number % 4]
            if round_number % 3:
                found = await consumer.poll_bodies(limit=limit)
            else:
                found = [message.body for message in await consumer.poll(limit=limit)]
            assert limit is None or len(found) <= limit
            if not found:
                break
            bodies.extend(found)
        filtered = Consumer(channel, "mixed", "f", start="earliest", filter="paid")
        await filtered.open()
        with pytest.raises(RocketError) as caught:
            await filtered.poll_bodies()
        assert caught.value.code == Code.BAD_REQUEST
    indexes = [int(body[:6]) for body in bodies]
    assert sorted(indexes) == list(range(3100))
    for key in range(7):
        of_key = [index for index in indexes if index < 3000 and index % 7 == key]
        assert of_key == sorted(of_key)


@pytest.mark.parametrize("direct", ["false", "true"])
async def test_a_backlog_behind_the_cached_wal_is_read_from_the_disk_intact(nursery, tmp_path, direct):
    """With wal_cached_bytes, a consumer behind the cached part of the WAL (the page cache's, or a direct WAL's
    memory) is served from the disk (in a worker thread) while producers write on: every message once, in order
    per queue, byte for byte."""
    from rocket.node import run_node
    from tests.conftest import node_config

    config = node_config(tmp_path / "data", wal_cached_bytes=str(1 << 20), wal_direct_io=direct)
    ready = await nursery.start(lambda task_status: run_node(config, handle_signals=False, task_status=task_status))
    body = bytes(range(256)) * 8
    async with connect(f"127.0.0.1:{ready.tcp_port}", "tcp", "avro") as channel:
        await channel.call("CreateTopic", {"topic": "backlog", "queues": 2})
        async with open_producer(channel, "backlog", batch_bytes=64 * 1024) as producer:
            await producer.send_many([Message(b"%06d" % i + body, key=f"k{i % 2}") for i in range(12000)])
            consumer = Consumer(channel, "backlog", "g", start="earliest", wait_ms=100)
            await consumer.open()
            received: list[Message] = []
            async with trio.open_nursery() as writers:
                writers.start_soon(producer.send_many,
                                   [Message(b"%06d" % i + body, key=f"k{i % 2}") for i in range(12000, 14000)])
                while len(received) < 14000:
                    received.extend(await consumer.poll())
    assert sorted(int(m.body[:6]) for m in received) == list(range(14000))
    assert all(m.body[6:] == body for m in received)
    for queue in range(2):
        offsets = [m.offset for m in received if m.queue == queue]
        assert offsets == list(range(len(offsets)))


async def test_pull_fetched_ahead_is_dropped_when_the_queues_change_hands(node):
    """A member holding a pull fetched ahead for two queues, that loses one of them to a new member, reads
    on only the queue it keeps: between the two members every message is read once."""
    async with connect(server_of(node, "tcp"), "tcp", "avro") as channel:
        await channel.call("CreateTopic", {"topic": "shared", "queues": 2})
        async with open_producer(channel, "shared", batch_bytes=4096) as producer:
            await producer.send_many([Message(b"%06d" % i + bytes(500), key=f"k{i % 7}") for i in range(2000)])
        first = Consumer(channel, "shared", "g", start="earliest", wait_ms=100, max_bytes=16384, member="a")
        second = Consumer(channel, "shared", "g", start="earliest", wait_ms=100, max_bytes=16384, member="b")
        await first.open()
        received = list(await first.poll())
        assert first._ahead is not None and set(first._ahead[0]) == {0, 1}
        await second.open()
        first._heartbeat_at = 0.0  # its next poll learns of the new member at once
        for consumer in (first, second, first, second):
            while messages := await consumer.poll(wait_ms=0):
                received.extend(messages)
        assert len(first.positions) == len(second.positions) == 1
    assert sorted(int(m.body[:6]) for m in received) == list(range(2000))


@pytest.mark.parametrize("transport", ["tcp", "http2"])
async def test_subscribe_streams_new_messages(node, transport):
    """A server stream delivers batches as they are produced, and ends cleanly when the client leaves."""
    async with connect(server_of(node, transport), transport, "avro") as channel:
        await channel.call("CreateTopic", {"topic": "live", "queues": 1})
        received = []

        async def listen():
            request = {"topic": "live", "queues": [{"queue": 0, "offset": 0}], "max_bytes": 1 << 20}
            async for item in channel.stream("Subscribe", request):
                received.extend(item["batches"])
                if sum(1 for _ in received) >= 3:
                    return

        async with trio.open_nursery() as nursery:
            nursery.start_soon(listen)
            async with open_producer(channel, "live") as producer:
                for index in range(3):
                    await producer.send(Message(b"m%d" % index))
                    await trio.sleep(0.05)
        assert [b["base_offset"] for b in received] == [0, 1, 2]
        assert (await channel.call("Ping", {}))["version"]


async def test_large_bodies_and_many_streams_over_http2(node):
    """A 6 MiB batch crosses HTTP/2 flow control, and 60 concurrent calls share one connection."""
    async with connect(server_of(node, "http2"), "http2", "avro") as channel:
        await channel.call("CreateTopic", {"topic": "big", "queues": 2})
        async with open_producer(channel, "big", batch_bytes=7 << 20) as producer:
            receipts = await producer.send_many([Message(bytes([i]) * (1 << 20), key="one") for i in range(6)])
        assert [r.count for r in receipts] == [6]
        described = []

        async def describe():
            described.append(await channel.call("DescribeTopic", {"topic": "big"}))

        async with trio.open_nursery() as nursery:
            for _ in range(60):
                nursery.start_soon(describe)
        assert len(described) == 60
        assert all(d["queues"][receipts[0].queue]["next_offset"] == 6 for d in described)
        pulled = await channel.call("Pull", {"topic": "big", "queues": [{"queue": receipts[0].queue, "offset": 0}],
                                             "max_bytes": 16 << 20})
        assert len(pulled["batches"][0]["batch"]) > 6 << 20


@pytest.mark.parametrize("transport", ["tcp", "http2"])
async def test_errors_cross_both_transports(node, transport):
    """The same stable codes arrive whichever transport carries them."""
    async with connect(server_of(node, transport), transport, "json") as channel:
        for method, message, code in [
            ("DescribeTopic", {"topic": "missing"}, Code.UNKNOWN_TOPIC),
            ("CreateTopic", {"topic": "x", "queues": 0}, Code.BAD_REQUEST),
            ("Pull", {"topic": "missing", "queues": []}, Code.UNKNOWN_TOPIC),
        ]:
            with pytest.raises(RocketError) as caught:
                await channel.call(method, message)
            assert caught.value.code == code


async def curl(*args: str) -> subprocess.CompletedProcess:
    return await trio.run_process(["curl", "-s", "--http2-prior-knowledge", "--max-time", "10", *args],
                                  capture_stdout=True, capture_stderr=True, check=False)


async def test_curl_is_a_client(node):
    """curl, a real external HTTP/2 client, creates and describes a topic and sees error codes."""
    base = f"http://127.0.0.1:{node.http2_port}/rocket.v1"
    created = await curl("-X", "POST", "-H", "content-type: application/json",
                         "--data", '{"topic": "from-curl", "queues": 3}', f"{base}/CreateTopic")
    assert json.loads(created.stdout)["queues"] == 3
    described = await curl("-X", "POST", "-H", "content-type: application/json", "--data", '{"topic": "from-curl"}',
                           f"{base}/DescribeTopic")
    assert len(json.loads(described.stdout)["queues"]) == 3
    unknown = await curl("-i", "-X", "POST", "-H", "content-type: application/json", "--data", "{}", f"{base}/Nope")
    assert b"HTTP/2 404" in unknown.stdout and b"rocket-error: UNKNOWN_METHOD" in unknown.stdout
    garbage = await curl("-i", "-X", "POST", "-H", "content-type: application/json", "--data", "{oops",
                         f"{base}/CreateTopic")
    assert b"rocket-error: UNDECODABLE" in garbage.stdout


async def test_http2_survives_garbage_and_protocol_errors(node):
    """Bytes that are not HTTP/2 close that connection only; the server keeps answering."""
    for garbage in (b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\xff" * 64):
        stream = await trio.open_tcp_stream("127.0.0.1", node.http2_port)
        async with stream:
            await stream.send_all(garbage)
            with trio.move_on_after(5):
                while await stream.receive_some(65536):
                    pass
    async with connect(server_of(node, "http2"), "http2") as channel:
        assert (await channel.call("Ping", {}))["roles"]


@pytest.mark.parametrize("serde", ["json", "avro", "lane"])
async def test_pull_over_many_full_queues_fits_a_frame(node, serde):
    """A pull across queues full of large batches stays within the frame limit (it once overflowed it)."""
    from rocket import limits
    from rocket.serde import batch as batch_codec

    async with connect(server_of(node, "tcp"), "tcp", serde) as channel:
        await channel.call("CreateTopic", {"topic": "wide", "queues": 4})
        per_batch = limits.read_bytes_max // limits.MiB // 2 + 1  # MiB messages: a batch over half a pull
        big = batch_codec.encode([Message(bytes(limits.MiB)) for _ in range(per_batch)], 1)
        for queue in range(4):
            await channel.call("Produce", {"topic": "wide", "queue": queue, "batch": big})
        request = {"topic": "wide", "queues": [{"queue": q, "offset": 0} for q in range(4)],
                   "max_bytes": limits.read_bytes_max}
        response = await channel.call("Pull", request)
        assert 1 <= len(response["batches"]) and sum(len(b["batch"]) for b in response["batches"]) <= max(
            limits.read_bytes_max, len(big))
        progressed = {entry["queue"]: entry["offset"] for entry in response["next_offsets"]}
        assert progressed[0] == per_batch and all(progressed[q] == 0 for q in range(1, 4))


async def test_a_pull_of_many_tiny_batches_fits_a_frame_as_big_ones_do(node, monkeypatch):
    """Each batch costs a response its queue and offset besides its bytes (and, in JSON, keys and base64): a read
    charges that against max_bytes, so a pull of the smallest batches stays within 4/3 of it plus a constant, the
    bound the frame limit is sized by. A smaller read limit stands in for 8 MiB of 42-byte batches."""
    from rocket import limits
    from rocket.serde import json_codec

    monkeypatch.setattr(limits, "read_bytes_max", 16 * 1024)
    tiny = batch_codec.encode_lines(b"x\n", 1)
    async with connect(server_of(node, "tcp"), "tcp", "avro") as channel:
        await channel.call("CreateTopic", {"topic": "tiny", "queues": 1})

        async def produce(count: int) -> None:
            for _ in range(count):
                await channel.call("Produce", {"topic": "tiny", "queue": 0, "batch": tiny})

        async with trio.open_nursery() as nursery:
            for _ in range(8):
                nursery.start_soon(produce, 75)
        response = await channel.call("Pull", {"topic": "tiny", "queues": [{"queue": 0, "offset": 0}],
                                               "max_bytes": limits.read_bytes_max})
    count = len(response["batches"])
    assert count == limits.read_bytes_max // (len(tiny) + limits.read_batch_overhead_bytes)
    assert response["next_offsets"] == [{"queue": 0, "offset": count}]
    as_json = json_codec.encode("PullResponse", response)  # batches inline, in base64
    assert len(as_json) <= limits.read_bytes_max * 4 // 3 + 1024
