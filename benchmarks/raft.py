"""Raft benchmark: three local node processes (benchmarks/raft_node.py) on 127.0.0.1, each with its WAL
in a temporary directory on the disk under test.

    python benchmarks/raft.py                      # the scenarios below; results in results/raft.json
    python benchmarks/raft.py --groups 1000 --size 1024 --seconds 10

Load scenarios report committed entries/s and MB/s summed over the leaders, fsyncs/s actually issued
and CPU per node; the idle scenario reports the CPU used by many quiet groups.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from rocket.transport.listen import free_ports

RESULTS = Path(__file__).parent / "results"
NODE = Path(__file__).parent / "raft_node.py"


def scenario(groups: int, size: int, seconds: float, mode: str = "load", data_parent: str | None = None) -> dict:
    directory = Path(tempfile.mkdtemp(prefix="rocket-raft-bench-", dir=data_parent))
    ports = ",".join(map(str, free_ports(3)))
    processes = [subprocess.Popen(
        [sys.executable, str(NODE), "--id", str(node), "--ports", ports, "--dir", str(directory / f"node{node}"),
         "--groups", str(groups), "--size", str(size), "--seconds", str(seconds), "--mode", mode],
        stdout=subprocess.PIPE, text=True) for node in (1, 2, 3)]
    try:
        nodes = [json.loads(process.communicate(timeout=seconds + 300)[0].strip().splitlines()[-1])
                 for process in processes]
    finally:
        for process in processes:
            process.kill()
        shutil.rmtree(directory, ignore_errors=True)
    summary = {"groups": groups, "entry_bytes": size, "mode": mode, "nodes": nodes}
    if mode == "load":
        summary["entries_per_s"] = sum(n["entries_per_s"] for n in nodes)
        summary["mb_per_s"] = round(sum(n["mb_per_s"] for n in nodes), 2)
        summary["fsyncs_per_s_per_node"] = [n["fsyncs_per_s"] for n in nodes]
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--groups", type=int)
    parser.add_argument("--size", type=int, default=1024)
    parser.add_argument("--seconds", type=float, default=10)
    parser.add_argument("--idle-groups", type=int, default=10_000)
    parser.add_argument("--data-parent", default=None, help="a directory on the disk under test (default: the temporary directory)")
    arguments = parser.parse_args()
    RESULTS.mkdir(parents=True, exist_ok=True)
    if arguments.groups:
        results = [scenario(arguments.groups, arguments.size, arguments.seconds, data_parent=arguments.data_parent)]
    else:
        results = [scenario(groups, size, arguments.seconds, data_parent=arguments.data_parent)
                   for groups in (1, 1000) for size in (1024, 65536)]
        results.append(scenario(arguments.idle_groups, 0, arguments.seconds, "idle", arguments.data_parent))
    (RESULTS / "raft.json").write_text(json.dumps(results, indent=2))
    for result in results:
        print(json.dumps({k: v for k, v in result.items() if k != "nodes"} | {
            "cpu_percent": [n.get("cpu_percent", n.get("idle_cpu_percent")) for n in result["nodes"]]}))


if __name__ == "__main__":
    main()
