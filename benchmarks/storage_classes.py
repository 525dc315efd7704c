"""Produce through a two-replica controller-mode class (RIP-44) against the default three-replica Raft class, in one
run on one cluster: examples/cluster (three nameservers, three storage nodes, two brokers, all on this machine's one
disk), a topic on each class, and `rocket bench produce` against each in turn, alternating, so that both see the
same disk and the same noise.

    python benchmarks/storage_classes.py --rounds 3 --messages 100000 --size 1024 [--port-base 9700] [--keep]

Each round runs the controller class first on odd rounds and the Raft class first on even ones. Writes
benchmarks/results/storage-classes.json (every round and the medians) and prints the median of the rounds' ratios: the
controller class stores two copies of every byte where Raft stores three, and waits for every replica in sync where
Raft waits for a majority (two of three).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CLUSTER = ROOT / "examples" / "cluster" / "cluster.sh"
ROCKET = [sys.executable, "-m", "rocket"]


def rocket(*arguments: str, server: str) -> str:
    result = subprocess.run([*ROCKET, *arguments, "--server", server], capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise SystemExit(f"rocket {' '.join(arguments)} failed: {result.stdout}{result.stderr}")
    return result.stdout


def bench(topic: str, server: str, messages: int, size: int, scratch: Path) -> dict:
    out = scratch / f"{topic}.json"
    rocket("bench", "produce", "--topic", topic, "--messages", str(messages), "--size", str(size), "--json", str(out),
           "--disk-dir", str(scratch), server=server)
    return json.loads(out.read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--size", type=int, default=1024)
    parser.add_argument("--groups", type=int, default=8, help="storage groups of each class")
    parser.add_argument("--port-base", type=int, default=9700)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    parser.add_argument("--keep", action="store_true", help="leave the cluster's directory behind")
    options = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="rocket-classes-"))
    environment = {**os.environ, "PORT_BASE": str(options.port_base), "ROCKET_BIN": " ".join(ROCKET),
                   "ROCKET_STORAGE_GROUPS": str(options.groups)}
    server = f"127.0.0.1:{options.port_base + 21}"
    subprocess.run(["bash", str(CLUSTER), "start", str(base)], env=environment, check=True, capture_output=True)
    rounds: list[dict] = []
    try:
        rocket("cluster", "storage-class", "create", "pair", "--mode", "controller", "--replicas", "2", "--groups",
               str(options.groups), server=server)
        rocket("topic", "create", "on-pair", "--queues", str(options.groups), "--storage-class", "pair", server=server)
        rocket("topic", "create", "on-raft", "--queues", str(options.groups), server=server)
        for number in range(options.rounds):
            order = ["on-pair", "on-raft"] if number % 2 == 0 else ["on-raft", "on-pair"]
            results = {topic: bench(topic, server, options.messages, options.size, base) for topic in order}
            rounds.append({"round": number + 1, "order": order, **{
                topic: {"mb_per_s": result["result"]["mb_per_s"],
                        "messages_per_s": result["result"]["messages_per_s"],
                        "latency_ms_p50": result["result"]["latency_ms_p50"],
                        "latency_ms_p99": result["result"]["latency_ms_p99"],
                        "raw_disk_mb_per_s": result["raw_disk_mb_per_s"]} for topic, result in results.items()}})
            print(json.dumps(rounds[-1]), flush=True)
    finally:
        subprocess.run(["bash", str(CLUSTER), "stop", str(base)], env=environment, check=False, capture_output=True)
    medians = {topic: {metric: statistics.median(entry[topic][metric] for entry in rounds)
                       for metric in ("mb_per_s", "messages_per_s", "latency_ms_p50", "latency_ms_p99",
                                      "raw_disk_mb_per_s")} for topic in ("on-pair", "on-raft")}
    summary = {
        "what": "rocket bench produce (1 MiB batches, 16 in flight) through broker1 of examples/cluster, to a topic "
                "on a two-replica controller-mode class (on-pair) and one on the default three-replica Raft class "
                "(on-raft), alternating, on one machine and one disk",
        "messages": options.messages, "size": options.size, "groups": options.groups, "rounds": rounds,
        "medians": medians,
        # The disk's speed swings by 3x within a run (its raw probe, per bench): the ratios are taken within each
        # round, whose two runs follow each other, and their median is the figure.
        "throughput_ratio_controller_to_raft": statistics.median(
            entry["on-pair"]["mb_per_s"] / entry["on-raft"]["mb_per_s"] for entry in rounds),
        "p99_ratio_controller_to_raft": statistics.median(
            entry["on-pair"]["latency_ms_p99"] / entry["on-raft"]["latency_ms_p99"] for entry in rounds),
    }
    options.out.mkdir(parents=True, exist_ok=True)
    (options.out / "storage-classes.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps({key: summary[key] for key in ("medians", "throughput_ratio_controller_to_raft",
                                                    "p99_ratio_controller_to_raft")}, indent=2))
    if not options.keep:
        subprocess.run(["rm", "-rf", str(base)], check=False)


if __name__ == "__main__":
    main()
