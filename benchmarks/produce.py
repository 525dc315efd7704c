"""Single-node durable produce: starts `rocket run` on a temporary data directory on the same disk,
runs `rocket bench produce` against it, and records the result beside the raw fdatasync bandwidth.

    python benchmarks/produce.py --messages 200000 --size 1024 [--transport tcp] [--profile]

Writes benchmarks/results/produce-<transport>-<serde>.json; with --profile also a py-spy flame graph
of the server (benchmarks/results/produce-server.svg).
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

RESULTS = Path(__file__).parent / "results"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--size", type=int, default=1024)
    parser.add_argument("--transport", default="tcp", choices=["tcp", "http2"])
    parser.add_argument("--serde", default="avro", choices=["json", "avro"])
    parser.add_argument("--in-flight", type=int, default=16)
    parser.add_argument("--batch-bytes", type=int, default=1 << 20)
    parser.add_argument("--profile", action="store_true", help="record the server with py-spy")
    parser.add_argument("--data-parent", default=".", help="directory on the disk under test")
    arguments = parser.parse_args()

    RESULTS.mkdir(parents=True, exist_ok=True)
    data = Path(tempfile.mkdtemp(prefix="rocket-bench-", dir=arguments.data_parent))
    server = subprocess.Popen(
        [sys.executable, "-m", "rocket", "run", "--data-dir", str(data / "node"), "--listen", "127.0.0.1:0",
         "--http2-listen", "127.0.0.1:0", "--log-level", "warning"],
        stdout=subprocess.PIPE)
    profiler = None
    try:
        ready = re.search(rb"tcp=[^:]+:(\d+) http2=(\d+)", server.stdout.readline())
        port = ready.group(1) if arguments.transport == "tcp" else ready.group(2)
        if arguments.profile:
            svg = RESULTS / f"produce-server-{arguments.transport}.svg"
            profiler = subprocess.Popen(["py-spy", "record", "-o", str(svg), "--pid", str(server.pid), "--idle"],
                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        name = f"produce-{arguments.transport}-{arguments.serde}"
        output = RESULTS / f"{name}.json"
        subprocess.run(
            [sys.executable, "-m", "rocket", "bench", "produce", "--server", f"127.0.0.1:{port.decode()}",
             "--transport", arguments.transport, "--serde", arguments.serde, "--messages", str(arguments.messages),
             "--size", str(arguments.size), "--in-flight", str(arguments.in_flight),
             "--batch-bytes", str(arguments.batch_bytes), "--disk-dir", str(data), "--json", str(output)],
            check=True)
        result = json.loads(output.read_text())
        print(json.dumps({"ratio_to_raw_disk": result["ratio_to_raw_disk"],
                          "mb_per_s": result["result"]["mb_per_s"], "raw_disk_mb_per_s": result["raw_disk"]["mb_per_s"],
                          "latency_ms_p99": result["result"]["latency_ms_p99"]}, indent=2))
    finally:
        if profiler is not None:
            profiler.send_signal(signal.SIGINT)
            profiler.wait(30)
        server.send_signal(signal.SIGTERM)
        server.wait(30)
        shutil.rmtree(data, ignore_errors=True)


if __name__ == "__main__":
    main()
