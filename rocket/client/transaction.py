"""The transactional producer: send half messages (stored, invisible), run the local transaction, then
commit or roll back. A transaction left open is checked back: the broker streams it to the producer's
checker, whose answer (commit, rollback, or unknown: ask again later) ends it.
"""

from __future__ import annotations

import dataclasses
import enum
import logging
import secrets
import time
from collections.abc import Awaitable, Callable
from contextlib import asynccontextmanager
from typing import cast

import trio

from rocket.client.producer import Sequencer
from rocket.errors import RocketError, collapse_single_error
from rocket.model import Message, queue_for_key
from rocket.serde import batch as batch_codec
from rocket.transport.channel import Channel

log = logging.getLogger("rocket.client")


class Outcome(enum.Enum):
    COMMIT = "commit"
    ROLLBACK = "rollback"
    UNKNOWN = "unknown"  # not decided yet: the transaction is checked again later


@dataclasses.dataclass(frozen=True, slots=True)
class Transaction:
    """Half messages at queue, offset .. offset + count - 1 of the topic's half queue."""

    topic: str
    queue: int
    offset: int
    count: int

    @property
    def id(self) -> str:
        return f"{self.queue}.{self.offset}.{self.count}"


Checker = Callable[[Transaction, list[Message]], Awaitable[Outcome]]


class TransactionProducer:
    def __init__(self, channel: Channel, topic: str, queues: int, checker: Checker | None):
        self.channel = channel
        self.topic = topic
        self.queues = queues
        self.checker = checker
        self._round_robin = secrets.randbelow(queues)  # each producer starts at a queue of its own (producer.py)
        self.sequencer = Sequencer()  # idempotent: half messages sent again are stored once

    async def send_half(self, *messages: Message) -> Transaction:
        """Store messages as one transaction's half messages: invisible until commit. With a key, the
        first message picks the queue, as for plain sends."""
        if messages[0].key:
            queue = queue_for_key(messages[0].key, self.queues)
        else:
            self._round_robin = queue = (self._round_robin + 1) % self.queues
        batch = batch_codec.encode(list(messages), int(time.time() * 1000), transaction=True)
        reply = await self.channel.call("Produce", self.sequencer.produce_request(self.topic, queue, batch))
        return Transaction(self.topic, reply["queue"], reply["base_offset"], reply["count"])

    async def end(self, transaction: Transaction, commit: bool) -> None:
        """NOT_FOUND if it was ended before (or set aside as unresolved)."""
        await self.channel.call("EndTransaction", {"topic": transaction.topic, "queue": transaction.queue,
                                                   "offset": transaction.offset, "count": transaction.count,
                                                   "commit": commit})

    async def commit(self, transaction: Transaction) -> None:
        await self.end(transaction, True)

    async def rollback(self, transaction: Transaction) -> None:
        await self.end(transaction, False)

    async def answer_checks(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Listen for check-backs of open transactions and end them as the checker says; reconnects
        after a failure, until cancelled."""
        task_status.started()
        while True:
            try:
                async for response in self.channel.stream("TransactionChecks", {"topic": self.topic}):
                    for check in response["checks"]:
                        await self._check(check)
            except RocketError as error:
                log.info("transaction checks of %s: %s; listening again", self.topic, error)
            await trio.sleep(1.0)

    async def _check(self, check: dict) -> None:
        transaction = Transaction(self.topic, check["queue"], check["offset"], check["count"])
        messages = batch_codec.decode(check["batch"], check["offset"], check["queue"])
        outcome = await cast(Checker, self.checker)(transaction, messages)  # checks are answered with a checker alone
        if outcome is not Outcome.UNKNOWN:
            try:
                await self.end(transaction, outcome is Outcome.COMMIT)
            except RocketError as error:  # ended meanwhile by the producer itself, or another check
                log.info("transaction %s of %s: %s", transaction.id, self.topic, error)


@asynccontextmanager
async def open_transaction_producer(channel: Channel, topic: str, checker: Checker | None = None):
    """A transactional producer; with a checker it answers check-backs while open."""
    described = await channel.call("DescribeTopic", {"topic": topic})
    producer = TransactionProducer(channel, topic, described["topic"]["queues"], checker)
    with collapse_single_error():
        async with trio.open_nursery() as nursery:
            if checker is not None:
                await nursery.start(producer.answer_checks)
            yield producer
            nursery.cancel_scope.cancel()
