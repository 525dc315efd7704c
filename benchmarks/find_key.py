"""Lookups by key through the storage groups' key index (issue 53, part 2), against a scan of the queue: starts
`rocket run` (one node) on a temporary data directory, fills one queue with --messages messages of --size bytes,
each with a key of its own (key-N), --per-batch to a batch; times how long after the last produce the key indexer
(which works in the node's idle time) has indexed them all, then looks up --lookups keys drawn at random (and as
many absent ones) with FindMessages over the whole queue, and once reads the whole queue as the search did before
the index (every batch pulled and decoded). Writes benchmarks/results/find-key.json.

    PYTHONPATH=. python benchmarks/find_key.py --messages 10000000 [--size 100] [--per-batch 1000] [--lookups 100]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import trio

from rocket.client import Admin, connect, open_producer
from rocket.client.bench import percentile
from rocket.model import Message
from rocket.serde import batch as batch_codec

RESULTS = Path(__file__).parent / "results" / "find-key.json"
READY = re.compile(r"rocket ready tcp=([^ ]+)")


def spread(values: list[float]) -> dict:
    return {"p50": round(percentile(values, 50), 4), "p99": round(percentile(values, 99), 4),
            "max": round(max(values), 4), "count": len(values)}


async def fill(server: str, messages: int, size: int, per_batch: int) -> float:
    """Messages per second produced."""
    body = bytes(size)
    started = time.monotonic()
    async with connect(server) as channel:
        await Admin(channel).create_topic("keyed", 1)
        async with open_producer(channel, "keyed") as producer:
            for first in range(0, messages, per_batch):
                now_ms = int(time.time() * 1000)
                await producer.send_encoded(batch_codec.encode([
                    Message(body, key=f"key-{number}") for number in range(first, min(first + per_batch, messages))],
                    now_ms), 0)
            await producer.flush()
    return messages / (time.monotonic() - started)


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def caught_up(pid: int) -> float:
    """Seconds until the node goes idle (under 5% of a core over a second): the key indexer has indexed it all (a
    lookup meanwhile would read the batches it has not, and keep the node from the idle time it works in)."""
    started = time.monotonic()
    while True:
        before = cpu_seconds(pid)
        time.sleep(1.0)
        if cpu_seconds(pid) - before < 0.05:
            return time.monotonic() - started - 1.0


async def lookups(server: str, messages: int, count: int) -> dict:
    present, absent, read = [], [], []
    async with connect(server) as channel:
        admin = Admin(channel)
        for _ in range(count):
            for wanted, times in ((random.randrange(messages), present),
                                  (messages + random.randrange(messages), absent)):
                started = time.perf_counter()
                response = await channel.call("FindMessages", {
                    "topic": "keyed", "key": f"key-{wanted}", "message_id": False, "queues": [], "start_ms": 0,
                    "end_ms": 0, "limit": 64})
                times.append(time.perf_counter() - started)
                read.append(response["batches_read"])
                assert len(response["offsets"]) == (wanted < messages), (wanted, response["offsets"])
        started = time.perf_counter()
        found = await admin.find_messages("keyed", f"key-{messages // 2}")
        assert [message.offset for message in found] == [messages // 2]
        client_s = time.perf_counter() - started
    return {"present_s": spread(present), "absent_s": spread(absent), "batches_read_max": max(read),
            "find_messages_one_s": round(client_s, 4)}


async def scan(server: str) -> float:
    """Seconds to read and decode every message of the queue, as a search without the index did."""
    started = time.perf_counter()
    offset = 0
    async with connect(server) as channel:
        while True:
            response = await channel.call("Pull", {"topic": "keyed", "queues": [{"queue": 0, "offset": offset}],
                                                   "wait_ms": 0})
            if not response["batches"]:
                return time.perf_counter() - started
            for stored in response["batches"]:
                [message.key for message in batch_codec.decode(stored["batch"], stored["base_offset"], 0)]
            offset = response["next_offsets"][0]["offset"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=10_000_000)
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--per-batch", type=int, default=1000)
    parser.add_argument("--lookups", type=int, default=100)
    parser.add_argument("--data-parent", default=None)
    parser.add_argument("--out", default=str(RESULTS))
    arguments = parser.parse_args()
    data = Path(tempfile.mkdtemp(prefix="rocket-find-", dir=arguments.data_parent))
    server = subprocess.Popen([sys.executable, "-m", "rocket", "run", "--data-dir", str(data / "data"), "--listen",
                               "127.0.0.1:0", "--http2-listen", "off", "--log-level", "warning"],
                              stdout=subprocess.PIPE, text=True, env=dict(os.environ, ROCKET_TIER_BACKEND="off"))
    try:
        address = next(found.group(1) for line in server.stdout if (found := READY.search(line)))
        produced = trio.run(fill, address, arguments.messages, arguments.size, arguments.per_batch)
        print(f"filled: {arguments.messages:,} messages at {produced:,.0f} a second", flush=True)
        indexed_s = caught_up(server.pid)
        print(f"the key indexer caught up {indexed_s:.1f} s after the last produce", flush=True)
        looked = trio.run(lookups, address, arguments.messages, arguments.lookups)
        print(f"lookups: {looked}", flush=True)
        scanned = trio.run(scan, address)
        print(f"scan of the queue: {scanned:.2f} s", flush=True)
    finally:
        server.send_signal(signal.SIGKILL)
        server.wait()
        shutil.rmtree(data, ignore_errors=True)
    result = {"messages": arguments.messages, "size": arguments.size, "per_batch": arguments.per_batch,
              "produced_per_s": round(produced), "indexed_after_s": round(indexed_s, 1), **looked,
              "scan_s": round(scanned, 3),
              "machine": f"{platform.node()} {os.cpu_count()} cpus", "at": time.strftime("%Y-%m-%d %H:%M")}
    Path(arguments.out).write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
