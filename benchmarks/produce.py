"""Durable produce, then consume: starts `rocket run` on a temporary data directory on the disk under
test, runs `rocket bench produce` and `rocket bench consume` against it, and repeats.

    python benchmarks/produce.py --rounds 3 --messages 600000 --size 1024 [--transport tcp] [--profile]
    python benchmarks/produce.py --nodes 1,3     # each round: one node, then a three-node cluster
    python benchmarks/produce.py --half-peak     # then the same again paced at half that rate: its latency
    python benchmarks/produce.py --syscalls      # each node's system calls per batch in round 1 (strace -c)
    python benchmarks/produce.py --floor         # and before each round, the floor under it (benchmarks/floor.py)

With --nodes 3 the cluster is three all-role processes on this machine (one nameserver group, every
storage group replicated three times, so every byte is written three times to the same disk), and
the client produces through node 1. Each measurement probes the raw durable bandwidth of the same
disk (1 MiB write + fdatasync, as many bytes as the workload) before and after producing, because
this machine's disk swings from run to run. Writes produce-<transport>-<serde>.json (or
produce-cluster-... with --nodes 1,3) with every round and the medians into --out, by default
benchmarks/results, where the committed figures live: give a scratch directory for an A/B run.
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
import time
from pathlib import Path

import floor
from rocket.transport.listen import free_ports

RESULTS = Path(__file__).parent / "results"
PACED_IN_FLIGHT = 64  # --half-peak's window: room enough that a paced send never waits for an answer


def rocket(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "rocket", *args], check=True, stdout=subprocess.DEVNULL)


def cpu_seconds(processes: list[subprocess.Popen]) -> float:
    """The CPU time (user and system) the processes used so far: a figure the machine's noise moves less than
    throughput, since a process waiting for the CPU uses none."""
    ticks = 0
    for process in processes:
        fields = Path(f"/proc/{process.pid}/stat").read_text().rsplit(")", 1)[1].split()
        ticks += int(fields[11]) + int(fields[12])  # utime, stime: the 14th and 15th fields
    return ticks / os.sysconf("SC_CLK_TCK")


def settle(processes: list[subprocess.Popen], timeout_s: float = 10.0) -> None:
    """Wait until the nodes are idle: after its ready line a node touches its heap (limits.malloc_pretouch_bytes),
    which would count in the first workload's CPU (a fifth of a short run's, with 1 MiB batches)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        before = cpu_seconds(processes)
        time.sleep(0.25)
        if cpu_seconds(processes) - before < 0.02 * len(processes):
            return


def start_nodes(data: Path, nodes: int, tier: str = "local") -> list[subprocess.Popen]:
    """One dev-mode node, or a cluster of all-role nodes on free ports; returns once all are ready."""
    if nodes == 1:
        commands = [["--data-dir", str(data / "node"), "--listen", "127.0.0.1:0", "--http2-listen", "127.0.0.1:0"]]
    else:
        ports = free_ports(2 * nodes)
        members = ",".join(f"{n + 1}@127.0.0.1:{ports[n]}" for n in range(nodes))
        commands = [["--node-id", str(n + 1), "--nameservers", members, "--data-dir", str(data / f"node{n + 1}"),
                     "--listen", f"127.0.0.1:{ports[n]}", "--http2-listen", f"127.0.0.1:{ports[nodes + n]}"]
                    for n in range(nodes)]
    return [subprocess.Popen([sys.executable, "-m", "rocket", "run", *command, "--log-level", "warning"],
                             stdout=subprocess.PIPE, env={**os.environ, "ROCKET_TIER_BACKEND": tier})
            for command in commands]


def trace_syscalls(servers: list[subprocess.Popen]) -> list[tuple[subprocess.Popen, Path]]:
    """strace -c on every thread of each node (-f: and the threads they start), until syscall_counts."""
    tracers = []
    for index, each in enumerate(servers):
        output = Path(tempfile.mkstemp(prefix=f"strace-node{index + 1}-")[1])
        command = ["strace", "-c", "-f", "-o", str(output)]
        for task in os.listdir(f"/proc/{each.pid}/task"):
            command += ["-p", task]
        tracers.append((subprocess.Popen(command, stderr=subprocess.DEVNULL), output))
    time.sleep(1)  # attached
    return tracers


def syscall_counts(tracers: list[tuple[subprocess.Popen, Path]], batches: int) -> dict[str, dict[str, float]]:
    """Stop the tracers; per node, the system calls made per batch (those made at least once per 20 batches)."""
    for tracer, _ in tracers:
        tracer.send_signal(signal.SIGINT)
    counts = {}
    for index, (tracer, output) in enumerate(tracers):
        tracer.wait(30)
        calls = {}
        for line in output.read_text().splitlines():  # % time, seconds, usecs/call, calls, [errors,] syscall
            fields = line.split()
            if len(fields) >= 5 and fields[3].isdigit() and int(fields[3]) >= batches / 20:
                calls[fields[-1]] = round(int(fields[3]) / batches, 2)
        counts[f"node{index + 1}"] = calls
        output.unlink()
    return counts


def one_round(arguments, number: int, nodes: int = 1) -> dict:
    # The floor first, with no node running: a bare Trio echo of requests the size of a batch, as many in flight.
    floors = {}
    if arguments.floor:
        requests = max(1000, min(20_000, (256 << 20) // arguments.batch_bytes))
        floors = floor.measure(arguments.batch_bytes, requests, [arguments.in_flight], arguments.data_parent)
    data = Path(tempfile.mkdtemp(prefix="rocket-bench-", dir=arguments.data_parent))
    servers = start_nodes(data, nodes, arguments.tier)
    profilers = []
    try:
        readies = [re.search(rb"tcp=[^:]+:(\d+) http2=(?:[^: ]+:)?(\d+)", each.stdout.readline()) for each in servers]
        ready = readies[0]
        port = (ready.group(1) if arguments.transport == "tcp" else ready.group(2)).decode()
        settle(servers)
        if arguments.profile and number == 0:  # every node: an SVG and its collapsed stacks (to sum by frame), of
            # the threads holding the GIL: where the CPU goes
            for index, each in enumerate(servers):
                stem = Path(arguments.out) / f"produce-server-{arguments.transport}-{nodes}-node{index + 1}"
                profilers += [subprocess.Popen(["py-spy", "record", "-o", f"{stem}.{kind}", "--format", form,
                                                "--gil", "--nonblocking", "--pid", str(each.pid)],
                                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                              for kind, form in (("svg", "flamegraph"), ("txt", "raw"))]
        common = ("--server", f"127.0.0.1:{port}", "--transport", arguments.transport, "--serde", arguments.serde,
                  "--disk-dir", str(data))
        produced_file, consumed_file = data / "produce.json", data / "consume.json"
        tracers = trace_syscalls(servers) if arguments.syscalls and number == 0 else []
        cpu_before = cpu_seconds(servers)
        rocket("bench", "produce", *common, "--messages", str(arguments.messages), "--size", str(arguments.size),
               "--in-flight", str(arguments.in_flight), "--batch-bytes", str(arguments.batch_bytes),
               "--json", str(produced_file))
        produced = json.loads(produced_file.read_text())
        if tracers:
            produced["syscalls_per_batch"] = syscall_counts(tracers, produced["result"]["batches"])
        # Server CPU per batch, all nodes together (with three nodes: the leader's, its followers', the brokers').
        produced["server_cpu_us_per_batch"] = (cpu_seconds(servers) - cpu_before) / produced["result"]["batches"] * 1e6
        if floors:
            produced["floor"] = floors
        if arguments.half_peak:  # the same workload again, paced at half the rate just measured: latency at that
            # load, with no disk probe (its writes would still be flushing when the run starts)
            paced_file = data / "paced.json"
            rate = produced["result"]["batches"] / produced["result"]["seconds"] / 2
            cpu_before = cpu_seconds(servers)
            rocket("bench", "produce", *common, "--no-probe",
                   "--messages", str(arguments.messages), "--size", str(arguments.size),
                   "--in-flight", str(PACED_IN_FLIGHT), "--batch-bytes", str(arguments.batch_bytes),
                   "--rate", f"{rate:.3f}", "--json", str(paced_file))
            produced["half_peak"] = json.loads(paced_file.read_text())
            # At half the rate a batch may cost more: fewer batches share each round, fsync and wake-up.
            produced["half_peak"]["server_cpu_us_per_batch"] = ((cpu_seconds(servers) - cpu_before)
                                                                / produced["half_peak"]["result"]["batches"] * 1e6)
        rocket("bench", "consume", *common, "--topic", produced["result"]["topic"],
               "--messages", str(arguments.messages), "--json", str(consumed_file))
        return {"produce": produced, "consume": json.loads(consumed_file.read_text())}
    finally:
        for profiler in profilers:
            profiler.send_signal(signal.SIGINT)
        for profiler in profilers:
            profiler.wait(60)
        for each in servers:
            each.send_signal(signal.SIGTERM)
        for each in servers:
            each.wait(30)
        shutil.rmtree(data, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--messages", type=int, default=600_000)
    parser.add_argument("--size", type=int, default=1024)
    parser.add_argument("--transport", default="tcp", choices=["tcp", "http2"])
    parser.add_argument("--serde", default="lane", choices=["lane", "json", "avro"])
    parser.add_argument("--in-flight", type=int, default=8)
    parser.add_argument("--batch-bytes", type=int, default=1 << 20)
    parser.add_argument("--profile", action="store_true", help="record the server with py-spy in round 1")
    parser.add_argument("--syscalls", action="store_true",
                        help="count each node's system calls per batch with strace -c in round 1's produce")
    parser.add_argument("--data-parent", default=None, help="a directory on the disk under test (default: the temporary directory)")
    parser.add_argument("--tier", default="local", choices=["local", "off"],
                        help="the node's tier backend: local (the default: pieces are copied to DATA_DIR/tier as they "
                             "fill, on the same disk) or off")
    parser.add_argument("--nodes", default="1", choices=["1", "3", "1,3"],
                        help="one node, a three-node cluster, or both in every round")
    parser.add_argument("--half-peak", action="store_true",
                        help="after each produce, the same workload paced at half its rate (rocket bench produce "
                             "--rate): the latency at half of peak")
    parser.add_argument("--floor", action="store_true",
                        help="before each round, with no node running, the floor under a batch's cost "
                             "(benchmarks/floor.py: a bare Trio echo of batch-sized requests, as many in flight, "
                             "the same on blocking sockets, a durable Trio echo, and write+fdatasync), and the "
                             "server's CPU per batch over the Trio echo's and the durable echo's")
    parser.add_argument("--out", default=str(RESULTS), help="the directory the results (and --profile's SVG) go to")
    arguments = parser.parse_args()
    Path(arguments.out).mkdir(parents=True, exist_ok=True)
    if arguments.nodes == "1,3":
        return compare_cluster(arguments)

    rounds = [one_round(arguments, number, int(arguments.nodes)) for number in range(arguments.rounds)]
    summary = {
        "produce_ratio_to_raw_disk": [round(r["produce"]["ratio_to_raw_disk"], 3) for r in rounds],
        "produce_mb_per_s": [round(r["produce"]["result"]["mb_per_s"], 1) for r in rounds],
        "raw_disk_mb_per_s": [round(r["produce"]["raw_disk_mb_per_s"], 1) for r in rounds],
        "produce_latency_ms_p50": [round(r["produce"]["result"]["latency_ms_p50"], 1) for r in rounds],
        "produce_latency_ms_p99": [round(r["produce"]["result"]["latency_ms_p99"], 1) for r in rounds],
        "server_cpu_us_per_batch": [round(r["produce"]["server_cpu_us_per_batch"]) for r in rounds],
        "consume_mb_per_s": [round(r["consume"]["result"]["mb_per_s"], 1) for r in rounds],
        "consume_messages_per_s": [round(r["consume"]["result"]["messages_per_s"]) for r in rounds],
        **half_peak([r["produce"] for r in rounds], ""),
        **floor_summary([r["produce"] for r in rounds], "", arguments.in_flight),
    }
    summary["median"] = {name: statistics.median(values) for name, values in summary.items()}
    settings = vars(arguments)
    cluster = "-cluster3" if arguments.nodes == "3" else ""
    output = Path(arguments.out) / f"produce{cluster}-{arguments.transport}-{arguments.serde}.json"
    output.write_text(json.dumps({"settings": settings, "summary": summary, "rounds": rounds}, indent=2))
    print(json.dumps(summary, indent=2))


def half_peak(produced: list[dict], prefix: str) -> dict:
    """With --half-peak: each round's paced produce, its rate and latency."""
    if not all("half_peak" in each for each in produced):
        return {}
    paced = [each["half_peak"]["result"] for each in produced]
    return {f"{prefix}half_peak_mb_per_s": [round(each["mb_per_s"], 1) for each in paced],
            f"{prefix}half_peak_latency_ms_p50": [round(each["latency_ms_p50"], 1) for each in paced],
            f"{prefix}half_peak_latency_ms_p99": [round(each["latency_ms_p99"], 1) for each in paced],
            f"{prefix}half_peak_send_late_ms_p99": [round(each["send_late_ms_p99"], 1) for each in paced],
            f"{prefix}half_peak_server_cpu_us_per_batch": [round(each["half_peak"].get("server_cpu_us_per_batch", 0))
                                                           for each in produced]}


def floor_summary(produced: list[dict], prefix: str, in_flight: int) -> dict:
    """With --floor: each round's floors, and the server's CPU per batch over the bare Trio echo's per request and
    over the durable echo's (the floor of a single node's durable produce)."""
    if not all("floor" in each for each in produced):
        return {}

    def per_request(kind: str) -> list[float]:
        return [each["floor"][f"{kind}_in_flight_{in_flight}"]["server_cpu_us_per_request"] for each in produced]

    def over(floors: list[float]) -> list[float | None]:
        return [round(each["server_cpu_us_per_batch"] / floor_us, 1) if floor_us else None
                for each, floor_us in zip(produced, floors)]

    echo, durable = per_request("trio"), per_request("trio-durable")
    return {f"{prefix}floor_trio_echo_cpu_us": [round(each, 1) for each in echo],
            f"{prefix}floor_sockets_echo_cpu_us": [round(each, 1) for each in per_request("sockets")],
            f"{prefix}floor_trio_durable_cpu_us": [round(each, 1) for each in durable],
            f"{prefix}floor_write_fdatasync_cpu_us": [round(each["floor"]["disk"]["cpu_us_per_write"], 1)
                                                      for each in produced],
            f"{prefix}server_cpu_over_trio_echo": over(echo),
            f"{prefix}server_cpu_over_trio_durable": over(durable)}


def compare_cluster(arguments) -> None:
    """Each round: one node, then three; the ratio of the two is taken within the round."""
    rounds = []
    for number in range(arguments.rounds):
        single = one_round(arguments, number, 1)
        cluster = one_round(arguments, number, 3)
        rounds.append({"single": single, "cluster": cluster})
    summary = {
        "single_mb_per_s": [round(r["single"]["produce"]["result"]["mb_per_s"], 1) for r in rounds],
        "cluster_mb_per_s": [round(r["cluster"]["produce"]["result"]["mb_per_s"], 1) for r in rounds],
        "cluster_to_single": [round(r["cluster"]["produce"]["result"]["mb_per_s"]
                                    / r["single"]["produce"]["result"]["mb_per_s"], 3) for r in rounds],
        "single_ratio_to_raw_disk": [round(r["single"]["produce"]["ratio_to_raw_disk"], 3) for r in rounds],
        "cluster_ratio_to_raw_disk": [round(r["cluster"]["produce"]["ratio_to_raw_disk"], 3) for r in rounds],
        "cluster_latency_ms_p50": [round(r["cluster"]["produce"]["result"]["latency_ms_p50"], 1) for r in rounds],
        "cluster_latency_ms_p99": [round(r["cluster"]["produce"]["result"]["latency_ms_p99"], 1) for r in rounds],
        "cluster_consume_mb_per_s": [round(r["cluster"]["consume"]["result"]["mb_per_s"], 1) for r in rounds],
        "single_server_cpu_us_per_batch": [round(r["single"]["produce"]["server_cpu_us_per_batch"]) for r in rounds],
        "cluster_server_cpu_us_per_batch": [round(r["cluster"]["produce"]["server_cpu_us_per_batch"]) for r in rounds],
        **half_peak([r["single"]["produce"] for r in rounds], "single_"),
        **half_peak([r["cluster"]["produce"] for r in rounds], "cluster_"),
        **floor_summary([r["single"]["produce"] for r in rounds], "single_", arguments.in_flight),
        **floor_summary([r["cluster"]["produce"] for r in rounds], "cluster_", arguments.in_flight),
    }
    summary["median"] = {name: statistics.median(values) for name, values in summary.items()}
    output = Path(arguments.out) / f"produce-cluster-{arguments.transport}-{arguments.serde}.json"
    output.write_text(json.dumps({"settings": vars(arguments), "summary": summary, "rounds": rounds}, indent=2))
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
