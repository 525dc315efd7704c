"""Tiered storage end to end: a real `rocket run` offloads to moto's S3 server (started here on 127.0.0.1)
in many small pieces, drops local data once offloaded, and serves every message back byte for byte from
the tier, to pull and to pop consumers; a corrupted object is CORRUPT_DATA; S3 stopped for a while loses nothing and catches up; a node
killed mid-upload resumes without duplicate objects."""

from __future__ import annotations

import random
import sys
import time

import pytest
import trio

from rocket.client import Admin, SimpleConsumer, connect, open_consumer
from rocket.errors import Code, RocketError
from rocket.model import Message
from rocket.serde import batch as batch_codec
from rocket.serde.piece import range_of_key
from rocket.transport.listen import free_ports
from tests.integration.test_tier_objectstore import CREDENTIALS, MotoServer, only_local_network, s3_store  # noqa: F401

pytestmark = pytest.mark.skipif(sys.flags.dev_mode, reason="aiohttp rejects moto's duplicate Server header in -X dev")

QUEUES = 2
PREFIX = "rocket"


@pytest.fixture
def moto(tmp_path):
    server = MotoServer(free_ports(1)[0], tmp_path / "moto.log").start()
    yield server
    server.stop()


def start_node(server_process, tmp_path, moto: MotoServer, bucket: str, piece_age_s: float = 0.3):
    config = tmp_path / "rocket.toml"
    config.write_text(f'tier_backend = "s3"\ntier_s3_endpoint = "{moto.url}"\ntier_s3_bucket = "{bucket}"\n'
                      f'tier_s3_prefix = "{PREFIX}"\ntier_piece_bytes = 4096\ntier_piece_age_s = {piece_age_s}\n')
    return server_process(tmp_path / "data").start(extra=("--config", str(config)))


def body(queue: int, seq: int) -> bytes:
    return f"{queue}:{seq}:".encode() + random.Random(queue * 100_000 + seq).randbytes(300 + seq % 200)


async def produce(server: str, first: int, count: int) -> None:
    """count single-message batches per queue, so that pieces of 4 KiB hold a few batches each."""
    async with connect(server) as channel:
        for seq in range(first, first + count):
            for queue in range(QUEUES):
                batch = batch_codec.encode([Message(body(queue, seq))], int(time.time() * 1000))
                await channel.call("Produce", {"topic": "orders", "queue": queue, "batch": batch})


async def consume_everything(server: str, group: str) -> dict[int, list[bytes]]:
    async with connect(server) as channel, open_consumer(channel, "orders", group, start="earliest",
                                                         wait_ms=300) as consumer:
        found: dict[int, list[bytes]] = {queue: [] for queue in range(QUEUES)}
        while True:
            messages = await consumer.poll()
            if not messages:
                return found
            for message in messages:
                assert message.offset == len(found[message.queue])
                found[message.queue].append(message.body)


async def pop_everything(server: str, group: str, count: int) -> dict[int, list[bytes]]:
    """Receive (pop) and ack every message; the first one received is left unacked once, so that it comes
    back after its invisible time and is read again."""
    bodies: dict[tuple[int, int], bytes] = {}
    skipped = None
    async with connect(server) as channel:
        consumer = SimpleConsumer(channel, "orders", group, invisible_s=1)
        with trio.move_on_after(60):
            while len(bodies) < count:
                for message in await consumer.receive(max_messages=32, wait_s=1):
                    if skipped is None:
                        skipped = (message.queue, message.offset)
                        continue
                    assert (message.queue, message.offset) not in bodies
                    bodies[(message.queue, message.offset)] = message.body
                    await consumer.ack(message)
    assert skipped in bodies, "the unacked message came back"
    return {queue: [bodies[(queue, offset)] for offset in range(count // QUEUES) if (queue, offset) in bodies]
            for queue in range(QUEUES)}


async def tier_rows(server: str, topic: str = "orders") -> list[dict]:
    async with connect(server) as channel:
        [(_, rows)] = await Admin(channel).tier_status(topic)
    return rows


async def wait_until(server: str, condition, timeout_s: float = 60.0) -> list[dict]:
    with trio.move_on_after(timeout_s):
        while True:
            rows = await tier_rows(server)
            if condition(rows):
                return rows
            await trio.sleep(0.3)
    raise AssertionError(f"tier state never got there: {rows}")


def all_cold(rows: list[dict], messages: int) -> bool:
    """Everything offloaded, and nothing left locally."""
    return all(row["next_offset"] == row["tiered_offset"] == row["local_offset"] == messages
               and row["pending_bytes"] == 0 and row["first_offset"] == 0 for row in rows)


async def setup_topic(server: str, local_retention_s: float = 1.0) -> None:
    async with connect(server) as channel:
        admin = Admin(channel)
        await admin.create_topic("orders", QUEUES)
        spec = await admin.update_topic("orders", retention_s=0.0, local_retention_s=local_retention_s)
    assert (spec.retention_s, spec.local_retention_s) == (0.0, local_retention_s)


def expected(messages: int) -> dict[int, list[bytes]]:
    return {queue: [body(queue, seq) for seq in range(messages)] for queue in range(QUEUES)}


async def tier_keys(moto: MotoServer, bucket: str) -> list[str]:
    async with s3_store(moto, bucket) as store:
        return [info.key for info in await store.list(PREFIX + "/")]


async def test_offload_expire_locally_and_consume_everything_cold(server_process, tmp_path, moto):
    """Many small pieces offload, local data goes, every message reads back byte for byte from S3; a
    flipped byte in one object is CORRUPT_DATA for the consumer, and the repaired object reads again."""
    bucket = moto.create_bucket()
    node = start_node(server_process, tmp_path, moto, bucket)
    await setup_topic(node.server)
    await produce(node.server, 0, 150)
    rows = await wait_until(node.server, lambda rows: all_cold(rows, 150))
    assert all(row["pieces"] >= 10 and row["local_bytes"] == 0 for row in rows)
    keys = await tier_keys(moto, bucket)
    assert sum(key.endswith(".seg") for key in keys) == sum(row["pieces"] for row in rows)

    first_segment = sorted(key for key in keys if key.startswith(f"{PREFIX}/orders/0/") and key.endswith(".seg"))[0]
    async with s3_store(moto, bucket) as store:
        original = await store.get(first_segment)
        await store.put(first_segment, original[:60] + bytes([original[60] ^ 0xFF]) + original[61:])
    with pytest.raises(RocketError) as caught:
        await consume_everything(node.server, "damaged")
    assert caught.value.code == Code.CORRUPT_DATA and first_segment in caught.value.message
    async with s3_store(moto, bucket) as store:
        await store.put(first_segment, original)

    assert await consume_everything(node.server, "billing") == expected(150)
    assert await pop_everything(node.server, "workers", QUEUES * 150) == expected(150)


async def test_s3_stopped_loses_nothing_and_catches_up(server_process, tmp_path, moto):
    """While S3 is down, data stays local and readable; once it is back, everything offloads and reads cold."""
    bucket = moto.create_bucket()
    node = start_node(server_process, tmp_path, moto, bucket)
    await setup_topic(node.server)
    moto.stop()
    await produce(node.server, 0, 60)
    await trio.sleep(3)
    rows = await tier_rows(node.server)
    assert all(row["local_offset"] == 0 and row["pending_bytes"] > 0 and row["next_offset"] == 60 for row in rows)
    assert await consume_everything(node.server, "during") == expected(60)
    moto.start()  # the same bucket, empty: nothing reached it
    await wait_until(node.server, lambda rows: all_cold(rows, 60), timeout_s=90)
    assert await consume_everything(node.server, "after") == expected(60)


async def test_a_node_killed_mid_upload_resumes_without_duplicates(server_process, tmp_path, moto):
    """SIGKILL while pieces are uploading; after a restart the upload resumes, every offset is in exactly
    one object, and everything reads back byte for byte."""
    bucket = moto.create_bucket()
    node = start_node(server_process, tmp_path, moto, bucket, piece_age_s=600)  # only full pieces
    await setup_topic(node.server, local_retention_s=0.0)  # keep local: uploads are what this test is about
    await produce(node.server, 0, 200)
    await wait_until(node.server, lambda rows: any(row["pieces"] > 0 for row in rows))
    node.kill()
    node = start_node(server_process, tmp_path, moto, bucket, piece_age_s=0.3)
    await wait_until(node.server, lambda rows: all(row["tiered_offset"] == 200 for row in rows))
    for queue in range(QUEUES):
        ranges = sorted(range_of_key(key) for key in await tier_keys(moto, bucket)
                        if key.startswith(f"{PREFIX}/orders/{queue}/") and key.endswith(".seg"))
        assert ranges[0][0] == 0 and ranges[-1][1] == 200
        assert all(previous[1] == following[0] for previous, following in zip(ranges, ranges[1:])), ranges
    async with connect(node.server) as channel:
        await Admin(channel).update_topic("orders", local_retention_s=1.0)
    await wait_until(node.server, lambda rows: all_cold(rows, 200))
    assert await consume_everything(node.server, "billing") == expected(200)
