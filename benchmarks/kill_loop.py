"""SIGKILL soak of the 8-node example cluster (examples/cluster: 3 nameservers, 3 storage nodes, 2 brokers, each a
`python -m rocket run --config <its toml>` process, data dirs in a temporary directory, ports free ones on 127.0.0.1).
Writers (tests/integration/test_cluster.py's: one sequential stream of numbered batches per queue, failing over
between the brokers and resending a batch of unknown outcome as the same request) produce all along, and --cycles
times a random node (any role, leaders included) is killed at a random moment, restarted after a short random delay,
and waited for: ready, every storage group led, a storage node's replicas caught up, every writer acknowledged again.
At the end every acknowledged message is consumed and checked (verify_acknowledged: at its offset, intact, in order,
stored once); exit 1 if any was lost, duplicated or reordered, or the loop aborted.

    PYTHONPATH=. python benchmarks/kill_loop.py [--cycles 100] [--queues 8] [--seed S] [--keep-data]
        [--out benchmarks/results/kill_loop.json]

One line per cycle, then one summary line. A writer's stall is the time from a kill to that writer's next
acknowledgement; restart-to-ready from the restart to the node's `rocket ready` line. Node logs (node<ID>.log, the
ready lines in node<ID>.out) stay in the run's directory, which is printed; data dirs are removed unless --keep-data.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import platform
import random
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path

import pytest
import trio

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the tests' cluster harness, whatever the current directory
sys.path.insert(0, str(ROOT / "benchmarks"))

from controller_failover import NOT_CONSUMED, spread  # noqa: E402

from rocket.client import connect  # noqa: E402
from rocket.transport.listen import free_ports  # noqa: E402
from tests.integration.test_cluster import (  # noqa: E402
    BATCH, Node, Writers, cluster_status, verify_acknowledged, wait_all_groups_led, wait_caught_up)

CONFIGS = ROOT / "examples" / "cluster"
RESULTS = ROOT / "benchmarks" / "results" / "kill_loop.json"
NAMES = {1: "ns1", 2: "ns2", 3: "ns3", 11: "storage1", 12: "storage2", 13: "storage3", 21: "broker1", 22: "broker2"}
KINDS = {"ns": "nameserver", "storage": "storage", "broker": "broker"}
STORAGE_GROUPS = 8  # examples/cluster/ns*.toml: storage_groups
WARMUP_S = 3.0
READY_TIMEOUT_S = 90.0  # a restart on this shared 2-core machine, with the other seven nodes busy
LED_TIMEOUT_S = 60.0
CAUGHT_UP_TIMEOUT_S = 60.0
RESUMED_TIMEOUT_S = 60.0  # after the node is back: every writer acknowledged again
STOP_WAIT_S = 60.0
LOG_LINE = re.compile(r"^\S+ \S+ (ERROR|CRITICAL|WARNING) (\S+): (.*)$")
# A traceback's first line, an exception group's too (Python prints it indented, after "+"; those nested in it further
# in, after "|", are not counted again).
TRACEBACK = re.compile(r"^(  \+ )?(Exception Group )?Traceback \(most recent call last\):")


class ClusterNode(Node):
    """One node of examples/cluster, started from its TOML file; flags override its data dir and addresses."""

    ready_pattern = re.compile(rb"rocket ready tcp=\S+ http2=\S+ node=(\d+)")

    def __init__(self, node_id: int, port: int, http2_port: int | None, nameservers: str, base: Path):
        super().__init__(node_id, port, nameservers, base, roles="", environment={
            # One object store for the cluster, as cluster.sh gives it.
            "ROCKET_TIER_DIRECTORY": str(base / "tier")})
        self.name = NAMES[node_id]
        self.kind = KINDS[self.name.rstrip("0123456789")]
        self.http2 = f"127.0.0.1:{http2_port}" if http2_port else "off"

    def command(self) -> list[str]:
        return [sys.executable, "-m", "rocket", "run", "--config", str(CONFIGS / f"{self.name}.toml"),
                "--data-dir", str(self.data_dir), "--listen", self.server, "--http2-listen", self.http2,
                "--nameservers", self.nameservers]


def make_cluster(base: Path, nameserver_ports: dict[int, int] | None = None) -> dict[int, ClusterNode]:
    """The cluster's nodes on free ports; every node reaches the nameservers at their own ports, or at
    nameserver_ports (node -> port: proxies in front of them)."""
    ports = free_ports(len(NAMES) + 2)
    tcp = dict(zip(NAMES, ports))
    http2 = {21: ports[-2], 22: ports[-1]}
    reach = nameserver_ports or tcp
    nameservers = ",".join(f"{node}@127.0.0.1:{reach[node]}" for node in NAMES if NAMES[node].startswith("ns"))
    return {node: ClusterNode(node, tcp[node], http2.get(node), nameservers, base) for node in NAMES}


def of_kind(nodes: dict[int, ClusterNode], kind: str) -> list[ClusterNode]:
    return [node for node in nodes.values() if node.kind == kind]


def status_servers(nodes: dict[int, ClusterNode], but: int | None = None) -> list[str]:
    """Where ClusterStatus is asked: the brokers, then the nameservers."""
    return [node.server for node in of_kind(nodes, "broker") + of_kind(nodes, "nameserver") if node.node_id != but]


async def start_cluster(nodes: dict[int, ClusterNode], queues: int) -> dict:
    for node in nodes.values():  # all at once: a storage node is ready once it registered with the nameservers
        node.start()
    for node in nodes.values():
        await node.wait_ready(READY_TIMEOUT_S)
    async with connect(of_kind(nodes, "broker")[0].server) as channel:
        await channel.call("CreateTopic", {"topic": "orders", "queues": queues}, timeout_s=30)
    storage = {node.node_id for node in of_kind(nodes, "storage")}
    return await wait_all_groups_led(status_servers(nodes), storage, LED_TIMEOUT_S, groups=STORAGE_GROUPS)


def first_acks_after(writers: Writers, from_index: int, after: float) -> dict[int, float]:
    """queue -> time of its writer's first acknowledgement later than after (acks are appended in time order)."""
    first: dict[int, float] = {}
    for ack in writers.acks[from_index:]:
        if ack.at > after:
            first.setdefault(ack.queue, ack.at)
    return first


async def cycle(number: int, nodes: dict[int, ClusterNode], writers: Writers, queues: list[int],
                chooser: random.Random, args: argparse.Namespace) -> dict:
    """Kill a random node at a random moment, restart it, and wait until the cluster and every writer are back."""
    await trio.sleep(chooser.uniform(*args.kill_after_s))
    victim = nodes[chooser.choice(sorted(nodes))]
    before = await cluster_status(status_servers(nodes, but=victim.node_id))
    led = sum(1 for group in before["groups"] if group["leader"] == victim.node_id) if before else None
    row = {"cycle": number, "victim": victim.name, "kind": victim.kind, "storage_groups_led": led,
           "nameserver_leader": bool(before and before["nameserver_leader"] == victim.node_id)}
    acks_before = len(writers.acks)
    killed_at = trio.current_time()
    victim.kill()
    row["down_s"] = round(chooser.uniform(*args.restart_after_s), 3)
    await trio.sleep(row["down_s"])
    restarted_at = trio.current_time()
    victim.start()
    await victim.wait_ready(READY_TIMEOUT_S)
    row["ready_s"] = round(trio.current_time() - restarted_at, 3)
    storage = {node.node_id for node in of_kind(nodes, "storage")}
    await wait_all_groups_led(status_servers(nodes), storage, LED_TIMEOUT_S, groups=STORAGE_GROUPS)
    row["all_led_s"] = round(trio.current_time() - restarted_at, 3)
    if victim.kind == "storage":
        row["caught_up_s"] = round(await wait_caught_up(status_servers(nodes), victim.node_id,
                                                        CAUGHT_UP_TIMEOUT_S), 3)
    with trio.move_on_after(RESUMED_TIMEOUT_S):
        while len(first_acks_after(writers, acks_before, killed_at)) < len(queues):
            await trio.sleep(0.1)
    resumed = first_acks_after(writers, acks_before, killed_at)
    row["stall_s"] = {str(queue): round(resumed[queue] - killed_at, 3) for queue in sorted(resumed)}
    row["not_resumed"] = sorted(set(queues) - set(resumed))
    died = [node.name for node in nodes.values() if node.exited_by_itself() is not None]
    if died:
        raise AssertionError(f"nodes exited by themselves: {died}")
    return row


def print_cycle(row: dict) -> None:
    stalls = list(row["stall_s"].values())
    what = (f"leader of {row['storage_groups_led']} groups" if row["kind"] == "storage"
            else "nameserver leader" if row["nameserver_leader"] else row["kind"])
    print(f"cycle {row['cycle']:3d}: kill -9 {row['victim']} ({what}), down {row['down_s']:.2f} s, ready "
          f"{row['ready_s']:.2f} s, all groups led {row['all_led_s']:.2f} s after restart"
          + (f", caught up +{row['caught_up_s']:.2f} s" if "caught_up_s" in row else "")
          + (f"; writers stalled {min(stalls):.2f}-{max(stalls):.2f} s" if stalls else "")
          + (f"; NOT resumed: queues {row['not_resumed']}" if row["not_resumed"] else ""), flush=True)


async def soak(args: argparse.Namespace, base: Path) -> dict:
    chooser = random.Random(args.seed)
    nodes = make_cluster(base)
    queues = list(range(args.queues))
    started = time.monotonic()
    rows: list[dict] = []
    aborted = None
    writers = Writers({node.node_id: node.server for node in of_kind(nodes, "broker")})
    checked, failure, lost = None, None, None
    try:
        status = await start_cluster(nodes, args.queues)
        leaders = collections.Counter(group["leader"] for group in status["groups"])
        print(f"cluster up after {time.monotonic() - started:.1f} s: storage groups led {dict(sorted(leaders.items()))}"
              f", nameserver leader {status['nameserver_leader']}; logs in {base}", flush=True)
        try:
            async with trio.open_nursery() as writing:
                for index, queue in enumerate(queues):
                    writing.start_soon(writers.write, queue, index)  # half start on each broker
                await trio.sleep(WARMUP_S)
                try:
                    for number in range(1, args.cycles + 1):
                        rows.append(await cycle(number, nodes, writers, queues, chooser, args))
                        print_cycle(rows[-1])
                except (AssertionError, trio.TooSlowError, pytest.fail.Exception) as error:
                    aborted = f"cycle {len(rows) + 1}: {type(error).__name__}: {error}"
                    print(f"aborted: {aborted}", flush=True)
                writers.stop.set()
                with trio.fail_after(STOP_WAIT_S):
                    while writers.done < len(queues):
                        await trio.sleep(0.1)
        except Exception as error:  # a writer's unexpected error, or writers that would not stop
            aborted = (aborted + "; " if aborted else "") + f"writers: {type(error).__name__}: {error!r}"[:2000]
            print(f"aborted: {aborted}", flush=True)
        writing_s = time.monotonic() - started
        print(f"verifying {sum(len(ack.seqs) for ack in writers.acks)} acknowledged messages...", flush=True)
        try:
            checked = await verify_acknowledged(writers, of_kind(nodes, "broker")[0].server, base)
            lost = 0
        except (AssertionError, pytest.fail.Exception) as error:
            failure = str(error)[:4000]
            found = NOT_CONSUMED.search(failure)
            lost = int(found.group(1)) if found else None
    finally:
        for node in nodes.values():
            node.kill()
    return {"rows": rows, "aborted": aborted, "failure": failure, "lost": lost, "checked": checked,
            "writers": writers, "writing_s": round(writing_s, 1), "wall_s": round(time.monotonic() - started, 1)}


def scan_logs(base: Path) -> dict:
    """Per node log: tracebacks, and ERROR/CRITICAL/WARNING lines counted by logger and message (numbers blurred)."""
    found = {}
    for path in sorted(base.glob("node*.log")):
        lines = path.read_text(errors="replace").splitlines()
        counts: collections.Counter = collections.Counter()
        for line in lines:
            match = LOG_LINE.match(line)
            if match:
                counts[f"{match.group(1)} {match.group(2)}: {re.sub(r'[0-9]+', 'N', match.group(3))[:160]}"] += 1
        found[path.name] = {"tracebacks": sum(1 for line in lines if TRACEBACK.match(line)),
                            "lines": dict(counts.most_common(15))}
    return found


def figures(rows: list[dict]) -> dict:
    stalls = {kind: spread([stall for row in rows if row["kind"] == kind for stall in row["stall_s"].values()])
              for kind in ("storage", "broker", "nameserver")}
    return {"stall_s": stalls,
            "stall_nameserver_leader_s": spread([stall for row in rows if row["nameserver_leader"]
                                                 for stall in row["stall_s"].values()]),
            "restart_ready_s": spread([row["ready_s"] for row in rows]),
            "restart_ready_by_kind_s": {kind: spread([row["ready_s"] for row in rows if row["kind"] == kind])
                                        for kind in ("storage", "broker", "nameserver")},
            "restart_all_led_s": spread([row["all_led_s"] for row in rows]),
            "caught_up_s": spread([row["caught_up_s"] for row in rows if "caught_up_s" in row])}


def report(args: argparse.Namespace, base: Path, outcome: dict) -> dict:
    rows, writers, checked = outcome["rows"], outcome["writers"], outcome["checked"]
    reordered = None
    if checked is not None:
        reordered = 0
    elif outcome["failure"] and "out of order" in outcome["failure"]:
        reordered = 1  # verify_acknowledged stops at the first queue out of order: at least one
    return {
        "benchmark": "kill_loop", "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "host": {"machine": platform.machine(), "python": platform.python_version(), "cpus": os.cpu_count()},
        "command": " ".join(["python", "benchmarks/kill_loop.py", *sys.argv[1:]]),
        "setup": {"cycles": args.cycles, "cycles_done": len(rows), "seed": args.seed, "queues": args.queues,
                  "writers": args.queues, "batch_messages": BATCH, "storage_groups": STORAGE_GROUPS,
                  "kill_after_s": args.kill_after_s, "restart_after_s": args.restart_after_s, "base": str(base)},
        "measured": {
            "stall_s": "per victim kind, over every writer of every cycle: kill -> that writer's next acknowledgement",
            "restart_ready_s": "restart -> the node's `rocket ready` line",
            "restart_all_led_s": "restart -> every storage group led (ClusterStatus, polled)",
            "caught_up_s": "storage victims: all led -> no group reports it more than 200 entries behind",
            "percentiles": "nearest rank (rocket.client.bench.percentile)"},
        "acknowledged": checked["acknowledged"] if checked else len({seq for ack in writers.acks for seq in ack.seqs}),
        "batches": len(writers.acks), "lost": outcome["lost"],
        "duplicated": checked["duplicates"] if checked else None, "reordered": reordered,
        "consumed": checked["consumed"] if checked else None,
        "never_acknowledged": checked["never_acknowledged"] if checked else None,
        "duplicated_batches": [list(entry) for entry in checked["duplicated_batches"]][:50] if checked else None,
        "aborted": outcome["aborted"], "failure": outcome["failure"],
        "writer_errors": dict(writers.errors), "writer_failovers": writers.failovers,
        "writer_resends": writers.resends, "writing_s": outcome["writing_s"], "wall_s": outcome["wall_s"],
        "figures": figures(rows), "victims": dict(collections.Counter(row["kind"] for row in rows)),
        "logs": scan_logs(base), "cycles": rows}


def summary_line(result: dict, out: Path) -> str:
    figures_ = result["figures"]

    def pair(spread_: dict) -> str:
        return f"{spread_.get('p50')}/{spread_.get('p99')} s" if spread_ else "-"
    stalls = ", ".join(f"{kind} {pair(figures_['stall_s'][kind])} (n={figures_['stall_s'][kind].get('count', 0)})"
                       for kind in ("storage", "broker", "nameserver"))
    return (f"kill_loop: cycles {result['setup']['cycles_done']}/{result['setup']['cycles']} {result['victims']}, "
            f"acknowledged {result['acknowledged']}, lost {result['lost']}, duplicated {result['duplicated']}, "
            f"reordered {result['reordered']}; produce stall p50/p99 per writer on a {stalls}; restart-to-ready "
            f"p50/p99 {pair(figures_['restart_ready_s'])}; writer failovers {result['writer_failovers']} "
            f"{result['writer_errors']}, resends {result['writer_resends']}; wall {result['wall_s']} s; {out}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cycles", type=int, default=100)
    parser.add_argument("--queues", type=int, default=8, help="queues of the topic, one writer each")
    parser.add_argument("--seed", type=int, default=None, help="victims and delays (default: random, recorded)")
    parser.add_argument("--kill-after-s", type=float, nargs=2, default=(0.5, 3.0), metavar=("MIN", "MAX"),
                        help="the kill comes this long after the cluster is back from the previous one")
    parser.add_argument("--restart-after-s", type=float, nargs=2, default=(0.2, 2.0), metavar=("MIN", "MAX"))
    parser.add_argument("--data-parent", type=Path, default=Path(tempfile.gettempdir()))
    parser.add_argument("--keep-data", action="store_true", help="keep the nodes' data dirs (logs are always kept)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    if args.cycles < 1 or args.queues < 1:
        parser.error("--cycles and --queues must be at least 1")
    args.seed = random.randrange(1 << 32) if args.seed is None else args.seed
    base = Path(tempfile.mkdtemp(prefix="kill-loop-", dir=args.data_parent))
    print(f"kill loop: {args.cycles} cycles, {args.queues} writers, seed {args.seed}, in {base}", flush=True)
    result = report(args, base, trio.run(soak, args, base))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    tracebacks = {name: log["tracebacks"] for name, log in result["logs"].items() if log["tracebacks"]}
    print(f"node logs in {base}: tracebacks {tracebacks or 'none'}", flush=True)
    ok = (not result["aborted"] and not result["failure"] and result["lost"] == 0 and result["duplicated"] == 0
          and result["reordered"] == 0)
    if not ok:
        print(f"FAILED: aborted {result['aborted']}; {result['failure']}", flush=True)
    if not args.keep_data:
        for path in base.glob("data*"):
            shutil.rmtree(path, ignore_errors=True)
        shutil.rmtree(base / "tier", ignore_errors=True)
    print(summary_line(result, args.out), flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
