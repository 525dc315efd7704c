"""What security costs on the produce path: durable produce throughput of 1 KiB messages over rocket's TCP transport,
on this machine in one run, in four configurations: plain; TLS (a trustme certificate, tls_mode enforcing); auth
(a cluster secret and auth on: the producer signs in as a user that is no super user, with a pub policy on the
topic, so each call is looked up and matched against its policies); and auth over TLS. Each round starts a fresh dev
node per configuration, each on its own data directory, and produces to it with the client's Producer (the same code
as `rocket bench produce`, without its disk probes); each round rotates which configuration goes first.
With auth, the admin creates the topic, the user and its policy first, and the run waits for the policy to reach the
node. Prints each run, the medians and each configuration's ratio to plain; --json writes them.

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
from rocket.access import Credentials
from rocket.client import Admin, connect
from rocket.client import bench as bench_module

READY = re.compile(r"rocket ready tcp=[^:]+:(\d+)")
ROOT = Path(__file__).resolve().parents[1]
KINDS = ("plain", "tls", "auth", "auth+tls")
ADMIN = Credentials("admin", "security-cost-admin-secret")
PRODUCER = Credentials("producer", "security-cost-producer-secret")
TOPIC = "security-cost"


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
    if "tls" in kind:
        environment |= {"ROCKET_TLS_CERT": str(certs["cert"]), "ROCKET_TLS_KEY": str(certs["key"])}
    if "auth" in kind:
        environment |= {"ROCKET_CLUSTER_SECRET": "security-cost-cluster-secret", "ROCKET_AUTH": "true",
                        "ROCKET_AUTH_ADMIN_SECRET": ADMIN.secret}
    node, port = start_node(data / "data", environment)
    try:
        async def produce() -> dict:
            tls = str(certs["ca"]) if "tls" in kind else None
            credentials = None
            if "auth" in kind:
                async with connect(f"127.0.0.1:{port}", serde="avro", tls=tls, credentials=ADMIN) as channel:
                    admin = Admin(channel)
                    await channel.call("CreateTopic", {"topic": TOPIC, "queues": 8})
                    await admin.create_user(PRODUCER.user, PRODUCER.secret)
                    await admin.grant(PRODUCER.user, f"topic:{TOPIC}", ["pub"])
                await trio.sleep(2 * limits.acl_refresh_s + 0.5)  # the node follows the policies every acl_refresh_s
                credentials = PRODUCER
            async with connect(f"127.0.0.1:{port}", serde="avro", tls=tls, credentials=credentials) as channel:
                return await bench_module.bench_produce(channel, messages=messages, size=1024, topic=TOPIC,
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
            for kind in KINDS[round_ % len(KINDS):] + KINDS[:round_ % len(KINDS)]:
                result = one_run(kind, arguments.messages, certs)
                result["round"] = round_ + 1
                runs.append(result)
                print(f"round {round_ + 1} {kind:8}: {result['messages_per_s']:>10,.0f} msgs/s "
                      f"{result['mb_per_s']:7.1f} MB/s  p50 {result['latency_ms_p50']:6.1f} ms  "
                      f"p99 {result['latency_ms_p99']:6.1f} ms", flush=True)
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    medians, ratios, round_ratios = summary(runs)
    print("median " + ", ".join(f"{kind} {medians[kind]:,.0f} msgs/s ({ratios[kind]:.2f} of plain)" for kind in KINDS)
          + f" ({arguments.messages:,} messages of 1 KiB per run, {arguments.rounds} rounds, {os.cpu_count()} CPUs)")
    print("median of each round's ratio to its plain run: "
          + ", ".join(f"{kind} {round_ratios[kind]:.2f}" for kind in KINDS))
    if arguments.json:
        arguments.json.write_text(json.dumps({"runs": runs, "medians_messages_per_s": medians,
                                              "ratios_to_plain": ratios, "round_ratios_to_plain": round_ratios},
                                             indent=2))


def summary(runs: list[dict]) -> tuple[dict, dict, dict]:
    """Per configuration: the median msgs/s, its ratio to plain's median, and the median over rounds of each round's
    ratio to that round's plain run (steadier when the machine's load drifts between rounds, as other jobs come and
    go: a round's runs follow each other within seconds)."""
    medians = {kind: statistics.median(run["messages_per_s"] for run in runs if run["transport"] == kind)
               for kind in KINDS}
    ratios = {kind: medians[kind] / medians["plain"] for kind in KINDS}
    by_round: dict[int, dict[str, float]] = {}
    for run in runs:
        by_round.setdefault(run["round"], {})[run["transport"]] = run["messages_per_s"]
    round_ratios = {kind: statistics.median(rates[kind] / rates["plain"] for rates in by_round.values())
                    for kind in KINDS}
    return medians, ratios, round_ratios


if __name__ == "__main__":
    main()
