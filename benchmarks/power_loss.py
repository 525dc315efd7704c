"""Power loss under a rocket dev node: its data dir on a lazy slowfs (benchmarks/slowfs.py, as Jepsen's LazyFS),
produced to without pause, then killed with SIGKILL and every write it had not fsynced dropped, restarted, cycle
after cycle. At the end every acknowledged message must be there once, at the offset it was acknowledged at, in
send order per queue. tests/integration/test_power_loss.py runs a few cycles of this; this script runs many:

    python benchmarks/power_loss.py --cycles 30 [--direct-io] [--queues 4] [--seed S] [--work DIR]

One line per cycle (acknowledged so far, what the crash dropped), then the totals, as JSON on the last line.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path

import trio

from rocket.client import connect, open_consumer
from rocket.errors import Code, RocketError
from rocket.model import Message
from rocket.serde import batch as batch_codec

sys.path.insert(0, str(Path(__file__).resolve().parent))

import faults  # noqa: E402

TOPIC = "power"
BATCH_MESSAGES = 20  # messages per Produce call: each call is one batch, one Raft entry
READY = re.compile(rb"rocket ready tcp=[^:]+:(\d+)")
START_TIMEOUT_S = 60.0
CONSUME_WAIT_MS = 300


@dataclass
class Tally:
    """What the final read found against what producers were told."""
    cycles: int = 0
    acknowledged: int = 0
    lost: int = 0  # acknowledged, and not read back at all
    misplaced: int = 0  # acknowledged at one offset, read at another
    duplicated: int = 0  # read more than once
    reordered: int = 0  # read after a message sent later on the same queue
    unacknowledged_kept: int = 0  # sent, answer never seen (the kill), and there after all: allowed
    crashes: list[dict] = field(default_factory=list)  # what each crash dropped

    @property
    def ok(self) -> bool:
        return self.lost == self.misplaced == self.duplicated == self.reordered == 0


class Node:
    """`python -m rocket run` on a data dir, on a free port; killed with SIGKILL only."""

    def __init__(self, data_dir: Path, log: Path, direct_io: bool):
        self.data_dir, self.log, self.direct_io = data_dir, log, direct_io
        self.process: subprocess.Popen | None = None
        self.server = ""

    def start(self) -> None:
        command = [sys.executable, "-m", "rocket", "run", "--data-dir", str(self.data_dir), "--listen",
                   "127.0.0.1:0", "--http2-listen", "off"]
        environment = {**os.environ, "ROCKET_WAL_DIRECT_IO": str(self.direct_io).lower()}
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=log, env=environment)
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            line = self.process.stdout.readline()
            if not line:
                raise RuntimeError(f"rocket run exited with {self.process.wait()}: "
                                   f"{self.log.read_text(errors='replace')[-3000:]}")
            if match := READY.search(line):
                self.server = f"127.0.0.1:{match.group(1).decode()}"
                return
        self.kill()
        raise RuntimeError(f"rocket run did not become ready within {START_TIMEOUT_S} s")

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        if self.process is not None:
            self.process.stdout.close()


@contextmanager
def lazy_disk(work: Path) -> Iterator[Path]:
    """A lazy slowfs mounted on work/mount over work/backing; yields its control file; unmounted after."""
    backing, mountpoint, control = work / "backing", work / "mount", work / "slowfs.json"
    backing.mkdir(parents=True)
    mountpoint.mkdir()
    faults.write_control(control, {"factor": 1, "lazy": True})
    process = faults.start_slowfs(backing, mountpoint, control, work / "slowfs.log")
    try:
        yield control
    finally:
        faults.stop_process(process.pid)
        process.wait(faults.STOP_WAIT_S)
        faults.unmount(mountpoint)


def make_message(queue: int, number: int) -> Message:
    return Message(f"q{queue}-n{number}-".encode() * 4, properties={"queue": str(queue), "number": str(number)})


async def produce_until_killed(node: Node, queues: int, sent: list[int], acknowledged: dict[tuple[int, int], int],
                               kill_after_s: float) -> None:
    """One sequential stream of batches per queue (so send order is queue order); kill the node after
    kill_after_s. sent[queue] is the next number to send; acknowledged maps (queue, number) to its offset."""
    async with connect(node.server) as channel:

        async def one_queue(queue: int) -> None:
            while True:
                numbers = range(sent[queue], sent[queue] + BATCH_MESSAGES)
                encoded = batch_codec.encode([make_message(queue, number) for number in numbers], 1_700_000_000_000)
                sent[queue] = numbers.stop  # never sent again, whatever the answer
                try:
                    reply = await channel.call("Produce", {"topic": TOPIC, "queue": queue, "batch": encoded})
                except RocketError:
                    return  # the node died with this batch in flight: never acknowledged
                for index, number in enumerate(numbers):
                    acknowledged[(queue, number)] = reply["base_offset"] + index

        async with trio.open_nursery() as nursery:
            for queue in range(queues):
                nursery.start_soon(one_queue, queue)
            await trio.sleep(kill_after_s)
            node.kill()  # at a moment the producers do not choose: batches are in flight
            nursery.cancel_scope.cancel()


async def create_topic(server: str, queues: int) -> None:
    async with connect(server) as channel:
        await channel.call("CreateTopic", {"topic": TOPIC, "queues": queues})


async def read_everything(server: str, group: str) -> list[Message]:
    """Every message of the topic; none if the topic itself was lost (its creation not made durable)."""
    try:
        async with connect(server) as channel, open_consumer(channel, TOPIC, group, start="earliest",
                                                             wait_ms=CONSUME_WAIT_MS) as consumer:
            received: list[Message] = []
            while messages := await consumer.poll():
                received.extend(messages)
            return received
    except RocketError as error:
        if error.code != Code.UNKNOWN_TOPIC:
            raise
        return []


def check(received: list[Message], acknowledged: dict[tuple[int, int], int], tally: Tally) -> None:
    seen: dict[tuple[int, int], list[int]] = {}
    last_number: dict[int, int] = {}
    for message in sorted(received, key=lambda each: (each.queue, each.offset)):
        queue, number = int(message.properties["queue"]), int(message.properties["number"])
        assert message.queue == queue and message.body == make_message(queue, number).body, "a damaged message"
        seen.setdefault((queue, number), []).append(message.offset)
        if number <= last_number.get(queue, -1):
            tally.reordered += 1
        last_number[queue] = max(number, last_number.get(queue, -1))
    tally.acknowledged = len(acknowledged)
    tally.duplicated = sum(len(offsets) - 1 for offsets in seen.values())
    for key, offset in acknowledged.items():
        if key not in seen:
            tally.lost += 1
        elif seen[key][0] != offset:
            tally.misplaced += 1
    tally.unacknowledged_kept = sum(1 for key in seen if key not in acknowledged)


def run(work: Path, cycles: int, queues: int = 4, direct_io: bool = False, seed: int | None = None,
        kill_after_s: tuple[float, float] = (0.3, 1.5), report=print) -> Tally:
    """cycles x (start the node, produce, kill it and crash its disk at a random moment), then read back."""
    seed = random.randrange(1 << 32) if seed is None else seed
    chooser = random.Random(seed)
    report(f"power loss: {cycles} cycles, {queues} queues, WAL {'O_DIRECT' if direct_io else 'page cache'}, "
           f"seed {seed}, work {work}")
    tally = Tally()
    sent = [0] * queues
    acknowledged: dict[tuple[int, int], int] = {}
    with lazy_disk(work) as control:
        node = Node(work / "mount" / "data", work / "node.log", direct_io)
        try:
            for cycle in range(cycles):
                node.start()
                if cycle == 0:
                    trio.run(create_topic, node.server, queues)
                delay_s = chooser.uniform(*kill_after_s)
                trio.run(produce_until_killed, node, queues, sent, acknowledged, delay_s)
                dropped = faults.crash_slowfs(control)
                tally.crashes.append(dropped)
                tally.cycles += 1
                report(f"cycle {cycle + 1}: killed after {delay_s:.2f} s, {len(acknowledged)} acknowledged so far, "
                       f"sent {sum(sent)}; the crash dropped {dropped['bytes_dropped']} bytes in "
                       f"{dropped['files_reverted']} files and removed {dropped['files_removed']} files")
            node.start()
            check(trio.run(read_everything, node.server, "power-loss-check"), acknowledged, tally)
        finally:
            node.kill()
    report(f"acknowledged {tally.acknowledged}, lost {tally.lost}, misplaced {tally.misplaced}, duplicated "
           f"{tally.duplicated}, reordered {tally.reordered}; sent but unacknowledged and kept "
           f"{tally.unacknowledged_kept}")
    return tally


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cycles", type=int, default=30)
    parser.add_argument("--queues", type=int, default=4)
    parser.add_argument("--direct-io", action="store_true", help="the WAL with O_DIRECT (ROCKET_WAL_DIRECT_IO)")
    parser.add_argument("--seed", type=int)
    parser.add_argument("--work", type=Path, help="an empty directory to mount in (default: a temporary one)")
    args = parser.parse_args(argv)
    if args.work is None:
        with tempfile.TemporaryDirectory(prefix="power-loss-") as work:
            tally = run(Path(work), args.cycles, args.queues, args.direct_io, args.seed)
    else:
        tally = run(args.work, args.cycles, args.queues, args.direct_io, args.seed)
    print(json.dumps({key: value for key, value in asdict(tally).items() if key != "crashes"}
                     | {"bytes_dropped": sum(each["bytes_dropped"] for each in tally.crashes)}))
    return 0 if tally.ok else 1


if __name__ == "__main__":
    sys.exit(main())
