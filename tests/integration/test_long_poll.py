"""What a long poll costs storage: the broker's first read, then one storage call per group that waits and returns
the data, never a wait and then reads again; a receive on a one-group topic is one pop that waits."""

import pytest
import trio

from rocket.client import Admin, SimpleConsumer, open_producer
from rocket.client.connection import connect
from rocket.model import Message
from rocket.serde import batch as batch_codec
from rocket.roles.storage.pops import Pops
from rocket.roles.storage.reads import Reads


def counted(monkeypatch, role_class, method: str, handed_out) -> list[tuple[int, int]]:
    """Record (wait_ms, handed_out(response)) of each call of role_class.method the node serves, in order."""
    calls: list[tuple[int, int]] = []
    serve = getattr(role_class, method)

    async def recorded(self, request: dict) -> dict:
        response = await serve(self, request)
        calls.append((request["wait_ms"], handed_out(response)))
        return response

    monkeypatch.setattr(role_class, method, recorded)
    return calls


async def send_after(channel, topic: str, body: bytes, delay_s: float) -> None:
    """Send one message once a long poll is waiting."""
    await trio.sleep(delay_s)
    async with open_producer(channel, topic) as producer:
        await producer.send(Message(body))


@pytest.fixture
def storage_reads(monkeypatch):
    """The StorageRead calls: (wait_ms, batches answered)."""
    return counted(monkeypatch, Reads, "read", lambda response: len(response["batches"]))


@pytest.fixture
def storage_pops(monkeypatch):
    """The StoragePop calls: (wait_ms, messages handed out)."""
    return counted(monkeypatch, Pops, "pop", lambda response: len(response["handles"]))


async def test_an_empty_long_poll_is_one_read_then_one_waiting_call(storage_reads, node):
    """A pull on an empty queue that waits and times out costs two storage reads: one that finds nothing and one
    that waits; a message sent during the wait comes back from that waiting call, with no read after it."""
    async with connect(f"127.0.0.1:{node.tcp_port}") as channel:
        await Admin(channel).create_topic("quiet", 1)
        storage_reads.clear()
        pulled = await channel.call("Pull", {"topic": "quiet", "queues": [{"queue": 0, "offset": 0}],
                                             "wait_ms": 300})
        assert pulled["batches"] == []
        assert [wait_ms for wait_ms, _ in storage_reads] == [0, pytest.approx(300, abs=50)]

        storage_reads.clear()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(send_after, channel, "quiet", b"late", 0.3)
            pulled = await channel.call("Pull", {"topic": "quiet", "queues": [{"queue": 0, "offset": 0}],
                                                 "wait_ms": 10_000}, timeout_s=20)
        assert len(pulled["batches"]) == 1
        assert len(storage_reads) == 2 and storage_reads[0] == (0, 0) and storage_reads[1][1] == 1


async def test_a_receive_on_one_group_is_one_pop_that_waits(storage_pops, storage_reads, node):
    """A receive that waits on a topic of one storage group is one StoragePop that waits and hands out the message
    sent meanwhile: no pop, wait and pop again."""
    async with connect(f"127.0.0.1:{node.tcp_port}") as channel:
        await Admin(channel).create_topic("jobs", 1)
        storage_pops.clear()
        storage_reads.clear()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(send_after, channel, "jobs", b"job", 0.3)
            received = await SimpleConsumer(channel, "jobs", "workers").receive(wait_s=10)
        assert [message.body for message in received] == [b"job"]
        assert len(storage_pops) == 1 and storage_pops[0][0] > 9000 and storage_pops[0][1] == 1
        assert storage_reads == []


async def test_a_long_poll_over_groups_still_waits_on_a_group_whose_wait_a_pop_woke(node):
    """A pop of another consumer group wakes the pull's storage wait on that queue's group, which then answers
    nothing: the pull waits on every group again, and the message sent to that queue after it comes back."""
    async with connect(f"127.0.0.1:{node.tcp_port}") as channel:
        await Admin(channel).create_topic("spread", 4)

        async def produce(body: bytes) -> None:
            batch = batch_codec.encode([Message(body)], 0)
            await channel.call("Produce", {"topic": "spread", "queue": 0, "batch": batch})

        await produce(b"first")
        pulled: list[dict] = []

        async def pull() -> None:
            pulled.append(await channel.call("Pull", {"topic": "spread", "queues": [
                {"queue": queue, "offset": 1 if queue == 0 else 0} for queue in range(4)], "wait_ms": 8000},
                timeout_s=20))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(pull)
            await trio.sleep(0.5)
            popped = await SimpleConsumer(channel, "spread", "poppers").receive(wait_s=0)
            assert [message.body for message in popped] == [b"first"]
            await trio.sleep(0.5)
            await produce(b"second")
        bodies = [message.body for stored in pulled[0]["batches"]
                  for message in batch_codec.decode(stored["batch"], stored["base_offset"], stored["queue"])]
        assert bodies == [b"second"]
