"""Pop consumption: SimpleConsumer (receive, ack, change the invisible time, nack with backoff) and
PushConsumer (a listener called with bounded concurrency; acked on success, retried on failure).
Unacked messages reappear after their invisible time; past max_attempts they go to the dead-letter queue.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

import trio

from rocket import limits
from rocket.errors import Code, RocketError
from rocket.filter import compile_filter
from rocket.model import Message, check_group_name
from rocket.client.throttle import Throttle
from rocket.serde.receive import parse_receipt, received
from rocket.transport.channel import Channel

log = logging.getLogger("rocket.client")

class SimpleConsumer:
    def __init__(self, channel: Channel, topic: str, group: str, *, invisible_s: float = limits.simple_invisible_s_default,
                 max_attempts: int = limits.pop_attempts_default, backoff_s: tuple[float, ...] = limits.pop_retry_backoff_s,
                 filter_type: str = "tag", filter: str = "*"):
        self.channel = channel
        self.topic = topic
        self.group = check_group_name(group)
        self.invisible_ms = int(invisible_s * 1000)
        self.max_attempts = max_attempts
        self.backoff_s = backoff_s
        self.filter_type = filter_type
        self.filter = compile_filter(filter_type, filter)
        self.fifo = False  # the topic is FIFO (learnt from the first receive)
        # The group's settings in the metadata, learnt from each receive: its max attempts override max_attempts (the
        # broker applies them), and its retry backoff, when it sets one, backoff_s.
        self.group_max_attempts = 0
        self.group_backoff_s: tuple[float, ...] = ()
        self.throttle = Throttle()  # client quotas: what the broker told to wait (client/throttle.py)

    async def receive(self, max_messages: int = limits.simple_receive_messages_default,
                      wait_s: float = limits.simple_receive_wait_s_default) -> list[Message]:
        """Up to max_messages, each invisible to the group's other receivers until acked or its invisible
        time runs out; waits up to wait_s for some."""
        request = {"topic": self.topic, "group": self.group, "max_messages": max_messages,
                   "invisible_ms": self.invisible_ms, "wait_ms": int(wait_s * 1000), "max_attempts": self.max_attempts,
                   "filter_type": self.filter_type, "filter": self.filter.expression}
        await self.throttle.wait()
        response = await self.channel.call("Receive", request, timeout_s=limits.request_timeout_s_default + wait_s)
        self.throttle.told(response)
        self.fifo = response["fifo"]
        self.group_max_attempts = response.get("max_attempts", 0)
        self.group_backoff_s = tuple(response.get("retry_backoff_s", ()))
        messages, unreadable = received(response, self.topic)
        if unreadable:  # a stale receipt: another receiver has it now, and does the same
            await self.channel.call("DeadLetter", {"topic": self.topic, "group": self.group, "invisible_ms": -1,
                                                   "receipts": unreadable})
        return messages

    async def _receipts(self, method: str, messages: list[Message], invisible_ms: int = -1) -> list[Message]:
        """The messages whose receipts were stale."""
        by_receipt = {}
        for message in messages:
            queue, offset, attempt = parse_receipt(message.receipt)
            by_receipt[(queue, offset, attempt)] = message
        response = await self.channel.call(method, {
            "topic": self.topic, "group": self.group, "invisible_ms": invisible_ms,
            "receipts": [{"queue": queue, "offset": offset, "attempt": attempt} for queue, offset, attempt in by_receipt]})
        return [by_receipt[(entry["queue"], entry["offset"], entry["attempt"])] for entry in response["stale"]]

    async def ack(self, *messages: Message) -> None:
        """Done with messages: they are not delivered again. NOT_FOUND if one's invisible time ran out
        first (it was, or will be, delivered again); the others are acknowledged all the same."""
        stale = await self._receipts("Ack", list(messages))
        if stale:
            raise RocketError(Code.NOT_FOUND, f"receipts {', '.join(m.receipt for m in stale)} of group {self.group!r} "
                              f"on {self.topic!r} are stale: acknowledged before, or their invisible time ran out "
                              "and the message was delivered again")

    async def change_invisible(self, message: Message, invisible_s: float) -> None:
        """Keep a message invisible for invisible_s from now (or let it reappear sooner)."""
        if await self._receipts("ChangeInvisible", [message], int(invisible_s * 1000)):
            raise RocketError(Code.NOT_FOUND, f"receipt {message.receipt} is stale")

    async def dead_letter(self, message: Message) -> None:
        """Give up on a message now: it goes to the group's dead-letter queue (%DLQ%group%topic), whatever
        attempts it has left. NOT_FOUND if its receipt is stale."""
        if await self._receipts("DeadLetter", [message]):
            raise RocketError(Code.NOT_FOUND, f"receipt {message.receipt} is stale")

    async def nack(self, message: Message) -> None:
        """Processing failed: deliver the message again after the backoff for its attempt (the group's, when its
        settings set one)."""
        backoff = self.group_backoff_s or self.backoff_s
        backoff_s = backoff[min(message.attempt, len(backoff)) - 1]
        await self.change_invisible(message, backoff_s)


class PushConsumer:
    """Receives continuously and calls listener(message) with at most concurrency calls at once: a call
    that returns acks the message, one that raises has it retried with backoff (then dead-lettered).
    On a FIFO topic each queue's messages are handled one after the other, in order; after a failure the
    rest of them come back with the failed one, so order holds across retries."""

    def __init__(self, consumer: SimpleConsumer, listener: Callable[[Message], Awaitable[None]],
                 concurrency: int = limits.simple_listener_tasks_default):
        self.consumer = consumer
        self.listener = listener
        self.concurrency = concurrency

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Until cancelled."""
        slots = trio.Semaphore(self.concurrency)
        async with trio.open_nursery() as nursery:
            task_status.started()
            while True:
                await slots.acquire()  # receive only what there is room to process
                free = slots.value + 1
                try:
                    messages = await self.consumer.receive(max_messages=free)
                except RocketError as error:
                    slots.release()
                    log.warning("push consumer of %s: receive failed: %s", self.consumer.topic, error)
                    await trio.sleep(1.0)
                    continue
                runs = [[message] for message in messages]
                if self.consumer.fifo:
                    by_queue: dict[int, list[Message]] = {}
                    for message in messages:
                        by_queue.setdefault(message.queue, []).append(message)
                    runs = list(by_queue.values())
                for index, run in enumerate(runs):
                    if index:
                        await slots.acquire()
                    nursery.start_soon(self._handle, run, slots)
                if not runs:
                    slots.release()

    async def _handle(self, run: list[Message], slots: trio.Semaphore) -> None:
        try:
            for index, message in enumerate(run):
                try:
                    await self.listener(message)
                except Exception as error:  # the listener's failure is the message's: retry it later
                    log.info("push consumer of %s: listener failed on %s: %r", self.consumer.topic, message.receipt,
                             error)
                    await self.consumer.nack(message)
                    for later in run[index + 1:]:  # FIFO: the rest wait for it, and come back after it
                        await self.consumer.change_invisible(later, self.consumer.backoff_s[0])
                    return
                await self.consumer.ack(message)
        except RocketError as error:  # a stale receipt: the message reappeared and goes round again
            log.warning("push consumer of %s: %s", self.consumer.topic, error)
        finally:
            slots.release()
