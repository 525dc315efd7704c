"""KV capacity (issue 29): N keys with 100-byte values in one bucket of a dev-mode `rocket run`; the node's RSS sampled
throughout; a range scan that pages through every key; `rocket kv export` and `rocket kv import` of the bucket, each
in its own process, with their peak RSS. Writes benchmarks/results/kv_capacity.json.

    python benchmarks/kv_capacity.py [--keys 10000000] [--shards 4] [--writers 8]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import trio

from rocket.client import connect
from rocket.client.kv import KV
from rocket.model import shard_of

ROOT = Path(__file__).resolve().parents[1]
READY = re.compile(rb"rocket ready tcp=[^:]+:(\d+)")
VALUE = bytes(100)
PUTS_PER_TXN = 128


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def anonymous_bytes(pid: int) -> int:
    """The process's own memory: RSS without the pages of files it maps (LevelDB maps its table files; those pages
    are page cache, which the kernel takes back under pressure)."""
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        if line.startswith("Anonymous:"):
            return int(line.split()[1]) * 1024
    return 0


class PeakRss:
    """Samples a process's RSS (and its anonymous part) every 0.2 s in a thread; peak holds the largest seen."""

    def __init__(self, pid: int):
        self.pid, self.peak, self.anonymous_peak, self._stop = pid, 0, 0, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.2):
            try:
                self.peak = max(self.peak, rss_bytes(self.pid))
                self.anonymous_peak = max(self.anonymous_peak, anonymous_bytes(self.pid))
            except OSError:
                return

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        return self.peak


def limit_memory(pid: int, limit_mib: int) -> Path | None:
    """Put a process in a memory cgroup (v1) of limit_mib: page cache counts against it and is reclaimed within it,
    so the process runs only if its own memory fits. None when this machine offers no such cgroup."""
    root = Path("/sys/fs/cgroup/memory")
    if not (root / "memory.limit_in_bytes").exists():
        return None
    group = root / f"rocket-kv-capacity-{pid}"
    group.mkdir(exist_ok=True)
    (group / "memory.limit_in_bytes").write_text(str(limit_mib * 2**20))
    (group / "cgroup.procs").write_text(str(pid))
    return group


async def load(server: str, keys: int, shards: int, writers: int) -> float:
    """Put keys k000000000.. with 100-byte values, PUTS_PER_TXN per transaction (each on one shard)."""
    started = time.monotonic()
    async with connect(server) as channel:
        kv = KV(channel)
        await kv.create_bucket("cap", shards=shards)
        per_writer = -(-keys // writers)

        async def writer(number: int) -> None:
            pending: dict[int, list[dict]] = {}
            for index in range(number * per_writer, min(keys, (number + 1) * per_writer)):
                key = f"k{index:09}"
                ops = pending.setdefault(shard_of(key, shards), [])
                ops.append({"op": "put", "key": key, "value": VALUE})
                if len(ops) == PUTS_PER_TXN:
                    await kv.txn("cap", [], ops)
                    ops.clear()
            for ops in pending.values():
                if ops:
                    await kv.txn("cap", [], ops)

        async with trio.open_nursery() as nursery:
            for number in range(writers):
                nursery.start_soon(writer, number)
    return time.monotonic() - started


async def scan(server: str) -> tuple[int, float]:
    started = time.monotonic()
    async with connect(server) as channel:
        count = 0
        async for _ in KV(channel).range("cap", page=10_000):
            count += 1
    return count, time.monotonic() - started


def cli(*args: str, server: str) -> tuple[float, int]:
    """Run a rocket command; (seconds, its peak RSS in bytes)."""
    started = time.monotonic()
    process = subprocess.Popen([sys.executable, "-m", "rocket", *args, "--server", server], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE)
    peak = PeakRss(process.pid)
    out, err = process.communicate()
    if process.returncode:
        raise RuntimeError(f"rocket {' '.join(args)} failed: {err.decode()[-2000:]}")
    return time.monotonic() - started, peak.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=10_000_000)
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--writers", type=int, default=8)
    parser.add_argument("--memory-limit-mib", type=int, default=0,
                        help="run the node in a memory cgroup of this size (its page cache counts too)")
    arguments = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="kv-capacity-") as directory:
        data = Path(directory)
        node = subprocess.Popen([sys.executable, "-m", "rocket", "run", "--data-dir", str(data / "data"), "--listen",
                                 "127.0.0.1:0", "--http2-listen", "off"], stdout=subprocess.PIPE,
                                stderr=open(data / "node.log", "wb"))
        cgroup = None
        try:
            match = None
            while match is None:
                line = node.stdout.readline()
                if not line:
                    raise RuntimeError((data / "node.log").read_text()[-2000:])
                match = READY.search(line)
            server = f"127.0.0.1:{int(match.group(1))}"
            cgroup = limit_memory(node.pid, arguments.memory_limit_mib) if arguments.memory_limit_mib else None
            peak = PeakRss(node.pid)
            load_s = trio.run(load, server, arguments.keys, arguments.shards, arguments.writers)
            after_load = rss_bytes(node.pid)
            scanned, scan_s = trio.run(scan, server)
            export = data / "cap.rkv"
            export_s, export_rss = cli("kv", "export", "cap", "--out", str(export), server=server)
            import_s, import_rss = cli("kv", "import", "copy", "--in", str(export), server=server)
            node_peak = peak.stop()
            disk = sum(path.stat().st_size for path in (data / "data").rglob("*") if path.is_file())
            result = {
                "keys": arguments.keys, "value_bytes": len(VALUE), "shards": arguments.shards,
                "load_s": round(load_s, 1), "puts_per_s": round(arguments.keys / load_s),
                "node_rss_after_load_mib": round(after_load / 2**20), "node_rss_peak_mib": round(node_peak / 2**20),
                "node_anonymous_peak_mib": round(peak.anonymous_peak / 2**20),
                "memory_limit_mib": arguments.memory_limit_mib if cgroup else None,
                "cgroup_peak_mib": round(int((cgroup / "memory.max_usage_in_bytes").read_text()) / 2**20)
                if cgroup else None,
                "scanned": scanned, "scan_s": round(scan_s, 1),
                "export_s": round(export_s, 1), "export_bytes": export.stat().st_size,
                "export_rss_peak_mib": round(export_rss / 2**20),
                "import_s": round(import_s, 1), "import_rss_peak_mib": round(import_rss / 2**20),
                "data_dir_bytes": disk, "client_rss_peak_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
                "cpus": os.cpu_count(),
            }
        finally:
            node.terminate()
            node.wait(60)
            if cgroup is not None:
                cgroup.rmdir()
    print(json.dumps(result, indent=2))
    out = ROOT / "benchmarks" / "results" / "kv_capacity.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    assert scanned == arguments.keys, f"the scan saw {scanned} keys of {arguments.keys}"


if __name__ == "__main__":
    main()
