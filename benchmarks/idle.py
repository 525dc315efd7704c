"""What an idle cluster costs: three all-role `rocket run` processes on this machine, a topic written once and then
left alone, and the CPU (user and system) the three use together over --seconds, in cores.

    python benchmarks/idle.py --seconds 30 [--nodes 3] [--topics 4] [--profile DIR]

Issue 50's goal: an idle three-node cluster uses at most 0.02 cores. The nodes settle first (their heaps touched,
their groups quiesced: limits.raft_quiesce_ticks); the figure is then the periodic work alone. --profile records
each node with py-spy meanwhile (collapsed stacks, DIR/idle-nodeN.txt), which costs CPU of its own: measure without.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from produce import cpu_seconds, rocket, settle, start_nodes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=3, choices=[1, 3])
    parser.add_argument("--topics", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--profile", default=None, help="a directory for each node's py-spy stacks")
    parser.add_argument("--quiesce-s", type=float, default=10.0, help="how long the nodes are left before measuring")
    arguments = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="rocket-idle-") as data:
        servers = start_nodes(Path(data), arguments.nodes)
        try:
            ports = [re.search(rb"tcp=[^:]+:(\d+)", server.stdout.readline()).group(1).decode() for server in servers]
            address = f"127.0.0.1:{ports[0]}"
            for topic in range(arguments.topics):
                rocket("topic", "create", f"idle-{topic}", "--queues", "4", "--server", address)
                rocket("send", f"idle-{topic}", "hello", "--server", address)
            settle(servers)
            time.sleep(arguments.quiesce_s)
            profilers = [subprocess.Popen(["py-spy", "record", "-o", f"{arguments.profile}/idle-node{number + 1}.txt",
                                           "--format", "raw", "--nonblocking", "--duration", str(int(arguments.seconds)),
                                           "--pid", str(server.pid)], stdout=subprocess.DEVNULL,
                                          stderr=subprocess.DEVNULL)
                         for number, server in enumerate(servers)] if arguments.profile else []
            before, started = cpu_seconds(servers), time.monotonic()
            time.sleep(arguments.seconds)
            cores = (cpu_seconds(servers) - before) / (time.monotonic() - started)
            for profiler in profilers:
                profiler.wait()
        finally:
            for server in servers:
                server.terminate()
            for server in servers:
                server.wait(timeout=30)
    print(json.dumps({"nodes": arguments.nodes, "topics": arguments.topics, "seconds": arguments.seconds,
                      "idle_cores": round(cores, 4)}))
    print(f"idle: {arguments.nodes} nodes use {cores:.4f} cores")


if __name__ == "__main__":
    sys.exit(main())
