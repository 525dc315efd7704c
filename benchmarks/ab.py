"""A/B of two checkouts of rocket on this machine: for each round and each tree (alternating which goes first), a fresh
`rocket run`, `rocket bench produce` of N messages (with its raw-disk probe, and the server's CPU time per message,
which the machine's noise moves less than throughput), then `rocket bench consume` of them three times as new groups.
Prints each run and the medians; --json writes them all.

    git worktree add --detach /tmp/before <commit>
    python benchmarks/ab.py /tmp/before . --rounds 4 --messages 1000000
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

READY = re.compile(r"rocket ready tcp=[^:]+:(\d+)")


def rocket(tree: Path, *args: str, **options) -> subprocess.CompletedProcess:
    environment = dict(os.environ, PYTHONPATH=str(tree))
    # Run in the tree: `python -m` puts the current directory first on the path, before PYTHONPATH.
    done = subprocess.run([sys.executable, "-m", "rocket", *args], env=environment, capture_output=True, text=True,
                          cwd=tree, **options)
    if done.returncode:
        raise SystemExit(f"rocket {' '.join(args)} of {tree} exited {done.returncode}: {done.stderr[-2000:]}")
    return done


def cpu_seconds(pid: int) -> float:
    """The CPU time (user and system) the process used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def one_run(tree: Path, messages: int) -> dict:
    """Produce and consume on a fresh server of tree: produce MB/s, its raw-disk probe, three consume MB/s."""
    data = Path(tempfile.mkdtemp(prefix="rocket-ab-"))
    environment = dict(os.environ, PYTHONPATH=str(tree))
    server = subprocess.Popen([sys.executable, "-m", "rocket", "run", "--data-dir", str(data / "data"), "--listen",
                               "127.0.0.1:0", "--http2-listen", "off"], env=environment, stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL, text=True, cwd=tree)
    try:
        for line in server.stdout:
            found = READY.search(line)
            if found:
                break
        else:
            raise RuntimeError(f"rocket run of {tree} exited before it was ready")
        common = ["--server", f"127.0.0.1:{found.group(1)}", "--disk-dir", str(data), "--messages", str(messages)]
        cpu_before = cpu_seconds(server.pid)
        rocket(tree, "bench", "produce", "--topic", "ab", "--json", str(data / "produce.json"), *common, timeout=900)
        produce_cpu_s = cpu_seconds(server.pid) - cpu_before
        produce = json.loads((data / "produce.json").read_text())
        consumed = []
        for number in range(3):
            rocket(tree, "bench", "consume", "--topic", "ab", "--json", str(data / f"consume{number}.json"), *common,
                   timeout=900)
            consumed.append(json.loads((data / f"consume{number}.json").read_text())["result"]["mb_per_s"])
        return {"produce_mb_per_s": produce["result"]["mb_per_s"],
                "server_cpu_us_per_message": round(produce_cpu_s / messages * 1e6, 3),
                "raw_disk_mb_per_s": max(probe["mb_per_s"] for probe in produce["raw_disk"]),
                "latency_ms_p99": produce["result"]["latency_ms_p99"], "consume_mb_per_s": consumed}
    finally:
        server.send_signal(signal.SIGKILL)
        server.wait()
        shutil.rmtree(data, ignore_errors=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("before", type=Path)
    parser.add_argument("after", type=Path)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--json", type=Path)
    arguments = parser.parse_args(argv)
    trees = {"before": arguments.before.resolve(), "after": arguments.after.resolve()}
    runs: dict[str, list[dict]] = {name: [] for name in trees}
    for round_number in range(arguments.rounds):
        order = list(trees) if round_number % 2 == 0 else list(reversed(trees))
        for name in order:
            run = one_run(trees[name], arguments.messages)
            runs[name].append(run)
            print(name, round_number, json.dumps(run), flush=True)
    for name, found in runs.items():
        produce = statistics.median(run["produce_mb_per_s"] for run in found)
        ratio = statistics.median(run["produce_mb_per_s"] / run["raw_disk_mb_per_s"] for run in found)
        consume = statistics.median(value for run in found for value in run["consume_mb_per_s"])
        cpu = statistics.median(run["server_cpu_us_per_message"] for run in found)
        print(f"{name}: produce median {produce:.0f} MB/s ({ratio:.2f} of the raw disk), server CPU median "
              f"{cpu:.2f} us a message; consume median {consume:.0f} MB/s")
    if arguments.json:
        arguments.json.write_text(json.dumps(runs, indent=1))


if __name__ == "__main__":
    main()
