"""The data plane's cost budget, counted, not timed (issue 50, part 7): per batch produced (or KV put or get) on one
node, the tasks spawned, the codec passes and the writes. A ceiling here fails in CI on any machine, however fast,
when a change puts a task, a decode or a write back on the hot path; benchmarks/produce.py --floor measures what the
path costs."""

from __future__ import annotations

import collections

import pytest
import trio

from rocket import __version__
from rocket.model import Message
from rocket.serde import avro_codec
from rocket.serde import batch as batch_codec
from rocket.serde.schema import SCHEMA_VERSION
from rocket.transport import frames
from rocket.transport.frames import FrameDecoder, Kind

AVRO = 2
BATCHES = 200
IN_FLIGHT = 8
# Per batch, at most: what the data plane spends (0 tasks, one decode of the request and one encode of its answer,
# one check of the batch's records, a share of one round's WAL write, fsync and answer write), with room for the
# node's own background work during the run, never for one more of each per batch.
CEILINGS = {"tasks spawned": 0.1, "avro decodes": 1.1, "avro encodes": 1.1, "batch record checks": 1.0,
            "answer writes (sendmsg)": 1.0, "WAL writes": 1.0, "fsyncs": 1.0}


class Counts(trio.abc.Instrument):
    def __init__(self) -> None:
        self.counts: collections.Counter[str] = collections.Counter()
        self.on = False

    def task_spawned(self, task) -> None:
        if self.on:
            self.counts["tasks spawned"] += 1

    def counted(self, what: str, function):
        def wrapper(*args, **kwargs):
            if self.on:
                self.counts[what] += 1
            return function(*args, **kwargs)
        return wrapper


async def _call(stream: trio.SocketStream, decoder: FrameDecoder, method: str, request: dict) -> dict:
    from rocket.transport.methods import method_spec

    body = avro_codec.encode(method_spec(method).request_type, request)
    await stream.send_all(frames.encode(Kind.REQUEST, AVRO, 1, body, method))
    return await _answers(stream, decoder, 1)


async def _answers(stream: trio.SocketStream, decoder: FrameDecoder, count: int) -> list:
    answers = []
    while len(answers) < count:
        while len(answers) < count and (frame := decoder.next_frame()) is not None:
            assert frame.kind == Kind.RESPONSE, bytes(frame.body)
            answers.append(frame)
        if len(answers) < count:
            decoder.feed(await stream.receive_some(1 << 16))
    return answers


# What each workload sends, IN_FLIGHT at a time, after its setup calls: a produce of 16 messages of 1,000 bytes, a
# KV put of 1 KiB, or a linearizable KV get of it.
REQUESTS = {
    "Produce": ([("CreateTopic", {"topic": "budget", "queues": 1})],
                {"topic": "budget", "queue": 0, "batch": b""}),
    "KvPut": ([("KvCreateBucket", {"bucket": "budget"})],
              {"bucket": "budget", "key": "k", "value": b""}),
    "KvGet": ([("KvCreateBucket", {"bucket": "budget"}), ("KvPut", {"bucket": "budget", "key": "k", "value": b"v"})],
              {"bucket": "budget", "key": "k"}),
}
WRITES = ("Produce", "KvPut")


async def _per_batch(node, monkeypatch, method: str = "Produce") -> dict[str, float]:
    """Send BATCHES requests of method, IN_FLIGHT at a time, on a raw connection (no client task counts), and count
    what the node spent per request."""
    from rocket.raft import wal
    from rocket.roles.broker import produce
    from rocket.transport import tcp

    counts = Counts()
    monkeypatch.setattr(avro_codec, "decode", counts.counted("avro decodes", avro_codec.decode))
    monkeypatch.setattr(avro_codec, "encode", counts.counted("avro encodes", avro_codec.encode))
    monkeypatch.setattr(produce, "check_produced", counts.counted("batch record checks", produce.check_produced))
    monkeypatch.setattr(tcp, "send_parts", counts.counted("answer writes (sendmsg)", tcp.send_parts))
    monkeypatch.setattr(wal.Wal, "write", counts.counted("WAL writes", wal.Wal.write))
    monkeypatch.setattr(wal.Wal, "sync", counts.counted("fsyncs", wal.Wal.sync))
    from rocket.transport.methods import method_spec

    setup, request = REQUESTS[method]
    attachment = batch_codec.encode([Message(b"x" * 1000) for _ in range(16)], 1) if method == "Produce" else \
        b"v" * 1024 if method == "KvPut" else None
    request = avro_codec.encode(method_spec(method).request_type, request)
    stream = await trio.open_tcp_stream("127.0.0.1", node.tcp_port)
    decoder = FrameDecoder()
    await _call(stream, decoder, "Hello", {"schema_version": SCHEMA_VERSION, "version": __version__})
    for setup_method, setup_request in setup:
        await _call(stream, decoder, setup_method, setup_request)

    async def produce_batches(count: int) -> None:
        sent = answered = 0
        while answered < count:
            while sent < count and sent - answered < IN_FLIGHT:
                sent += 1
                await stream.send_all(b"".join(frames.encode_parts(Kind.REQUEST, AVRO, sent, request, method,
                                                                   attachment=attachment)))
            answered += len(await _answers(stream, decoder, 1))

    await produce_batches(20)  # the route cached, the group's leader known
    trio.lowlevel.add_instrument(counts)
    counts.on = True
    await produce_batches(BATCHES)
    counts.on = False
    trio.lowlevel.remove_instrument(counts)
    await stream.aclose()
    per_batch = {what: counts.counts[what] / BATCHES for what in CEILINGS}
    assert per_batch["avro decodes"] >= 1 and (per_batch["WAL writes"] > 0 or method not in WRITES), per_batch
    return per_batch


@pytest.mark.parametrize("method", REQUESTS)
async def test_a_produced_batch_a_put_or_a_get_costs_no_task_one_decode_one_encode_and_a_share_of_a_round(
        node, monkeypatch, method):
    per_batch = await _per_batch(node, monkeypatch, method)
    ceilings = {**CEILINGS, "batch record checks": 1.0 if method == "Produce" else 0.0}
    if method not in WRITES:  # a read while the lease holds: no Raft round at all, beyond the node's own work
        ceilings.update({"WAL writes": 0.1, "fsyncs": 0.1})
    over = {what: f"{cost:.2f} > {ceilings[what]}" for what, cost in per_batch.items() if cost > ceilings[what]}
    assert not over, f"the data plane's budget per {method} is exceeded: {over} (all: {per_batch})"


async def test_the_budget_catches_a_produce_served_as_a_task(node, monkeypatch):
    """The same run with the data plane off (every produce a task, as before issue 50) exceeds the task ceiling:
    the budget can fail."""
    from rocket.transport.rpc import Dispatcher

    monkeypatch.setattr(Dispatcher, "parks", lambda self, name: False)
    per_batch = await _per_batch(node, monkeypatch)
    assert per_batch["tasks spawned"] > CEILINGS["tasks spawned"], per_batch
