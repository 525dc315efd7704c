"""Deleting topics and consumer groups on a real `rocket run`: a node killed -9 in the middle of a delete finishes it
after a restart, leaving nothing of the topic in its index or in the object store (moto's S3 server); a produce that
races the delete is refused with UNKNOWN_TOPIC and never stored; a topic made again starts empty. And creates sent
again with their request id get their first answer."""

from __future__ import annotations

import sys

import pytest
import trio

from rocket.client import Admin, connect, open_consumer, open_producer
from rocket.errors import Code, RocketError
from rocket.model import Message
from rocket.store.queue_index import QueueIndex
from tests.integration.test_tier import (PREFIX, QUEUES, all_cold, moto, produce, start_node,  # noqa: F401
                                         tier_keys, wait_until)
from tests.integration.test_tier_objectstore import only_local_network  # noqa: F401

pytestmark = pytest.mark.skipif(sys.flags.dev_mode, reason="aiohttp rejects moto's duplicate Server header in -X dev")


async def wait_deleted(server: str, timeout_s: float = 60.0) -> None:
    with trio.move_on_after(timeout_s):
        while True:
            async with connect(server) as channel:
                if "orders" not in [spec.name for spec in await Admin(channel).list_topics()]:
                    try:
                        await Admin(channel).create_topic("orders", QUEUES)
                        return
                    except RocketError as error:
                        if error.code != Code.UNAVAILABLE:  # still being deleted
                            raise
            await trio.sleep(0.5)
    raise AssertionError("the delete never finished")


async def topic_objects(moto, bucket: str) -> int:
    return len([key for key in await tier_keys(moto, bucket) if key.startswith(f"{PREFIX}/orders/")])


async def test_a_delete_cut_by_kill_9_finishes_after_the_restart(server_process, tmp_path, moto):
    """Offloaded data, a committed offset and local batches; the node is killed -9 while the delete removes the
    topic's objects from S3. After the restart the nameserver finishes the delete: the objects go, the index holds
    nothing of the topic, and the topic made again starts empty."""
    bucket = moto.create_bucket()
    node = start_node(server_process, tmp_path, moto, bucket)
    async with connect(node.server) as channel:
        await Admin(channel).create_topic("orders", QUEUES, retention_s=0, local_retention_s=1)
    await produce(node.server, 0, 300)
    await wait_until(node.server, lambda rows: all_cold(rows, 300), timeout_s=90)
    async with connect(node.server) as channel, open_consumer(channel, "orders", "billing",
                                                              start="earliest") as consumer:
        assert await consumer.poll()
        await consumer.commit()
    before = await topic_objects(moto, bucket)  # no upload is due any more
    await produce(node.server, 300, 5)  # and a little left local
    assert before > 50

    async with connect(node.server) as channel:
        with pytest.raises(RocketError) as refused:
            await Admin(channel).delete_topic("orders")
        assert refused.value.code == Code.NOT_CONSUMED and "billing" in refused.value.message

    async def delete() -> None:
        with pytest.raises(RocketError):  # the node dies under it
            async with connect(node.server) as channel:
                await Admin(channel).delete_topic("orders", force=True)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(delete)
        with trio.fail_after(60):
            while (left := await topic_objects(moto, bucket)) >= before:
                await trio.sleep(0.02)
        node.kill()
    assert 0 < left < before, "killed in the middle of the objects' deletes"
    node = start_node(server_process, tmp_path, moto, bucket)
    await wait_deleted(node.server)
    assert await topic_objects(moto, bucket) == 0
    async with connect(node.server) as channel:
        _, queues = await Admin(channel).describe_topic("orders")
        assert [info["next_offset"] for info in queues] == [0] * QUEUES
        assert (await Admin(channel).describe_group("orders", "billing"))[0]["committed"] == -1
        async with open_producer(channel, "orders") as producer:
            await producer.send(Message(b"new"))
        async with open_consumer(channel, "orders", "fresh", start="earliest", wait_ms=200) as consumer:
            assert [message.body for message in await consumer.poll()] == [b"new"]
    node.kill()
    index = QueueIndex(tmp_path / "data" / "storage" / "index")
    try:
        left = [key for key, _ in index._db.iterator() if b"orders" in key]
        assert left and not [key for key in left if b"billing" in key], left  # the old group's offsets went
        batches = [key for key in left if key.startswith(b"qorders")]
        assert len(batches) <= 1 and all(key.endswith(bytes(8)) for key in batches), batches  # the new one alone
    finally:
        index.close()


async def test_a_produce_racing_the_delete_is_refused_never_stored(server_process, tmp_path):
    """Producers send without pause while the topic is deleted: each send is acknowledged before the delete or
    refused with UNKNOWN_TOPIC after it; once made again, the topic holds nothing of what they sent."""
    node = server_process(tmp_path / "data").start()
    async with connect(node.server) as channel:
        await Admin(channel).create_topic("orders", QUEUES)
    refusals: list[Code] = []
    acked = 0

    async def send_until_refused(number: int) -> None:
        nonlocal acked
        async with connect(node.server) as channel, open_producer(channel, "orders") as producer:
            while True:
                try:
                    await producer.send(Message(b"racing %d" % number))
                    acked += 1
                except RocketError as error:
                    refusals.append(error.code)
                    return

    async with trio.open_nursery() as nursery:
        for number in range(4):
            nursery.start_soon(send_until_refused, number)
        await trio.sleep(1)
        async with connect(node.server) as channel:
            await Admin(channel).delete_topic("orders", force=True)
    assert acked > 0 and set(refusals) == {Code.UNKNOWN_TOPIC}, refusals
    async with connect(node.server) as channel:
        await Admin(channel).create_topic("orders", QUEUES)
        _, queues = await Admin(channel).describe_topic("orders")
    assert [info["next_offset"] for info in queues] == [0] * QUEUES


async def test_a_create_sent_again_gets_its_first_answer(server_process, tmp_path):
    """A CreateTopic or CreateStorageClass whose answer was lost, sent again with its request id, gets the first
    answer (as the client's failover resends it); another create of the name is TOPIC_EXISTS as before."""
    node = server_process(tmp_path / "data").start()
    async with connect(node.server) as channel:
        create = {"topic": "orders", "queues": 2, "message_type": "normal", "storage_class": "raft",
                  "retention_s": 3600, "local_retention_s": -1, "request_id": "r-1"}
        first = await channel.call("CreateTopic", create)
        assert await channel.call("CreateTopic", create) == first
        assert first["retention_s"] == 3600
        with pytest.raises(RocketError) as exists:
            await channel.call("CreateTopic", {**create, "request_id": "r-2"})
        assert exists.value.code == Code.TOPIC_EXISTS
        storage_class = {"name": "single", "mode": "raft", "replicas": 1, "groups": 1, "request_id": "c-1"}
        made = await channel.call("CreateStorageClass", storage_class)
        assert (await channel.call("CreateStorageClass", storage_class))["name"] == made["name"] == "single"
        with pytest.raises(RocketError):
            await channel.call("CreateStorageClass", {**storage_class, "request_id": "c-2"})
