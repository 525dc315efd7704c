"""What security costs on the produce path: durable produce throughput of 1 KiB messages over rocket's TCP transport,
plain and over TLS, on this machine in one run. Each round starts a fresh dev node plain, then one with TLS (a
trustme certificate, tls_mode enforcing), each on its own data directory, and produces to it with the client's
Producer (the same code as `rocket bench produce`, without its disk probes); rounds alternate which goes first.
Prints each run, the medians and the ratio TLS / plain; --json writes them.

    PYTHONPATH=. python benchmarks/security_cost.py --rounds 3 --messages 200000
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

import trio
import trustme

from rocket import limits
from rocket.client import bench as bench_module
from rocket.client import connect

READY = re.compile(r"rocket ready tcp=[^:]+:(\d+)")
ROOT = Path(__file__).resolve().parents[1]


def start_node(data: Path, environment: dict[str, str]) -> tuple[subprocess.Popen, int]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), **environment}
    node = subprocess.Popen([sys.executable, "-m", "rocket", "run", "--data-dir", str(data), "--listen",
                             "127.0.0.1:0", "--http2-listen", "off", "--http-listen", "off"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    for line in node.stdout:
        match = READY.search(line)
        if match:
            return node, int(match.group(1))
    raise RuntimeError(f"rocket run exited with {node.wait()}")


def one_run(kind: str, messages: int, certs: dict[str, Path]) -> dict:
    data = Path(tempfile.mkdtemp(prefix=f"rocket-security-{kind}-"))
    environment = {}
    if kind == "tls":
        environment = {"ROCKET_TLS_CERT": str(certs["cert"]), "ROCKET_TLS_KEY": str(certs["key"])}
    node, port = start_node(data / "data", environment)
    try:
        async def produce() -> dict:
            tls = None if kind == "plain" else str(certs["ca"])
            async with connect(f"127.0.0.1:{port}", serde="avro", tls=tls) as channel:
                return await bench_module.bench_produce(channel, messages=messages, size=1024,
                                                        batch_bytes=limits.producer_batch_bytes_default, in_flight=16)
        result = trio.run(produce)
    finally:
        node.send_signal(signal.SIGTERM)
        node.wait(30)
        shutil.rmtree(data, ignore_errors=True)
    result["transport"] = kind
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--json", type=Path)
    arguments = parser.parse_args()
    directory = Path(tempfile.mkdtemp(prefix="rocket-security-certs-"))
    ca = trustme.CA()
    issued = ca.issue_cert("127.0.0.1")
    certs = {"cert": directory / "node.pem", "key": directory / "node.key", "ca": directory / "ca.pem"}
    issued.cert_chain_pems[0].write_to_path(str(certs["cert"]))
    issued.private_key_pem.write_to_path(str(certs["key"]))
    ca.cert_pem.write_to_path(str(certs["ca"]))
    runs: list[dict] = []
    try:
        for round_ in range(arguments.rounds):
            for kind in (("plain", "tls") if round_ % 2 == 0 else ("tls", "plain")):
                result = one_run(kind, arguments.messages, certs)
                runs.append(result)
                print(f"round {round_ + 1} {kind:5}: {result['messages_per_s']:>10,.0f} msgs/s "
                      f"{result['mb_per_s']:7.1f} MB/s  p50 {result['latency_ms_p50']:6.1f} ms  "
                      f"p99 {result['latency_ms_p99']:6.1f} ms", flush=True)
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    medians = {kind: statistics.median(run["messages_per_s"] for run in runs if run["transport"] == kind)
               for kind in ("plain", "tls")}
    print(f"median plain {medians['plain']:,.0f} msgs/s, TLS {medians['tls']:,.0f} msgs/s: "
          f"TLS / plain = {medians['tls'] / medians['plain']:.2f} ({arguments.messages:,} messages of 1 KiB per run, "
          f"{arguments.rounds} rounds, {os.cpu_count()} CPUs)")
    if arguments.json:
        arguments.json.write_text(json.dumps({"runs": runs, "medians_messages_per_s": medians}, indent=2))


if __name__ == "__main__":
    main()
