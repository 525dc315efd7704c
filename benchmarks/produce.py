"""Single-node durable produce, then consume: starts `rocket run` on a temporary data directory on the
disk under test, runs `rocket bench produce` and `rocket bench consume` against it, and repeats.

    python benchmarks/produce.py --rounds 3 --messages 600000 --size 1024 [--transport tcp] [--profile]

Each round probes the raw durable bandwidth of the same disk (1 MiB write + fdatasync, as many bytes
as the workload) before and after producing, because this machine's disk swings from run to run.
Writes benchmarks/results/produce-<transport>-<serde>.json with every round and the medians.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

RESULTS = Path(__file__).parent / "results"


def rocket(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "rocket", *args], check=True, stdout=subprocess.DEVNULL)


def one_round(arguments, number: int) -> dict:
    data = Path(tempfile.mkdtemp(prefix="rocket-bench-", dir=arguments.data_parent))
    server = subprocess.Popen(
        [sys.executable, "-m", "rocket", "run", "--data-dir", str(data / "node"), "--listen", "127.0.0.1:0",
         "--http2-listen", "127.0.0.1:0", "--log-level", "warning"], stdout=subprocess.PIPE)
    profiler = None
    try:
        ready = re.search(rb"tcp=[^:]+:(\d+) http2=(\d+)", server.stdout.readline())
        port = (ready.group(1) if arguments.transport == "tcp" else ready.group(2)).decode()
        if arguments.profile and number == 0:
            svg = RESULTS / f"produce-server-{arguments.transport}.svg"
            profiler = subprocess.Popen(["py-spy", "record", "-o", str(svg), "--pid", str(server.pid)],
                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        common = ("--server", f"127.0.0.1:{port}", "--transport", arguments.transport, "--serde", arguments.serde,
                  "--disk-dir", str(data))
        produced_file, consumed_file = data / "produce.json", data / "consume.json"
        rocket("bench", "produce", *common, "--messages", str(arguments.messages), "--size", str(arguments.size),
               "--in-flight", str(arguments.in_flight), "--batch-bytes", str(arguments.batch_bytes),
               "--json", str(produced_file))
        produced = json.loads(produced_file.read_text())
        rocket("bench", "consume", *common, "--topic", produced["result"]["topic"],
               "--messages", str(arguments.messages), "--json", str(consumed_file))
        return {"produce": produced, "consume": json.loads(consumed_file.read_text())}
    finally:
        if profiler is not None:
            profiler.send_signal(signal.SIGINT)
            profiler.wait(60)
        server.send_signal(signal.SIGTERM)
        server.wait(30)
        shutil.rmtree(data, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--messages", type=int, default=600_000)
    parser.add_argument("--size", type=int, default=1024)
    parser.add_argument("--transport", default="tcp", choices=["tcp", "http2"])
    parser.add_argument("--serde", default="avro", choices=["json", "avro"])
    parser.add_argument("--in-flight", type=int, default=8)
    parser.add_argument("--batch-bytes", type=int, default=1 << 20)
    parser.add_argument("--profile", action="store_true", help="record the server with py-spy in round 1")
    parser.add_argument("--data-parent", default=None, help="a directory on the disk under test (default: the temporary directory)")
    arguments = parser.parse_args()
    RESULTS.mkdir(parents=True, exist_ok=True)

    rounds = [one_round(arguments, number) for number in range(arguments.rounds)]
    summary = {
        "produce_ratio_to_raw_disk": [round(r["produce"]["ratio_to_raw_disk"], 3) for r in rounds],
        "produce_mb_per_s": [round(r["produce"]["result"]["mb_per_s"], 1) for r in rounds],
        "raw_disk_mb_per_s": [round(r["produce"]["raw_disk_mb_per_s"], 1) for r in rounds],
        "produce_latency_ms_p50": [round(r["produce"]["result"]["latency_ms_p50"], 1) for r in rounds],
        "produce_latency_ms_p99": [round(r["produce"]["result"]["latency_ms_p99"], 1) for r in rounds],
        "consume_mb_per_s": [round(r["consume"]["result"]["mb_per_s"], 1) for r in rounds],
        "consume_messages_per_s": [round(r["consume"]["result"]["messages_per_s"]) for r in rounds],
    }
    summary["median"] = {name: statistics.median(values) for name, values in summary.items()}
    settings = vars(arguments)
    output = RESULTS / f"produce-{arguments.transport}-{arguments.serde}.json"
    output.write_text(json.dumps({"settings": settings, "summary": summary, "rounds": rounds}, indent=2))
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
