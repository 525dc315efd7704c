"""KV catch-up through a streamed snapshot: three all-role `rocket run` processes (3 storage groups, 3 replicas) take
~2 GiB of KV state in one bucket (16 KiB values, so the key count stays moderate), enough that every group has
compacted its log into a snapshot file. Node 3 is drained and a fourth node (storage, broker) starts: the nameserver
moves every group's replica from node 3 to node 4, which cannot replay the log from entry 1 and must fetch and
install the leaders' snapshot files (RaftSnapshotChunk, in resumable ranges). Mid-transfer the TCP connections of
node 4 are dropped (`ss -K`; --drop kill instead SIGKILLs node 4 and starts it again on its data directory). The
run ends once node 4 is a voter of every group and each shard's digest on node 4 (a serializable StorageKvRead)
equals the leader's, and a sample of keys read from node 4 holds the values written.

It shows how long the catch-up takes and at what rate, the snapshot files' sizes, the peak RSS of the sending
leaders and of node 4 during the transfer, how long node 4 stops answering while it installs a snapshot (a Ping
every 0.25 s), whether the drop came mid-file and how many bytes had arrived, and the errors in the node logs.
Writes benchmarks/results/kv_catchup.json; node logs stay in the run's directory under --data-parent.

    PYTHONPATH=. python benchmarks/kv_catchup.py [--gib 2] [--value-kib 16] [--writers 4] [--drop ss|kill|none]
        [--drop-at 0.4] [--write-during-mib-s 0] [--data-parent /tmp] [--keep-data]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import trio

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the tests' cluster harness, whatever the current directory

from rocket.client import connect  # noqa: E402
from rocket.client.kv import KV  # noqa: E402
from rocket.errors import RocketError  # noqa: E402
from rocket.model import shard_of  # noqa: E402
from rocket.transport.listen import free_ports  # noqa: E402
from tests.integration.test_cluster import Node as ClusterNode  # noqa: E402
from tests.integration.test_cluster import cluster_status  # noqa: E402
BUCKET = "catchup"
GROUPS = 3
REPLICATION = 3
NAMESERVERS = (1, 2, 3)
NEW, DRAINED = 4, 3
PUTS_PER_TXN = 64  # 64 x 16 KiB = 1 MiB of values per transaction (a transaction holds at most 4 MiB)
POOL = 64  # distinct random value bodies: values do not compress (LevelDB uses snappy), and are cheap to make
LOG_TIME = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3}) ")


# ---- processes -----------------------------------------------------------------------------------------------

class Node(ClusterNode):
    """The integration tests' `rocket run` process (tests/integration/test_cluster.py), with this benchmark's groups,
    its pid, and a graceful stop."""

    def __init__(self, node_id: int, port: int, nameservers: str, base: Path, roles: str):
        super().__init__(node_id, port, nameservers, base, roles, {
            "ROCKET_STORAGE_GROUPS": str(GROUPS), "ROCKET_REPLICATION": str(REPLICATION),
            "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")})

    @property
    def pid(self) -> int:
        return self.process.pid

    async def wait_ready(self, timeout_s: float = 60.0) -> None:
        await super().wait_ready(timeout_s)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.kill()

    def snapshot_dir(self) -> Path | None:
        return next((path for path in self.data_dir.rglob("snapshots") if path.is_dir()), None)

    def snapshot_files(self) -> dict[str, int]:
        """File name -> bytes, of the node's snapshots directory (.snap, .part, .tmp)."""
        directory = self.snapshot_dir()
        if directory is None:
            return {}
        found = {}
        for path in list(directory.iterdir()):
            try:
                found[path.name] = path.stat().st_size
            except FileNotFoundError:
                pass
        return found

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


def proc_status(pid: int) -> dict[str, int]:
    """VmRSS, VmHWM, RssAnon (its own memory) and RssFile (pages of files it maps: LevelDB maps its tables) of a
    process, in bytes ({} once it is gone)."""
    try:
        lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    except OSError:
        return {}
    return {line.split(":")[0]: int(line.split()[1]) * 1024 for line in lines if line.startswith(("VmRSS", "VmHWM", "RssAnon", "RssFile"))}


class RssSampler:
    """Samples the nodes' VmRSS and RssAnon every 0.2 s in a thread; peak[node] and anonymous[node] are the largest
    seen since reset()."""

    def __init__(self, nodes: dict[int, Node]):
        self.nodes, self.peak, self.anonymous, self._stop = nodes, {}, {}, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def reset(self) -> None:
        self.peak, self.anonymous = {}, {}

    def _run(self) -> None:
        while not self._stop.wait(0.2):
            for node in self.nodes.values():
                if node.process is not None and node.process.poll() is None:
                    status = proc_status(node.pid)
                    self.peak[node.node_id] = max(self.peak.get(node.node_id, 0), status.get("VmRSS", 0))
                    self.anonymous[node.node_id] = max(self.anonymous.get(node.node_id, 0), status.get("RssAnon", 0))

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def drop_connections(pid: int, port: int) -> list[str]:
    """Kill (ss -K, in one call) every TCP connection of the process: those into its listening port and those it
    opened. The sockets destroyed (both ends of a loopback connection), as ss lists them."""
    ports = {port}
    listing = subprocess.run(["ss", "-tnpH"], capture_output=True, text=True).stdout
    for line in listing.splitlines():
        fields = line.split()
        if f"pid={pid}," in line and fields[0] == "ESTAB":
            ports.add(int(fields[3].rsplit(":", 1)[1]))
    match = " or ".join(f"sport = :{each} or dport = :{each}" for each in sorted(ports))
    result = subprocess.run(["ss", "-K", "-tnH", f"( {match} )"], capture_output=True, text=True)
    if result.returncode:
        raise RuntimeError(f"ss -K failed: {result.stderr}")
    return [" ".join(line.split()[3:5]) for line in result.stdout.splitlines() if line.strip()]


# ---- values ----------------------------------------------------------------------------------------------------

def make_pool(value_bytes: int) -> list[bytes]:
    generator = random.Random(29)
    return [generator.randbytes(value_bytes) for _ in range(POOL)]


def key_of(index: int) -> str:
    return f"k{index:08}"


def value_of(pool: list[bytes], index: int) -> bytes:
    stamp = key_of(index).encode().ljust(16, b".")
    return stamp + pool[index % POOL][len(stamp):]


# ---- cluster calls ---------------------------------------------------------------------------------------------

async def wait_status(servers: list[str], condition, timeout_s: float, what: str) -> dict:
    last = None
    with trio.move_on_after(timeout_s):
        while True:
            status = await cluster_status(servers)
            if status is not None:
                last = status
                if condition(status):
                    return status
            await trio.sleep(0.25)
    raise RuntimeError(f"{what}: not reached after {timeout_s} s; last status "
                       f"{None if last is None else {'groups': last['groups'], 'moving': last['moving']}}")


async def load(servers: list[str], keys: int, shards: int, writers: int, pool: list[bytes]) -> float:
    """Put keys k00000000.. with the pool's values, PUTS_PER_TXN per transaction (each on one shard); each writer
    on one node's broker, in turn."""
    started = time.monotonic()
    done = [0]
    per_writer = -(-keys // writers)

    async def writer(number: int) -> None:
        async with connect(servers[number % len(servers)], serde="avro") as channel:
            kv = KV(channel)
            pending: dict[int, list[dict]] = {}

            async def send(ops: list[dict]) -> None:
                await kv.txn(BUCKET, [], ops)
                done[0] += len(ops)

            for index in range(number * per_writer, min(keys, (number + 1) * per_writer)):
                key = key_of(index)
                ops = pending.setdefault(shard_of(key, shards), [])
                ops.append({"op": "put", "key": key, "value": value_of(pool, index)})
                if len(ops) == PUTS_PER_TXN:
                    await send(list(ops))
                    ops.clear()
            for ops in pending.values():
                if ops:
                    await send(ops)

    async def progress() -> None:
        while True:
            await trio.sleep(15)
            elapsed = time.monotonic() - started
            print(f"  load: {done[0]}/{keys} keys after {elapsed:.0f} s "
                  f"({done[0] * len(pool[0]) / elapsed / 2**20:.1f} MiB/s)", flush=True)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(progress)
        async with trio.open_nursery() as writing:
            for number in range(writers):
                writing.start_soon(writer, number)
        nursery.cancel_scope.cancel()
    return time.monotonic() - started


async def describe(server: str) -> dict:
    async with connect(server) as channel:
        return await KV(channel).describe_bucket(BUCKET)


async def shard_digest_on(server: str, group: int, shard: int) -> dict:
    """The shard's digest as this node's replica holds it (a serializable read: served by a replica in sync)."""
    async with connect(server) as channel:
        return await channel.call("StorageKvRead", {"group": group, "bucket": BUCKET, "shard": shard, "op": "digest",
                                                    "serializable": True}, timeout_s=60)


async def read_on(server: str, group: int, shard: int, key: str) -> bytes | None:
    async with connect(server) as channel:
        found = await channel.call("StorageKvRead", {"group": group, "bucket": BUCKET, "shard": shard, "op": "get",
                                                     "key": key, "serializable": True}, timeout_s=30)
    return found["entries"][0]["value"] if found["entries"] else None


class Pinger:
    """Pings a node every 0.25 s; the longest answer (or silence) while it ran, and when."""

    def __init__(self, node: Node):
        self.node, self.longest_s, self.longest_at, self.failures, self.pings = node, 0.0, None, 0, 0

    async def run(self) -> None:
        while True:
            started = time.monotonic()
            try:
                with trio.move_on_after(120):
                    async with connect(self.node.server) as channel:
                        while True:
                            sent = time.monotonic()
                            await channel.call("Ping", {}, timeout_s=120)
                            self._saw(time.monotonic() - sent, sent)
                            await trio.sleep(0.25)
            except RocketError:
                self.failures += 1
                self._saw(time.monotonic() - started, started)
                await trio.sleep(0.25)

    def _saw(self, seconds: float, at: float) -> None:
        self.pings += 1
        if seconds > self.longest_s:
            self.longest_s, self.longest_at = seconds, time.strftime("%H:%M:%S", time.localtime(
                time.time() - (time.monotonic() - at)))


def log_events(text: str) -> list[tuple[str, str]]:
    """(time, message) of node 4's snapshot lines."""
    wanted = ("fetching snapshot", "fetched snapshot", "not fetched", "taken from the snapshot",
              "installed a snapshot", "replica moved", "resumes at byte")
    events = []
    for line in text.splitlines():
        if any(word in line for word in wanted):
            found = LOG_TIME.match(line)
            events.append((f"{found.group(1)[11:]}.{found.group(2)}" if found else "", line[24:].strip()))
    return events


def log_problems(nodes: dict[int, Node]) -> dict[int, dict]:
    problems = {}
    for node in nodes.values():
        text = node.log_text()
        errors = [line for line in text.splitlines() if "Traceback" in line or " ERROR " in line or "CRITICAL" in line]
        warnings = [line for line in text.splitlines() if " WARNING " in line]
        if errors or warnings:
            problems[node.node_id] = {"errors": len(errors), "error_lines": errors[:8], "warnings": len(warnings),
                                      "warning_kinds": sorted({re.sub(r"\d+", "N", line[24:])[:110]
                                                               for line in warnings})[:12]}
    return problems


# ---- the run ---------------------------------------------------------------------------------------------------

async def run(arguments, base: Path) -> dict:
    ports = dict(zip((1, 2, 3, 4), free_ports(4)))
    nameservers = ",".join(f"{node}@127.0.0.1:{ports[node]}" for node in NAMESERVERS)
    nodes = {node: Node(node, ports[node], nameservers, base, "all" if node in NAMESERVERS else "storage,broker")
             for node in (1, 2, 3, 4)}
    result: dict = {"gib": arguments.gib, "value_bytes": arguments.value_kib * 1024, "groups": GROUPS,
                    "replication": REPLICATION, "drop_mode": arguments.drop, "cpus": os.cpu_count(),
                    "run_directory": str(base)}
    sampler = RssSampler(nodes)
    try:
        for node in NAMESERVERS:
            nodes[node].start()
        for node in NAMESERVERS:
            await nodes[node].wait_ready()
        servers = [nodes[node].server for node in NAMESERVERS]
        async with connect(servers[0]) as channel:  # the groups are made with the first topic or bucket
            await channel.call("KvCreateBucket", {"bucket": BUCKET, "shards": arguments.shards, "history": 1,
                                                  "ttl_ms": 0}, timeout_s=30)
        await wait_status(servers, lambda status: len(status["groups"]) == GROUPS and all(
            group["leader"] in NAMESERVERS for group in status["groups"]), 60, "groups led")
        print(f"cluster up on ports {ports}; run directory {base}", flush=True)

        # 2. load
        value_bytes = arguments.value_kib * 1024
        keys = int(arguments.gib * 2**30 / value_bytes)
        pool = make_pool(value_bytes)
        load_s = await load(servers, keys, arguments.shards, arguments.writers, pool)
        result.update(keys=keys, value_bytes_total=keys * value_bytes, load_s=round(load_s, 1),
                      load_mib_s=round(keys * value_bytes / load_s / 2**20, 1))
        print(f"loaded {keys} keys ({keys * value_bytes / 2**30:.2f} GiB of values) in {load_s:.0f} s", flush=True)
        before = await describe(servers[0])
        groups = sorted({shard["group"] for shard in before["shards"]})
        result["shards"] = [{key: shard[key] for key in ("shard", "group", "keys", "bytes", "revision", "digest")}
                            for shard in before["shards"]]
        assert sum(shard["keys"] for shard in before["shards"]) == keys, before["shards"]

        # every group of the bucket has compacted: its leader holds a snapshot file, its log no longer starts at 1
        async def snapshots_everywhere() -> dict[int, dict[str, int]]:
            with trio.fail_after(300):
                while True:
                    held = {node: nodes[node].snapshot_files() for node in NAMESERVERS}
                    if all(any(name.startswith(f"g{group}-") and name.endswith(".snap") for name in files)
                           for files in held.values() for group in groups):
                        return held
                    await trio.sleep(1)

        held = await snapshots_everywhere()
        status = await cluster_status(servers)
        leaders = {group["id"]: group["leader"] for group in status["groups"]}
        result["snapshot_files_on_leaders"] = {
            name: size for group in groups for name, size in held[leaders[group]].items()
            if name.startswith(f"g{group}-")}
        result["rss_after_load_mib"] = {node: round(proc_status(nodes[node].pid).get("VmRSS", 0) / 2**20)
                                        for node in NAMESERVERS}
        result["hwm_after_load_mib"] = {node: round(proc_status(nodes[node].pid).get("VmHWM", 0) / 2**20)
                                        for node in NAMESERVERS}
        result["anonymous_after_load_mib"] = {node: round(proc_status(nodes[node].pid).get("RssAnon", 0) / 2**20)
                                              for node in NAMESERVERS}
        result["data_dir_bytes_node1"] = sum(path.stat().st_size for path in nodes[1].data_dir.rglob("*")
                                             if path.is_file())
        print(f"snapshot files on the leaders {leaders}: {result['snapshot_files_on_leaders']}", flush=True)

        # 3. drain node 3 (nowhere to go yet), then start node 4: every group's replica moves from 3 to 4
        async with connect(servers[0]) as channel:
            await channel.call("DrainNode", {"node": DRAINED, "draining": True}, timeout_s=20)
        await wait_status(servers, lambda status: next(node for node in status["nodes"] if node["id"] == DRAINED)[
            "state"] == "draining", 30, "node 3 draining")
        sampler.reset()
        transfer_started = time.monotonic()
        result["transfer_started"] = time.strftime("%H:%M:%S")
        nodes[NEW].start()
        await nodes[NEW].wait_ready()
        pinger = Pinger(nodes[NEW])
        states_seen: dict[str, int] = {}
        drop: dict = {"happened": False}
        expected = {name: size for name, size in result["snapshot_files_on_leaders"].items()}

        def arrived() -> tuple[int, dict[str, int]]:
            files = nodes[NEW].snapshot_files()
            return sum(files.values()), files

        seen: dict[str, int] = {}  # node 4's snapshot files (.part and .snap) -> the most bytes seen

        async def watch_and_drop() -> None:
            """Record node 4's snapshot files as they grow; drop its connections (once) when a file on its way is
            drop_at through."""
            while True:
                total, files = arrived()
                for name, size in files.items():
                    seen[name] = max(seen.get(name, 0), size)
                    if name.endswith(".part") and arguments.drop != "none" and not drop["happened"]:
                        whole = expected.get(name[:-len(".part")]) or held_now().get(name[:-len(".part")], 0)
                        if whole and size >= arguments.drop_at * whole:
                            drop.update(happened=True, at=time.strftime("%H:%M:%S"), file=name, file_bytes=whole,
                                        file_arrived=size, arrived_all_files=total,
                                        after_s=round(time.monotonic() - transfer_started, 1), files_then=files)
                            if arguments.drop == "ss":
                                drop["sockets_destroyed"] = drop_connections(nodes[NEW].pid, nodes[NEW].port)
                                drop["file_bytes_after_drop"] = nodes[NEW].snapshot_files().get(name)
                            else:
                                nodes[NEW].kill()
                                drop["killed"] = True
                                nodes[NEW].start()
                                await nodes[NEW].wait_ready()
                                drop["restarted_after_s"] = round(time.monotonic() - transfer_started, 1)
                                drop["files_after_restart"] = nodes[NEW].snapshot_files()
                            print(f"dropped: {drop}", flush=True)
                await trio.sleep(0.05)

        def held_now() -> dict[str, int]:
            merged: dict[str, int] = {}
            for node in NAMESERVERS:
                merged.update(nodes[node].snapshot_files())
            return merged

        def moved(status: dict) -> bool:
            for state in status["nodes"]:
                states_seen[f"{state['id']}:{state['state']}"] = states_seen.get(f"{state['id']}:{state['state']}",
                                                                                 0) + 1
            return status["moving"] == 0 and all(
                NEW in group["voters"] and DRAINED not in group["voters"] + group["learners"] and not group["learners"]
                for group in status["groups"] if group["id"] in groups)

        overwriting = {"keys": 0, "stop": trio.Event(), "writers": 0}

        async def overwrite(number: int) -> None:
            """Put keys again, with the values they hold, at write_during_mib_s in all: the leaders' logs grow and
            they compact (and delete the snapshot files before) while node 4 fetches."""
            overwriting["writers"] += 1
            rate = arguments.write_during_mib_s * 2**20 / value_bytes / 2  # keys per second, per writer
            began, index, sent = time.monotonic(), number * keys // 2, 0
            async with connect(servers[number % len(servers)], serde="avro") as channel:
                kv = KV(channel)
                pending: dict[int, list[dict]] = {}
                while not overwriting["stop"].is_set():
                    key = key_of(index % keys)
                    ops = pending.setdefault(shard_of(key, arguments.shards), [])
                    ops.append({"op": "put", "key": key, "value": value_of(pool, index % keys)})
                    index += 1
                    if len(ops) == PUTS_PER_TXN:
                        await kv.txn(BUCKET, [], list(ops))
                        ops.clear()
                        sent += PUTS_PER_TXN
                        overwriting["keys"] += PUTS_PER_TXN
                        await trio.sleep(max(0.0, began + sent / rate - time.monotonic()))
            overwriting["writers"] -= 1

        async with trio.open_nursery() as nursery:
            nursery.start_soon(pinger.run)
            nursery.start_soon(watch_and_drop)
            if arguments.write_during_mib_s:
                nursery.start_soon(overwrite, 0)
                nursery.start_soon(overwrite, 1)
            await wait_status(servers, moved, arguments.timeout_s, "node 4 a voter of every group, node 3 of none")
            moved_s = time.monotonic() - transfer_started
            moved_peaks = {node: round(peak / 2**20) for node, peak in sorted(sampler.peak.items())}
            moved_anonymous = {node: round(peak / 2**20) for node, peak in sorted(sampler.anonymous.items())}
            reference = before
            if arguments.write_during_mib_s:
                overwriting["stop"].set()
                while overwriting["writers"]:
                    await trio.sleep(0.1)
                reference = await describe(servers[0])
            # 5. caught up: each shard's digest on node 4 is the leader's
            digests: dict[int, dict] = {}
            with trio.fail_after(arguments.timeout_s):
                while len(digests) < len(reference["shards"]):
                    for shard in reference["shards"]:
                        if shard["shard"] in digests:
                            continue
                        try:
                            found = await shard_digest_on(nodes[NEW].server, shard["group"], shard["shard"])
                        except RocketError as error:
                            print(f"  digest of shard {shard['shard']} on node 4 not yet: {error}", flush=True)
                            continue
                        if found["digest"] == shard["digest"]:
                            digests[shard["shard"]] = found
                    await trio.sleep(0.5)
            caught_up_s = time.monotonic() - transfer_started
            nursery.cancel_scope.cancel()
        peaks, anonymous = dict(sampler.peak), dict(sampler.anonymous)
        after = await describe(servers[0])
        status = await cluster_status(servers)

        # sample reads from node 4
        generator = random.Random(7)
        sample = generator.sample(range(keys), min(arguments.sample, keys))
        groups_of = {shard["shard"]: shard["group"] for shard in before["shards"]}
        wrong = 0
        for index in sample:
            shard = shard_of(key_of(index), arguments.shards)
            if await read_on(nodes[NEW].server, groups_of[shard], shard, key_of(index)) != value_of(pool, index):
                wrong += 1

        text = nodes[NEW].log_text()
        events = log_events(text)
        fetched_names = sorted(set(re.findall(r"fetched snapshot (\S+) from node", text)))
        fetched_bytes = sum(max(seen.get(name, 0), expected.get(name, 0)) for name in fetched_names)
        stamps = [(when, what) for when, what in events if when]
        first = next((when for when, what in stamps if "fetching snapshot" in what), None)
        last = next((when for when, what in reversed(stamps) if "fetched snapshot" in what), None)
        fetch_s = None
        if first and last:
            fetch_s = (time.mktime(time.strptime(last[:8], "%H:%M:%S")) + float(last[8:])
                       - time.mktime(time.strptime(first[:8], "%H:%M:%S")) - float(first[8:]))
        installed = len(re.findall(r"the KV state of its shards is taken from the snapshot", text))
        result.update(
            moved_s=round(moved_s, 1), caught_up_s=round(caught_up_s, 1),
            snapshots_fetched=fetched_names, snapshot_bytes_fetched=fetched_bytes,
            fetch_window_s=round(fetch_s, 1) if fetch_s is not None else None,
            fetch_mb_s=round(fetched_bytes / fetch_s / 1e6, 1) if fetched_bytes and fetch_s else None,
            catch_up_mb_s=round(fetched_bytes / caught_up_s / 1e6, 1) if fetched_bytes else None,
            node4_files_seen=seen,
            snapshots_installed_kv=installed,
            node4_snapshot_files=nodes[NEW].snapshot_files(),
            digests_equal={shard: digests[shard]["digest"] for shard in sorted(digests)},
            digests_after_equal_reference=[s["digest"] for s in after["shards"]] == [
                s["digest"] for s in reference["shards"]],
            write_during_mib_s=arguments.write_during_mib_s, keys_overwritten_during=overwriting["keys"],
            snapshots_not_fetched=len(re.findall(r"not fetched from node", text)),
            fetches_started=len(re.findall(r"fetching snapshot \S+ from node", text)),
            sample_reads=len(sample), sample_wrong=wrong,
            drop=drop,
            peak_rss_until_moved_mib=moved_peaks, peak_anonymous_until_moved_mib=moved_anonymous,
            peak_rss_until_digests_mib={node: round(peak / 2**20) for node, peak in sorted(peaks.items())},
            peak_anonymous_until_digests_mib={node: round(peak / 2**20) for node, peak in sorted(anonymous.items())},
            hwm_mib={node: round(proc_status(nodes[node].pid).get("VmHWM", 0) / 2**20) for node in nodes},
            leaders_at_start=leaders,
            leaders_at_end={group["id"]: group["leader"] for group in status["groups"]},
            voters_at_end={group["id"]: group["voters"] for group in status["groups"]},
            node4_ping_longest_s=round(pinger.longest_s, 2), node4_ping_longest_at=pinger.longest_at,
            node4_ping_failures=pinger.failures, node_states_seen=states_seen,
            node4_events=events[:60],
            resumes=len(re.findall(r"resumes at byte", text)),
            log_problems=log_problems(nodes),
            exited=[node.node_id for node in nodes.values() if node.process is not None
                    and node.process.poll() is not None],
        )
        return result
    finally:
        sampler.stop()
        for node in nodes.values():
            node.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gib", type=float, default=2.0, help="GiB of values to load")
    parser.add_argument("--value-kib", type=int, default=16)
    parser.add_argument("--shards", type=int, default=GROUPS)
    parser.add_argument("--writers", type=int, default=4)
    parser.add_argument("--drop", choices=("ss", "kill", "none"), default="ss",
                        help="ss: ss -K node 4's TCP connections mid-transfer; kill: SIGKILL node 4 and restart it")
    parser.add_argument("--drop-at", type=float, default=0.4, help="drop once a file on its way is this far through")
    parser.add_argument("--write-during-mib-s", type=float, default=0,
                        help="keep putting (the same values again) at this rate while node 4 catches up")
    parser.add_argument("--sample", type=int, default=300, help="keys read back from node 4")
    parser.add_argument("--timeout-s", type=float, default=1800)
    parser.add_argument("--data-parent", default="/tmp")
    parser.add_argument("--keep-data", action="store_true", help="keep the nodes' data directories (logs are kept)")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "kv_catchup.json"))
    arguments = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="kv-catchup-", dir=arguments.data_parent))
    started = time.monotonic()
    try:
        result = trio.run(run, arguments, base)
    except Exception as error:  # the figures of a failed run: what node 4's log says it fetched and installed
        text = (base / "node4.log").read_text(errors="replace") if (base / "node4.log").exists() else ""
        result = {"error": repr(error)[:3000], "run_directory": str(base), "gib": arguments.gib,
                  "drop_mode": arguments.drop, "write_during_mib_s": arguments.write_during_mib_s,
                  "fetches_started": len(re.findall(r"fetching snapshot \S+ from node", text)),
                  "snapshots_fetched": len(re.findall(r"fetched snapshot \S+ from node", text)),
                  "snapshots_not_fetched": len(re.findall(r"not fetched from node", text)),
                  "snapshots_installed_kv": len(re.findall(r"the KV state of its shards is taken", text)),
                  "moved": re.findall(r"group \d+: replica moved from node \d+ to node \d+", "".join(
                      (base / f"node{node}.log").read_text(errors="replace") for node in NAMESERVERS
                      if (base / f"node{node}.log").exists()))}
        Path(arguments.out).write_text(json.dumps(result, indent=2) + "\n")
        raise
    finally:
        if not arguments.keep_data:
            for data in base.glob("data*"):
                shutil.rmtree(data, ignore_errors=True)
    result["wall_s"] = round(time.monotonic() - started, 1)
    print(json.dumps(result, indent=2))
    Path(arguments.out).write_text(json.dumps(result, indent=2) + "\n")
    assert result["sample_wrong"] == 0, "node 4 holds wrong values"
    assert result["snapshots_installed_kv"] >= 1, "node 4 installed no KV snapshot"


if __name__ == "__main__":
    main()
