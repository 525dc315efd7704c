"""A client given several servers (or discovering the brokers) moves on when one is gone."""

from __future__ import annotations

from rocket.client import connect
from rocket.model import Message
from rocket.serde import batch as batch_codec
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
