"""Make tests/jobs/data/tier/: the telemetry a REAL dev node ships while it carries traffic that varies over time.

    PYTHONPATH=. python tests/jobs/make_sample.py [--minutes 15] [--out tests/jobs/data/tier]

It starts `python -m rocket run` (dev mode, telemetry sampled every 2 s: ROCKET_TELEMETRY_INTERVAL_S=2) on a
temporary data directory, creates four topics and produces to them for --minutes at rates of four shapes:

- `steady`  (2 queues): about 20 KB/s, a little noise;
- `rising`  (2 queues): from 2 KB/s up to about 60 KB/s, linearly;
- `bursty`  (3 queues): 2 KB/s, with a 100 KB/s burst for 20 s out of every 3 minutes;
- `dying`   (1 queue):  40 KB/s falling to nothing by two thirds of the run, then idle;

a consumer group reads `steady` along the way (so the out-metrics move). It then stops the node with SIGTERM (a
graceful stop ships the open spool file) and copies DATA_DIR/tier/telemetry to OUT/telemetry, replacing it. The
objects keep LocalDirectoryStore's footer, as the node left them. Spool files close every 60 s and the shipper runs
every 60 s, so a 15-minute run leaves about 15 objects.
"""

from __future__ import annotations

import argparse
import os
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

from rocket.client import connect, open_consumer
from rocket.model import Message
from rocket.serde import batch as batch_codec

READY = re.compile(rb"rocket ready tcp=[^:]+:(\d+)")
TICK_S = 1.0  # one produce call per queue per tick: its size is the rate
MESSAGE_BYTES = 1_000
TOPICS = {"steady": 2, "rising": 2, "bursty": 3, "dying": 1}


def rate(topic: str, elapsed_s: float, total_s: float, rng: random.Random) -> float:
    """Bytes/s wanted per queue of topic at elapsed_s into the run."""
    if topic == "steady":
        return 20_000 * (1 + 0.1 * rng.uniform(-1, 1))
    if topic == "rising":
        return 2_000 + 58_000 * elapsed_s / total_s
    if topic == "bursty":
        return 100_000 if elapsed_s % 180 < 20 else 2_000
    if topic == "dying":
        return max(0.0, 40_000 * (1 - elapsed_s / (total_s * 2 / 3)))
    raise AssertionError(topic)


async def drive(server: str, total_s: float) -> None:
    rng = random.Random(30)
    async with connect(server) as channel:
        for topic, queues in TOPICS.items():
            await channel.call("CreateTopic", {"topic": topic, "queues": queues})
        start = time.monotonic()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(consume, server, "steady", start + total_s)
            tick = 0
            while (elapsed := time.monotonic() - start) < total_s:
                for topic, queues in TOPICS.items():
                    for queue in range(queues):
                        count = round(rate(topic, elapsed, total_s, rng) * TICK_S / MESSAGE_BYTES)
                        if count:
                            messages = [Message(b"x" * MESSAGE_BYTES) for _ in range(count)]
                            batch = batch_codec.encode(messages, int(time.time() * 1000))
                            await channel.call("Produce", {"topic": topic, "queue": queue, "batch": batch})
                tick += 1
                await trio.sleep(max(0.0, start + tick * TICK_S - time.monotonic()))
                if tick % 60 == 0:
                    print(f"make_sample: {tick // 60} of {total_s / 60:.0f} minutes", file=sys.stderr, flush=True)
            nursery.cancel_scope.cancel()


async def consume(server: str, topic: str, until: float) -> None:
    async with connect(server) as channel, open_consumer(channel, topic, "readers", start="earliest",
                                                         wait_ms=500) as consumer:
        while time.monotonic() < until:
            if await consumer.poll():
                await consumer.commit()
            await trio.sleep(0.5)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=15.0)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "data" / "tier")
    parser.add_argument("--keep", action="store_true", help="keep the temporary data directory")
    args = parser.parse_args()
    data_dir = Path(tempfile.mkdtemp(prefix="rocket-sample-"))
    environment = {**os.environ, "ROCKET_TELEMETRY_INTERVAL_S": "2"}
    log = open(data_dir.parent / f"{data_dir.name}.log", "ab")
    process = subprocess.Popen([sys.executable, "-m", "rocket", "run", "--data-dir", str(data_dir), "--listen",
                                "127.0.0.1:0", "--http2-listen", "off"], stdout=subprocess.PIPE, stderr=log,
                               env=environment)
    try:
        while True:
            line = process.stdout.readline()
            if not line:
                raise SystemExit(f"rocket run exited with {process.wait()}; see {log.name}")
            if match := READY.search(line):
                break
        trio.run(drive, f"127.0.0.1:{int(match.group(1))}", args.minutes * 60)
        time.sleep(3)  # a last sample or two of the idle node
    finally:
        process.send_signal(signal.SIGTERM)
        code = process.wait(timeout=60)
    if code != 0:
        raise SystemExit(f"rocket run stopped with {code}; see {log.name}")
    target = args.out / "telemetry"
    shutil.rmtree(target, ignore_errors=True)
    shutil.copytree(data_dir / "tier" / "telemetry", target)
    files = sorted(path for path in target.rglob("*") if path.is_file())
    size = sum(path.stat().st_size for path in files)
    print(f"make_sample: {len(files)} objects, {size / 1e6:.2f} MB in {target}")
    if not args.keep:
        shutil.rmtree(data_dir)


if __name__ == "__main__":
    main()
