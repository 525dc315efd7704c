"""Message semantics, measured against one `rocket run` on a temporary directory, in one run:

- filtered consumption: a topic where 1% of batches hold the wanted tag, read whole with a tag filter
  (storage skips the other batches by their tag summary, unread) and without one;
- timers: the rate of scheduling delayed messages beside plain produce, and of delivering them when
  they fall due together;
- pop consumption: receive 256 and ack them in one call, over and over.

    python benchmarks/semantics.py [--messages 400000] [--size 256]

Writes benchmarks/results/semantics.json.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

import trio

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.produce import RESULTS, start_nodes  # noqa: E402
from rocket.client import Admin, Consumer, SimpleConsumer, connect, open_producer  # noqa: E402
from rocket.model import Message  # noqa: E402
from rocket.serde import batch as batch_codec  # noqa: E402

BATCH_MESSAGES = 500


async def produce_tagged(channel, topic: str, messages: int, size: int) -> float:
    """Batches of BATCH_MESSAGES messages, every 100th batch tagged 'hit', the rest 'miss'; seconds taken."""
    body = bytes(size)
    started = time.perf_counter()
    async with open_producer(channel, topic) as producer:
        for number in range(messages // BATCH_MESSAGES):
            tag = "hit" if number % 100 == 0 else "miss"
            await producer.send_encoded(batch_codec.encode([Message(body, tag=tag)] * BATCH_MESSAGES, 1))
    return time.perf_counter() - started


async def consume_all(channel, topic: str, group: str, **options) -> tuple[int, float]:
    consumer = Consumer(channel, topic, group, start="earliest", wait_ms=0, **options)
    await consumer.open()
    started = time.perf_counter()
    count = 0
    while True:
        before = dict(consumer.positions)
        messages = await consumer.poll()
        count += len(messages)
        if not messages and consumer.positions == before:
            return count, time.perf_counter() - started


async def schedule(channel, topic: str, messages: int, size: int, deliver_at_ms: int) -> float:
    body = bytes(size)
    started = time.perf_counter()
    async with open_producer(channel, topic) as producer:
        for _ in range(messages // BATCH_MESSAGES):
            await producer.send_encoded(batch_codec.encode([Message(body, deliver_at_ms=deliver_at_ms)] * BATCH_MESSAGES, 1))
    return time.perf_counter() - started


async def measure(server: str, messages: int, size: int) -> dict:
    result: dict = {"messages": messages, "size": size}
    async with connect(server, serde="avro") as channel:
        admin = Admin(channel)
        await admin.create_topic("mixed", 8)
        result["produce_s"] = await produce_tagged(channel, "mixed", messages, size)
        count, seconds = await consume_all(channel, "mixed", "all")
        result["unfiltered"] = {"messages": count, "seconds": seconds, "messages_per_s": count / seconds}
        count, seconds = await consume_all(channel, "mixed", "hits", filter="hit")
        result["tag_filtered_1pct"] = {"messages": count, "seconds": seconds, "scanned_messages_per_s": messages / seconds}
        result["filtered_scan_speedup"] = result["unfiltered"]["seconds"] / seconds

        await admin.create_topic("later", 8, "delay")
        timers = messages // 4
        due_ms = int(time.time() * 1000) + 3_600_000
        seconds = await schedule(channel, "later", timers, size, due_ms)
        plain = await produce_tagged(channel, "mixed", timers, size)
        result["timers_scheduled_per_s"] = timers / seconds
        result["plain_produced_per_s"] = timers / plain
        # A burst: every timer due at once, two seconds from now; time until all are consumable.
        await admin.create_topic("burst", 8, "delay")
        burst = messages // 10
        due_ms = int(time.time() * 1000) + 2_000
        await schedule(channel, "burst", burst, size, due_ms)
        consumer = Consumer(channel, "burst", "g", start="earliest", wait_ms=500)
        await consumer.open()
        got = 0
        while got < burst:
            got += len(await consumer.poll())
        result["timer_burst"] = {"messages": burst, "all_delivered_s_after_due": time.time() - due_ms / 1000}

        await admin.create_topic("jobs", 8)
        pops = messages // 10
        await produce_tagged(channel, "jobs", pops, size)
        simple = SimpleConsumer(channel, "jobs", "workers", invisible_s=60)
        started = time.perf_counter()
        done = 0
        while done < pops:
            received = await simple.receive(max_messages=256, wait_s=1)
            if received:
                await simple.ack(*received)
            done += len(received)
        result["pop_receive_ack_per_s"] = done / (time.perf_counter() - started)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=400_000)
    parser.add_argument("--size", type=int, default=256)
    parser.add_argument("--data-parent", default=None)
    arguments = parser.parse_args()
    data = Path(tempfile.mkdtemp(prefix="rocket-semantics-", dir=arguments.data_parent))
    [server] = start_nodes(data, 1)
    try:
        ready = re.search(rb"tcp=[^:]+:(\d+)", server.stdout.readline())
        result = trio.run(measure, f"127.0.0.1:{ready.group(1).decode()}", arguments.messages, arguments.size)
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(60)
        shutil.rmtree(data, ignore_errors=True)
    result["date"] = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "semantics.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
