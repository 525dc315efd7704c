"""A client given several servers (or discovering the brokers) moves on when one is gone."""

from __future__ import annotations

import functools

import trio

from rocket.client import connect
from rocket.client.kv import KV
from rocket.errors import Code, RocketError
from rocket.model import Message
from rocket.serde import batch as batch_codec
from rocket.serde import SERDE_IDS
from rocket.serde.schema import SCHEMA_VERSION
from rocket.transport import frames
from rocket.transport.listen import free_ports


async def test_calls_move_to_the_next_server_when_one_is_unreachable_or_dies(server_process, tmp_path):
    """Two dev-mode servers and an address nobody listens on: every call succeeds on a live one, also
    after the one in use is killed; a stream starts on a live one."""
    first = server_process(tmp_path / "one").start()
    second = server_process(tmp_path / "two").start()
    nobody = f"127.0.0.1:{free_ports(1)[0]}"
    servers = ",".join([nobody, first.server, second.server])
    for server in (first, second):
        async with connect(server.server) as channel:
            await channel.call("CreateTopic", {"topic": "orders", "queues": 1})
    batch = batch_codec.encode([Message(b"hello")], 1_700_000_000_000)
    async with connect(servers) as channel:
        for _ in range(5):
            assert (await channel.call("Produce", {"topic": "orders", "queue": 0, "batch": batch}))["count"] == 1
        in_use = channel.servers[channel._at]
        victim = first if str(in_use) == first.server else second
        victim.kill()
        for _ in range(5):
            assert (await channel.call("Produce", {"topic": "orders", "queue": 0, "batch": batch}))["count"] == 1
        assert str(channel.servers[channel._at]) != victim.server
        async for response in channel.stream("Subscribe", {"topic": "orders", "queues": [{"queue": 0, "offset": 0}],
                                                           "max_bytes": 1 << 20, "wait_ms": 0}):
            assert response["batches"]
            break


async def test_discovery_adds_the_brokers_the_cluster_knows(server_process, tmp_path):
    server = server_process(tmp_path / "one").start()
    async with connect(server.server, discover=True) as channel:
        assert len(channel.servers) == 1  # a dev node is its only broker, at the port it got for port 0
        assert (await channel.call("Ping", {}))["roles"] == ["nameserver", "storage", "broker"]


async def test_a_kv_write_whose_answer_is_lost_is_not_sent_to_the_next_server(node, nursery):
    """A server that reads a request and drops the connection without answering: a Ping moves on to the next
    server, but a KV put (MethodSpec.at_most_once) does not, since it may have been applied: CONNECTION_LOST, and
    the put reached no other server."""
    async def swallow(stream: trio.SocketStream) -> None:
        async with stream:
            decoder = frames.FrameDecoder()
            while True:
                decoder.feed(await stream.receive_some())
                frame = decoder.next_frame()
                if frame is None:
                    continue
                if frame.method != "Hello":  # the connection's first call (schema versions) is answered,
                    return  # the request went out; no answer ever comes
                await stream.send_all(frames.encode(frames.Kind.RESPONSE, frame.serde, frame.request_id,
                                                    SERDE_IDS[frame.serde].encode(
                    "Hello", {"schema_version": SCHEMA_VERSION, "version": "swallow"})))

    listeners = await nursery.start(functools.partial(trio.serve_tcp, swallow, 0, host="127.0.0.1"))
    black_hole = f"127.0.0.1:{listeners[0].socket.getsockname()[1]}"
    live = f"127.0.0.1:{node.tcp_port}"
    async with connect(live) as channel:
        await KV(channel).create_bucket("once")
    async with connect(f"{black_hole},{live}") as channel:
        channel._at = 0
        assert (await channel.call("Ping", {}))["roles"]
        channel._at = 0
        try:
            await KV(channel).put("once", "k", b"v")
            raise AssertionError("the put was answered")
        except RocketError as error:
            assert error.code == Code.CONNECTION_LOST
    async with connect(live) as channel:
        assert await KV(channel).count("once") == 0
