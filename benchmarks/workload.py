"""A workload with the shape placement has to learn (issue 30): topics of heavy-tailed sizes (Zipf), daily and weekly
cycles, bursts, and topics that grow, die, or are born mid-run, produced against a running cluster for a while, so
that its telemetry holds something to forecast.

    python benchmarks/workload.py --server 127.0.0.1:9121 [--minutes 30] [--day-s 600] [--topics 12]
        [--peak-messages-s 3000] [--size 512] [--seed 1] [--out benchmarks/results/workload.json]

Time is compressed: a "day" lasts --day-s seconds (10 minutes by default), and a week seven of them, so a run of an
hour holds six days of cycles. Each topic's rate at time t is

    peak * share(topic) * daily(t + phase) * weekly(t) * burst(t) * life(t)

where share follows Zipf (exponent --zipf), daily swings between 20% and 100% on a sine, weekend days run at half, a
burst multiplies by 5 for --day-s/20 seconds (on average twice a day per topic), and a topic's life is steady,
growing (to 3x over the run), dying (to nothing at half the run) or born (from nothing at a third of the run).
Messages go in batches every 100 ms, keys random over the topic's queues. The --out file records, per topic, its
kind, share and the intended rate each second: the ground truth the forecaster's error can be measured against.
Not part of CI.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import time
from pathlib import Path

import trio

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from rocket.client import Admin, connect, open_producer  # noqa: E402
from rocket.errors import Code, RocketError  # noqa: E402
from rocket.model import Message  # noqa: E402

KINDS = ("steady", "growing", "dying", "born")
TICK_S = 0.1
BURST_FACTOR = 5.0


class Topic:
    def __init__(self, name: str, share: float, kind: str, chooser: random.Random, day_s: float, run_s: float):
        self.name, self.share, self.kind = name, share, kind
        self.phase = chooser.random() * 2 * math.pi
        self.day_s, self.run_s = day_s, run_s
        burst_s = day_s / 20
        self.bursts = sorted(chooser.uniform(0, run_s) for _ in range(int(2 * run_s / day_s) + 1))
        self.burst_s = burst_s
        self.sent = 0

    def rate(self, peak: float, t: float) -> float:
        day = t / self.day_s
        daily = 0.2 + 0.8 * (1 + math.sin(2 * math.pi * day + self.phase)) / 2
        weekly = 0.5 if int(day) % 7 >= 5 else 1.0
        burst = BURST_FACTOR if any(start <= t < start + self.burst_s for start in self.bursts) else 1.0
        progress = t / self.run_s
        life = {"steady": 1.0, "growing": 1.0 + 2.0 * progress, "dying": max(0.0, 1.0 - 2.0 * progress),
                "born": 0.0 if progress < 1 / 3 else 1.0}[self.kind]
        return peak * self.share * daily * weekly * burst * life


def make_topics(count: int, zipf: float, seed: int, day_s: float, run_s: float) -> list[Topic]:
    chooser = random.Random(seed)
    weights = [1 / (rank + 1) ** zipf for rank in range(count)]
    total = sum(weights)
    # Every other rank is steady; the others grow, die or are born in turn, so each life has big and small topics.
    kinds = ["steady" if index % 2 == 0 else KINDS[1 + (index // 2) % 3] for index in range(count)]
    return [Topic(f"load-{index:03d}", weight / total, kinds[index], chooser, day_s, run_s)
            for index, weight in enumerate(weights)]


async def produce(server: str, topic: Topic, peak: float, started: float, run_s: float, size: int,
                  schedule: list[float]) -> None:
    body = b"x" * size
    chooser = random.Random(topic.name)
    carried = 0.0
    async with connect(server) as channel, open_producer(channel, topic.name) as producer:
        next_tick = started
        while (now := trio.current_time()) < started + run_s:
            t = now - started
            rate = topic.rate(peak, t)
            if int(t) >= len(schedule):
                schedule.append(round(rate, 2))
            carried += rate * TICK_S
            count, carried = int(carried), carried - int(carried)
            if count:
                await producer.send_many([Message(body, key=f"k{chooser.randrange(1 << 30)}") for _ in range(count)])
                topic.sent += count
            next_tick += TICK_S
            await trio.sleep_until(max(next_tick, trio.current_time()))


async def main(arguments) -> None:
    run_s = arguments.minutes * 60
    topics = make_topics(arguments.topics, arguments.zipf, arguments.seed, arguments.day_s, run_s)
    async with connect(arguments.server) as channel:
        admin = Admin(channel)
        for topic in topics:
            try:
                await admin.create_topic(topic.name, arguments.queues)
            except RocketError as error:
                if error.code != Code.TOPIC_EXISTS:
                    raise
    schedules: dict[str, list[float]] = {topic.name: [] for topic in topics}
    started = trio.current_time()
    wall_started = time.time()

    async def report() -> None:
        while True:
            await trio.sleep(60)
            print(f"{(trio.current_time() - started) / 60:5.1f} min: {sum(t.sent for t in topics):,} messages sent",
                  flush=True)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(report)
        async with trio.open_nursery() as producers:
            for topic in topics:
                producers.start_soon(produce, arguments.server, topic, arguments.peak_messages_s, started, run_s,
                                     arguments.size, schedules[topic.name])
        nursery.cancel_scope.cancel()
    result = {"started_s": wall_started, "day_s": arguments.day_s, "minutes": arguments.minutes,
              "size": arguments.size, "peak_messages_s": arguments.peak_messages_s,
              "topics": [{"name": topic.name, "kind": topic.kind, "share": topic.share, "sent": topic.sent,
                          "messages_per_s_each_second": schedules[topic.name]} for topic in topics]}
    if arguments.out:
        Path(arguments.out).write_text(json.dumps(result))
    print(f"workload: {sum(topic.sent for topic in topics):,} messages to {len(topics)} topics in "
          f"{arguments.minutes} min", flush=True)


def parse_arguments(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--server", default="127.0.0.1:9876")
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--day-s", type=float, default=600.0, help="seconds of a compressed day")
    parser.add_argument("--topics", type=int, default=12)
    parser.add_argument("--queues", type=int, default=4, help="queues per topic")
    parser.add_argument("--zipf", type=float, default=1.1)
    parser.add_argument("--peak-messages-s", type=float, default=3000.0, help="all topics at their daily peak")
    parser.add_argument("--size", type=int, default=512, help="bytes per message")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", default="")
    return parser.parse_args(argv)


if __name__ == "__main__":
    trio.run(main, parse_arguments())
