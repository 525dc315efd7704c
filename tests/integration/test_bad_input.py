"""Malformed input over real sockets: every bad request gets a stable error code, broken framing closes
the connection, and the server keeps serving everyone else."""

from __future__ import annotations

import random
import struct

import pytest
import trio

from rocket import limits
from rocket.errors import Code, RocketError
from rocket.serde import SERDE_IDS, json_codec
from rocket.transport import frames
from rocket.transport.frames import FrameDecoder, Kind
from rocket.transport.methods import METHODS


async def exchange(port: int, data: bytes, timeout_s: float = 5.0, expect: int | None = None,
                   quiet_s: float = 0.3) -> tuple[list[frames.Frame], bool]:
    """Send raw bytes, read frames until `expect` arrived, the server goes quiet, or it closes."""
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    decoder = FrameDecoder(frame_bytes_max=limits.frame_bytes_max * 4)
    received = []
    closed = False
    async with stream:
        await stream.send_all(data)
        with trio.move_on_after(timeout_s):
            while True:
                if expect is not None and len(received) >= expect:
                    break
                with trio.move_on_after(quiet_s if expect is None else timeout_s) as quiet:
                    chunk = await stream.receive_some(65536)
                if quiet.cancelled_caught:
                    break
                if not chunk:
                    closed = True
                    break
                decoder.feed(chunk)
                while (frame := decoder.next_frame()) is not None:
                    received.append(frame)
    return received, closed


def error_code(frame: frames.Frame) -> str:
    assert frame.kind == Kind.ERROR, frame
    return json_codec.decode("Error", frame.body)["code"] if frame.serde == 1 else SERDE_IDS[frame.serde].decode("Error", frame.body)["code"]


async def assert_serving(port: int) -> None:
    ping = frames.encode(Kind.REQUEST, 1, 9, b"{}", "Ping")
    answers, _ = await exchange(port, ping, timeout_s=5, expect=1)
    assert answers and answers[0].kind == Kind.RESPONSE and answers[0].request_id == 9


async def test_request_errors_have_stable_codes(node):
    """Unknown methods, garbage bodies, missing fields and bad batches each get their code; the connection lives on."""
    requests = [
        frames.encode(Kind.REQUEST, 1, 1, b"{}", "NoSuchMethod"),
        frames.encode(Kind.REQUEST, 1, 2, b"{not json", "CreateTopic"),
        frames.encode(Kind.REQUEST, 2, 3, b"\xff\xff\xff\xff", "Produce"),
        frames.encode(Kind.REQUEST, 1, 4, b'{"queues": 3}', "CreateTopic"),
        frames.encode(Kind.REQUEST, 1, 5, b'{"topic": "t", "batch": "AAAA"}', "Produce"),
        frames.encode(Kind.REQUEST, 7, 6, b"{}", "Ping"),
        frames.encode(Kind.REQUEST, 1, 7, b'{"topic": "bad name!", "queues": 1}', "CreateTopic"),
        frames.encode(Kind.REQUEST, 1, 8, b"{}", "Ping"),
        frames.encode(Kind.REQUEST, 3, 9, b"\xff\xff\xff\xff", "Produce"),  # the lane: shorter than its layout
        frames.encode(Kind.REQUEST, 3, 10, struct.pack(">q?II", 0, False, 1, 1) + b"b\xff", "KvGet"),  # not UTF-8
        frames.encode(Kind.REQUEST, 3, 11, struct.pack(">iqqII", 0, 0, 0, 2**31, 0) + b"t", "Produce"),  # past it
    ]
    answers, closed = await exchange(node.tcp_port, b"".join(requests), expect=len(requests))
    by_id = {frame.request_id: frame for frame in answers}
    assert not closed
    assert error_code(by_id[1]) == "UNKNOWN_METHOD"
    assert error_code(by_id[2]) == "UNDECODABLE"
    assert error_code(by_id[3]) == "UNDECODABLE"
    assert error_code(by_id[4]) == "BAD_REQUEST"
    assert error_code(by_id[5]) == "UNKNOWN_TOPIC"
    assert error_code(by_id[6]) == "UNSUPPORTED_SERDE"
    assert error_code(by_id[7]) == "BAD_REQUEST"
    assert by_id[8].kind == Kind.RESPONSE
    assert [error_code(by_id[number]) for number in (9, 10, 11)] == ["UNDECODABLE"] * 3


async def test_corrupt_batch_is_refused(node):
    """A produce whose batch fails its checksum is refused with BAD_BATCH and nothing is stored."""
    from rocket.model import Message
    from rocket.serde import avro_codec, batch
    from rocket.serde.versions import for_peer

    await exchange(node.tcp_port, frames.encode(Kind.REQUEST, 1, 1, b'{"topic": "t", "queues": 1}', "CreateTopic"))
    damaged = bytearray(batch.encode([Message(b"payload")], 1))
    damaged[-1] ^= 0xFF
    # A connection that says no Hello speaks schema version 1.
    body = for_peer(avro_codec, 1).encode("ProduceRequest", {"topic": "t", "queue": 0, "batch": bytes(damaged)})
    describe = frames.encode(Kind.REQUEST, 1, 3, b'{"topic": "t"}', "DescribeTopic")
    answers, _ = await exchange(node.tcp_port, frames.encode(Kind.REQUEST, 2, 2, body, "Produce") + describe)
    by_id = {frame.request_id: frame for frame in answers}
    assert SERDE_IDS[2].decode("Error", by_id[2].body)["code"] == "BAD_BATCH"
    assert json_codec.decode("DescribeTopicResponse", by_id[3].body)["queues"][0]["next_offset"] == 0


async def test_pull_batches_travel_as_attachments_and_requests_may_not_send_lists(node):
    """Over TCP a pull response carries its batches outside the serde, byte for byte as produced; a request
    that sends a list of attachments is refused with BAD_REQUEST and the connection lives on."""
    from rocket.model import Message
    from rocket.serde import avro_codec, batch
    from rocket.serde.versions import for_peer

    produced = [batch.encode([Message(b"m%d" % n * 50)], 1) for n in range(3)]
    await exchange(node.tcp_port, frames.encode(Kind.REQUEST, 1, 1, b'{"topic": "t", "queues": 1}', "CreateTopic"),
                   expect=1)
    requests = []
    for request_id, encoded in enumerate(produced, 2):
        body = for_peer(avro_codec, 1).encode("ProduceRequest", {"topic": "t", "queue": 0, "batch": b""})
        requests.append(frames.encode(Kind.REQUEST, 2, request_id, body, "Produce", attachment=encoded))
    await exchange(node.tcp_port, b"".join(requests), expect=len(requests))
    pull = for_peer(avro_codec, 1).encode("PullRequest", {"topic": "t", "queues": [{"queue": 0, "offset": 0}],
                                                          "max_bytes": 1 << 20, "wait_ms": 0, "filter_type": "tag",
                                                          "filter": "*"})  # as a connection of no Hello writes it
    listed = frames.encode(Kind.REQUEST, 2, 11, for_peer(avro_codec, 1).encode("ProduceRequest", {"topic": "t", "queue": 0,
                                                                                    "batch": b""}),
                           "Produce", attachment=[produced[0]])
    answers, closed = await exchange(node.tcp_port, frames.encode(Kind.REQUEST, 2, 10, pull, "Pull") + listed, expect=2)
    by_id = {frame.request_id: frame for frame in answers}
    # A connection that said no Hello is answered in schema version 1 (serde/versions.py): read it as such.
    response = for_peer(avro_codec, 1).decode("PullResponse", by_id[10].body)
    assert [stored["batch"] for stored in response["batches"]] == [b""] * 3
    assert sorted(bytes(each) for each in by_id[10].attachment) == sorted(produced)  # concurrent produces: any order
    assert not closed and error_code(by_id[11]) == "BAD_REQUEST"


async def test_oversized_frame_is_answered_and_closed(node):
    """A frame announcing more than the limit gets FRAME_TOO_LARGE for its request id, then the connection closes."""
    header = struct.pack(">IBBBBQH", limits.frame_bytes_max + 1, 1, Kind.REQUEST, 1, 0, 42, 4) + b"Ping"
    answers, closed = await exchange(node.tcp_port, header)
    assert closed and answers and answers[0].request_id == 42 and error_code(answers[0]) == "FRAME_TOO_LARGE"
    await assert_serving(node.tcp_port)


async def test_broken_framing_closes_only_that_connection(node):
    """Garbage framing (bad version, client-sent response kinds) closes that connection alone."""
    for garbage in (b"GET / HTTP/1.1\r\n\r\n" + bytes(32), frames.encode(Kind.RESPONSE, 1, 5, b"{}")):
        answers, closed = await exchange(node.tcp_port, garbage)
        assert closed and error_code(answers[0]) == "BAD_FRAME"
    await assert_serving(node.tcp_port)


async def test_half_a_frame_then_silence_does_not_block_others(node):
    """A client that stops mid-frame holds only its own connection."""
    stalled = await trio.open_tcp_stream("127.0.0.1", node.tcp_port)
    async with stalled:
        await stalled.send_all(frames.encode(Kind.REQUEST, 1, 1, b"{}" * 100, "Ping")[:50])
        await assert_serving(node.tcp_port)


async def test_random_bodies_never_break_the_server(node):
    """Random bodies for every method and serde (the lane's too) answer with a response or a non-INTERNAL error code,
    and the server keeps serving. Seeded, so a failure replays."""
    generator = random.Random(20261122)
    methods = [name for name, spec in sorted(METHODS.items()) if not spec.streaming] + ["Bogus"]
    for round_number in range(150):
        method = generator.choice(methods)
        serde = generator.choice([1, 2, 3])
        body = generator.randbytes(generator.randint(0, 300))
        if serde == 1 and generator.random() < 0.5:
            body = b'{"topic": "t", "queues": [], "batch": "' + body.hex().encode() + b'"}'
        request = frames.encode(Kind.REQUEST, serde, round_number + 1, body, method)
        answers, closed = await exchange(node.tcp_port, request, timeout_s=3, expect=1)
        assert not closed and len(answers) == 1, (round_number, method, body)
        if answers[0].kind == Kind.ERROR:
            assert error_code(answers[0]) in {code.name for code in Code} - {"INTERNAL"}, (method, body)
    await assert_serving(node.tcp_port)


async def test_random_bytes_never_break_the_server(node):
    """Random bytes on a socket get an error or a close, never a crash or a hang. Seeded."""
    generator = random.Random(7)
    for _ in range(40):
        await exchange(node.tcp_port, generator.randbytes(generator.randint(1, 2000)), timeout_s=2, quiet_s=0.1)
    await assert_serving(node.tcp_port)


async def test_hostile_calls_between_nodes_get_stable_codes_and_harm_nothing(node):
    """Well-formed calls of the methods nodes use among themselves, with values that must not reach a
    Raft log (where every replica would apply them): each gets a stable code, and the node keeps
    serving and storing."""
    from rocket.client import connect
    from rocket.model import Message
    from rocket.serde import batch

    good = batch.encode([Message(b"payload")], 1)
    async with connect(f"127.0.0.1:{node.tcp_port}") as channel:
        await channel.call("CreateTopic", {"topic": "t", "queues": 1})
        assert (await channel.call("Produce", {"topic": "t", "queue": 0, "batch": good}))["base_offset"] == 0
        group = (await channel.call("GetRoute", {"topic": "t"}))["queue_groups"][0]
        hostile = [
            ("StorageAppend", {"group": group, "topic": "t", "queue": -1, "batch": good}, "BAD_REQUEST"),
            ("StorageAppend", {"group": group, "topic": "t", "queue": 0, "batch": b"\x00" * 64}, "BAD_BATCH"),
            ("StorageAppend", {"group": group, "topic": "bad name!", "queue": 0, "batch": good}, "BAD_REQUEST"),
            ("StorageAppend", {"group": 999, "topic": "t", "queue": 0, "batch": good}, "UNAVAILABLE"),
            ("StorageCommitOffsets", {"group": group, "consumer_group": "g", "topic": "t",
                                      "offsets": [{"queue": 0, "offset": -5}]}, "BAD_REQUEST"),
            ("StorageRead", {"group": group, "topic": "t", "queues": [{"queue": 0, "offset": -1}]}, "BAD_REQUEST"),
            ("StorageQueues", {"group": group, "topic": "t", "queues": [-3]}, "BAD_REQUEST"),
            ("StorageMembers", {"group": group, "action": "explode", "node": 2}, "BAD_REQUEST"),
            ("NodeHeartbeat", {"node": 5, "address": "nowhere", "roles": ["storage"], "load": {}}, "BAD_REQUEST"),
            ("NodeHeartbeat", {"node": 0, "address": "127.0.0.1:1", "roles": ["storage"], "load": {}}, "BAD_REQUEST"),
            ("NodeHeartbeat", {"node": 5, "address": "127.0.0.1:1", "roles": ["king"], "load": {}}, "BAD_REQUEST"),
            ("DrainNode", {"node": 77}, "BAD_REQUEST"),
            ("StoragePop", {"group": group, "consumer_group": "g", "topic": "t", "queues": [-1]}, "BAD_REQUEST"),
            ("StoragePop", {"group": group, "consumer_group": "bad group!", "topic": "t", "queues": [0]}, "BAD_REQUEST"),
            ("StoragePop", {"group": group, "consumer_group": "g", "topic": "t", "queues": [0], "filter_type": "sql",
                            "filter": "a = 'x"}, "BAD_FILTER"),
            ("StorageReceipt", {"group": group, "consumer_group": "g", "topic": "t",
                                "receipts": [{"queue": 0, "offset": -1, "attempt": 1}]}, "BAD_REQUEST"),
            ("StorageCancelTimer", {"group": group, "topic": "t", "queue": 0, "offset": -1}, "BAD_REQUEST"),
            ("StorageCancelTimer", {"group": group, "topic": "t", "queue": 0, "offset": 12}, "NOT_FOUND"),
            ("Pull", {"topic": "t", "queues": [{"queue": 0, "offset": 0}], "filter_type": "regex", "filter": "."},
             "BAD_FILTER"),
            ("Receive", {"topic": "t", "group": "g", "filter": "a || "}, "BAD_FILTER"),
            ("ResetGroup", {"topic": "t", "group": "g", "to": "sideways"}, "BAD_REQUEST"),
            ("CancelTimer", {"topic": "t", "queue": 7, "offset": 0}, "BAD_QUEUE"),
            ("Produce", {"topic": "%DLQ%g%t", "queue": 0, "batch": good}, "WRONG_MESSAGE_TYPE"),
            ("Produce", {"topic": "%DLQ%g%nothing", "queue": 0, "batch": good}, "UNKNOWN_TOPIC"),
            ("StorageEndTransaction", {"group": group, "topic": "t", "queue": 0, "offset": 5, "count": 1,
                                       "commit": True}, "NOT_FOUND"),
            ("StorageEndTransaction", {"group": group, "topic": "t", "queue": 0, "offset": 0, "count": 0,
                                       "commit": False}, "BAD_REQUEST"),
            ("StorageGroupHeartbeat", {"group": group, "consumer_group": "g", "topic": "t", "member": ""},
             "BAD_REQUEST"),
            ("TransactionChecks", {"topic": "t"}, "WRONG_MESSAGE_TYPE"),
            ("StorageImport", {"group": group, "topic": "t", "queue": 0, "base_offset": -1, "batches": [good]},
             "BAD_REQUEST"),
            ("StorageImport", {"group": group, "topic": "t", "queue": 0, "base_offset": 0, "batches": [b"\x00" * 64]},
             "BAD_BATCH"),
            ("StorageImport", {"group": group, "topic": "t", "queue": 0, "base_offset": 7, "batches": [good]},
             "BAD_REQUEST"),  # a gap after the queue's end
            ("StorageDrop", {"group": group, "op": "vanish", "topic": "t", "queues": [0]}, "BAD_REQUEST"),
            ("StorageLock", {"group": group, "op": "steal", "consumer_group": "g", "topic": "t", "client": "c",
                             "queues": [0]}, "BAD_REQUEST"),
            ("StorageLock", {"group": group, "op": "lock", "consumer_group": "g", "topic": "t", "client": "",
                             "queues": [0]}, "BAD_REQUEST"),
            ("LockQueues", {"topic": "t", "group": "g", "client": "c", "queues": [5]}, "BAD_QUEUE"),
            ("LockQueues", {"topic": "nothing", "group": "g", "client": "c", "queues": [0]}, "UNKNOWN_TOPIC"),
            ("UpdateTopic", {"topic": "t", "storage_class": "nowhere"}, "BAD_REQUEST"),
        ]
        for method, request, code in hostile:
            with pytest.raises(RocketError) as refused:
                await channel.call(method, request)
            assert refused.value.code.name == code, (method, request, refused.value)
        stale = await channel.call("StorageReceipt", {"group": group, "consumer_group": "g", "topic": "t",
                                                      "receipts": [{"queue": 0, "offset": 0, "attempt": 3}]})
        assert stale["stale"] == [{"queue": 0, "offset": 0, "attempt": 3}]
        reply = await channel.call("Produce", {"topic": "t", "queue": 0, "batch": good})
        assert reply["base_offset"] == 1  # nothing hostile was stored
    await assert_serving(node.tcp_port)


async def test_heartbeats_of_new_nodes_past_the_limit_are_refused(node, monkeypatch):
    """Anyone who may call NodeHeartbeat (without a cluster secret, anyone) could register nodes without end; past
    limits.nodes_max a new node is refused with OVERLOADED, and nodes already known keep beating."""
    from rocket.client import connect

    monkeypatch.setattr(limits, "nodes_max", 3)
    load = {"groups": 0, "leads": [], "bytes": 0, "free_disk_bytes": 0, "lagging": []}

    async def beat(channel, node_id: int) -> dict:
        return await channel.call("NodeHeartbeat", {"node": node_id, "address": f"127.0.0.1:{1000 + node_id}",
                                                    "roles": ["broker"], "load": load, "assignment_version": -1})

    async with connect(f"127.0.0.1:{node.tcp_port}") as channel:
        for node_id in (2, 3):  # with the dev node itself, three
            await beat(channel, node_id)
        with pytest.raises(RocketError) as refused:
            await beat(channel, 4)
        assert refused.value.code == Code.OVERLOADED and "nodes_max" in refused.value.message
        assert not (await beat(channel, 3))["unchanged"]  # a known node goes on
        status = await channel.call("ClusterStatus", {})
        assert sorted(entry["id"] for entry in status["nodes"]) == [1, 2, 3]
