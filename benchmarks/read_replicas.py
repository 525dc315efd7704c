"""Consume throughput of one hot topic with 0, 1 and 2 read replicas per group, in one run on one cluster:
examples/cluster (three nameservers, three storage nodes, two brokers) and two more storage nodes (ids 14 and 15),
so that each group of the topic has nodes to put read replicas on; all on this machine's cores and one disk.

    python benchmarks/read_replicas.py --rounds 2 --messages 200000 --consumers 4 [--port-base 9700] [--keep]

The topic is filled once (rocket bench produce, 1 KiB messages). Then, per round and per read-replica count (the
order turns each round), `rocket topic update --read-replicas N`, a wait until every group of the topic has them,
caught up, and no replica moves, and `--consumers` concurrent `rocket bench consume --bodies` (each a new consumer
group reading the whole topic from the earliest offset, half through each broker). The figure is their summed
messages per second, and each storage node's CPU seconds over the consume (from /proc): how the reads spread.
Writes benchmarks/results/read-replicas.json (every round and the medians).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CLUSTER = ROOT / "examples" / "cluster" / "cluster.sh"
ROCKET = [sys.executable, "-m", "rocket"]
STORAGE = {"storage1": 11, "storage2": 12, "storage3": 13, "storage4": 14, "storage5": 15}
EXTRA = ("storage4", "storage5")  # started here, beside examples/cluster's nodes
TICKS = os.sysconf("SC_CLK_TCK")


def rocket(*arguments: str, server: str) -> str:
    result = subprocess.run([*ROCKET, *arguments, "--server", server], capture_output=True, text=True, check=False,
                            cwd=ROOT)
    if result.returncode != 0:
        raise SystemExit(f"rocket {' '.join(arguments)} failed: {result.stdout}{result.stderr}")
    return result.stdout


def call(method: str, request: dict, server: str) -> dict:
    """One RPC through rocket's client, in a subprocess (this script stays free of an event loop)."""
    program = ("import json, sys, trio\nfrom rocket.client import connect\n"
               "async def main():\n    async with connect(sys.argv[1]) as channel:\n"
               "        print(json.dumps(await channel.call(sys.argv[2], json.loads(sys.argv[3]))))\n"
               "trio.run(main)\n")
    result = subprocess.run([sys.executable, "-c", program, server, method, json.dumps(request)], capture_output=True,
                            text=True, check=True, cwd=ROOT)
    return json.loads(result.stdout)


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS  # utime, stime


def node_pids(base: Path, extra: dict[str, subprocess.Popen]) -> dict[str, int]:
    pids = {name: int((base / name / "node.pid").read_text()) for name in STORAGE if name not in extra}
    return pids | {name: process.pid for name, process in extra.items()}


def settled(topic: str, readers: int, server: str) -> dict:
    """Wait until every group of the topic has `readers` read replicas within 200 entries of its leader, and no
    replica moves; group -> its leader, voters and readers."""
    groups = set(call("GetRoute", {"topic": topic}, server)["queue_groups"])
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        status = call("ClusterStatus", {}, server)
        mine = [group for group in status["groups"] if group["id"] in groups]
        if status["moving"] == 0 and all(len(group["readers"]) == readers and not any(
                lag["entries"] > 200 for lag in group["lagging"]) for group in mine):
            return {group["id"]: {"leader": group["leader"], "voters": group["voters"], "readers": group["readers"]}
                    for group in mine}
        time.sleep(1)
    raise SystemExit(f"the groups of {topic} did not settle with {readers} read replicas in 120 s")


def consume(topic: str, messages: int, consumers: int, brokers: list[str], scratch: Path,
            pids: dict[str, int]) -> dict:
    before = {name: cpu_seconds(pid) for name, pid in pids.items()}
    started = time.monotonic()
    runs = [subprocess.Popen([*ROCKET, "bench", "consume", "--topic", topic, "--messages", str(messages), "--bodies",
                              "--json", str(scratch / f"consume-{number}.json"), "--disk-dir", str(scratch),
                              "--server", brokers[number % len(brokers)]],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=ROOT)
            for number in range(consumers)]
    for run in runs:
        if run.wait() != 0:
            raise SystemExit("a rocket bench consume failed")
    wall_s = time.monotonic() - started
    results = [json.loads((scratch / f"consume-{number}.json").read_text())["result"] for number in range(consumers)]
    cpu = {name: round(cpu_seconds(pid) - before[name], 2) for name, pid in pids.items()}
    return {"messages_per_s": round(sum(result["messages_per_s"] for result in results)),
            "consumed": sum(result["messages"] for result in results), "wall_s": round(wall_s, 2),
            "storage_cpu_s": cpu}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--size", type=int, default=1024)
    parser.add_argument("--batch-bytes", type=int, default=16 * 1024,
                        help="of the produced batches: a hot topic of many small writers; each read is of whole ones")
    parser.add_argument("--queues", type=int, default=4)
    parser.add_argument("--consumers", type=int, default=4)
    parser.add_argument("--port-base", type=int, default=9700)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    parser.add_argument("--keep", action="store_true", help="leave the cluster's directory behind")
    options = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="rocket-readers-"))
    environment = {**os.environ, "PORT_BASE": str(options.port_base), "ROCKET_BIN": " ".join(ROCKET),
                   "ROCKET_STORAGE_GROUPS": str(options.queues)}
    brokers = [f"127.0.0.1:{options.port_base + 21}", f"127.0.0.1:{options.port_base + 22}"]
    nameserver = f"127.0.0.1:{options.port_base + 1}"
    nameservers = ",".join(f"{node}@127.0.0.1:{options.port_base + node}" for node in (1, 2, 3))
    subprocess.run(["bash", str(CLUSTER), "start", str(base)], env=environment, check=True, capture_output=True)
    extra: dict[str, subprocess.Popen] = {}
    rounds: list[dict] = []
    try:
        for name in EXTRA:
            (base / name).mkdir()
            extra[name] = subprocess.Popen(
                [*ROCKET, "run", "--role", "storage", "--node-id", str(STORAGE[name]), "--listen",
                 f"127.0.0.1:{options.port_base + STORAGE[name]}", "--http2-listen", "off", "--nameservers",
                 nameservers, "--data-dir", str(base / name / "data")],
                stdout=open(base / name / "node.out", "wb"), stderr=open(base / name / "node.log", "wb"), cwd=ROOT,
                env=environment)
        time.sleep(5)
        rocket("topic", "create", "hot", "--queues", str(options.queues), server=brokers[0])
        settled("hot", 0, nameserver)
        rocket("bench", "produce", "--topic", "hot", "--messages", str(options.messages), "--size", str(options.size),
               "--batch-bytes", str(options.batch_bytes), "--disk-dir", str(base), server=brokers[0])
        pids = node_pids(base, extra)
        for number in range(options.rounds):
            order = [0, 1, 2] if number % 2 == 0 else [2, 1, 0]
            entry: dict = {"round": number + 1, "order": order}
            for readers in order:
                rocket("topic", "update", "hot", "--read-replicas", str(readers), server=brokers[0])
                groups = settled("hot", readers, nameserver)
                entry[str(readers)] = {"groups": groups} | consume("hot", options.messages, options.consumers,
                                                                   brokers, base, pids)
            rounds.append(entry)
            print(json.dumps(entry), flush=True)
    finally:
        for process in extra.values():
            process.terminate()
        subprocess.run(["bash", str(CLUSTER), "stop", str(base)], env=environment, check=False, capture_output=True)
        for process in extra.values():
            process.wait(30)
    medians = {readers: statistics.median(entry[readers]["messages_per_s"] for entry in rounds)
               for readers in ("0", "1", "2")}
    summary = {
        "what": f"{options.consumers} concurrent rocket bench consume --bodies (each a new group, the whole topic from "
                f"earliest, half through each broker) of one topic of {options.queues} queues and "
                f"{options.messages:,} messages of {options.size} B in batches of {options.batch_bytes:,} B, with 0, "
                "1 and 2 read replicas per group, on "
                "examples/cluster plus two storage nodes, all on this machine's cores and one disk",
        "rounds": rounds, "median_messages_per_s": medians,
        "ratio_2_to_0": statistics.median(entry["2"]["messages_per_s"] / entry["0"]["messages_per_s"]
                                          for entry in rounds),
        "ratio_1_to_0": statistics.median(entry["1"]["messages_per_s"] / entry["0"]["messages_per_s"]
                                          for entry in rounds),
        "cores": os.cpu_count(),
    }
    options.out.mkdir(parents=True, exist_ok=True)
    (options.out / "read-replicas.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps({key: summary[key] for key in ("median_messages_per_s", "ratio_1_to_0", "ratio_2_to_0")},
                     indent=2))
    if not options.keep:
        subprocess.run(["rm", "-rf", str(base)], check=False)


if __name__ == "__main__":
    main()
