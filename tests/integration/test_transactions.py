"""Transactions against a real `rocket run`: committed half messages are delivered once, rolled-back
ones never; a transaction the producer forgets is checked back (also after a SIGKILL of the server) and
ends as the checker says; one never decided is set aside as unresolved, where operators can read it."""

from __future__ import annotations

import pytest
import trio

from rocket.client import Admin, Consumer, Outcome, connect, open_transaction_producer
from rocket.errors import Code, RocketError
from rocket.model import Message, unresolved_topic


@pytest.fixture
def quick_checks(monkeypatch):
    """Check-backs after 1 s, every 1 s, at most 3 times (the defaults are 6 s, 60 s and 15)."""
    monkeypatch.setenv("ROCKET_TRANSACTION_TIMEOUT_S", "1")
    monkeypatch.setenv("ROCKET_TRANSACTION_CHECK_S", "1")
    monkeypatch.setenv("ROCKET_TRANSACTION_CHECKS_MAX", "3")


async def visible(server: str, topic: str, group: str, wanted: int, timeout_s: float = 15.0) -> list[bytes]:
    """What a consumer of the topic sees: until wanted messages arrived (or the timeout), then a bit more."""
    found: list[bytes] = []
    async with connect(server) as channel:
        consumer = Consumer(channel, topic, group, start="earliest", wait_ms=200)
        await consumer.open()
        with trio.move_on_after(timeout_s):
            while len(found) < wanted:
                found.extend(m.body for m in await consumer.poll())
        with trio.move_on_after(1.0):
            while True:
                found.extend(m.body for m in await consumer.poll())
    return found


async def test_commit_is_delivered_once_and_rollback_never(server_process, quick_checks):
    """Half messages are invisible; a commit makes them visible once (a second commit or a rollback after
    it is NOT_FOUND); a rollback drops them for good."""
    server = server_process().start()
    async with connect(server.server) as channel:
        await Admin(channel).create_topic("payments", 2, "transaction")
        async with open_transaction_producer(channel, "payments") as producer:
            kept = await producer.send_half(Message(b"kept-1", key="order-1"), Message(b"kept-2", key="order-1"))
            dropped = await producer.send_half(Message(b"dropped", key="order-2"))
            assert await visible(server.server, "payments", "early", 1, timeout_s=1) == []
            await producer.commit(kept)
            await producer.rollback(dropped)
            for again in (producer.commit(kept), producer.rollback(kept), producer.commit(dropped)):
                with pytest.raises(RocketError) as caught:
                    await again
                assert caught.value.code == Code.NOT_FOUND
    assert sorted(await visible(server.server, "payments", "g", 2)) == [b"kept-1", b"kept-2"]


async def test_forgotten_transactions_are_checked_back_across_a_sigkill(server_process, quick_checks):
    """Transactions the producer neither commits nor rolls back are checked back after the server was
    killed and restarted: the checker's commits become visible once, its rollbacks never."""
    server = server_process().start()
    async with connect(server.server) as channel:
        await Admin(channel).create_topic("payments", 4, "transaction")
        async with open_transaction_producer(channel, "payments") as producer:
            for number in range(20):
                await producer.send_half(Message(f"order-{number}".encode(), key=f"k{number}"))
    server.kill()
    server.start()
    checked: list[str] = []

    async def checker(transaction, messages: list[Message]) -> Outcome:
        checked.append(transaction.id)
        number = int(messages[0].body.split(b"-")[1])
        return Outcome.COMMIT if number % 2 == 0 else Outcome.ROLLBACK

    async with connect(server.server) as channel:
        async with open_transaction_producer(channel, "payments", checker):
            found = await visible(server.server, "payments", "g", 10, timeout_s=20)
    assert sorted(found) == sorted(f"order-{number}".encode() for number in range(0, 20, 2))
    assert len(set(checked)) == 20


async def test_a_transaction_never_decided_is_set_aside_as_unresolved(server_process, quick_checks):
    """A checker that keeps answering 'unknown' sees the transaction a few times; then it goes to the
    topic's unresolved queue, readable there, never to consumers of the topic."""
    server = server_process().start()
    checks: list[str] = []

    async def undecided(transaction, messages: list[Message]) -> Outcome:
        checks.append(transaction.id)
        return Outcome.UNKNOWN

    async with connect(server.server) as channel:
        await Admin(channel).create_topic("payments", 1, "transaction")
        async with open_transaction_producer(channel, "payments", undecided) as producer:
            await producer.send_half(Message(b"limbo"))
            unresolved = await visible(server.server, unresolved_topic("payments"), "ops", 1, timeout_s=20)
    assert unresolved == [b"limbo"]
    assert 2 <= len(checks) <= 4
    assert await visible(server.server, "payments", "g", 1, timeout_s=0.5) == []



async def test_half_messages_that_cannot_be_read_are_refused(server_process):
    """Checks and commits read a transaction's half messages, so a half batch with a right CRC and malformed
    records is refused at once with BAD_BATCH; nothing is stored, and the topic's transactions go on."""
    from rocket.serde.batch import FLAG_TRANSACTION
    from tests.integration.test_malformed_batches import unreadable_batch

    server = server_process().start()
    async with connect(server.server) as channel:
        await Admin(channel).create_topic("payments", 1, "transaction")
        with pytest.raises(RocketError) as caught:
            await channel.call("Produce", {"topic": "payments", "queue": 0,
                                           "batch": unreadable_batch(1, FLAG_TRANSACTION)})
        assert caught.value.code == Code.BAD_BATCH and "malformed records" in caught.value.message
        async with open_transaction_producer(channel, "payments") as producer:
            await producer.commit(await producer.send_half(Message(b"good")))
    assert await visible(server.server, "payments", "g", 1) == [b"good"]
