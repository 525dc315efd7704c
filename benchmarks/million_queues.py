"""A million queues on a three-node cluster: three all-role `rocket run` processes on 127.0.0.1, then
1,000 topics of 1,000 queues each (queues hash onto the cluster's storage groups, so a queue costs
metadata, not a Raft group).

    python benchmarks/million_queues.py [--topics 1000] [--queues 1000] [--storage-groups 100]

Reports the time to create them all, each node's resident memory before and after, the latency of
route queries (GetRoute asked of a nameserver that is not the leader, and of the leader), and the CPU
each node uses while idle afterwards. Writes benchmarks/results/million-queues.json.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import trio

from rocket.client import connect
from rocket.client.bench import percentile
from rocket.transport.listen import free_ports

RESULTS = Path(__file__).parent / "results"
READY = re.compile(rb"rocket ready tcp=[^:]+:(\d+)")


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def measure(servers: list[str], pids: list[int], arguments) -> dict:
    result: dict = {"rss_mib_before": [round(rss_mib(pid), 1) for pid in pids]}
    started = time.perf_counter()
    async with connect(servers[0]) as channel:
        async def create(first: int) -> None:
            for topic in range(first, arguments.topics, 8):
                await channel.call("CreateTopic", {"topic": f"t{topic:05d}", "queues": arguments.queues})

        async with trio.open_nursery() as nursery:
            for first in range(8):  # eight creations in flight
                nursery.start_soon(create, first)
        result["create_s"] = round(time.perf_counter() - started, 2)
        result["queues"] = arguments.topics * arguments.queues
        status = await channel.call("ClusterStatus", {})
    leader = status["nameserver_leader"]
    result["nameserver_leader"] = leader
    result["rss_mib_after"] = [round(rss_mib(pid), 1) for pid in pids]
    follower = next(server for node, server in zip((1, 2, 3), servers) if node != leader)
    for name, server in (("follower", follower), ("leader", servers[leader - 1])):
        latencies = []
        async with connect(server) as channel:
            for _ in range(arguments.route_queries):
                topic = f"t{random.randrange(arguments.topics):05d}"
                sent = time.perf_counter()
                await channel.call("GetRoute", {"topic": topic})
                latencies.append(time.perf_counter() - sent)
        result[f"route_ms_p50_{name}"] = round(percentile(latencies, 50) * 1000, 2)
        result[f"route_ms_p99_{name}"] = round(percentile(latencies, 99) * 1000, 2)
    await trio.sleep(5)  # let the groups quiesce
    before = [cpu_s(pid) for pid in pids]
    await trio.sleep(arguments.idle_seconds)
    result["idle_cpu_percent"] = [round((cpu_s(pid) - cpu) / arguments.idle_seconds * 100, 1)
                                  for pid, cpu in zip(pids, before)]
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--topics", type=int, default=1000)
    parser.add_argument("--queues", type=int, default=1000)
    parser.add_argument("--storage-groups", type=int, default=100)
    parser.add_argument("--route-queries", type=int, default=2000)
    parser.add_argument("--idle-seconds", type=float, default=10)
    arguments = parser.parse_args()
    directory = Path(tempfile.mkdtemp(prefix="rocket-million-"))
    ports = free_ports(3)
    members = ",".join(f"{node}@127.0.0.1:{port}" for node, port in zip((1, 2, 3), ports))
    environment = {**os.environ, "ROCKET_STORAGE_GROUPS": str(arguments.storage_groups)}
    processes = [subprocess.Popen(
        [sys.executable, "-m", "rocket", "run", "--node-id", str(node), "--nameservers", members, "--listen",
         f"127.0.0.1:{port}", "--http2-listen", "off", "--data-dir", str(directory / f"node{node}"),
         "--log-level", "warning"], stdout=subprocess.PIPE, env=environment)
        for node, port in zip((1, 2, 3), ports)]
    try:
        for process in processes:
            if not READY.search(process.stdout.readline()):
                raise SystemExit("a node did not start")
        servers = [f"127.0.0.1:{port}" for port in ports]
        result = trio.run(measure, servers, [process.pid for process in processes], arguments)
    finally:
        for process in processes:
            process.terminate()
        for process in processes:
            process.wait(30)
        shutil.rmtree(directory, ignore_errors=True)
    result["settings"] = vars(arguments)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "million-queues.json").write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
