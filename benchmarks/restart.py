"""Restart time of a dev node: from spawning `python -m rocket run` on a data directory that holds data to the first
acknowledged produce. The node is started on free ports as tests/conftest.py's ServerProcess starts it, a topic is
made and some data produced, then --cycles times: kill -9, restart, and time two moments from the spawn: the
`rocket ready` line, and the first produce acknowledged (a client connect() and Producer, retried every 10 ms until
a send is acknowledged); and the CPU seconds the node used until ready, which a busy machine disturbs less than wall
time. Prints each cycle and the p50/p99. With --compare OTHER_TREE (say a `git worktree` of an older commit) a second
node runs from that tree and the two are restarted in turn, so that both see the same machine.

With --wal-sizes it fills the WAL instead: for each size in turn (cumulative, e.g. 10M,200M,1G) it produces until
the WAL bytes a replay reads (from the checkpoint mark, rocket/raft/wal.py's replay-from, to the end) reach the size,
then restarts --cycles-per-size times and reports restart time against the WAL bytes replayed. A checkpoint may
land while filling: the bytes replayed are measured at each kill, not assumed. With --cold the node's files are
evicted from the page cache before each restart, so the replay reads the disk.

    PYTHONPATH=. python benchmarks/restart.py [--cycles 20] [--messages 2000] [--compare OTHER_TREE] [--cold]
    PYTHONPATH=. python benchmarks/restart.py --wal-sizes 10M,200M,1G [--cycles-per-size 3] [--fill-batch-bytes 65536]
        [--fill-message-bytes 1024] [--cold] [--tree TREE]
    [--data-parent /tmp] [--keep-data] [--out benchmarks/results/restart.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import trio

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rocket.client import connect, open_producer  # noqa: E402
from rocket.client.bench import percentile  # noqa: E402
from rocket.errors import RocketError  # noqa: E402
from rocket.model import Message  # noqa: E402
from rocket.serde import batch as batch_codec  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results" / "restart.json"
READY = re.compile(rb"rocket ready tcp=[^:]+:(\d+)")
TOPIC = "restart"
QUEUES = 4
READY_WAIT_S = 120.0  # a replay of gigabytes takes a while
ACK_WAIT_S = 60.0
RETRY_S = 0.01
SIZE_UNITS = {"K": 1024, "M": 1024**2, "G": 1024**3}


class Node:
    """One `rocket run` process on a data directory, restarted on it, its stderr appended to one log."""

    def __init__(self, data_dir: Path, log_path: Path, tree: Path = ROOT):
        self.data_dir = data_dir
        self.log_path = log_path
        self.tree = tree
        self.process: subprocess.Popen | None = None
        self.server = ""

    def start(self) -> tuple[float, float, float]:
        """Spawn the node and wait for its ready line; returns (spawned at, ready at), in time.monotonic(), and the
        CPU seconds the node had used by then (less noisy than the wall time on a shared machine)."""
        command = [sys.executable, "-m", "rocket", "run", "--data-dir", str(self.data_dir), "--listen", "127.0.0.1:0",
                   "--http2-listen", "127.0.0.1:0", "--http-listen", "127.0.0.1:0"]
        environment = {**os.environ, "PYTHONPATH": str(self.tree)}
        with open(self.log_path, "ab") as log:
            spawned = time.monotonic()
            # In the tree: `python -m` puts the working directory first on sys.path, before PYTHONPATH.
            self.process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=log, env=environment, cwd=self.tree)
        deadline = spawned + READY_WAIT_S
        while time.monotonic() < deadline:
            line = self.process.stdout.readline()
            if not line:
                raise RuntimeError(f"rocket run exited with {self.process.wait()}: "
                                   f"{self.log_path.read_text()[-2000:]}")
            found = READY.search(line)
            if found:
                self.server = f"127.0.0.1:{int(found.group(1))}"
                return spawned, time.monotonic(), cpu_seconds(self.process.pid)
        raise RuntimeError(f"rocket run was not ready within {READY_WAIT_S} s")

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait()


async def first_acknowledgement(server: str) -> None:
    """Connect and produce one message, retrying every RETRY_S until it is acknowledged (the groups may still be
    electing or replaying)."""
    deadline = trio.current_time() + ACK_WAIT_S
    while True:
        try:
            async with connect(server) as channel, open_producer(channel, TOPIC, linger_s=0) as producer:
                await producer.send(Message(b"after restart"))
                return
        except (RocketError, OSError):
            if trio.current_time() > deadline:
                raise
            await trio.sleep(RETRY_S)


async def produce(server: str, messages: int) -> None:
    async with connect(server) as channel:
        try:
            await channel.call("CreateTopic", {"topic": TOPIC, "queues": QUEUES})
        except RocketError:
            pass  # made by an earlier run on this directory
        async with open_producer(channel, TOPIC) as producer:
            for number in range(messages):
                await producer.send(Message(f"message {number}".encode() + bytes(200), key=f"k{number % 97}"))


async def fill(server: str, bytes_more: int, batch_bytes: int, message_bytes: int) -> None:
    """Produce about bytes_more in batches of batch_bytes of message_bytes messages, one writer per queue. Small
    batches make many Raft entries, which is what a replay spends its time on."""
    body = os.urandom(message_bytes)
    encoded = batch_codec.encode([Message(body) for _ in range(max(1, batch_bytes // message_bytes))],
                                 1_700_000_000_000)
    batches = max(1, bytes_more // len(encoded))
    async with connect(server) as channel:

        async def writer(queue: int) -> None:
            for _ in range(queue, batches, QUEUES):
                await channel.call("Produce", {"topic": TOPIC, "queue": queue, "batch": encoded})

        async with trio.open_nursery() as nursery:
            for queue in range(QUEUES):
                nursery.start_soon(writer, queue)


def cpu_seconds(pid: int) -> float:
    """User and system CPU seconds of a process so far (Linux: /proc/PID/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def wal_bytes_replayed(data_dir: Path) -> int:
    """The WAL bytes a replay reads: from the checkpoint mark to the end of the last segment."""
    directory = data_dir / "raft"
    mark = directory / "replay-from"
    start = struct.unpack("<Q", mark.read_bytes()[:8])[0] if mark.exists() else 0
    segments = sorted(directory.glob("*.log"))
    total = 0
    for segment in segments:
        segment_start = int(segment.stem)
        end = segment_start + segment.stat().st_size
        if end > start:
            total += end - max(start, segment_start)
    return total


def drop_cached(data_dir: Path) -> None:
    """Evict the data directory's files from the page cache (flushed first), as after a reboot or under memory
    pressure: a replay then reads the disk. Per file (posix_fadvise), so the rest of the machine keeps its cache."""
    for path in data_dir.rglob("*"):
        if path.is_file():
            descriptor = os.open(path, os.O_RDONLY)
            try:
                os.fsync(descriptor)
                os.posix_fadvise(descriptor, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(descriptor)


def restart_once(node: Node, cold: bool = False) -> dict:
    node.kill()
    replayed = wal_bytes_replayed(node.data_dir)
    if cold:
        drop_cached(node.data_dir)
    spawned, ready, cpu = node.start()
    trio.run(first_acknowledgement, node.server)
    acknowledged = time.monotonic()
    return {"wal_bytes": replayed, "ready_s": round(ready - spawned, 3), "first_ack_s": round(acknowledged - spawned, 3),
            "ready_cpu_s": round(cpu, 3)}


def spread(values: list[float]) -> dict:
    return {"p50": round(percentile(values, 50), 3), "p99": round(percentile(values, 99), 3),
            "max": round(max(values), 3), "count": len(values)} if values else {}


def parse_size(text: str) -> int:
    text = text.strip().upper().removesuffix("B")
    return int(float(text[:-1]) * SIZE_UNITS[text[-1]]) if text[-1] in SIZE_UNITS else int(text)


def summary(rows: list[dict]) -> dict:
    return {"cycles": rows, "ready_s": spread([r["ready_s"] for r in rows]),
            "first_ack_s": spread([r["first_ack_s"] for r in rows]), "ready_cpu_s": spread([r["ready_cpu_s"] for r in rows])}


def run_cycles(nodes: dict[str, Node], cycles: int, cold: bool) -> dict:
    """Restart each node cycles times; with several (trees compared), in turn, so that they share the conditions
    of a busy machine."""
    rows: dict[str, list[dict]] = {name: [] for name in nodes}
    for cycle in range(1, cycles + 1):
        for name, node in (nodes.items() if cycle % 2 else reversed(nodes.items())):
            row = restart_once(node, cold)
            rows[name].append(row)
            print(f"{name} cycle {cycle}: ready {row['ready_s']:.3f} s ({row['ready_cpu_s']:.2f} s CPU), first ack "
                  f"{row['first_ack_s']:.3f} s (WAL replayed {row['wal_bytes'] / 2**20:.1f} MiB)", flush=True)
    results = {name: summary(named) for name, named in rows.items()}
    for name, result in results.items():
        ready, acknowledged, cpu = result["ready_s"], result["first_ack_s"], result["ready_cpu_s"]
        print(f"{name} ({nodes[name].tree}): ready p50 {ready['p50']:.3f} s p99 {ready['p99']:.3f} s; first ack p50 "
              f"{acknowledged['p50']:.3f} s p99 {acknowledged['p99']:.3f} s; CPU to ready p50 {cpu['p50']:.2f} s "
              f"p99 {cpu['p99']:.2f} s over {len(rows[name])} restarts", flush=True)
    return results


def run_sizes(node: Node, sizes: list[int], cycles_per_size: int, batch_bytes: int, message_bytes: int,
              cold: bool) -> list[dict]:
    results = []
    for size in sizes:
        while (current := wal_bytes_replayed(node.data_dir)) < size:
            trio.run(fill, node.server, size - current, batch_bytes, message_bytes)
            if wal_bytes_replayed(node.data_dir) <= current:
                break  # a checkpoint moved the mark: the WAL to replay cannot grow to this size
        rows = [restart_once(node, cold) for _ in range(cycles_per_size)]
        row = {"target_bytes": size, "wal_bytes": [r["wal_bytes"] for r in rows],
               "first_ack_s": spread([r["first_ack_s"] for r in rows]), "ready_s": spread([r["ready_s"] for r in rows]),
               "ready_cpu_s": spread([r["ready_cpu_s"] for r in rows])}
        results.append(row)
        print(f"WAL target {size / 2**20:.0f} MiB, replayed {[round(b / 2**20, 1) for b in row['wal_bytes']]} MiB: "
              f"first ack p50 {row['first_ack_s']['p50']:.3f} s max {row['first_ack_s']['max']:.3f} s "
              f"(ready p50 {row['ready_s']['p50']:.3f} s)", flush=True)
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cycles", type=int, default=20)
    parser.add_argument("--messages", type=int, default=2000, help="produced before the first restart")
    parser.add_argument("--wal-sizes", default="", help="e.g. 10M,200M,1G: restart time against WAL size instead")
    parser.add_argument("--cycles-per-size", type=int, default=3)
    parser.add_argument("--fill-batch-bytes", type=int, default=64 * 1024)
    parser.add_argument("--fill-message-bytes", type=int, default=1024)
    parser.add_argument("--cold", action="store_true", help="evict the node's files from the page cache before "
                        "each restart: the replay reads the disk")
    parser.add_argument("--data-parent", type=Path, default=None)
    parser.add_argument("--keep-data", action="store_true")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--tree", type=Path, default=ROOT, help="the rocket tree the node runs from (the client is "
                        "this one's)")
    parser.add_argument("--compare", type=Path, default=None, help="another tree (an older checkout): a second node "
                        "runs from it and the two are restarted in turn, under the same conditions")
    arguments = parser.parse_args(argv)
    run_directory = Path(tempfile.mkdtemp(prefix="rocket-restart-", dir=arguments.data_parent)).resolve()
    nodes = {"this": Node(run_directory / "data", run_directory / "node.log", arguments.tree.resolve())}
    if arguments.compare is not None:
        nodes["compared"] = Node(run_directory / "compared-data", run_directory / "compared-node.log",
                                 arguments.compare.resolve())
    try:
        for node in nodes.values():
            node.start()
            trio.run(produce, node.server, arguments.messages)
        report: dict = {"machine": platform.node(), "python": platform.python_version(),
                        "trees": {name: str(node.tree) for name, node in nodes.items()},
                        "bytecode_written": not sys.flags.dont_write_bytecode,
                        "started": time.strftime("%Y-%m-%dT%H:%M:%S"), "messages": arguments.messages,
                        "cold": arguments.cold}
        if arguments.wal_sizes:
            sizes = [parse_size(size) for size in arguments.wal_sizes.split(",")]
            report["fill"] = {"batch_bytes": arguments.fill_batch_bytes, "message_bytes": arguments.fill_message_bytes}
            report["wal_sizes"] = {name: run_sizes(node, sizes, arguments.cycles_per_size, arguments.fill_batch_bytes,
                                                   arguments.fill_message_bytes, arguments.cold)
                                   for name, node in nodes.items()}
        else:
            report["restarts"] = run_cycles(nodes, arguments.cycles, arguments.cold)
        arguments.out.parent.mkdir(parents=True, exist_ok=True)
        arguments.out.write_text(json.dumps(report, indent=1) + "\n")
        print(f"wrote {arguments.out}")
    finally:
        for node in nodes.values():
            node.kill()
        if arguments.keep_data:
            print(f"data and node logs kept in {run_directory}")
        else:
            shutil.rmtree(run_directory, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
