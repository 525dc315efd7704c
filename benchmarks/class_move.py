"""A topic moved between storage classes, back and forth, under load: tests/integration/test_class_move.py's
processes (three nameservers, four storage nodes, a broker; topic "orders" in the Raft class on nodes 11-12, class
"pair" in controller mode on nodes 13-14), one writer per queue producing through the broker all along, and --moves
times `rocket topic update orders --storage-class` to the other class. Each move is measured: from the CLI call to
the switch, the longest a produce sent meanwhile waited (the stall) and, beside it, the longest one sent in as long a
time just before the move, and how long the old groups were sealed before the switch (the nameserver leader's log).
At the end every acknowledged message is consumed and checked (tests/integration/test_cluster.py's
verify_acknowledged). Writes benchmarks/results/class-move.json.

    PYTHONPATH=. python benchmarks/class_move.py [--moves 10] [--data-parent /tmp] [--keep-data]
        [--out benchmarks/results/class-move.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path

import trio

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the tests' cluster harness, whatever the current directory

from rocket.client.bench import percentile  # noqa: E402
from tests.integration.controller_cluster import (  # noqa: E402
    BROKER, QUEUES, STORAGE_CLASS, ControllerCluster, stop_writers, totals)
from tests.integration.test_class_move import move, start_apart  # noqa: E402
from tests.integration.test_cluster import Writers, verify_acknowledged  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results" / "class-move.json"
WARMUP_S = 3.0


def spread(values: list[float]) -> dict:
    return {"p50": round(percentile(values, 50), 3), "p99": round(percentile(values, 99), 3),
            "max": round(max(values), 3), "count": len(values)}


async def run(moves: int, base: Path) -> dict:
    cluster = ControllerCluster(base, storage=(11, 12, 13, 14))
    started = time.monotonic()
    try:
        await start_apart(cluster)
        writers = Writers({BROKER: cluster.broker.server})
        figures = []
        async with trio.open_nursery() as writing:
            for queue in range(QUEUES):
                writing.start_soon(writers.write, queue, 0)
            await trio.sleep(WARMUP_S)
            for number in range(moves):
                moved = await move(cluster, writers, STORAGE_CLASS if number % 2 == 0 else "raft")
                print(f"move {number + 1}: {moved}", flush=True)
                figures.append(moved)
            await stop_writers(writers, list(range(QUEUES)))
        assert not cluster.died(), cluster.died()
        result = await verify_acknowledged(writers, cluster.broker.server, base)
    finally:
        cluster.kill()
    print(totals(result, writers, started), flush=True)
    return {"moves": moves, "queues": QUEUES, "switched_s": spread([moved.switched_s for moved in figures]),
            "stall_s": spread([moved.stall_s for moved in figures]),
            "before_s": spread([moved.before_s for moved in figures]),
            "sealed_s": spread([moved.sealed_s for moved in figures]),
            "acknowledged": result["acknowledged"], "duplicates": result["duplicates"],
            "writer_errors": dict(writers.errors)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--moves", type=int, default=10)
    parser.add_argument("--data-parent", default=None)
    parser.add_argument("--keep-data", action="store_true")
    parser.add_argument("--out", default=str(RESULTS))
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="class-move-", dir=args.data_parent))
    report = trio.run(run, args.moves, base)
    report.update({"when": time.strftime("%Y-%m-%d %H:%M:%S"), "machine": platform.platform(),
                   "cpus": os.cpu_count()})
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps({key: report[key] for key in ("switched_s", "stall_s", "before_s", "sealed_s")}), flush=True)
    if args.keep_data:
        print(f"node logs in {base}")
    else:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
