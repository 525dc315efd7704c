"""Combined faults on the 8-node example cluster (examples/cluster, started as benchmarks/kill_loop.py starts it), for a
given time, under a mixed workload, with the history kept and checked at the end.

Workload, every client reaching the brokers through the same proxies as the nodes do:
- one idempotent writer per queue of a normal topic (tests/integration/test_cluster.py's Writers: a sequential stream
  of numbered batches, failing over between the brokers and resending a batch of unknown outcome as the same request);
- KV clients doing get, put and compare-and-set on a few keys of a two-shard bucket, each operation recorded with its
  invocation and response times (one whose outcome is unknown, cut by a timeout or an error that does not say it was
  refused, is recorded open, and its client goes on under a new id);
- delayed messages (1-10 s) from an idempotent producer, received by a pop consumer group, each first delivery timed.

Nemesis: a seeded schedule of faults, started every GAP_S and lasting longer, so several hold at once:
- kill: kill -9 of any node, restarted after a short while;
- partition: every connection into a storage node or a broker is cut (held, or reset) at a TCP proxy in front of it
  (the node advertises the proxy's address, so its peers and the brokers reach it only through it; its own outgoing
  connections do not pass it: a one-way partition);
- slow_disk: a storage node's data dir is slowfs (FUSE), whose fsyncs are made N times slower.
At the end every fault is healed, every node is running, and the checks run:
- every acknowledged message is consumed once, at its offset, in order per queue (verify_acknowledged);
- every acknowledged delayed message is delivered, none before its time;
- the KV history is linearizable (benchmarks/linearizable.py, a Porcupine-style checker, per key);
- no client saw INTERNAL, and no node logged a traceback or an INTERNAL answer;
- every node's RSS over the last half of the run, in the process that ran then, grew by less than RSS_SLOPE_MAX.

    python benchmarks/chaos.py --minutes 60 --seed N [--out benchmarks/results/chaos.json] [--no-slow-disk]

One line per fault as it ends, then the figures, and last
`chaos: acked=N lost=L dup=D reordered=R early=E nonlinearizable=X faults=F rss_slope=S%` (acked and lost count
messages of both topics; dup and reordered the normal topic's, whose consumption is exactly once in order; early the
delayed ones delivered before their time; nonlinearizable the KV keys whose history is not). Exit 1 if any check
failed.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import dataclasses
import json
import os
import platform
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

import pytest
import trio

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from controller_failover import NOT_CONSUMED, spread  # noqa: E402
from faults import start_proxy, start_slowfs, stop_process, unmount, write_control  # noqa: E402
from kill_loop import (ClusterNode, first_acks_after, make_cluster, of_kind, scan_logs, start_cluster,  # noqa: E402
                       status_servers, STORAGE_GROUPS)
from linearizable import Op, check  # noqa: E402

from rocket.client import Admin, connect  # noqa: E402
from rocket.client.kv import KV  # noqa: E402
from rocket.client.producer import Sequencer  # noqa: E402
from rocket.client.simple import SimpleConsumer  # noqa: E402
from rocket.model import Message  # noqa: E402
from rocket.serde import batch as batch_codec  # noqa: E402
from rocket.errors import Code, RocketError  # noqa: E402
from rocket.transport.listen import free_ports  # noqa: E402
from tests.integration.test_cluster import (FAILOVER, Writers, verify_acknowledged,  # noqa: E402
                                            wait_all_groups_led)

RESULTS = ROOT / "benchmarks" / "results" / "chaos.json"
KINDS = ("kill", "partition", "slow_disk")
WARMUP_S = 5.0  # the workload runs alone first
GAP_S = (2.0, 8.0)  # between the starts of two faults
KILL_DOWN_S = (0.5, 5.0)
PARTITION_S = (3.0, 20.0)
SLOW_DISK_S = (5.0, 30.0)
SLOW_DISK_FACTOR = (5.0, 50.0)
HEAL_S = 10.0  # no fault starts in the run's last this long, so the last ones end inside it
READY_TIMEOUT_S = 120.0  # a restart on the shared 2-core machine, under other faults
SETTLE_TIMEOUT_S = 120.0  # after the last fault: every storage group led again
WRITE_TIMEOUT_S = 5.0  # a produce that takes longer (a held partition) is sent again, as the same request, elsewhere
KV_BUCKET = "chaos"
KV_KEYS = 4
KV_CLIENTS = 4
KV_TIMEOUT_S = 10.0  # an operation that takes longer has an unknown outcome: its client starts afresh
KV_DEFINITE = {Code.CAS_FAILED, Code.NOT_FOUND}  # answers that say the operation did not change anything
DELAYED_TOPIC = "chaos-delayed"
DELAYED_QUEUES = 4
DELAY_S = (1.0, 10.0)  # from a delayed message's send to its delivery time
DELAYED_GAP_S = 0.05  # between two delayed sends: about 20 a second
DELAYED_CONSUMERS = 2
DELAYED_INVISIBLE_S = 10.0
DRAIN_S = 60.0  # after the run, for the last delayed messages (and those a fault held up) to be delivered
RSS_SAMPLE_S = 2.0
RSS_SLOPE_MAX = 0.10  # growth over the last half of the run, as a share of the mean
STOP_WAIT_S = 60.0


@dataclasses.dataclass(frozen=True)
class Fault:
    kind: str
    node: int
    at_s: float  # from the end of the warm-up
    for_s: float
    severity: float = 0.0  # slow_disk: the fsync factor; partition: 1 resets connections, 0 holds them


def plan(seed: int, seconds: float, nodes: dict[int, str], slow_disk: bool) -> list[Fault]:
    """The faults of a run, from its seed alone: a node carries at most one fault of a kind at a time."""
    chooser = random.Random(seed)
    kinds = [kind for kind in KINDS if slow_disk or kind != "slow_disk"]
    storage = [node for node, name in nodes.items() if name.startswith("storage")]
    proxied = storage + [node for node, name in nodes.items() if name.startswith("broker")]
    busy: dict[tuple[str, int], float] = {}
    faults, at = [], chooser.uniform(*GAP_S)
    while at < seconds - HEAL_S:
        kind = chooser.choice(kinds)
        targets = sorted(nodes) if kind == "kill" else proxied if kind == "partition" else storage
        node = chooser.choice(targets)
        span = {"kill": KILL_DOWN_S, "partition": PARTITION_S, "slow_disk": SLOW_DISK_S}[kind]
        for_s = min(chooser.uniform(*span), seconds - HEAL_S - at + KILL_DOWN_S[1])
        severity = (chooser.uniform(*SLOW_DISK_FACTOR) if kind == "slow_disk"
                    else float(chooser.random() < 0.5) if kind == "partition" else 0.0)
        if busy.get((kind, node), 0.0) <= at:
            faults.append(Fault(kind, node, round(at, 3), round(for_s, 3), round(severity, 1)))
            busy[(kind, node)] = at + for_s
        at += chooser.uniform(*GAP_S)
    return faults


class Proxy:
    """benchmarks/faults.py's TCP proxy in front of a node (a process), and its control file."""

    def __init__(self, node: ClusterNode, base: Path):
        self.port = free_ports(1)[0]
        self.control = base / f"proxy{node.node_id}.json"
        write_control(self.control, {})
        self.process = start_proxy(f"127.0.0.1:{self.port}", node.server, self.control,
                                   base / f"proxy{node.node_id}.log")
        self.address = f"127.0.0.1:{self.port}"
        node.environment["ROCKET_ADVERTISE"] = self.address

    def partition(self, reset: bool) -> None:
        write_control(self.control, {"partition": "both", "partition_mode": "reset" if reset else "hold"})

    def heal(self) -> None:
        write_control(self.control, {})

    def stop(self) -> None:
        stop_process(self.process.pid)


class SlowDisk:
    """A node's data dir on slowfs (benchmarks/slowfs.py through faults.py), over a backing dir beside it."""

    def __init__(self, node: ClusterNode, base: Path):
        self.mountpoint = node.data_dir
        backing = base / f"{node.data_dir.name}.backing"
        backing.mkdir(parents=True, exist_ok=True)
        self.mountpoint.mkdir(parents=True, exist_ok=True)
        self.control = base / f"slowfs{node.node_id}.json"
        write_control(self.control, {"factor": 1})
        self.process = start_slowfs(backing, self.mountpoint, self.control, base / f"slowfs{node.node_id}.log")

    def slow(self, factor: float) -> None:
        write_control(self.control, {"factor": factor})

    def heal(self) -> None:
        write_control(self.control, {"factor": 1})

    def stop(self) -> None:
        stop_process(self.process.pid)
        unmount(self.mountpoint)


@dataclasses.dataclass
class KvClients:
    """Clients doing get, put and compare-and-set on KV_KEYS keys through the brokers, every operation recorded."""

    servers: list[str]
    seed: int
    stop: trio.Event = dataclasses.field(default_factory=trio.Event)
    history: list[Op] = dataclasses.field(default_factory=list)
    errors: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    next_client: int = 0

    def _client(self) -> int:
        self.next_client += 1
        return self.next_client

    async def run(self, index: int) -> None:
        chooser = random.Random(self.seed * 1000 + index)
        client, written, server = self._client(), 0, index
        while not self.stop.is_set():
            try:
                async with connect(self.servers[server % len(self.servers)]) as channel:
                    kv = KV(channel)
                    while not self.stop.is_set():
                        key = f"k{chooser.randrange(KV_KEYS)}"
                        kind = chooser.choice(("get", "put", "cas", "cas"))
                        written += 1
                        value = f"{client}:{written}".encode()
                        if kind == "cas":  # from what this client last read of the key, or from absent
                            seen = [op for op in self.history[-50:] if op.key == key and op.kind == "get"]
                            expected = seen[-1].result if seen else None
                        else:
                            expected = None
                        op = await self._call(kv, client, kind, key, value, expected)
                        self.history.append(op)
                        if op.completed is None:
                            client = self._client()  # its operation stays open for ever: a new client goes on
                            break
            except RocketError as error:
                self.errors[error.code.name] += 1
            server += 1
            await trio.sleep(0.05)

    async def _call(self, kv: KV, client: int, kind: str, key: str, value: bytes, expected: bytes | None) -> Op:
        op = Op(client=client, key=key, kind=kind, value=None if kind == "get" else value,
                expected=expected if kind == "cas" else None, invoked=trio.current_time(), completed=None, ok=None,
                result=None)
        result, ok = None, True
        try:
            with trio.fail_after(KV_TIMEOUT_S):
                if kind == "get":
                    result = (await kv.get(KV_BUCKET, key)).value
                elif kind == "put":
                    await kv.put(KV_BUCKET, key, value)
                else:
                    await kv.compare_and_set(KV_BUCKET, key, expected, value)
        except RocketError as error:
            self.errors[error.code.name] += 1
            if error.code not in KV_DEFINITE:
                return op  # open: it may have taken effect, now or later
            ok = kind == "get"  # a get of an absent key reads None; a refused compare-and-set changed nothing
        except trio.TooSlowError:
            self.errors["timeout"] += 1
            return op
        return dataclasses.replace(op, completed=trio.current_time(), ok=ok, result=result)


@dataclasses.dataclass
class Delayed:
    """Delayed messages: one idempotent producer (each message's delivery DELAY_S from its send, resent as the same
    request on an unknown outcome) and DELAYED_CONSUMERS receivers of one group (pop: receive, then ack), each
    message's first delivery timed on the harness's wall clock. Early: delivered before its time."""

    servers: list[str]
    stop: trio.Event = dataclasses.field(default_factory=trio.Event)  # the producer's
    drained: trio.Event = dataclasses.field(default_factory=trio.Event)  # the receivers'
    acked: dict[str, int] = dataclasses.field(default_factory=dict)  # id -> the delivery time sent (epoch ms)
    received: dict[str, int] = dataclasses.field(default_factory=dict)  # id -> first delivery (epoch ms)
    early: list[tuple[str, int]] = dataclasses.field(default_factory=list)  # (id, ms before its time)
    errors: collections.Counter = dataclasses.field(default_factory=collections.Counter)

    async def produce(self, seed: int) -> None:
        chooser, sequencer = random.Random(seed), Sequencer()
        count, server, pending = 0, 0, None
        while True:
            try:
                async with connect(self.servers[server % len(self.servers)]) as channel:
                    while True:
                        if pending is None:
                            if self.stop.is_set():
                                return
                            count += 1
                            at = int(time.time() * 1000 + chooser.uniform(*DELAY_S) * 1000)
                            message = Message(b"delayed", properties={"id": f"d{count}", "at": str(at)},
                                              deliver_at_ms=at)
                            pending = (f"d{count}", at, sequencer.produce_request(
                                DELAYED_TOPIC, count % DELAYED_QUEUES, batch_codec.encode([message], at)))
                        await channel.call("Produce", pending[2], timeout_s=WRITE_TIMEOUT_S)
                        self.acked[pending[0]] = pending[1]
                        pending = None
                        await trio.sleep(DELAYED_GAP_S)
            except RocketError as error:
                if error.code not in FAILOVER:
                    raise
                self.errors[error.code.name] += 1
            server += 1
            await trio.sleep(0.05)

    async def consume(self, index: int) -> None:
        server = index
        while not self.drained.is_set():
            try:
                async with connect(self.servers[server % len(self.servers)]) as channel:
                    consumer = SimpleConsumer(channel, DELAYED_TOPIC, "chaos-delayed", invisible_s=DELAYED_INVISIBLE_S)
                    while not self.drained.is_set():
                        messages = await consumer.receive(32, wait_s=1.0)
                        now = int(time.time() * 1000)
                        for message in messages:
                            key, at = message.properties["id"], int(message.properties["at"])
                            if key not in self.received:
                                self.received[key] = now
                                if now < at:
                                    self.early.append((key, at - now))
                        if messages:
                            with contextlib.suppress(RocketError):  # stale receipts: delivered again, counted once
                                await consumer.ack(*messages)
            except RocketError as error:
                self.errors[error.code.name] += 1
            server += 1
            await trio.sleep(0.05)

    async def drain(self, timeout_s: float) -> None:
        """Until every acknowledged message was delivered, or timeout_s; then the receivers stop."""
        with trio.move_on_after(timeout_s):
            while not set(self.acked) <= set(self.received):
                await trio.sleep(0.2)
        self.drained.set()

    def lost(self) -> list[str]:
        return sorted(set(self.acked) - set(self.received))


async def sample_rss(nodes: dict[int, ClusterNode], samples: list[tuple[float, int, int, int]]) -> None:
    """(time, node, start number, RSS bytes) of every running node, every RSS_SAMPLE_S."""
    while True:
        for node in nodes.values():
            if node.process is not None and node.process.poll() is None:
                try:
                    status = Path(f"/proc/{node.process.pid}/status").read_text()
                except OSError:
                    continue
                rss = next((int(line.split()[1]) * 1024 for line in status.splitlines()
                            if line.startswith("VmRSS:")), None)
                if rss is not None:
                    samples.append((trio.current_time(), node.node_id, node.starts, rss))
        await trio.sleep(RSS_SAMPLE_S)


def rss_slopes(samples: list[tuple[float, int, int, int]], half_at: float) -> dict[int, float]:
    """node -> its RSS growth over the last half (least squares over the samples of the process running at the end,
    if it ran from the half on), as a share of its mean there."""
    slopes = {}
    for node in {node for _, node, _, _ in samples}:
        mine = [sample for sample in samples if sample[1] == node]
        last_start = mine[-1][2]
        same = [(at, rss) for at, _, start, rss in mine if start == last_start]
        if same[0][0] > half_at + RSS_SAMPLE_S:  # restarted in the last half: its process did not run it all
            continue
        points = [(at, rss) for at, rss in same if at >= half_at]
        if len(points) < 3:
            continue
        mean_at = sum(at for at, _ in points) / len(points)
        mean_rss = sum(rss for _, rss in points) / len(points)
        slope = (sum((at - mean_at) * (rss - mean_rss) for at, rss in points)
                 / max(1e-9, sum((at - mean_at) ** 2 for at, _ in points)))
        slopes[node] = round(slope * (points[-1][0] - points[0][0]) / mean_rss, 4)
    return slopes


class Nemesis:
    """Applies the planned faults, each in its own task, and heals them; records when each held."""

    def __init__(self, nodes: dict[int, ClusterNode], proxies: dict[int, Proxy], disks: dict[int, SlowDisk],
                 writers: Writers):
        self.nodes, self.proxies, self.disks, self.writers = nodes, proxies, disks, writers
        self.done: list[dict] = []
        self.problems: list[str] = []
        self.kills: collections.Counter = collections.Counter()  # node -> kills so far

    async def run(self, faults: list[Fault]) -> None:
        started = trio.current_time()
        async with trio.open_nursery() as nursery:
            for fault in faults:
                await trio.sleep_until(started + fault.at_s)
                nursery.start_soon(self.apply, fault)

    async def apply(self, fault: Fault) -> None:
        node = self.nodes[fault.node]
        row = {"kind": fault.kind, "node": node.name, "for_s": fault.for_s, "severity": fault.severity}
        acks_before = len(self.writers.acks)
        began = trio.current_time()
        if fault.kind == "kill":
            self.kills[fault.node] += 1
            mine = self.kills[fault.node]
            node.kill()  # also while it restarts from an earlier kill: that kill's wait for it ends then
            await trio.sleep(fault.for_s)
            node.start()
            try:
                await node.wait_ready(READY_TIMEOUT_S)
            except (AssertionError, trio.TooSlowError) as error:
                if self.kills[fault.node] == mine:  # not killed again meanwhile
                    self.problems.append(f"{node.name} did not come back after a kill: {str(error)[-1000:]}")
        elif fault.kind == "partition":
            self.proxies[fault.node].partition(reset=bool(fault.severity))
            await trio.sleep(fault.for_s)
            self.proxies[fault.node].heal()
        else:
            self.disks[fault.node].slow(fault.severity)
            await trio.sleep(fault.for_s)
            self.disks[fault.node].heal()
        first = first_acks_after(self.writers, acks_before, began)
        row["stall_s"] = round(max((at - began for at in first.values()), default=0.0), 3)
        row["ended_s"] = round(trio.current_time() - began, 3)
        self.done.append(row)
        print(f"fault {len(self.done):3d}: {fault.kind} {node.name} for {fault.for_s:.1f} s"
              + (f" (x{fault.severity:.0f})" if fault.kind == "slow_disk" else "")
              + (" (reset)" if fault.kind == "partition" and fault.severity else "")
              + f"; writers' longest stall {row['stall_s']:.2f} s", flush=True)


async def work(args: argparse.Namespace, nodes: dict[int, ClusterNode], writers: Writers, kv: KvClients,
               delayed: Delayed, nemesis: Nemesis, faults: list[Fault], started: float) -> None:
    """The workload, under the faults, for the run's time; then every group led again and the clients stopped."""
    queues = list(range(args.queues))
    async with trio.open_nursery() as working:
        for index, queue in enumerate(queues):
            working.start_soon(writers.write, queue, index)
        for index in range(KV_CLIENTS):
            working.start_soon(kv.run, index)
        working.start_soon(delayed.produce, args.seed)
        for index in range(DELAYED_CONSUMERS):
            working.start_soon(delayed.consume, index)
        await trio.sleep(WARMUP_S)
        await nemesis.run(faults)
        await trio.sleep_until(started + WARMUP_S + args.minutes * 60)
        storage = {node.node_id for node in of_kind(nodes, "storage")}
        await wait_all_groups_led(status_servers(nodes), storage, SETTLE_TIMEOUT_S, groups=STORAGE_GROUPS)
        writers.stop.set()
        kv.stop.set()
        delayed.stop.set()
        with trio.fail_after(STOP_WAIT_S):
            while writers.done < len(queues):
                await trio.sleep(0.1)
        await delayed.drain(DRAIN_S)


async def chaos(args: argparse.Namespace, base: Path) -> dict:
    nodes = make_cluster(base)
    names = {node.node_id: node.name for node in nodes.values()}
    seconds = args.minutes * 60
    faults = plan(args.seed, seconds, names, args.slow_disk)
    proxies: dict[int, Proxy] = {}
    disks: dict[int, SlowDisk] = {}
    samples: list[tuple[float, int, int, int]] = []
    outcome: dict = {"faults_planned": len(faults), "problems": []}
    try:
        for node in nodes.values():
            if node.kind in ("storage", "broker"):
                proxies[node.node_id] = Proxy(node, base)
            if node.kind == "storage" and args.slow_disk:
                disks[node.node_id] = SlowDisk(node, base)
        # The clients too reach the brokers through their proxies: a partitioned broker is cut from them as well.
        brokers = {node.node_id: proxies[node.node_id].address for node in of_kind(nodes, "broker")}
        writers = Writers(brokers, timeout_s=WRITE_TIMEOUT_S)
        kv = KvClients(list(brokers.values()), args.seed)
        delayed = Delayed(list(brokers.values()))
        await start_cluster(nodes, args.queues)
        async with connect(of_kind(nodes, "broker")[0].server) as channel:
            await KV(channel).create_bucket(KV_BUCKET, shards=2)
            await Admin(channel).create_topic(DELAYED_TOPIC, DELAYED_QUEUES, message_type="delay")
        print(f"cluster up; {len(faults)} faults planned over {seconds:.0f} s; logs in {base}", flush=True)
        nemesis = Nemesis(nodes, proxies, disks, writers)
        started = trio.current_time()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(sample_rss, nodes, samples)
            try:
                await work(args, nodes, writers, kv, delayed, nemesis, faults, started)
            except Exception as error:  # a client's unexpected error, a cluster that did not settle, a stuck writer
                outcome["problems"].append(f"the run aborted: {type(error).__name__}: {error!r}"[:2000])
            nursery.cancel_scope.cancel()
        outcome["writers"] = writers
        outcome["delayed"] = {"acknowledged": len(delayed.acked), "delivered": len(delayed.received),
                              "lost": len(delayed.lost()), "lost_first": delayed.lost()[:20],
                              "early": len(delayed.early), "early_first": delayed.early[:20],
                              "errors": dict(delayed.errors)}
        outcome["half_at"] = started + WARMUP_S + seconds / 2
        outcome["rss_slopes"] = rss_slopes(samples, outcome["half_at"])
        outcome["nemesis"] = nemesis.done
        outcome["problems"] += nemesis.problems
        died = [node.name for node in nodes.values() if node.exited_by_itself() is not None]
        if died:
            outcome["problems"].append(f"nodes exited by themselves: {died}")
        print(f"verifying {sum(len(ack.seqs) for ack in writers.acks)} acknowledged messages and "
              f"{len(kv.history)} KV operations...", flush=True)
        try:
            outcome["checked"] = await verify_acknowledged(writers, of_kind(nodes, "broker")[0].server, base)
            outcome["lost"] = 0
        except (AssertionError, pytest.fail.Exception) as error:
            outcome["failure"] = str(error)[:4000]
            found = NOT_CONSUMED.search(outcome["failure"])
            outcome["lost"] = int(found.group(1)) if found else None
        linear = await trio.to_thread.run_sync(check, kv.history)
        outcome["kv"] = {"operations": len(kv.history), "open": sum(op.completed is None for op in kv.history),
                         "ok": linear.ok, "bad_keys": linear.bad_keys, "timed_out_keys": linear.timed_out_keys,
                         "details": linear.details, "errors": dict(kv.errors)}
    finally:
        for node in nodes.values():
            node.kill()
        for tool in [*proxies.values(), *disks.values()]:
            tool.stop()
    return outcome


def report(args: argparse.Namespace, base: Path, outcome: dict) -> dict:
    writers, checked = outcome["writers"], outcome.get("checked")
    failure = outcome.get("failure")
    logs = scan_logs(base)
    internal = {name: sum(count for line, count in log["lines"].items() if "INTERNAL" in line)
                for name, log in logs.items()}
    rows = outcome.get("nemesis", [])
    slopes = outcome.get("rss_slopes", {})
    return {
        "benchmark": "chaos", "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "host": {"machine": platform.machine(), "python": platform.python_version(), "cpus": os.cpu_count()},
        "command": " ".join(["python", "benchmarks/chaos.py", *sys.argv[1:]]),
        "setup": {"minutes": args.minutes, "seed": args.seed, "queues": args.queues, "kv_clients": KV_CLIENTS,
                  "kv_keys": KV_KEYS, "slow_disk": args.slow_disk, "base": str(base)},
        "acknowledged": checked["acknowledged"] if checked else len({seq for ack in writers.acks for seq in ack.seqs}),
        "lost": outcome.get("lost"), "duplicated": checked["duplicates"] if checked else None,
        "duplicated_batches": [list(entry) for entry in checked["duplicated_batches"]][:50] if checked else None,
        "reordered": 0 if checked else (1 if failure and "out of order" in failure else None),
        "early": outcome["delayed"]["early"] if "delayed" in outcome else None, "delayed": outcome.get("delayed"),
        "failure": failure, "problems": outcome["problems"],
        "kv": outcome.get("kv"),
        "faults": dict(collections.Counter(row["kind"] for row in rows)),
        "stall_s": {kind: spread([row["stall_s"] for row in rows if row["kind"] == kind]) for kind in KINDS},
        "rss_slopes": slopes, "rss_slope_max": max(slopes.values(), default=None),
        "writer_errors": dict(writers.errors), "writer_failovers": writers.failovers,
        "writer_resends": writers.resends, "internal_logged": {name: n for name, n in internal.items() if n},
        "tracebacks": {name: log["tracebacks"] for name, log in logs.items() if log["tracebacks"]},
        "logs": logs, "nemesis": rows}


def verdict(result: dict) -> list[str]:
    """What failed, if anything."""
    failed = []
    if result["lost"] != 0 or result["duplicated"] != 0 or result["reordered"] != 0 or result["failure"]:
        failed.append(f"messages: lost {result['lost']}, duplicated {result['duplicated']}, reordered "
                      f"{result['reordered']} ({(result['failure'] or '')[:300]})")
    delayed = result["delayed"]
    if delayed is None or delayed["lost"] or delayed["early"]:
        failed.append(f"delayed messages: {delayed}")
    if result["kv"] is None or result["kv"]["ok"] is not True:
        failed.append(f"KV history not shown linearizable: {result['kv'] and result['kv']['bad_keys']}")
    failed += result["problems"]
    if result["tracebacks"] or result["internal_logged"]:
        failed.append(f"tracebacks {result['tracebacks']}, INTERNAL logged {result['internal_logged']}")
    internal_seen = result["writer_errors"].get("INTERNAL", 0) + (result["kv"] or {}).get("errors", {}).get(
        "INTERNAL", 0)
    if internal_seen:
        failed.append(f"clients were answered INTERNAL {internal_seen} times")
    if result["rss_slope_max"] is not None and result["rss_slope_max"] > RSS_SLOPE_MAX:
        failed.append(f"RSS grew {result['rss_slope_max']:.1%} over the last half ({result['rss_slopes']})")
    return failed


def summary_line(result: dict) -> str:
    kv = result["kv"] or {}
    nonlinear = len(kv.get("bad_keys", [])) if kv else None
    slope = result["rss_slope_max"]
    delayed = result["delayed"] or {}
    lost = result["lost"] + delayed.get("lost", 0) if result["lost"] is not None else None
    return (f"chaos: acked={result['acknowledged'] + delayed.get('acknowledged', 0)} lost={lost} "
            f"dup={result['duplicated']} "
            f"reordered={result['reordered']} early={result['early']} nonlinearizable={nonlinear} "
            f"faults={sum(result['faults'].values())} rss_slope={'-' if slope is None else f'{slope:.1%}'}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=5.0, help="of faults, after a warm-up of WARMUP_S")
    parser.add_argument("--seed", type=int, default=None, help="the fault schedule and the KV clients' choices "
                                                               "(default: random, recorded)")
    parser.add_argument("--queues", type=int, default=8, help="queues of the topic, one writer each")
    parser.add_argument("--no-slow-disk", dest="slow_disk", action="store_false",
                        help="no slowfs under the storage nodes (it needs FUSE)")
    parser.add_argument("--data-parent", type=Path, default=Path(tempfile.gettempdir()))
    parser.add_argument("--keep-data", action="store_true", help="keep the nodes' data dirs (logs are always kept)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    if args.minutes <= 0 or args.queues < 1:
        parser.error("--minutes must be positive and --queues at least 1")
    args.seed = random.randrange(1 << 32) if args.seed is None else args.seed
    base = Path(tempfile.mkdtemp(prefix="chaos-", dir=args.data_parent))
    print(f"chaos: {args.minutes} minutes, seed {args.seed}, in {base}", flush=True)
    result = report(args, base, trio.run(chaos, args, base))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1, default=str) + "\n")
    failed = verdict(result)
    for line in failed:
        print(f"FAILED: {line}", flush=True)
    if not args.keep_data:
        for path in base.glob("data*"):
            shutil.rmtree(path, ignore_errors=True)
        shutil.rmtree(base / "tier", ignore_errors=True)
    print(f"stall p50/p99 per fault kind: " + ", ".join(
        f"{kind} {result['stall_s'][kind].get('p50', '-')}/{result['stall_s'][kind].get('p99', '-')} s"
        for kind in KINDS) + f"; KV {result['kv'] and result['kv']['operations']} operations; {args.out}", flush=True)
    print(summary_line(result), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
