"""Three replicas against their peers in the same shape (issue 50): three server processes on this machine, every
write on three replicas, one Python client, every system in turn in each round.

    python benchmarks/replicated.py [--rounds 1] [--seconds 5] [--systems rocket,nats,etcd] [--out DIR]

- produce-1k and produce-16k: one message of 1 KiB or 16 KiB per request, 64 requests in flight on one connection
  (the shape RocketMQ's own clients send in), for --seconds: rocket (three all-role `rocket run`, the topic's groups
  replicated three times, the client on node 1) against NATS JetStream (three `nats-server` in one cluster, a
  file-stored stream with three replicas, the client on server 1).
- batched-1k: 1 KiB messages in batches of 1 MiB, 8 in flight: rocket against the same NATS cluster sending the
  same messages one publish each with 64 acks outstanding (what nats-py does best).
- sends-1k: 256 tasks, each sending one 1 KiB message and waiting for it to be stored, then the next: rocket's SDK
  (`Producer.send()`, which batches what concurrent sends hand over within its linger) against NATS's publish with
  its acknowledgement (256 outstanding).
- kv-put-1 and kv-put-64: puts of 1 KiB values with 1 and 64 clients, each on its own connection: rocket's KV on
  the same three nodes against a 3-member etcd cluster (every client on member 1). rocket's result says which node
  led the bucket's one shard (`shard_leader`; the clients are on node 1, which forwards the puts to another).

Durability differs, and the table says how: rocket fdatasyncs every write on every replica before it answers (one
fsync per round); etcd does the same on a quorum; NATS JetStream writes to the OS and fsyncs every 2 minutes.

Writes DIR/replicated.json and DIR/replicated.md (default benchmarks/results); its last line is
`replicated: produce-1k=X produce-16k=Y kv-put-1=Z kv-put-64=W`, rocket's rate over its peer's, medians of the
rounds. With --in-flight-sweep 1,16,64 it runs produce-1k only, at each number of requests in flight, and prints
each result (server CPU per message summed and per server process). Needs `pip install -e '.[bench]'` and
`apt-get install nats-server etcd-server`. Not part of CI.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import itertools
import json
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parent))

from kv import VALUE_BYTES, Etcd, RocketKV, workload  # noqa: E402
from million_queues import cpu_s  # noqa: E402
from peers import HOST, Nats, Rocket, ServerProcess, find_binary  # noqa: E402
from run import RESULTS  # noqa: E402

from rocket.transport.listen import free_ports  # noqa: E402

NODES = 3
IN_FLIGHT = 64
STREAM = "replicated"
_streams = itertools.count()


class RocketCluster(RocketKV):
    durability = ("three all-role nodes, every group replicated three times; fdatasync on every replica before a "
                  "write is counted (group commit)")

    def start(self, directory: Path) -> None:
        from produce import start_nodes

        self.processes = start_nodes(directory, NODES)
        ports = [re.search(rb"tcp=[^:]+:(\d+)", process.stdout.readline()) for process in self.processes]
        if None in ports:
            self.stop()
            raise RuntimeError("a rocket node did not report its TCP port")
        self.address = f"{HOST}:{ports[0].group(1).decode()}"

    @property
    def pids(self) -> list[int]:
        return [process.pid for process in self.processes]

    @property
    def server_pid(self) -> int:
        return self.processes[0].pid

    def stop(self) -> None:
        for process in self.processes:
            self.process = process
            Rocket.stop(self)


class Cluster:
    """Three server processes of one system, started together; the client talks to the first."""

    def _start_all(self, commands: list[list[str]], logs: list[Path], ports: list[int]) -> None:
        self.servers = [ServerProcess(command, log) for command, log in zip(commands, logs)]
        for port, server in zip(ports, self.servers):
            server.wait_for_port(port)
        self.port = ports[0]
        self.server = self.servers[0]

    @property
    def pids(self) -> list[int]:
        return [server.pid for server in self.servers]

    def stop(self) -> None:
        for server in self.servers:
            server.stop()


class NatsCluster(Cluster, Nats):
    durability = ("three nats-server in one cluster, a JetStream file-stored stream with 3 replicas; acknowledged once "
                  "a quorum wrote it to the OS (fsync every 2 minutes)")

    def start(self, directory: Path) -> None:
        ports = free_ports(2 * NODES)
        routes = ",".join(f"nats://{HOST}:{ports[NODES + n]}" for n in range(NODES))
        self._start_all([[find_binary("nats-server"), "--js", "-sd", str(directory / f"nats{n}"), "-a", HOST, "-p",
                          str(ports[n]), "-n", f"n{n}", "--cluster_name", "bench", "--cluster",
                          f"nats://{HOST}:{ports[NODES + n]}", "--routes", routes] for n in range(NODES)],
                        [directory / f"nats{n}.log" for n in range(NODES)], ports[:NODES])

    async def create(self, stream: str) -> None:
        from nats.js.api import StorageType

        deadline = time.monotonic() + 60
        while True:  # the cluster elects its JetStream meta leader after the servers listen
            try:
                async with self._connection() as connection:
                    await connection.jetstream().add_stream(name=stream, subjects=[stream], storage=StorageType.FILE,
                                                            num_replicas=NODES)
                return
            except Exception:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.5)


class EtcdCluster(Cluster, Etcd):
    durability = "a 3-member etcd cluster: the Raft WAL fdatasynced on a quorum before a put is answered"

    def start(self, directory: Path) -> None:
        ports = free_ports(2 * NODES)
        cluster = ",".join(f"m{n}=http://{HOST}:{ports[NODES + n]}" for n in range(NODES))
        self._start_all([[find_binary("etcd"), "--name", f"m{n}", "--data-dir", str(directory / f"etcd{n}"),
                          "--listen-client-urls", f"http://{HOST}:{ports[n]}",
                          "--advertise-client-urls", f"http://{HOST}:{ports[n]}",
                          "--listen-peer-urls", f"http://{HOST}:{ports[NODES + n]}",
                          "--initial-advertise-peer-urls", f"http://{HOST}:{ports[NODES + n]}",
                          "--initial-cluster", cluster, "--initial-cluster-state", "new"] for n in range(NODES)],
                        [directory / f"etcd{n}.log" for n in range(NODES)], ports[:NODES])


def cpu_of(system) -> float:
    return sum(cpu_s(pid) for pid in system.pids)


async def produce(system, size: int, seconds: float, batch_messages: int = 1, in_flight: int = IN_FLIGHT,
                  sdk: bool = False) -> dict:
    """Messages of size bytes, batch_messages per request (NATS: one publish each), in_flight requests
    outstanding on one connection, for seconds; with sdk, in_flight tasks calling rocket's Producer.send()."""
    stream = f"{STREAM}{next(_streams)}"  # a new stream per run: its first round's groups are not reused
    await system.create(stream)
    batch = system.prepare(stream, batch_messages, bytes(size))
    counts = [0]
    latencies_s: list[float] = []
    async with (sdk_sender(system, stream, size) if sdk else system.producer(stream)) as sender:
        await sender.send(batch)  # connected, the stream's leader known
        stop_at = time.perf_counter() + seconds
        cpu_before, started = [cpu_s(pid) for pid in system.pids], time.perf_counter()

        async def one() -> None:
            while (began := time.perf_counter()) < stop_at:
                await sender.send(batch)
                latencies_s.append(time.perf_counter() - began)
                counts[0] += batch_messages

        async with anyio.create_task_group() as group:
            for _ in range(in_flight):
                group.start_soon(one)
        elapsed_s = time.perf_counter() - started
        cpu_used = [cpu_s(pid) - before for pid, before in zip(system.pids, cpu_before)]
    latencies_s.sort()
    return {"messages_per_s": round(counts[0] / elapsed_s), "server_cpu_us_per_message":
            round(sum(cpu_used) / counts[0] * 1e6, 1), "p99_ms": round(latencies_s[int(0.99 * len(latencies_s))] * 1e3, 1),
            "each_server_cpu_us_per_message": [round(used / counts[0] * 1e6) for used in cpu_used]}


@contextlib.asynccontextmanager
async def sdk_sender(system, stream: str, size: int):
    """rocket's SDK as produce()'s sender: each send is one Producer.send() of a message without a key, which the
    producer batches with what the other senders hand over within its linger."""
    from rocket.client.producer import open_producer
    from rocket.model import Message

    body = bytes(size)
    async with system._channel() as channel, open_producer(channel, stream) as producer:

        class Sender:
            async def send(self, batch) -> None:
                await producer.send(Message(body))

        yield Sender()


async def put(system, clients: int, seconds: float) -> dict:
    keys = [f"key-{number}" for number in range(1000)]
    values = (b"a" * VALUE_BYTES, b"b" * VALUE_BYTES)
    cpu_before = cpu_of(system)
    result = await workload(system, "put", clients=clients, seconds=seconds, keys=keys, values=values)
    result["server_cpu_us_per_operation"] = round((cpu_of(system) - cpu_before) / result["operations"] * 1e6, 1)
    if isinstance(system, RocketCluster):  # the clients are on node 1: its puts are parked there or forwarded
        result["shard_leader"] = await shard_leader(system)
    return {key: result[key] for key in ("operations_per_s", "server_cpu_us_per_operation", "p99_ms", "shard_leader")
            if key in result}


async def shard_leader(system) -> int:
    """The node that leads the KV bucket's one shard (1 is the clients' node), as KvDescribeBucket says."""
    from kv import BUCKET

    async with system._channel() as channel:
        described = await channel.call("KvDescribeBucket", {"bucket": BUCKET})
    return described["shards"][0]["leader"]


WORKLOADS = {
    "produce-1k": ("nats", functools.partial(produce, size=1024)),
    "produce-16k": ("nats", functools.partial(produce, size=16384)),
    "batched-1k": ("nats", None),  # below: rocket batches, NATS publishes one by one
    "sends-1k": ("nats", None),  # below: rocket's Producer.send(), NATS's publish, 256 at once
    "kv-put-1": ("etcd", functools.partial(put, clients=1)),
    "kv-put-64": ("etcd", functools.partial(put, clients=64)),
}


def run_round(systems: dict, seconds: float) -> dict[str, dict[str, dict]]:
    found: dict[str, dict[str, dict]] = {}
    for name, (peer, function) in WORKLOADS.items():
        for system_name in ("rocket", peer):
            system = systems.get(system_name)
            if system is None:
                continue
            if name == "batched-1k":
                function = functools.partial(produce, size=1024, batch_messages=1024, in_flight=8) \
                    if system_name == "rocket" else functools.partial(produce, size=1024)
            elif name == "sends-1k":
                function = functools.partial(produce, size=1024, in_flight=256, sdk=system_name == "rocket")
            result = anyio.run(functools.partial(function, system, seconds=seconds), backend=system.backend)
            found.setdefault(name, {})[system_name] = result
            print(f"{name} {system_name}: {result}", flush=True)
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--systems", default="rocket,nats,etcd")
    parser.add_argument("--out", default=str(RESULTS))
    parser.add_argument("--in-flight-sweep", default="", metavar="N,N,...",
                        help="instead of the workloads: produce-1k at each of these requests in flight, and print")
    arguments = parser.parse_args()
    wanted = arguments.systems.split(",")
    makers = {"rocket": RocketCluster, "nats": NatsCluster, "etcd": EtcdCluster}
    rounds = []
    with tempfile.TemporaryDirectory(prefix="rocket-replicated-") as scratch, contextlib.ExitStack() as stack:
        systems = {}
        for name in wanted:
            system = makers[name]()
            if (why := system.missing()) is not None:
                print(f"{name}: skipped: {why}")
                continue
            directory = Path(scratch) / name
            directory.mkdir()
            system.start(directory)
            stack.callback(system.stop)
            if name == "rocket":
                anyio.run(system.setup, backend="trio")
            systems[name] = system
        if arguments.in_flight_sweep:
            for number in range(arguments.rounds):
                for in_flight in map(int, arguments.in_flight_sweep.split(",")):
                    for name, system in systems.items():
                        if name != "etcd":
                            result = anyio.run(functools.partial(produce, system, size=1024, seconds=arguments.seconds,
                                                                 in_flight=in_flight), backend=system.backend)
                            print(f"produce-1k, {in_flight} in flight, {name}: {result}", flush=True)
            return
        for number in range(arguments.rounds):
            print(f"round {number + 1}", flush=True)
            rounds.append(run_round(systems, arguments.seconds))
    ratios = {}
    for name, (peer, _) in WORKLOADS.items():
        key = "operations_per_s" if name.startswith("kv") else "messages_per_s"
        each = [round(found[name]["rocket"][key] / found[name][peer][key], 2) for found in rounds
                if "rocket" in found.get(name, {}) and peer in found.get(name, {})]
        ratios[name] = round(statistics.median(each), 2) if each else None
    out = Path(arguments.out)
    out.mkdir(parents=True, exist_ok=True)
    report = {"rounds": rounds, "ratios": ratios, "seconds": arguments.seconds,
              "durability": {name: system.durability for name, system in systems.items()}}
    (out / "replicated.json").write_text(json.dumps(report, indent=2))
    lines = ["| workload | rocket | peer | rocket over peer |", "|---|---|---|---|"]
    for name, (peer, _) in WORKLOADS.items():
        for found in rounds:
            if "rocket" in found.get(name, {}) and peer in found.get(name, {}):
                lines.append(f"| {name} | {found[name]['rocket']} | {peer}: {found[name][peer]} | {ratios[name]} |")
    (out / "replicated.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    print("replicated: " + " ".join(f"{name}={ratios[name]}" for name in ("produce-1k", "produce-16k", "kv-put-1",
                                                                         "kv-put-64")))


if __name__ == "__main__":
    main()
