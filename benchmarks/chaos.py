"""Combined faults on the 8-node example cluster (examples/cluster, started as benchmarks/kill_loop.py starts it), for a
given time, under a mixed workload, with the history kept and checked at the end.

Workload, every client reaching the brokers through the same proxies as the nodes do:
- one idempotent writer per queue of a normal topic (tests/integration/test_cluster.py's Writers: a sequential stream
  of numbered batches, failing over between the brokers and resending a batch of unknown outcome as the same request);
- KV clients doing get, put and compare-and-set on a few keys of a two-shard bucket, each operation recorded with its
  invocation and response times (one whose outcome is unknown, cut by a timeout or an error that does not say it was
  refused, is recorded open, and its client goes on under a new id);
- delayed messages (1-10 s) from an idempotent producer, received by a pop consumer group, each first delivery timed;
- transactions: committed, rolled back, or left open for the check-back, read by a pull consumer group whose members
  leave and join again, so that it rebalances;
- FIFO message groups, each sent in order, received by a pop consumer group; their topic is on a controller-mode
  storage class (RIP-44: two replicas, a master and a slave, failed over by the nameservers' controller).
(The last four are benchmarks/chaos_workload.py's.)

Nemesis: a seeded schedule of faults, started every GAP_S and lasting longer, so several hold at once:
- kill: kill -9 of any node, restarted after a short while;
- partition: connections are cut (held, or reset) at the TCP proxies in front of every node (a node advertises its
  proxy's address, and the nameservers' addresses every node is given are their proxies', so its peers and the
  clients reach it only through it; each proxy can cut the callers of given processes alone, faults.py's
  partition_from), in one of three shapes:
  in: every connection into one node (its own outgoing ones pass: one way);
  isolated: one node from every other node and client, both ways;
  split: a minority (a node, with a node of another kind half the time) from the rest and the clients, both ways;
- slow_disk: a storage node's data dir is slowfs (FUSE), whose fsyncs are made N times slower;
- full_disk: that slowfs has 0-48 MiB left, and refuses writes past it (ENOSPC);
- clock: a node's wall clock jumps 2-60 s forward or back (libfaketime, monotonic time untouched), and back again;
- store: the object store the cluster offloads to (moto's S3 server, 1 MiB pieces) fails a quarter of requests (503
  SlowDown, 500), resets, stalls and slows them, or is down, at tests/integration/fault_proxy.py in front of it; the
  normal topic's offloaded data leaves the disks after a minute, so the checks read it back from the store;
- rolling: a quarter of the way in, every node in turn is stopped (SIGTERM), started, and waited for, as an operator
  upgrades.
At the end every fault is healed, every node is running, and the checks run:
- every acknowledged message is consumed once, at its offset, in order per queue (verify_acknowledged);
- every committed transaction's messages are read, no rolled-back one's, none skipped and read later;
- every acknowledged FIFO message arrives, a message group's first in the order they were sent;
- every acknowledged delayed message is delivered, none before its time (but by as much as a storage node's clock was
  ahead then: its timers fire by it);
- the KV history is linearizable (benchmarks/linearizable.py, a Porcupine-style checker, per key);
- every replica holds the same batches of every queue, byte for byte, as far as each has them (compare_replicas);
- no client saw INTERNAL, and no node logged a traceback or an INTERNAL answer;
- every node's RSS over the last half of the run, in each process that ran long enough then, grew by less than
  RSS_SLOPE_MAX.

    python benchmarks/chaos.py --minutes 60 --seed N [--out benchmarks/results/chaos.json] [--no-slow-disk]
        [--no-clock]

One line per fault as it ends, then the figures, and last
`chaos: acked=N lost=L dup=D reordered=R early=E nonlinearizable=X faults=F rss_slope=S%` (acked and lost count
the messages of the four topics, committed ones of the transaction topic; dup the normal topic's, whose consumption
is exactly once in order (the rebalancing group reads at least once: its repeats are a figure); reordered the normal
topic's, the transaction group's and the FIFO groups'; early the delayed ones delivered before their time;
nonlinearizable the KV keys whose history is not). Exit 1 if any check failed.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import dataclasses
import functools
import glob
import hashlib
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
from faults import command_line, start_proxy, start_slowfs, stop_process, unmount, write_control  # noqa: E402
from kill_loop import (NAMES, ClusterNode, first_acks_after, make_cluster, of_kind, scan_logs,  # noqa: E402
                       start_cluster, status_servers, STORAGE_GROUPS)
from chaos_workload import (DELAYED_CONSUMERS, DELAYED_QUEUES, DELAYED_TOPIC, KV_BUCKET, KV_CLIENTS,  # noqa: E402
                            FIFO_QUEUES, FIFO_READERS, FIFO_TOPIC, KV_KEYS, RESEND, TXN_CHECK_S, TXN_QUEUES,
                            TXN_READERS, TXN_TOPIC, WRITE_TIMEOUT_S, Delayed, Fifo, KvClients, Transactions)
from linearizable import check  # noqa: E402

from rocket.client import Admin, connect  # noqa: E402
from rocket.client.kv import KV  # noqa: E402
from rocket.errors import RocketError  # noqa: E402
from rocket.transport.listen import free_ports  # noqa: E402
from tests.integration.fault_proxy import FaultProxy  # noqa: E402
from tests.integration.test_tier_objectstore import SAFE_ENVIRONMENT, MotoServer, s3_store  # noqa: E402
from tests.integration.test_cluster import (Writers, verify_acknowledged,  # noqa: E402
                                            wait_all_groups_led)

RESULTS = ROOT / "benchmarks" / "results" / "chaos.json"
KINDS = ("kill", "partition", "slow_disk", "full_disk", "clock", "store", "rolling")
WARMUP_S = 5.0  # the workload runs alone first
GAP_S = (2.0, 8.0)  # between the starts of two faults
KILL_DOWN_S = (0.5, 5.0)
PARTITION_S = (3.0, 20.0)
PARTITION_SHAPES = ("in", "isolated", "split")
SLOW_DISK_S = (5.0, 30.0)
SLOW_DISK_FACTOR = (5.0, 50.0)
FULL_DISK_S = (5.0, 30.0)
# The free space of a full disk: from none to past limits.disk_reserve_bytes (32 MiB), under which a node refuses data.
FULL_DISK_FREE_MIB = (0.0, 48.0)
CLOCK_S = (5.0, 30.0)
STORE_S = (5.0, 30.0)
# The object store's faults, at tests/integration/fault_proxy.py in front of moto's S3 server: answers 503 SlowDown or
# 500 (a quarter of requests), resets after the store applied a request, stalls and slow bandwidth; or it is down.
STORE_FAULTY = {"error_rate": 0.25, "reset_rate": 0.1, "stall_s": 0.05, "bandwidth_bytes_s": 2_000_000, "down": False}
STORE_DOWN = {"down": True}
STORE_HEALED = {"error_rate": 0.0, "reset_rate": 0.0, "stall_s": 0.0, "bandwidth_bytes_s": 0, "down": False}
TIER_PREFIX = "chaos"
TIER_PIECE_BYTES = 1024 * 1024  # small pieces and a short age, so that queues offload all through a run
TIER_PIECE_AGE_S = 5.0
TIER_LOCAL_RETENTION_S = 60.0  # then the normal topic's offloaded data leaves the disks: the check reads it back cold
CLOCK_JUMP_S = (2.0, 60.0)  # a node's wall clock jumps this far, forward or back, and back again when the fault ends
FAKETIME_LIBRARIES = "/usr/lib/*/faketime/libfaketime.so.1"  # Debian's libfaketime
FAKETIME_CACHE_S = 1  # libfaketime reads its offset file at most this often: a jump takes effect within it
# The rolling restart starts this far into the run: early enough that the processes it starts have warmed up by the
# half, from which RSS must stay flat.
ROLLING_AT = 0.25
ROLLING_READY_S = 60.0  # a rolling restart goes on to the next node once every group is led, or after this
HEAL_S = 10.0  # no fault starts in the run's last this long, so the last ones end inside it
READY_TIMEOUT_S = 120.0  # a restart on the shared 2-core machine, under other faults
SETTLE_TIMEOUT_S = 120.0  # after the last fault: every storage group led again
# After the run, for the last delayed, transactional and FIFO messages (and those a fault held up) to arrive. A pop's
# invisibility runs by its leader's wall clock: a clock CLOCK_JUMP_S ahead holds an unacked message (and, in a FIFO
# group, those behind it) that much longer.
DRAIN_S = 60.0 + CLOCK_JUMP_S[1]
RSS_SAMPLE_S = 2.0
RSS_SLOPE_MAX = 0.10  # growth over the last half of the run, as a share of the mean
RSS_WARMUP_S = 30.0  # a process's first samples once ready, while it fills its caches, are not held against it ...
RSS_SPAN_MIN_S = 100.0  # ... and one whose samples in the last half span less than this is not judged
STOP_WAIT_S = 60.0
RESTART_S = 2.0  # examples/systemd's RestartSec
DISK_FULL_STOP = "stopped: the data disk is full"  # what `rocket run` says as it stops on a store a full disk failed
# The FIFO topic's storage class, beside the default Raft one: RIP-44's controller mode, a master and a slave per group.
HA_CLASS = "chaos-ha"
HA_GROUPS = 4
REPLICA_READ_BYTES = 4 * 1024 * 1024  # one read of a replica's copy, when the copies are compared at the end


@dataclasses.dataclass(frozen=True)
class Fault:
    kind: str
    node: int
    at_s: float  # from the end of the warm-up
    for_s: float
    # slow_disk: the fsync factor; full_disk: MiB left free; clock: the jump, in seconds; partition: 1 resets
    # connections, 0 holds them
    # store: 1 down, 0 failing requests
    severity: float = 0.0
    shape: str = ""  # partition: in, isolated or split
    minority: tuple[int, ...] = ()  # split: the nodes cut from the rest


def plan(seed: int, seconds: float, nodes: dict[int, str], kinds: tuple[str, ...]) -> list[Fault]:
    """The faults of a run, from its seed and kinds alone: a node carries at most one fault of a kind at a time, and
    a rolling restart (if a kind) starts a quarter of the way in."""
    chooser = random.Random(seed)
    storage = [node for node, name in nodes.items() if name.startswith("storage")]
    targets = {"kill": sorted(nodes), "partition": sorted(nodes), "slow_disk": storage, "full_disk": storage,
               "clock": sorted(nodes), "store": storage[:1]}  # the store is one: its faults are numbered as a node's
    spans = {"kill": KILL_DOWN_S, "partition": PARTITION_S, "slow_disk": SLOW_DISK_S, "full_disk": FULL_DISK_S,
             "clock": CLOCK_S, "store": STORE_S}
    drawn = [kind for kind in kinds if kind in spans]
    busy: dict[tuple[str, int], float] = {}
    faults, at = [], chooser.uniform(*GAP_S)
    while at < seconds - HEAL_S:
        kind = chooser.choice(drawn)
        node = chooser.choice(targets[kind])
        for_s = min(chooser.uniform(*spans[kind]), seconds - HEAL_S - at + KILL_DOWN_S[1])
        severity = (chooser.uniform(*SLOW_DISK_FACTOR) if kind == "slow_disk"
                    else chooser.uniform(*FULL_DISK_FREE_MIB) if kind == "full_disk"
                    else chooser.choice((-1, 1)) * chooser.uniform(*CLOCK_JUMP_S) if kind == "clock"
                    else float(chooser.random() < 0.5) if kind in ("partition", "store") else 0.0)
        shape = chooser.choice(PARTITION_SHAPES) if kind == "partition" else ""
        minority = (node,)
        if shape == "split" and chooser.random() < 0.5:
            minority += (chooser.choice([other for other in sorted(nodes) if nodes[other][0] != nodes[node][0]]),)
        if busy.get((kind, node), 0.0) <= at:
            faults.append(Fault(kind, node, round(at, 3), round(for_s, 3), round(severity, 1), shape,
                                minority if shape == "split" else ()))
            busy[(kind, node)] = at + for_s
        at += chooser.uniform(*GAP_S)
    if "rolling" in kinds:
        faults.append(Fault("rolling", min(nodes), round(seconds * ROLLING_AT, 3), 0.0))
        faults.sort(key=lambda fault: fault.at_s)
    return faults


class Proxy:
    """benchmarks/faults.py's TCP proxy in front of a node (a process), on a given port or a free one, and its control
    file."""

    def __init__(self, node: ClusterNode, base: Path, port: int | None = None):
        self.port = port or free_ports(1)[0]
        self.control = base / f"proxy{node.node_id}.json"
        write_control(self.control, {})
        self.process = start_proxy(f"127.0.0.1:{self.port}", node.server, self.control,
                                   base / f"proxy{node.node_id}.log")
        self.address = f"127.0.0.1:{self.port}"
        node.environment["ROCKET_ADVERTISE"] = self.address

    def cut(self, callers: frozenset[str] | None, reset: bool) -> None:
        """Cut the connections of callers (substrings of their command lines; None: every caller), or none."""
        write_control(self.control, {} if callers == frozenset() else {
            "partition": "both", "partition_mode": "reset" if reset else "hold",
            "partition_from": sorted(callers or ())})

    def stop(self) -> None:
        stop_process(self.process.pid)


def caller(node: ClusterNode) -> str:
    """What a node's command line holds and no other's does (its data dir is followed by its next flag)."""
    return f"--data-dir {node.data_dir} "


class Partitions:
    """The partitions in force, which may overlap: each proxy cuts, at once, the callers of every one of them."""

    def __init__(self, nodes: dict[int, ClusterNode], proxies: dict[int, Proxy]):
        self.nodes, self.proxies = nodes, proxies
        self.harness = command_line(os.getpid())  # the clients' process, on the majority's side of a split
        self.active: list[tuple[dict[int, frozenset[str] | None], bool]] = []

    def cuts(self, fault: Fault) -> dict[int, frozenset[str] | None]:
        """proxy -> the callers the partition cuts there (None: all)."""
        if fault.shape == "in":
            return {fault.node: None}
        side = set(fault.minority) if fault.shape == "split" else {fault.node}
        inside = frozenset(caller(self.nodes[node]) for node in side)
        outside = frozenset([self.harness, *(caller(node) for node in self.nodes.values() if node.node_id not in side)])
        if fault.shape == "isolated":
            return {proxy: None if proxy == fault.node else inside for proxy in self.proxies}
        return {proxy: outside if proxy in side else inside for proxy in self.proxies}

    def apply(self, fault: Fault) -> tuple:
        entry = (self.cuts(fault), bool(fault.severity))
        self.active.append(entry)
        self.write()
        return entry

    def heal(self, entry: tuple) -> None:
        self.active.remove(entry)
        self.write()

    def write(self) -> None:
        for proxy in self.proxies:
            cut: frozenset[str] | None = frozenset()
            for cuts, _ in self.active:
                callers = cuts.get(proxy, frozenset())
                cut = None if cut is None or callers is None else cut | callers
            reset = any(proxy in cuts and reset for cuts, reset in self.active)
            self.proxies[proxy].cut(cut, reset)


class SlowDisk:
    """A node's data dir on slowfs (benchmarks/slowfs.py through faults.py), over a backing dir beside it: slow
    fsyncs (factor) and a full disk (free_bytes), each set alone."""

    def __init__(self, node: ClusterNode, base: Path):
        self.mountpoint = node.data_dir
        backing = base / f"{node.data_dir.name}.backing"
        backing.mkdir(parents=True, exist_ok=True)
        self.mountpoint.mkdir(parents=True, exist_ok=True)
        self.control = base / f"slowfs{node.node_id}.json"
        self.settings: dict[str, float] = {"factor": 1, "free_bytes": -1}
        write_control(self.control, self.settings)
        self.process = start_slowfs(backing, self.mountpoint, self.control, base / f"slowfs{node.node_id}.log")

    def set(self, **values: float) -> None:
        self.settings.update(values)
        write_control(self.control, self.settings)

    def stop(self) -> None:
        stop_process(self.process.pid)
        unmount(self.mountpoint)


class FakeClock:
    """A node's wall clock, jumped by libfaketime (preloaded) from an offset file it reads at most every
    FAKETIME_CACHE_S; monotonic time is left alone, as by an NTP step."""

    def __init__(self, node: ClusterNode, base: Path, library: str):
        self.path = base / f"clock{node.node_id}"
        self.jump(0)
        node.environment.update({"LD_PRELOAD": library, "FAKETIME_TIMESTAMP_FILE": str(self.path),
                                 "FAKETIME_DONT_FAKE_MONOTONIC": "1", "FAKETIME_CACHE_DURATION": str(FAKETIME_CACHE_S)})

    def jump(self, offset_s: float) -> None:
        """The node's wall clock is offset_s ahead of the real one (behind if negative) from now on."""
        written = self.path.with_suffix(".tmp")
        written.write_text(f"{offset_s:+.0f}\n")
        written.replace(self.path)


def faketime_library() -> str | None:
    found = sorted(glob.glob(FAKETIME_LIBRARIES))
    return found[0] if found else None


def excused(early: list[tuple[str, int, int]], jumps: list[tuple[int, float, float, float]],
             names: dict[int, str]) -> tuple[list, list]:
    """(early, early_by_clock). A timer fires by its node's wall clock, as RocketMQ's do: a storage node whose clock
    was offset_s ahead from since to until fires a message due at `at` from real time at - offset_s, if that is
    before until, and it is received then or later. An early delivery that one such jump explains is the clock's."""
    ahead = [(offset_s * 1000, since * 1000, until * 1000) for node, offset_s, since, until in jumps
             if offset_s > 0 and names[node].startswith("storage")]
    by_clock = [(key, before_ms, received) for key, before_ms, received in early
                if any(since <= received and received + before_ms - offset <= until and before_ms <= offset
                       for offset, since, until in ahead)]
    return [entry for entry in early if entry not in by_clock], by_clock


async def tier_figures(server: str, store: FaultProxy, moto: MotoServer, bucket: str) -> dict:
    """What the object store's fault proxy did, the pieces the topics' manifests list, and the segment objects beside
    them in the store (orphans: uploads a lost leadership left, which cost space, never data)."""
    async with connect(server) as channel:
        topics = await Admin(channel).tier_status()
    async with s3_store(moto, bucket) as objects:  # straight to moto, not through the faults
        segments = [info.key for info in await objects.list(TIER_PREFIX + "/") if info.key.endswith(".seg")]
    pieces = {spec.name: sum(row["pieces"] for row in rows) for spec, rows in topics}
    return {"proxy": (await trio.to_thread.run_sync(store.faults))["counts"], "pieces": pieces,
            "orphans": len(segments) - sum(pieces.values())}


async def read_copy(server: str, group: int, topic: str, queue: int) -> tuple[dict[int, bytes], int]:
    """One replica's copy of a queue, read whole from that storage node (StorageRead on any replica): base offset ->
    a digest of its batch, and the copy's end."""
    copy, offset = {}, 0
    async with connect(server) as channel:
        while True:
            response = await channel.call("StorageRead", {
                "group": group, "topic": topic, "queues": [{"queue": queue, "offset": offset}],
                "max_bytes": REPLICA_READ_BYTES, "wait_ms": 0, "at_least_one": True, "any_replica": True,
                "follower_ok": False, "tag_mask": -1}, timeout_s=60)
            for batch in response["batches"]:
                copy[batch["base_offset"]] = hashlib.blake2b(batch["batch"], digest_size=16).digest()
            next_offset = response["next_offsets"][0]["offset"] if response["next_offsets"] else offset
            if not response["batches"] or next_offset <= offset:
                return copy, offset
            offset = next_offset


async def compare_replicas(nodes: dict[int, ClusterNode], topics: list[str]) -> dict:
    """Each queue of topics as every replica of its group holds it: below the shortest copy's end, every copy must
    hold the same batches at the same offsets, byte for byte (a replica may lag; none may differ)."""
    storage = {node.node_id: node.server for node in of_kind(nodes, "storage")}
    result: dict = {"queues": 0, "copies": 0, "batches_compared": 0, "differ": []}
    for topic in topics:
        route = None
        for nameserver in of_kind(nodes, "nameserver"):
            with contextlib.suppress(RocketError):
                async with connect(nameserver.server) as channel:
                    route = await channel.call("GetRoute", {"topic": topic})
                    break
        if route is None:
            result["differ"].append(f"{topic}: no nameserver gave its route")
            continue
        voters = {group["id"]: group["voters"] for group in route["groups"]}
        for queue, group in enumerate(route["queue_groups"]):
            copies = [await read_copy(storage[node], group, topic, queue) for node in voters[group]
                      if node in storage]
            compared, first = differ(copies)
            result["queues"] += 1
            result["copies"] += len(copies)
            result["batches_compared"] += compared
            if first is not None:
                result["differ"].append(f"{topic}/{queue} (group {group}): the copies of nodes {voters[group]} "
                                        f"differ from offset {first}")
    return result


def differ(copies: list[tuple[dict[int, bytes], int]]) -> tuple[int, int | None]:
    """(batches compared, the first offset at which copies differ or None). Copies (base offset -> digest, end) are
    compared from where each has batches (one that installed a snapshot may not have backfilled the earlier ones
    yet) to the shortest one's end (a replica may lag)."""
    start = max(min(copy, default=0) for copy, _ in copies)
    end = min(end for _, end in copies)
    shared = [{base: digest for base, digest in copy.items() if start <= base < end} for copy, _ in copies]
    bases = sorted({base for each in shared for base in each})
    first = next((base for base in bases if len({each.get(base) for each in shared}) > 1), None)
    return len(shared[0]), first


async def sample_rss(nodes: dict[int, ClusterNode], samples: list[tuple[float, int, int, int]]) -> None:
    """(time, node, start number, RSS bytes) of every running node that printed its ready line, every RSS_SAMPLE_S:
    a restarted storage node replays its log and catches up before it is ready, which took up to 3 minutes late in
    the hour-long runs, and its RSS grows while it does."""
    ready: set[tuple[int, int]] = set()
    while True:
        for node in nodes.values():
            if (node.node_id, node.starts) not in ready and node.started_ready():
                ready.add((node.node_id, node.starts))
            if (node.node_id, node.starts) in ready and node.process is not None and node.process.poll() is None:
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
    """node -> the most its RSS grew over the last half, in any one of its processes, as a share of the mean (least
    squares over the process's samples from the half on, past its first RSS_WARMUP_S, where they span at least
    RSS_SPAN_MIN_S: in a long run every node is restarted in the last half, some more than once)."""
    processes: dict[tuple[int, int], list[tuple[float, int]]] = {}
    for at, node, start, rss in samples:
        processes.setdefault((node, start), []).append((at, rss))
    slopes: dict[int, float] = {}
    for (node, _), mine in processes.items():
        points = [(at, rss) for at, rss in mine if at >= max(half_at, mine[0][0] + RSS_WARMUP_S)]
        if len(points) < 3 or points[-1][0] - points[0][0] < RSS_SPAN_MIN_S:
            continue
        mean_at = sum(at for at, _ in points) / len(points)
        mean_rss = sum(rss for _, rss in points) / len(points)
        slope = (sum((at - mean_at) * (rss - mean_rss) for at, rss in points)
                 / max(1e-9, sum((at - mean_at) ** 2 for at, _ in points)))
        slopes[node] = max(slopes.get(node, -1.0), round(slope * (points[-1][0] - points[0][0]) / mean_rss, 4))
    return slopes


def said_last(node: ClusterNode) -> list[str]:
    """The last error line `rocket run` printed since the node's latest start (a list of one, or empty)."""
    this_start = node.log_path.read_text(errors="replace").rsplit("\n---- start ", 1)[-1]
    return [line for line in this_start.splitlines() if line.startswith("error:")][-1:]


class Nemesis:
    """Applies the planned faults, each in its own task, and heals them; records when each held. A node is stopped
    and started by one fault at a time (a kill, or a rolling restart's turn): a kill while it starts is allowed."""

    def __init__(self, nodes: dict[int, ClusterNode], proxies: dict[int, Proxy], disks: dict[int, SlowDisk],
                 clocks: dict[int, FakeClock], store: FaultProxy | None, writers: Writers):
        self.nodes, self.disks, self.clocks, self.store, self.writers = nodes, disks, clocks, store, writers
        self.partitions = Partitions(nodes, proxies)
        self.done: list[dict] = []
        self.problems: list[str] = []
        self.kills: collections.Counter = collections.Counter()  # node -> kills so far
        self.down = {node: trio.Lock() for node in nodes}  # held while a fault has the node stopped
        self.jumps: list[tuple[int, float, float, float]] = []  # (node, offset s, from, until: epoch s) of clocks
        self.exits: list[dict] = []  # nodes that stopped by themselves, and what they said last

    async def supervise(self) -> None:
        """As systemd's Restart=on-failure (examples/systemd): a node that stopped by itself, while no fault has it
        stopped, is started again RESTART_S later. A stop that says the data disk is full is one rocket makes on
        purpose; any other is a problem."""
        while True:
            await trio.sleep(0.5)
            for node in self.nodes.values():
                process = node.process
                if process is None or process.poll() is None or self.down[node.node_id].locked():
                    continue
                async with self.down[node.node_id]:
                    if node.process is not process:  # a fault started it again meanwhile
                        continue
                    said = said_last(node)
                    self.exits.append({"node": node.name, "status": process.returncode, "said": said})
                    print(f"{node.name} stopped by itself ({process.returncode}): {said}", flush=True)
                    if not (said and DISK_FULL_STOP in said[0]):
                        self.problems.append(f"{node.name} stopped by itself ({process.returncode}): {said}")
                    await trio.sleep(RESTART_S)
                    node.start()  # one that stops again (its disk still full) is seen again here

    async def run(self, faults: list[Fault]) -> None:
        started = trio.current_time()
        async with trio.open_nursery() as nursery:
            for fault in faults:
                await trio.sleep_until(started + fault.at_s)
                nursery.start_soon(self.apply, fault)

    async def apply(self, fault: Fault) -> None:
        node = self.nodes[fault.node]
        row = {"kind": fault.kind, "node": node.name, "for_s": fault.for_s, "severity": fault.severity,
               "shape": fault.shape, "minority": [self.nodes[each].name for each in fault.minority]}
        acks_before = len(self.writers.acks)
        began = trio.current_time()
        if fault.kind == "kill":
            async with self.down[fault.node]:
                self.kills[fault.node] += 1
                node.kill()  # also while it restarts from an earlier kill: that kill's wait for it ends then
                await trio.sleep(fault.for_s)
                node.start()
            await self.wait_back(node, "a kill")
        elif fault.kind == "partition":
            entry = self.partitions.apply(fault)
            await trio.sleep(fault.for_s)
            self.partitions.heal(entry)
        elif fault.kind == "slow_disk":
            self.disks[fault.node].set(factor=fault.severity)
            await trio.sleep(fault.for_s)
            self.disks[fault.node].set(factor=1)
        elif fault.kind == "full_disk":
            self.disks[fault.node].set(free_bytes=int(fault.severity * 1024 * 1024))
            await trio.sleep(fault.for_s)
            self.disks[fault.node].set(free_bytes=-1)
        elif fault.kind == "clock":
            self.clocks[fault.node].jump(fault.severity)
            jumped = time.time()
            await trio.sleep(fault.for_s)
            self.clocks[fault.node].jump(0)
            self.jumps.append((fault.node, fault.severity, jumped, time.time() + FAKETIME_CACHE_S))
        elif fault.kind == "store":
            assert self.store is not None
            await trio.to_thread.run_sync(functools.partial(
                self.store.faults, **(STORE_DOWN if fault.severity else STORE_FAULTY)))
            await trio.sleep(fault.for_s)
            await trio.to_thread.run_sync(functools.partial(self.store.faults, **STORE_HEALED))
        else:
            await self.rolling()
        first = first_acks_after(self.writers, acks_before, began)
        row["stall_s"] = round(max((at - began for at in first.values()), default=0.0), 3)
        row["ended_s"] = round(trio.current_time() - began, 3)
        self.done.append(row)
        what = {"rolling": "all nodes", "store": "the object store"}.get(fault.kind, node.name)
        print(f"fault {len(self.done):3d}: {fault.kind} {what}"
              + (f" for {fault.for_s:.1f} s" if fault.kind != "rolling" else f", {row['ended_s']:.1f} s")
              + (f" (x{fault.severity:.0f})" if fault.kind == "slow_disk" else "")
              + (f" ({fault.severity:.0f} MiB free)" if fault.kind == "full_disk" else "")
              + (f" ({fault.severity:+.0f} s)" if fault.kind == "clock" else "")
              + ((" (down)" if fault.severity else " (failing)") if fault.kind == "store" else "")
              + (f" ({fault.shape}{', reset' if fault.severity else ''})" if fault.kind == "partition" else "")
              + (f" with {', '.join(self.nodes[node].name for node in fault.minority[1:])}"
                 if fault.minority[1:] else "")
              + f"; writers' longest stall {row['stall_s']:.2f} s", flush=True)

    async def wait_back(self, node: ClusterNode, after: str) -> None:
        """Until the node started last is ready; a problem if it is not, unless it was stopped again meanwhile."""
        kills, starts = self.kills[node.node_id], node.starts
        try:
            await node.wait_ready(READY_TIMEOUT_S)
        except (AssertionError, trio.TooSlowError) as error:
            stopped_full = node.process is not None and node.process.poll() is not None and any(
                DISK_FULL_STOP in line for line in said_last(node))  # supervise starts it again
            if (self.kills[node.node_id], node.starts) == (kills, starts) and not stopped_full:
                self.problems.append(f"{node.name} did not come back after {after}: {str(error)[-1000:]}")

    async def rolling(self) -> None:
        """Every node in turn, as an operator upgrades a cluster: SIGTERM, a clean exit, a start, and on to the next
        once it is ready and every storage group is led (or after ROLLING_READY_S)."""
        storage = {node.node_id for node in of_kind(self.nodes, "storage")}
        for node in self.nodes.values():
            async with self.down[node.node_id]:
                with trio.move_on_after(READY_TIMEOUT_S):  # a node a kill restarted is let start first
                    while not node.started_ready():
                        await trio.sleep(0.1)
                process = node.process
                if process is not None and process.poll() is None:
                    process.terminate()
                    with trio.move_on_after(STOP_WAIT_S):
                        while process.poll() is None:
                            await trio.sleep(0.05)
                    if process.poll() is None:
                        self.problems.append(f"{node.name} did not stop within {STOP_WAIT_S:.0f} s of SIGTERM")
                        node.kill()
                    elif process.returncode != 0:
                        self.problems.append(f"{node.name} exited with {process.returncode} on SIGTERM")
                node.start()
            await self.wait_back(node, "a rolling restart")
            with contextlib.suppress(trio.TooSlowError):
                await wait_all_groups_led(status_servers(self.nodes), storage, ROLLING_READY_S,
                                          groups=STORAGE_GROUPS + HA_GROUPS)


async def work(args: argparse.Namespace, nodes: dict[int, ClusterNode], writers: Writers, kv: KvClients,
               delayed: Delayed, transactions: Transactions, fifo: Fifo, nemesis: Nemesis, faults: list[Fault],
               started: float) -> None:
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
        working.start_soon(transactions.produce, args.seed)
        for server in transactions.servers:
            working.start_soon(transactions.check_backs, server)
        for index in range(TXN_READERS):
            working.start_soon(transactions.consume, index)
        working.start_soon(fifo.produce, args.seed)
        for index in range(FIFO_READERS):
            working.start_soon(fifo.consume, index)
        await trio.sleep(WARMUP_S)
        await nemesis.run(faults)
        await trio.sleep_until(started + WARMUP_S + args.minutes * 60)
        storage = {node.node_id for node in of_kind(nodes, "storage")}
        await wait_all_groups_led(status_servers(nodes), storage, SETTLE_TIMEOUT_S, groups=STORAGE_GROUPS + HA_GROUPS)
        writers.stop.set()
        kv.stop.set()
        delayed.stop.set()
        transactions.stop.set()
        fifo.stop.set()
        with trio.fail_after(STOP_WAIT_S):
            while writers.done < len(queues):
                await trio.sleep(0.1)
        async with trio.open_nursery() as draining:
            draining.start_soon(delayed.drain, DRAIN_S)
            draining.start_soon(transactions.drain, DRAIN_S)
            draining.start_soon(fifo.drain, DRAIN_S)


async def chaos(args: argparse.Namespace, base: Path) -> dict:
    nameserver_ports = dict(zip([node for node, name in NAMES.items() if name.startswith("ns")], free_ports(3)))
    nodes = make_cluster(base, nameserver_ports)  # every node reaches the nameservers through their proxies
    names = {node.node_id: node.name for node in nodes.values()}
    seconds = args.minutes * 60
    faults = plan(args.seed, seconds, names, args.kinds)
    proxies: dict[int, Proxy] = {}
    disks: dict[int, SlowDisk] = {}
    clocks: dict[int, FakeClock] = {}
    moto, store, bucket = None, None, ""
    samples: list[tuple[float, int, int, int]] = []
    outcome: dict = {"faults_planned": len(faults), "problems": []}
    try:
        for node in nodes.values():
            node.environment["ROCKET_TRANSACTION_CHECK_S"] = str(TXN_CHECK_S)
            proxies[node.node_id] = Proxy(node, base, nameserver_ports.get(node.node_id))
            if node.kind == "storage" and "slow_disk" in args.kinds:
                disks[node.node_id] = SlowDisk(node, base)
            if "clock" in args.kinds:
                clocks[node.node_id] = FakeClock(node, base, args.faketime)
        if "store" in args.kinds:  # the cluster offloads to moto's S3 server through the fault proxy
            moto = MotoServer(free_ports(1)[0], base / "moto.log").start()
            bucket = moto.create_bucket()
            store = FaultProxy(free_ports(1)[0], f"127.0.0.1:{moto.port}", base / "store-proxy.log", args.seed).start()
            for node in nodes.values():
                node.environment.update({**SAFE_ENVIRONMENT, "ROCKET_TIER_BACKEND": "s3",
                                         "ROCKET_TIER_S3_ENDPOINT": store.url, "ROCKET_TIER_S3_BUCKET": bucket,
                                         "ROCKET_TIER_S3_PREFIX": TIER_PREFIX,
                                         "ROCKET_TIER_PIECE_BYTES": str(TIER_PIECE_BYTES),
                                         "ROCKET_TIER_PIECE_AGE_S": str(TIER_PIECE_AGE_S)})
        # The clients too reach the brokers through their proxies: a partitioned broker is cut from them as well.
        brokers = {node.node_id: proxies[node.node_id].address for node in of_kind(nodes, "broker")}
        writers = Writers(brokers, timeout_s=WRITE_TIMEOUT_S, failover=RESEND)
        kv = KvClients(list(brokers.values()), args.seed)
        delayed = Delayed(list(brokers.values()))
        transactions = Transactions(list(brokers.values()))
        fifo = Fifo(list(brokers.values()))
        await start_cluster(nodes, args.queues)
        async with connect(of_kind(nodes, "broker")[0].server) as channel:
            await KV(channel).create_bucket(KV_BUCKET, shards=2)
            if store is not None:
                await Admin(channel).update_topic("orders", local_retention_s=TIER_LOCAL_RETENTION_S)
            await Admin(channel).create_topic(DELAYED_TOPIC, DELAYED_QUEUES, message_type="delay")
            await Admin(channel).create_topic(TXN_TOPIC, TXN_QUEUES, message_type="transaction")
            await Admin(channel).create_storage_class(HA_CLASS, "controller", replicas=2, groups=HA_GROUPS)
            await Admin(channel).create_topic(FIFO_TOPIC, FIFO_QUEUES, message_type="fifo", storage_class=HA_CLASS)
        print(f"cluster up; {len(faults)} faults planned over {seconds:.0f} s; logs in {base}", flush=True)
        nemesis = Nemesis(nodes, proxies, disks, clocks, store, writers)
        started = trio.current_time()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(sample_rss, nodes, samples)
            nursery.start_soon(nemesis.supervise)
            try:
                await work(args, nodes, writers, kv, delayed, transactions, fifo, nemesis, faults, started)
            except Exception as error:  # a client's unexpected error, a cluster that did not settle, a stuck writer
                outcome["problems"].append(f"the run aborted: {type(error).__name__}: {error!r}"[:2000])
            nursery.cancel_scope.cancel()
        outcome["writers"] = writers
        outcome["transactions"] = transactions.outcome()
        outcome["fifo"] = fifo.outcome()
        early, by_clock = excused(delayed.early, nemesis.jumps, names)
        outcome["delayed"] = {"acknowledged": len(delayed.acked), "delivered": len(delayed.received),
                              "lost": len(delayed.lost()), "lost_first": delayed.lost()[:20],
                              "early": len(early), "early_first": early[:20], "early_by_clock": len(by_clock),
                              "early_by_clock_first": by_clock[:20], "errors": dict(delayed.errors)}
        outcome["half_at"] = started + WARMUP_S + seconds / 2
        outcome["rss_slopes"] = rss_slopes(samples, outcome["half_at"])
        with open(base / "rss.csv", "w") as rss:  # for a look at a slope the check did not like
            rss.write("seconds,node,start,rss_bytes\n")
            rss.writelines(f"{at - started:.1f},{node},{start},{size}\n" for at, node, start, size in samples)
        outcome["nemesis"] = nemesis.done
        outcome["exits"] = nemesis.exits
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
        try:
            outcome["replicas"] = await compare_replicas(nodes, ["orders", DELAYED_TOPIC, TXN_TOPIC, FIFO_TOPIC])
        except RocketError as error:
            outcome["replicas"] = {"differ": [f"the copies could not be read: {error}"]}
        if store is not None:
            assert moto is not None
            outcome["store"] = await tier_figures(of_kind(nodes, "broker")[0].server, store, moto, bucket)
        linear = await trio.to_thread.run_sync(check, kv.history)
        outcome["kv"] = {"operations": len(kv.history), "open": sum(op.completed is None for op in kv.history),
                         "ok": linear.ok, "bad_keys": linear.bad_keys, "timed_out_keys": linear.timed_out_keys,
                         "details": linear.details, "errors": dict(kv.errors)}
    finally:
        for node in nodes.values():
            node.kill()
        for tool in [*proxies.values(), *disks.values(), store, moto]:
            if tool is not None:
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
                  "kv_keys": KV_KEYS, "kinds": list(args.kinds), "base": str(base)},
        "acknowledged": checked["acknowledged"] if checked else len({seq for ack in writers.acks for seq in ack.seqs}),
        "lost": outcome.get("lost"), "duplicated": checked["duplicates"] if checked else None,
        "duplicated_batches": [list(entry) for entry in checked["duplicated_batches"]][:50] if checked else None,
        "reordered": 0 if checked else (1 if failure and "out of order" in failure else None),
        "early": outcome["delayed"]["early"] if "delayed" in outcome else None, "delayed": outcome.get("delayed"),
        "transactions": outcome.get("transactions"), "fifo": outcome.get("fifo"), "store": outcome.get("store"),
        "failure": failure, "problems": outcome["problems"], "replicas": outcome.get("replicas"),
        "kv": outcome.get("kv"),
        "faults": dict(collections.Counter(row["kind"] for row in rows)),
        "partitions": dict(collections.Counter(row["shape"] for row in rows if row["kind"] == "partition")),
        "stall_s": {kind: spread([row["stall_s"] for row in rows if row["kind"] == kind]) for kind in KINDS},
        "rss_slopes": slopes, "rss_slope_max": max(slopes.values(), default=None),
        "writer_errors": dict(writers.errors), "writer_failovers": writers.failovers,
        "writer_resends": writers.resends, "internal_logged": {name: n for name, n in internal.items() if n},
        "tracebacks": {name: log["tracebacks"] for name, log in logs.items() if log["tracebacks"]},
        "logs": logs, "nemesis": rows, "exits": outcome.get("exits", [])}


def verdict(result: dict) -> list[str]:
    """What failed, if anything."""
    failed = []
    if result["lost"] != 0 or result["duplicated"] != 0 or result["reordered"] != 0 or result["failure"]:
        failed.append(f"messages: lost {result['lost']}, duplicated {result['duplicated']}, reordered "
                      f"{result['reordered']} ({(result['failure'] or '')[:300]})")
    delayed = result["delayed"]
    if delayed is None or delayed["lost"] or delayed["early"]:
        failed.append(f"delayed messages: {delayed}")
    transactions = result["transactions"]
    if transactions is None or transactions["lost"] or transactions["leaked"] or transactions["reordered"]:
        failed.append(f"transactions: {transactions}")
    fifo = result["fifo"]
    if fifo is None or fifo["lost"] or fifo["reordered"]:
        failed.append(f"FIFO message groups: {fifo}")
    if result["kv"] is None or result["kv"]["ok"] is not True:
        failed.append(f"KV history not shown linearizable: {result['kv'] and result['kv']['bad_keys']}")
    failed += result["problems"]
    if result["store"] is not None and result["store"]["orphans"] < 0:
        failed.append(f"the store holds {-result['store']['orphans']} segment objects fewer than the manifests list")
    replicas = result["replicas"]
    if replicas is None or replicas["differ"]:
        failed.append(f"replicas' copies: {replicas and replicas['differ'][:10]}")
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
    delayed, transactions, fifo = result["delayed"] or {}, result["transactions"] or {}, result["fifo"] or {}
    acked = (result["acknowledged"] + delayed.get("acknowledged", 0) + transactions.get("committed_messages", 0)
             + fifo.get("acknowledged", 0))
    lost = (result["lost"] + delayed.get("lost", 0) + transactions.get("lost", 0) + fifo.get("lost", 0)
            if result["lost"] is not None else None)
    reordered = (result["reordered"] + transactions.get("reordered", 0) + fifo.get("reordered", 0)
                 if result["reordered"] is not None else None)
    return (f"chaos: acked={acked} lost={lost} dup={result['duplicated']} reordered={reordered} "
            f"early={result['early']} nonlinearizable={nonlinear} "
            f"faults={sum(result['faults'].values())} rss_slope={'-' if slope is None else f'{slope:.1%}'}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=5.0, help="of faults, after a warm-up of WARMUP_S")
    parser.add_argument("--seed", type=int, default=None, help="the fault schedule and the KV clients' choices "
                                                               "(default: random, recorded)")
    parser.add_argument("--queues", type=int, default=8, help="queues of the topic, one writer each")
    parser.add_argument("--no-slow-disk", dest="slow_disk", action="store_false",
                        help="no slowfs under the storage nodes (it needs FUSE): no slow or full disks")
    parser.add_argument("--no-clock", dest="clock", action="store_false",
                        help="no clock jumps (they need libfaketime, Debian's libfaketime)")
    parser.add_argument("--no-store", dest="store", action="store_false",
                        help="no object store (moto's S3 server, of the test extra): the tier stays a local directory")
    parser.add_argument("--data-parent", type=Path, default=Path(tempfile.gettempdir()))
    parser.add_argument("--keep-data", action="store_true", help="keep the nodes' data dirs (logs are always kept)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    if args.minutes <= 0 or args.queues < 1:
        parser.error("--minutes must be positive and --queues at least 1")
    args.seed = random.randrange(1 << 32) if args.seed is None else args.seed
    args.faketime = faketime_library()
    if args.clock and args.faketime is None:
        parser.error(f"no libfaketime at {FAKETIME_LIBRARIES} for the clock jumps: install it, or pass --no-clock")
    args.kinds = tuple(kind for kind in KINDS if (args.slow_disk or kind not in ("slow_disk", "full_disk"))
                       and (args.clock or kind != "clock") and (args.store or kind != "store"))
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
