"""Benchmarks driven from the client: produce and consume throughput and latency.

The raw disk probe they are reported against is not the SDK's: it lives in rocket/cli/disk_probe.py.
"""

from __future__ import annotations

import os
import time
import uuid
from typing import cast

import trio

from rocket import limits
from rocket.client.consumer import Consumer
from rocket.client.producer import Receipt, open_producer
from rocket.model import Message
from rocket.serde import batch as batch_codec
from rocket.transport.channel import Channel


def percentile(values: list[float], rank: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * rank / 100))]


def build_batches(messages: int, size: int, batch_bytes: int) -> list[bytes]:
    """Encode the whole workload before the clock starts, so the run measures the server path."""
    body = os.urandom(size)
    per_batch = max(1, batch_bytes // (size + 16))
    now_ms = int(time.time() * 1000)
    template = [Message(body, key=f"k{index}") for index in range(per_batch)]
    batches = []
    remaining = messages
    while remaining > 0:
        count = min(per_batch, remaining)
        batches.append(batch_codec.encode(template[:count], now_ms))
        remaining -= count
    return batches


async def bench_produce(channel: Channel, *, messages: int, size: int, batch_bytes: int, in_flight: int,
                        topic: str | None = None, queues: int = 8, rate: float = 0.0, on_progress=None) -> dict:
    """As fast as in_flight allows, or with rate, batches sent at that many a second, each at its due time (an open
    loop: a slow answer does not delay the next send, unless in_flight batches are all unanswered). Latency is
    from the hand-over to the producer; send_late_ms_p99 says how late the paced sends were handed over (a wait
    for room in the window, which that latency does not count: give in_flight room)."""
    topic = topic or f"bench-{uuid.uuid4().hex[:8]}"
    topics = await channel.call("ListTopics", {})
    existing = {entry["name"]: entry["queues"] for entry in topics["topics"]}
    if topic in existing:
        queues = existing[topic]
    else:
        await channel.call("CreateTopic", {"topic": topic, "queues": queues})
    batches = build_batches(messages, size, batch_bytes)
    receipts: list[Receipt] = []
    async with open_producer(channel, topic, in_flight_max=in_flight) as producer:
        # Before the clock: a message to each queue, since the first sends of a cluster's first topic wait about 1.3 s
        # while the storage groups it made are hosted and elected (counted, that is a paced run's p99, and a part of a
        # short run's throughput).
        for queue in range(queues):
            await producer.send_encoded(batch_codec.encode([Message(b"warm-up")], int(time.time() * 1000)), queue)
        await producer.flush()
        started, due = time.perf_counter(), trio.current_time()
        late: list[float] = []  # how long after its due time each paced send was handed over
        for encoded in batches:
            if rate:
                due += 1 / rate
                await trio.sleep_until(due)
            await producer.send_encoded(encoded, -1, receipts)
            if rate:
                late.append(trio.current_time() - due)
            if on_progress:
                on_progress(batch_codec.peek_count(encoded))
        await producer.flush()
        elapsed = time.perf_counter() - started
    latencies = [receipt.latency_s for receipt in receipts]
    payload_bytes = messages * size
    paced = {"rate_batches_per_s": rate, "send_late_ms_p99": percentile(late, 99) * 1000} if rate else {}
    return {
        "topic": topic, "messages": messages, "message_bytes": size, "batches": len(batches),
        "seconds": elapsed, "messages_per_s": messages / elapsed, "mb_per_s": payload_bytes / elapsed / 1e6,
        "wire_mb_per_s": sum(len(b) for b in batches) / elapsed / 1e6,
        "latency_ms_p50": percentile(latencies, 50) * 1000, "latency_ms_p99": percentile(latencies, 99) * 1000,
        "latency_ms_max": max(latencies) * 1000 if latencies else 0.0,
        **paced, "note": "latency is per batch, from send to durable acknowledgement",
    }


async def bench_consume(channel: Channel, *, topic: str, messages: int, bodies: bool = False, on_progress=None) -> dict:
    """Read messages (or with bodies, only their bodies: Consumer.poll_bodies) from the earliest offset."""
    consumer = Consumer(channel, topic, f"bench-{uuid.uuid4().hex[:8]}", start="earliest", wait_ms=200,
                        max_bytes=limits.read_bytes_max)
    await consumer.open()
    received = 0
    payload = 0
    started = time.perf_counter()
    while received < messages:
        with trio.move_on_after(10) as scope:
            wanted = messages - received
            polled = await (consumer.poll_bodies(limit=wanted) if bodies else consumer.poll(limit=wanted))
        if scope.cancelled_caught or not polled:
            break
        received += len(polled)
        # poll_bodies gives the bodies, poll the messages.
        if bodies:
            payload += sum(map(len, cast("list[bytes]", polled)))
        else:
            payload += sum(len(message.body) for message in cast("list[Message]", polled))
        if on_progress:
            on_progress(len(polled))
        del polled  # done with them before the next poll, as a loop over each poll is: not freed cold after it
    elapsed = time.perf_counter() - started
    what = "each body" if bodies else "every message"
    return {"topic": topic, "messages": received, "seconds": elapsed, "messages_per_s": received / elapsed,
            "mb_per_s": payload / elapsed / 1e6, "note": f"includes client-side decoding of {what}"}
