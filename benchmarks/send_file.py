"""`rocket send --file` of a line file against the raw durable bandwidth of the same disk, in one run (issue 50's
goal: at least 0.6x).

    python benchmarks/send_file.py [--megabytes 1000] [--line-bytes 100] [--rounds 2] [--data-parent DIR]

Each round: a fresh dev-mode node (`rocket run`, started as benchmarks/produce.py starts it) with its data under
--data-parent; the raw disk probed (rocket/cli/disk_probe.py: 1 MiB writes, each followed by fdatasync, as many bytes
as the file holds); then `rocket send bench --file FILE` timed from its start to its exit (interpreter start-up
included); then the probe again. The file (--megabytes of --line-bytes lines, newline included) is written once,
before the rounds, and read from the page cache. Not part of CI.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # produce.py beside this file

from produce import cpu_seconds, rocket, settle, start_nodes  # noqa: E402

from rocket.cli.disk_probe import raw_disk_bandwidth  # noqa: E402


def write_lines(path: Path, total_bytes: int, line_bytes: int) -> int:
    """A file of total_bytes (rounded down to whole lines) of line_bytes lines; returns the line count."""
    line = b"x" * (line_bytes - 1) + b"\n"
    lines = total_bytes // line_bytes
    block = line * max(1, (1 << 20) // line_bytes)
    per_block = len(block) // line_bytes
    with path.open("wb") as out:
        for _ in range(lines // per_block):
            out.write(block)
        out.write(line * (lines % per_block))
    return lines


def one_round(lines_file: Path, data_parent: str | None) -> dict:
    data = Path(tempfile.mkdtemp(prefix="rocket-send-file-", dir=data_parent))
    size = lines_file.stat().st_size
    try:
        [node] = start_nodes(data, 1)
        try:
            port = re.search(rb"tcp=[^:]+:(\d+)", node.stdout.readline()).group(1).decode()
            address = f"127.0.0.1:{port}"
            settle([node])
            rocket("topic", "create", "bench", "--server", address)
            before = round(raw_disk_bandwidth(data / "probe", size)["mb_per_s"], 1)
            cpu_before, started = cpu_seconds([node]), time.perf_counter()
            subprocess.run([sys.executable, "-m", "rocket", "send", "bench", "--file", str(lines_file),
                            "--server", address], check=True, stdout=subprocess.DEVNULL)
            seconds = time.perf_counter() - started
            server_cpu_s = cpu_seconds([node]) - cpu_before
            after = round(raw_disk_bandwidth(data / "probe", size)["mb_per_s"], 1)
        finally:
            node.terminate()
            node.wait(30)
    finally:
        shutil.rmtree(data, ignore_errors=True)
    mb_per_s = size / seconds / 1e6
    return {"seconds": round(seconds, 2), "mb_per_s": round(mb_per_s, 1), "server_cpu_s": round(server_cpu_s, 2),
            "probe_before_mb_per_s": before, "probe_after_mb_per_s": after,
            "over_probe_before": round(mb_per_s / before, 2), "over_probe_after": round(mb_per_s / after, 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--megabytes", type=int, default=1000)
    parser.add_argument("--line-bytes", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--data-parent", default=None, help="where the node's data and the probe go (default: the "
                                                             "temporary directory)")
    arguments = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="rocket-lines-") as directory:
        lines_file = Path(directory) / "lines.txt"
        lines = write_lines(lines_file, arguments.megabytes * 1_000_000, arguments.line_bytes)
        rounds = []
        for number in range(1, arguments.rounds + 1):
            result = one_round(lines_file, arguments.data_parent)
            rounds.append(result)
            print(f"round {number}: {lines:,} lines, {result['mb_per_s']} MB/s in {result['seconds']} s; raw disk "
                  f"{result['probe_before_mb_per_s']} MB/s before, {result['probe_after_mb_per_s']} after: "
                  f"{result['over_probe_before']}x and {result['over_probe_after']}x", flush=True)
    print(json.dumps({"lines": lines, "line_bytes": arguments.line_bytes, "rounds": rounds}))


if __name__ == "__main__":
    main()
