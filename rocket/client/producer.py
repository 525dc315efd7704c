"""The producer: batches messages per queue (bounded linger and size) and sends the batches (Producer). Producers are
idempotent (Sequencer): a batch sent again is stored once, which is why the producer, not the broker, picks the
queue of every batch.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import itertools
import secrets
import time
from contextlib import asynccontextmanager
from typing import cast

import trio

from rocket import limits
from rocket.errors import RocketError, collapse_single_error
from rocket.model import Message, queue_for_key
from rocket.serde import batch as batch_codec
from rocket.client.throttle import Throttle
from rocket.transport.channel import Channel


@dataclasses.dataclass(slots=True)
class Receipt:
    queue: int
    base_offset: int
    count: int
    latency_s: float
    scheduled: bool = False  # the messages wait for their delivery time; queue.offset are their timer ids
    throttle_ms: int = 0  # over a quota: the broker's throttle time, which the producer waits before its next batch


class Sequencer:
    """An idempotent producer's id (random, 63 bits) and its batches' sequence. A batch sent again after a lost
    answer (the failover channel moves on to another broker, a broker retries its storage call) is so stored once
    and gets its first answer (store/producers.py)."""

    def __init__(self, producer_id: int = 0) -> None:
        self.producer_id = producer_id or secrets.randbits(63) or 1
        self._sequences = itertools.count()

    def produce_request(self, topic: str, queue: int, batch: bytes) -> dict:
        """A Produce request for a new batch: sending this same request again cannot store the batch twice."""
        return {"topic": topic, "queue": queue, "batch": batch, "producer_id": self.producer_id,
                "sequence": next(self._sequences)}


@dataclasses.dataclass
class _Pending:
    """Messages waiting for the linger timer, with one event their senders wait on."""

    messages: list[Message] = dataclasses.field(default_factory=list)
    bytes: int = 0
    done: trio.Event = dataclasses.field(default_factory=trio.Event)
    linger: trio.CancelScope = dataclasses.field(default_factory=trio.CancelScope)  # cancelled once it goes
    receipt: Receipt | None = None
    error: RocketError | None = None


class Producer:
    """Three ways in: send() for one message at a time (batched with concurrent senders by linger), send_many() for a
    list, and send_encoded() for batches the caller built (e.g. lines of a file). Batches for one queue are stored in
    the order they were handed over: each queue has a lane that sends its next batch once the one before is answered
    (the server may take concurrent requests in any order). Batches for any queue (queue -1; spread round robin
    here) are pipelined, up to in_flight_max at once. send() puts a message without a key in the batch filling for
    the current queue, and moves to the next queue once that batch goes (Kafka's sticky partitioner, KIP-480):
    concurrent sends make one batch, not one per queue. A batch goes at once while none of the producer's batches is
    in flight, and else once one is answered or its linger ends, whichever comes first (Nagle's rule): a lone send
    waits for nothing, and under load a batch gathers what came while the one before it was out."""

    def __init__(self, channel: Channel, topic: str, queues: int, nursery: trio.Nursery, *,
                 linger_s: float, batch_bytes: int, in_flight_max: int):
        self.channel = channel
        self.topic = topic
        self.queues = queues
        self._nursery = nursery
        self._linger_s = linger_s
        self._batch_bytes = min(batch_bytes, limits.batch_bytes_max - batch_codec.HEADER_BYTES)
        self._in_flight = trio.Semaphore(in_flight_max)
        self._pending: dict[int, _Pending] = {}
        self._lanes: dict[int, collections.deque] = {}  # per queue, batches handed over and not yet sent
        self._sending = 0  # batches of send() flushed and not answered yet
        self._round_robin = secrets.randbelow(queues)  # each producer starts at a queue of its own, as Kafka's do
        self._sticky = self._choose_queue()  # where send() puts messages without a key, until their batch goes
        self._failure: RocketError | None = None
        self._idle = trio.Event()
        self._tasks = 0
        self._idle.set()
        self.throttle = Throttle()  # client quotas: what the broker told to wait (client/throttle.py)
        self.sequencer = Sequencer()

    def _choose_queue(self, message: Message | None = None) -> int:
        if message is not None and message.key:
            return queue_for_key(message.key, self.queues)
        self._round_robin = (self._round_robin + 1) % self.queues
        return self._round_robin

    async def send(self, message: Message) -> Message:
        """Send one message; returns it with queue and offset once it is durable. A delayed message
        (deliver_at_ms set, to a delay topic) gets the queue and offset of its timer: its id for
        cancel_timer, until it is delivered at its time with an offset of the topic."""
        queue = queue_for_key(message.key, self.queues) if message.key else self._sticky
        pending = self._pending.get(queue)
        lingers = pending is not None
        if pending is None:
            pending = self._pending[queue] = _Pending()
        index = len(pending.messages)
        pending.messages.append(message)
        pending.bytes += len(message.body) + len(message.key) + 32
        if pending.bytes >= self._batch_bytes or not self._sending:
            self._flush_pending(queue)
        elif not lingers:
            self._nursery.start_soon(self._linger_then_flush, queue, pending)
        await pending.done.wait()
        if pending.error is not None:
            raise pending.error
        receipt = cast(Receipt, pending.receipt)  # set when done without an error
        message.queue = receipt.queue
        message.offset = receipt.base_offset + index
        return message

    async def _linger_then_flush(self, queue: int, pending: _Pending) -> None:
        with pending.linger:
            await trio.sleep(self._linger_s)
        if self._pending.get(queue) is pending:
            self._flush_pending(queue)

    def _flush_pending(self, queue: int) -> None:
        self._sending += 1
        pending = self._pending.pop(queue)
        pending.linger.cancel()
        if queue == self._sticky:
            self._sticky = self._choose_queue()
        self._in_order(queue, functools.partial(self._send_pending, queue, pending))

    def _in_order(self, queue: int, send) -> None:
        """Send after every batch handed over for this queue before (its lane runs while it has batches)."""
        lane = self._lanes.get(queue)
        if lane is not None:
            lane.append(send)
            return
        self._lanes[queue] = collections.deque([send])
        self._nursery.start_soon(self._run_lane, queue)

    async def _run_lane(self, queue: int) -> None:
        lane = self._lanes[queue]
        while lane:
            await lane.popleft()()
        del self._lanes[queue]

    async def _send_pending(self, queue: int, pending: _Pending) -> None:
        try:
            encoded = batch_codec.encode(pending.messages, int(time.time() * 1000))
            pending.receipt = await self._produce(encoded, queue)
        except RocketError as error:
            pending.error = error
        finally:
            pending.done.set()
            self._sending -= 1
            if not self._sending:  # nothing in flight: what gathered meanwhile goes now
                for waiting in list(self._pending):
                    self._flush_pending(waiting)

    async def _produce(self, encoded: bytes, queue: int) -> Receipt:
        await self.throttle.wait()
        started = time.perf_counter()
        response = await self.channel.call("Produce", self.sequencer.produce_request(self.topic, queue, encoded))
        return Receipt(response["queue"], response["base_offset"], response["count"], time.perf_counter() - started,
                       response["scheduled"], self.throttle.told(response))

    async def send_many(self, messages: list[Message]) -> list[Receipt]:
        """Group messages into batches per queue and send them pipelined; returns one receipt per batch."""
        by_queue: dict[int, list[Message]] = {}
        for message in messages:
            by_queue.setdefault(self._choose_queue(message), []).append(message)
        receipts: list[Receipt] = []
        now_ms = int(time.time() * 1000)
        for queue, group in by_queue.items():
            start = 0
            size = 0
            for index, message in enumerate(group):
                size += len(message.body) + len(message.key) + 32
                if size >= self._batch_bytes or index == len(group) - 1:
                    await self.send_encoded(batch_codec.encode(group[start:index + 1], now_ms), queue, receipts)
                    start, size = index + 1, 0
        await self.flush()
        return receipts

    async def send_encoded(self, encoded: bytes, queue: int = -1, receipts: list[Receipt] | None = None) -> None:
        """Start sending an encoded batch; waits only for room in the window of batches handed over and not
        yet answered."""
        if self._failure is not None:
            raise self._failure
        await self._in_flight.acquire()
        if self._tasks == 0:
            self._idle = trio.Event()
        self._tasks += 1
        if queue == -1:
            self._nursery.start_soon(self._send_tracked, encoded, self._choose_queue(), receipts)
        else:
            self._in_order(queue, functools.partial(self._send_tracked, encoded, queue, receipts))

    async def _send_tracked(self, encoded: bytes, queue: int, receipts: list[Receipt] | None) -> None:
        try:
            receipt = await self._produce(encoded, queue)
            if receipts is not None:
                receipts.append(receipt)
        except RocketError as error:
            if self._failure is None:
                self._failure = error
        finally:
            self._in_flight.release()
            self._tasks -= 1
            if self._tasks == 0:
                self._idle.set()

    async def flush(self) -> None:
        """Wait for every batch sent so far; raise the first failure among them."""
        for queue in list(self._pending):
            self._flush_pending(queue)
        await self._idle.wait()
        if self._failure is not None:
            failure, self._failure = self._failure, None
            raise failure


@asynccontextmanager
async def open_producer(channel: Channel, topic: str, *, linger_s: float = limits.producer_linger_ms_default / 1000,
                        batch_bytes: int = limits.producer_batch_bytes_default,
                        in_flight_max: int = limits.producer_in_flight_batches_max):
    described = await channel.call("DescribeTopic", {"topic": topic})
    queues = described["topic"]["queues"]
    with collapse_single_error():
        async with trio.open_nursery() as nursery:
            producer = Producer(channel, topic, queues, nursery, linger_s=linger_s, batch_bytes=batch_bytes,
                                in_flight_max=in_flight_max)
            yield producer
            await producer.flush()
