"""Lookups by key against a real `rocket run`: rocket's keys, RocketMQ's KEYS and UNIQ_KEY (over remoting), each
found by reading only the batches that hold it once the key indexer caught up; the index rebuilt from the WAL after
a kill -9 took it."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time

import trio

from rocket.client import Admin, connect, open_producer
from rocket.gateway.remoting.codec import RequestCode as R
from rocket.model import Message
from rocket.serde import batch as batch_codec
from tests.integration.test_remoting import decode_stored, send
from tests.remoting_client import RemotingClient

BATCHES, PER_BATCH = 40, 50  # per queue, in order: message i of batch b has key order-<b>-<i>


def rocket(server, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rocket", *args, "--server", server.server], capture_output=True,
                          text=True, timeout=60)


async def fill(server) -> None:
    async with connect(server.server) as channel:
        await Admin(channel).create_topic("orders", 2)
        async with open_producer(channel, "orders") as producer:
            for queue in (0, 1):
                for batch in range(BATCHES):
                    await producer.send_encoded(batch_codec.encode([
                        Message(f"{queue}-{batch}-{i}".encode(), key=f"order-{batch}-{i}") for i in range(PER_BATCH)],
                        int(time.time() * 1000)), queue)
            await producer.flush()


async def find(server, key: str, message_id: bool = False) -> tuple[list[tuple[int, int, bytes]], int]:
    """(queue, offset, body) of each message found, and how many batches the search read."""
    async with connect(server.server) as channel:
        response = await channel.call("FindMessages", {"topic": "orders", "key": key, "message_id": message_id,
                                                       "queues": [], "start_ms": 0, "end_ms": 0, "limit": 64})
        found = await Admin(channel).find_messages("orders", key, message_id=message_id)
    return [(message.queue, message.offset, message.body) for message in found], response["batches_read"]


def indexed(server, key: str) -> tuple[list[tuple[int, int, bytes]], int]:
    """find, once the key indexer caught up (it indexes in the node's idle time): a key no message has is then found
    without reading a batch. (The lookup for a key may read 3 batches before: 2 indexed, and an unindexed tail.)"""
    deadline = time.monotonic() + 30
    while trio.run(find, server, "absent")[1] and time.monotonic() < deadline:
        time.sleep(0.1)
    return trio.run(find, server, key)


def test_keys_and_message_ids_are_found_by_the_batches_that_hold_them(server_process):
    server = server_process().start()
    trio.run(fill, server)
    client = RemotingClient(server.tcp_port)
    send(client, "orders", b"remoting", queue=1, properties={"KEYS": "order-7-7 invoice-9",
                                                               "UNIQ_KEY": "7F0000010001"})
    found, read = indexed(server, "order-7-7")
    assert found == [(0, 7 * PER_BATCH + 7, b"0-7-7"), (1, 7 * PER_BATCH + 7, b"1-7-7"),
                     (1, BATCHES * PER_BATCH, b"remoting")]
    assert read == 3  # of the 81 batches the topic holds
    assert trio.run(find, server, "invoice-9")[0] == [(1, BATCHES * PER_BATCH, b"remoting")]
    assert trio.run(find, server, "7F0000010001", True)[0] == [(1, BATCHES * PER_BATCH, b"remoting")]
    assert trio.run(find, server, "7F0000010001")[0] == []  # an id is not a key
    assert trio.run(find, server, "order-99-1") == ([], 0)
    by_id = client.request(R.QUERY_MESSAGE, {"topic": "orders", "key": "7F0000010001", "maxNum": 8,
                                             "beginTimestamp": 0, "endTimestamp": int(time.time() * 1000) + 60_000,
                                             "_UNIQUE_KEY_QUERY": "true"})
    assert by_id.code == 0 and [each["body"] for each in decode_stored(by_id.body)] == [b"remoting"]
    for key, bodies in (("order-3-4", [b"0-3-4", b"1-3-4"]), ("invoice-9", [b"remoting"])):  # by key, as 4.x asks
        by_key = client.request(R.QUERY_MESSAGE, {"topic": "orders", "key": key, "maxNum": 8, "beginTimestamp": 0,
                                                  "endTimestamp": int(time.time() * 1000) + 60_000})
        assert by_key.code == 0 and sorted(each["body"] for each in decode_stored(by_key.body)) == bodies, key
    cli = rocket(server, "message", "find", "orders", "--key", "order-3-4", "--format", "raw")
    assert cli.returncode == 0 and cli.stdout.split() == ["0-3-4", "1-3-4"], cli.stderr
    assert "2 messages with key 'order-3-4'" in cli.stderr
    empty = rocket(server, "message", "find", "orders", "--key", "")
    assert empty.returncode != 0 and "BAD_REQUEST" in empty.stderr and len(empty.stderr.strip().splitlines()) == 1

    # kill -9, and the index lost with it: the node rebuilds it from its WAL as it starts
    server.kill()
    shutil.rmtree(server.data_dir / "storage" / "index")
    server.start(extra=("--listen", server.server))
    found, read = indexed(server, "order-7-7")
    assert [body for _, _, body in found] == [b"0-7-7", b"1-7-7", b"remoting"] and read == 3
