"""Whole roles in a simulated cluster: the real nameserver, storage and broker code of several nodes in
one trio run, wired by node.py's own build_roles, on trio's MockClock (wall time moves with it), over an
in-memory network that delays and drops, with nodes that crash as in a power cut (their logs lose what was
written after their last sync) and restart.

One seeded random source decides the delays, the losses, which node a writer asks, the ids the nodes draw and
trio's own scheduling order (ties between deadlines included); each node's world (rocket/world.py) runs blocking I/O
inline instead of in worker threads, so that the clock only moves when every task waits, and sees a fixed free
space. A seed so replays exactly: the network's trace (every call, answer and Raft payload, with its time and a
digest of its bytes) is the same each run. A failing run prints its seed and replays with `--seed N`.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import heapq
import itertools
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import outcome
import trio
import trio._core._run as trio_run
import trio.testing

from rocket import limits
from rocket.client.producer import Sequencer
from rocket.clock import Clock, TrioWallClock
from rocket.config import ALL_ROLES, ROLES, NodeConfig
from rocket.disk.commitlog import SUFFIX, CommitLog
from rocket.errors import Code, RocketError
from rocket.model import Address, Message
from rocket.node import build_roles
from rocket.raft.core import Role
from rocket.raft.host import RaftHost
from rocket.raft.wal import Wal
from rocket.roles.peers import RETRYABLE, Peers
from rocket.roles.storage import StorageRole
from rocket.serde import batch as batch_codec
from rocket.serde import avro_codec
from rocket.transport.methods import method_spec
from rocket.transport.rpc import Dispatcher
from rocket.world import World

EPOCH_S = 1_700_000_000.0  # the simulated wall time when trio's clock reads 0
SIMULATED_S_MAX = 300.0  # a controller-mode run that has not ended by then is stuck: it fails, not spins
# a storage node's calls to the controller (embedded in the nameservers, or standalone)
CONTROLLER_METHODS = {"NodeHeartbeat", "ControllerAlterSyncStateSet", "ControllerHeartbeat"}
FREE_BYTES = 64 << 30  # what every simulated disk has free, whatever the machine's has
T = TypeVar("T")


@dataclasses.dataclass
class NetworkFaults:
    delay_s_max: float = 0.02  # one way, per message or call
    drop: float = 0.0  # chance a Raft payload is lost
    call_loss: float = 0.0  # chance a call's answer is lost (the caller sees CONNECTION_LOST)


class SimWorld(World):
    """A simulated node's machine: blocking work runs inline (with a worker thread busy, the mock clock would jump
    ahead of it), the disk has FREE_BYTES free, and randomness follows the seed."""

    def free_bytes(self, directory: Path) -> int:
        return FREE_BYTES

    async def run_sync(self, function: Callable[..., T], *args: Any) -> T:
        return function(*args)

    def start_thread_soon(self, work: Callable[[], T], deliver: Callable[[outcome.Outcome[T]], object]) -> None:
        deliver(outcome.capture(work))


def deterministic_trio(seed: int) -> None:
    """Trio's scheduler follows the seed, whether Hypothesis is loaded or not: each batch of runnable tasks is put in
    the order they were made, then shuffled by the seeded draw (trio's mode under Hypothesis), and deadlines that fall
    at the same time expire in the order they were armed (trio breaks that tie by the cancel scopes' id(), an address
    that differs between runs and processes). For the rest of the process: both are orders trio leaves open."""
    trio_run._ALLOW_DETERMINISTIC_SCHEDULING = True
    trio_run._r.seed(seed)
    armed = itertools.count()

    def add(self, deadline: float, cancel_scope) -> None:
        heapq.heappush(self._heap, (deadline, next(armed), cancel_scope))
        self._active += 1

    trio_run.Deadlines.add = add


class Network:
    """Delivers calls and Raft payloads between simulated nodes; node 0 is the client. trace records each call, answer
    and payload: its time, its ends, and a digest of its bytes."""

    def __init__(self, randomness: random.Random, faults: NetworkFaults):
        self.random = randomness
        self.faults = faults
        self.isolated: set[int] = set()  # nodes cut off from every other one (and from the client)
        self.controller_cut: set[int] = set()  # nodes whose calls to the controller (their heartbeats) go unanswered
        self.split: set[int] = set()  # nodes cut off from every other one, the client still reaching them
        self.nodes: dict[int, SimNode] = {}
        self.by_address: dict[tuple[str, int], SimNode] = {}
        self.calls = self.lost = 0
        self.trace: list[str] = []

    def note(self, what: str, sender: int, receiver: object, data: bytes) -> None:
        digest = hashlib.blake2b(data, digest_size=8).hexdigest()
        self.trace.append(f"{trio.current_time():.6f} {what} {sender}>{receiver} {digest}")

    def delay(self) -> float:
        return self.random.uniform(0, self.faults.delay_s_max)

    def cut(self, sender: int, receiver: int) -> bool:
        if sender == receiver:
            return False
        if sender in self.isolated or receiver in self.isolated:
            return True
        return 0 not in (sender, receiver) and (sender in self.split or receiver in self.split)

    async def call(self, sender: int, address: tuple[str, int], method: str, request: dict, timeout_s: float,
                   reliable: bool = False) -> dict:
        """A call from node sender (0: the client); unless reliable (the scenario's own control calls),
        its answer may be lost. Across a partition it hangs until its timeout, as over a real network."""
        target = self.by_address.get(address)
        if target is None or not target.up:
            raise RocketError(Code.UNAVAILABLE, f"cannot connect to {address[0]}:{address[1]}")
        if self.cut(sender, target.config.node_id) or (sender in self.controller_cut and method in CONTROLLER_METHODS):
            await trio.sleep(min(timeout_s, limits.connect_timeout_s))
            raise RocketError(Code.TIMEOUT, f"{method} got no answer (partitioned)")
        self.calls += 1
        spec = method_spec(method)
        encoded = avro_codec.encode(spec.request_type, request)
        self.note(method, sender, target.config.node_id, encoded)
        request = avro_codec.decode(spec.request_type, encoded)  # through the serde, as over the wire: defaults filled
        lose_answer = not reliable and self.random.random() < self.faults.call_loss
        with trio.move_on_after(timeout_s) as waited:
            await trio.sleep(self.delay())
            response = await target.serve(method, request)
            await trio.sleep(self.delay())
        if waited.cancelled_caught:
            raise RocketError(Code.TIMEOUT, f"{method} got no answer within {timeout_s} s")
        self.note(f"{method}:answer", target.config.node_id, sender, avro_codec.encode(spec.response_type, response))
        if lose_answer:
            self.lost += 1
            raise RocketError(Code.CONNECTION_LOST, "connection lost (simulated)")
        return response

    def post(self, sender: int, destination: int, payload: bytes) -> None:
        target = self.nodes.get(destination)
        if target is None or not target.up or self.cut(sender, destination) or self.random.random() < self.faults.drop:
            return
        self.note("raft", sender, destination, payload)
        target.deliver(self.delay(), payload)


class SimPool:
    """What Peers needs of a ChannelPool: calls from one node."""

    def __init__(self, network: Network, node: int):
        self.network = network
        self.node = node

    async def call(self, address: tuple[str, int], method: str, request: dict,
                   timeout_s: float = limits.request_timeout_s_default) -> dict:
        return await self.network.call(self.node, address, method, request, timeout_s)

    @staticmethod
    def open_channel(address: tuple[str, int]) -> None:
        """No channel is held open here: a broker's calls to another node's leader go as tasks, through call()."""
        return None


class Disk:
    """A node's commit logs (its WAL) as a power cut leaves them: each keeps what its last
    sync made durable. watch() notes, at each sync of a log, where what it made durable ends; cut() is the
    power going: no sync reaches the disk after it; lose_unsynced(), once the node's files are closed, cuts
    every watched log's files back to that point and deletes the segments that start after it."""

    def __init__(self):
        self._durable: dict[str, tuple[Path, int]] = {}  # log name -> (its directory, where its last sync ended)
        self._cut = False
        self.lost_bytes: dict[str, int] = {}  # a log's name -> bytes written but never synced, lost at crashes

    def watch(self, name: str, log: CommitLog) -> None:
        self._durable[name] = (log.directory, log.end_position)  # what a log holds when it opens is on the disk
        self.lost_bytes.setdefault(name, 0)
        synced = log.sync

        def sync() -> int:
            if not self._cut:
                self._durable[name] = (log.directory, synced())
            return self._durable[name][1]

        log.sync = sync  # on this log object alone: production durability is unchanged

    def cut(self) -> None:
        self._cut = True

    def lose_unsynced(self) -> None:
        """After cut(), cut the watched logs' files back to their last sync; then forget them (a restart
        watches the logs it opens)."""
        if self._cut:
            for name, (directory, durable) in self._durable.items():
                self.lost_bytes[name] += _cut_back(directory, durable)
        self._durable, self._cut = {}, False


def _cut_back(directory: Path, durable: int) -> int:
    """Truncate a commit log's segment files to log position durable; returns the bytes cut."""
    lost = 0
    for path in directory.glob(f"*{SUFFIX}"):
        start, size = int(path.name[: -len(SUFFIX)]), path.stat().st_size
        if start > durable:
            path.unlink()  # created after the last sync, whose directory fsync it missed
            lost += size
        elif size > durable - start:
            with open(path, "r+b") as file:
                file.truncate(durable - start)
            lost += size - (durable - start)
    return lost


class SimNode:
    """One node's roles, wired by node.py's build_roles, on the simulated network, disk and clock."""

    def __init__(self, config: NodeConfig, network: Network, clock: Clock):
        self.config = config
        self.network = network
        self.clock = clock
        self.world = SimWorld(random.Random(network.random.getrandbits(64)))
        self.disk = Disk()
        self.up = False
        self.starts = 0
        self._nursery: trio.Nursery | None = None
        self._scope: trio.CancelScope | None = None
        self.stopped = trio.Event()
        self.host: RaftHost | None = None
        self.storage: StorageRole | None = None
        self.nameserver = None  # its Nameserver role, once it runs
        self.telemetry = None  # a Telemetry for its calls and heartbeats (scripted health counts), if a test sets one
        self.nameserver_objects = None  # the object store its nameserver reads models from, if a test sets one
        self.dispatcher = Dispatcher()
        network.nodes[config.node_id] = self
        network.by_address[(config.listen.host, config.listen.port)] = self

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        config = self.config
        self.dispatcher = Dispatcher()
        self.stopped = trio.Event()
        wal = Wal.open(config.data_dir / "raft", keep_segments=True)
        self.disk.watch("wal", wal.log)
        addresses = {node: (address.host, address.port)
                     for node, address in {**config.nameserver_members(), **config.controller_members()}.items()}
        self.host = RaftHost(config.node_id, wal, functools.partial(self.network.post, config.node_id),
                             tick_s=config.raft_tick_s, world=self.world)
        peers = Peers(config, self.dispatcher, SimPool(self.network, config.node_id))
        peers.telemetry = self.telemetry
        roles = build_roles(config, self.host, peers, self.dispatcher, self.clock, addresses, world=self.world)
        self.storage, self.nameserver = roles.storage, roles.nameserver
        if self.nameserver is not None and self.nameserver_objects is not None:
            for part in (self.nameserver.forecasts, self.nameserver.health):  # where they read their models
                part.objects = self.nameserver_objects
        try:
            with trio.CancelScope() as self._scope:
                async with trio.open_nursery() as nursery:
                    self._nursery = nursery
                    self.up = True
                    self.starts += 1
                    await roles.start(nursery)
                    await self.storage.assigned.wait()
                    task_status.started()
        finally:
            self.up = False
            self.storage.store.close()
            wal.close()
            self.disk.lose_unsynced()
            self.stopped.set()

    def crash(self) -> None:
        """A power cut: every task of the node ends at once, and its logs lose what was written after their
        last sync (LevelDB, written without sync, keeps what it has: tests/unit/test_store_recovery.py and the
        power-loss tests on a lazy file system cover it losing its unsynced writes)."""
        self.up = False
        self.disk.cut()
        self._scope.cancel()

    async def serve(self, method: str, request: dict) -> dict:
        """Run a call inside this node, so that a crash ends it like a lost connection."""
        if not self.up:
            raise RocketError(Code.CONNECTION_LOST, "the node went away")
        sender, receiver = trio.open_memory_channel(1)

        async def handle() -> None:
            async with sender:
                try:
                    await sender.send((True, await self.dispatcher.local(method, request)))
                except RocketError as error:
                    await sender.send((False, error))

        self._nursery.start_soon(handle)
        try:
            succeeded, value = await receiver.receive()
        except trio.EndOfChannel:
            raise RocketError(Code.CONNECTION_LOST, "the node went away during the call") from None
        if not succeeded:
            raise value
        return value

    def deliver(self, delay_s: float, payload: bytes) -> None:
        if not self.up:
            return

        async def later() -> None:
            await trio.sleep(delay_s)
            self.host.receive(payload)

        self._nursery.start_soon(later)


@dataclasses.dataclass
class Ack:
    queue: int
    base_offset: int
    seqs: list[int]


class Writers:
    """Sequential produce streams, one per queue, through a random live broker; an answer that does not
    come (node gone, lost, timed out) is resent elsewhere, as the same request: an idempotent producer's numbered
    batch (client/producer.py's Sequencer), which is stored once however often it is sent."""

    def __init__(self, network: Network, topic: str, queues: list[int], messages_per_batch: int,
                 ends_on: tuple[Code, ...] = ()):
        self.network = network
        self.topic = topic
        self.ends_on = ends_on  # refusals that end a stream (the topic deleted under it) rather than fail the run
        self.ended: list[Code] = []
        self.queues = queues
        self.per_batch = messages_per_batch
        self.acks: list[Ack] = []
        self.sent: set[int] = set()
        self.resends = 0
        self._next_seq = 0
        self.sequencer = Sequencer(network.random.getrandbits(63) or 1)

    async def run(self, stop: trio.Event, done: trio.Event) -> None:
        async with trio.open_nursery() as nursery:
            for queue in self.queues:
                nursery.start_soon(self._write, queue, stop)
        done.set()

    async def _write(self, queue: int, stop: trio.Event) -> None:
        while not stop.is_set():
            seqs = list(range(self._next_seq, self._next_seq + self.per_batch))
            self._next_seq += self.per_batch
            batch = batch_codec.encode([Message(f"m{seq}".encode(), properties={"seq": str(seq)}) for seq in seqs],
                                       1_700_000_000_000)
            self.sent.update(seqs)
            request = self.sequencer.produce_request(self.topic, queue, batch)
            while True:
                live = [node for node in self.network.nodes.values() if node.up]
                node = self.network.random.choice(live) if live else None
                try:
                    if node is None:
                        raise RocketError(Code.UNAVAILABLE, "no node is up")
                    reply = await self.network.call(0, (node.config.listen.host, node.config.listen.port), "Produce",
                                                    request, 10.0)
                    break
                except RocketError as error:
                    if error.code in self.ends_on:
                        self.ended.append(error.code)
                        return
                    if error.code not in RETRYABLE:
                        raise
                    self.resends += 1
                    await trio.sleep(0.2)
            self.acks.append(Ack(queue, reply["base_offset"], seqs))


async def consume_queue(network: Network, topic: str, queue: int) -> list[Message]:
    """Everything stored in a queue, read through any live broker."""
    messages: list[Message] = []
    offset = 0
    while True:
        live = [node for node in network.nodes.values() if node.up]
        node = network.random.choice(live)
        try:
            response = await network.call(0, (node.config.listen.host, node.config.listen.port), "Pull", {
                "topic": topic, "queues": [{"queue": queue, "offset": offset}], "max_bytes": 1 << 20,
                "wait_ms": 0}, 10.0, True)
        except RocketError as error:
            if error.code not in RETRYABLE:
                raise
            await trio.sleep(0.2)
            continue
        if not response["batches"]:
            return messages
        for found in response["batches"]:
            decoded = batch_codec.decode(found["batch"], found["base_offset"], queue)
            messages.extend(message for message in decoded if message.offset >= offset)
        offset = response["next_offsets"][0]["offset"]


def check_consumed(writers: Writers, consumed: dict[int, list[Message]]) -> dict:
    """Every acknowledged message is stored at the offset it was acknowledged at, the offsets of each
    queue run 0..next-1, first occurrences keep the order of acknowledgement, nothing unsent appears."""
    for queue, messages in consumed.items():
        assert [message.offset for message in messages] == list(range(len(messages))), f"queue {queue} has gaps"
    seq_at = {(queue, message.offset): int(message.properties["seq"])
              for queue, messages in consumed.items() for message in messages}
    order: dict[int, list[int]] = {}
    for ack in writers.acks:
        order.setdefault(ack.queue, []).extend(ack.seqs)
        for index, seq in enumerate(ack.seqs):
            assert seq_at.get((ack.queue, ack.base_offset + index)) == seq, f"acknowledged {seq} lost"
    acknowledged = {seq for seqs in order.values() for seq in seqs}
    duplicates = 0
    for queue, messages in consumed.items():
        seen: list[int] = []
        distinct: set[int] = set()
        for message in messages:
            seq = int(message.properties["seq"])
            assert seq in writers.sent, f"consumed {seq}, which nobody sent"
            if seq in distinct:
                duplicates += 1
            else:
                distinct.add(seq)
                seen.append(seq)
        assert [seq for seq in seen if seq in acknowledged] == order.get(queue, []), f"queue {queue} out of order"
    return {"acknowledged": len(acknowledged), "duplicates": duplicates}


def node_config(node: int, nodes: int, base: Path, groups: int, standalone: bool = False) -> NodeConfig:
    """With standalone, each node runs the standalone controller's role too, the three its group (on a Raft group of
    its own, beside the nameservers')."""
    members = tuple((member, Address(f"node{member}", 9876)) for member in range(1, nodes + 1))
    return NodeConfig(data_dir=base / f"node{node}", listen=Address(f"node{node}", 9876), http2_listen=None,
                      node_id=node, nameservers=members, storage_groups=groups, replication=3,
                      roles=ROLES if standalone else ALL_ROLES, controllers=members if standalone else ())


def cluster(seed: int, base: Path, faults: NetworkFaults, groups: int,
            standalone: bool = False) -> tuple[Network, dict[int, SimNode]]:
    """Three all-role nodes on one network, every random choice (trio's scheduling too) following the seed."""
    deterministic_trio(seed)
    network = Network(random.Random(seed), faults)
    clock = TrioWallClock(EPOCH_S)
    return network, {node: SimNode(node_config(node, 3, base, groups, standalone), network, clock)
                     for node in (1, 2, 3)}


async def start_nodes(nursery: trio.Nursery, nodes: dict[int, SimNode]) -> None:
    """Run every node in nursery; return once each has its storage assignment."""
    async with trio.open_nursery() as starting:
        for node in nodes.values():
            starting.start_soon(nursery.start, node.run)


async def run_failover(seed: int, base: Path, faults: NetworkFaults, groups: int = 6, partition: bool = False,
                       trace: list[str] | None = None) -> dict:
    """Three all-role nodes under writes: crash the busiest storage leader, restart it, crash the
    nameserver leader, restart it (with partition, cut each off for a while instead: it keeps running,
    believing it leads, and comes back); then consume everything and check it. The network's trace goes to trace."""
    network, nodes = cluster(seed, base, faults, groups)
    if trace is not None:
        network.trace = trace
    report: dict = {"seed": seed, "kills": []}
    async with trio.open_nursery() as nursery:
        await start_nodes(nursery, nodes)
        first = nodes[1].config.listen
        await network.call(0, (first.host, first.port), "CreateTopic", {"topic": "orders", "queues": 8}, 30.0, True)
        writers = Writers(network, "orders", [0, 2, 4, 6], messages_per_batch=5)
        stop, written = trio.Event(), trio.Event()
        nursery.start_soon(writers.run, stop, written)
        await trio.sleep(2 + network.random.random())
        for what in ("busiest storage leader", "nameserver leader"):
            asked = next(node.config.listen for node in nodes.values() if node.up and not network.cut(0, node.config.node_id))
            status = await network.call(0, (asked.host, asked.port), "ClusterStatus", {}, 30.0, True)
            if what == "nameserver leader":
                victim = status["nameserver_leader"] or 1
            else:
                victim = max(status["nodes"], key=lambda entry: len(entry["load"]["leads"]))["id"]
            acked_before = len(writers.acks)
            if partition:
                network.isolated.add(victim)
            else:
                nodes[victim].crash()
                await nodes[victim].stopped.wait()
            killed_at = trio.current_time()
            while len(writers.acks) == acked_before:
                await trio.sleep(0.05)
            report["kills"].append({"what": what, "victim": victim,
                                    "first_ack_after_s": round(trio.current_time() - killed_at, 2)})
            await trio.sleep(3 + network.random.random() * 2)
            if partition:
                network.isolated.discard(victim)
            else:
                await nursery.start(nodes[victim].run)
            await trio.sleep(3)
        stop.set()
        await written.wait()  # the batches in flight are answered before anything is read
        consumed = {queue: await consume_queue(network, "orders", queue) for queue in range(8)}
        report.update(check_consumed(writers, consumed))
        report["replica_reads"] = sum(node.storage.reads.replica_reads for node in nodes.values())
        report["unsynced_bytes_lost"] = {name: sum(node.disk.lost_bytes.get(name, 0) for node in nodes.values())
                                         for name in ("wal",)}
        report.update({"batches": len(writers.acks), "resends": writers.resends, "calls": network.calls,
                       "answers_lost": network.lost, "simulated_s": round(trio.current_time(), 1)})
        for node in nodes.values():
            node.crash()
    return report


async def call_any(network: Network, method: str, request: dict, done_on: tuple[Code, ...] = ()) -> dict | None:
    """A call through any live node, again while the answer is a retryable error (None if it ends in done_on)."""
    while True:
        live = [node for node in network.nodes.values() if node.up]
        try:
            if not live:
                raise RocketError(Code.UNAVAILABLE, "no node is up")
            asked = network.random.choice(live).config.listen
            return await network.call(0, (asked.host, asked.port), method, request, 30.0, True)
        except RocketError as error:
            if error.code in done_on:
                return None
            if error.code not in RETRYABLE:
                raise
            await trio.sleep(0.5)


async def run_delete(seed: int, base: Path, faults: NetworkFaults) -> dict:
    """Three all-role nodes; writers on "orders" and on "scratch"; "scratch" is deleted (forced) while its writers
    write, and the busiest storage leader crashes right after the delete starts, then restarts. The delete finishes
    (the call sent again, or the nameserver leader's loop); "scratch" made again starts empty on every node; every
    acknowledged message of "orders" is consumed, and its writers never saw a refusal."""
    network, nodes = cluster(seed, base, faults, 6)
    report: dict = {"seed": seed}
    async with trio.open_nursery() as nursery:
        await start_nodes(nursery, nodes)
        for topic in ("orders", "scratch"):
            await call_any(network, "CreateTopic", {"topic": topic, "queues": 4})
        orders = Writers(network, "orders", [0, 1, 2, 3], messages_per_batch=5)
        scratch = Writers(network, "scratch", [0, 1, 2, 3], messages_per_batch=5, ends_on=(Code.UNKNOWN_TOPIC,))
        stop, orders_done, scratch_done, deleted = trio.Event(), trio.Event(), trio.Event(), trio.Event()
        nursery.start_soon(orders.run, stop, orders_done)
        nursery.start_soon(scratch.run, stop, scratch_done)
        await trio.sleep(2 + network.random.random())

        async def delete() -> None:
            await call_any(network, "DeleteTopic", {"topic": "scratch", "force": True}, done_on=(Code.UNKNOWN_TOPIC,))
            deleted.set()

        nursery.start_soon(delete)
        await trio.sleep(network.random.random() * 0.3)
        status = await call_any(network, "ClusterStatus", {})
        assert status is not None
        victim = max(status["nodes"], key=lambda entry: len(entry["load"]["leads"]))["id"]
        nodes[victim].crash()
        await nodes[victim].stopped.wait()
        await trio.sleep(3)
        await nursery.start(nodes[victim].run)
        with trio.fail_after(120):
            await deleted.wait()
            await scratch_done.wait()  # each stream ended on UNKNOWN_TOPIC
            while await call_any(network, "CreateTopic", {"topic": "scratch", "queues": 4},
                                 done_on=(Code.UNAVAILABLE,)) is None:  # still being deleted: its groups drop it
                await trio.sleep(1)
        await trio.sleep(2)  # every replica applies what its leader did
        described = await call_any(network, "DescribeTopic", {"topic": "scratch"})
        assert described is not None and [queue["next_offset"] for queue in described["queues"]] == [0] * 4, described
        for node in nodes.values():
            left = [place for place in node.storage.store.machine.queues if "scratch" in place[0]]
            assert not left, f"node {node.config.node_id} still holds {left}"
        stop.set()
        await orders_done.wait()
        consumed = {queue: await consume_queue(network, "orders", queue) for queue in range(4)}
        report.update(check_consumed(orders, consumed))
        report.update({"scratch_acknowledged": len(scratch.acks), "scratch_refusals": len(scratch.ended),
                       "victim": victim, "simulated_s": round(trio.current_time(), 1)})
        for node in nodes.values():
            node.crash()
    return report


# ---- controller mode (RIP-44) ---------------------------------------------------------------------------------------


class MasterLog:
    """Every time a node became master of a controller-mode group, at which epoch (only the controller's word, which
    hosts get through add_group and control, makes a master): two masters of one epoch would break the controller's
    promise."""

    def __init__(self):
        self.masters: dict[tuple[int, int], set[int]] = {}  # (group, epoch) -> nodes that were master at it
        self._originals = RaftHost.add_group, RaftHost.control

    def __enter__(self) -> MasterLog:
        recorder, (add_group, control) = self, self._originals

        def note(host: RaftHost, group: int) -> None:
            core = host.controlled(group)
            if core is not None and core.role == Role.LEADER:
                recorder.masters.setdefault((group, core.term), set()).add(host.node_id)

        def noted_add_group(host: RaftHost, group: int, *args, **kwargs):
            core = add_group(host, group, *args, **kwargs)
            note(host, group)
            return core

        def noted_control(host: RaftHost, group: int, word) -> None:
            control(host, group, word)
            note(host, group)

        RaftHost.add_group, RaftHost.control = noted_add_group, noted_control
        return self

    def __exit__(self, *_) -> None:
        RaftHost.add_group, RaftHost.control = self._originals


def check_controlled_logs(nodes: dict[int, SimNode]) -> int:
    """Replicas of each controller-mode group hold the same entries up to the lower of their commits; returns the
    entries compared."""
    compared = 0
    cores: dict[int, list] = {}
    for node in nodes.values():
        for group in node.host.groups:
            core = node.host.controlled(group)
            if core is not None:
                cores.setdefault(group, []).append(core)
    for group, replicas in cores.items():
        for first, second in zip(replicas, replicas[1:]):
            low = max(first.snapshot.index, second.snapshot.index) + 1
            high = min(first.commit, second.commit, first.last_index, second.last_index)
            for index in range(low, high + 1):
                one, other = first._entries(index, index + 1), second._entries(index, index + 1)
                assert one == other, f"group {group}: replicas {first.id} and {second.id} differ at committed {index}"
                compared += 1
    return compared


async def create_once(network: Network, at: Address, method: str, request: dict) -> None:
    """A creation whose first try may have been applied with its answer lost between the broker and the nameservers
    (the broker then tries again): "exists" means done."""
    try:
        await network.call(0, (at.host, at.port), method, request, 30.0, True)
    except RocketError as error:
        if not (error.code == Code.TOPIC_EXISTS or "exists" in error.message):
            raise


async def masters(network: Network) -> dict[int, int]:
    """group -> its master, as the controller has it (asked through a live node)."""
    asked = next(node.config.listen for node in network.nodes.values() if node.up)
    classes = await network.call(0, (asked.host, asked.port), "StorageClasses", {"name": "pair"}, 30.0, True)
    return {group["id"]: group["master"] for group in classes["classes"][0]["groups"]}


async def run_controller_failover(seed: int, base: Path, faults: NetworkFaults, scenario: str,
                                  standalone: bool = False) -> dict:
    """Three all-role nodes, a topic on a controller-mode class of two replicas per group, under writes. Scenarios:
    crashes (the node mastering the most groups, restarted; then the nameserver leader's node with the masters it
    hosts, the controller's leader and masters at once, as in apache/rocketmq#7689), partitions (the busiest master
    cut off from the other nodes while the client still reaches it; then the nameserver leader isolated),
    controller_cut (a master's calls to the controller go unanswered while it reaches everyone else). Then everything
    is consumed and checked, and the replicas' logs compared; the controller's elections and the masters each epoch
    had are reported. With standalone, the controller is the standalone one, on the same three nodes."""
    network, nodes = cluster(seed, base, faults, groups=2, standalone=standalone)
    report: dict = {"seed": seed, "scenario": scenario, "faults": []}
    with MasterLog() as master_log, trio.fail_after(SIMULATED_S_MAX):
        async with trio.open_nursery() as nursery:
            await start_nodes(nursery, nodes)
            first = nodes[1].config.listen
            await create_once(network, first, "CreateStorageClass", {
                "name": "pair", "mode": "controller", "replicas": 2, "groups": 3, "min_in_sync_replicas": 1,
                "unclean_election": False, "ha_max_lag_s": 2.0})
            await create_once(network, first, "CreateTopic", {"topic": "orders", "queues": 8, "storage_class": "pair"})
            writers = Writers(network, "orders", [0, 2, 4, 6], messages_per_batch=5)
            stop, written = trio.Event(), trio.Event()
            nursery.start_soon(writers.run, stop, written)
            await trio.sleep(2 + network.random.random())
            for step in range(2):
                asked = next(node.config.listen for node in nodes.values() if node.up)
                status = await network.call(0, (asked.host, asked.port), "ClusterStatus", {}, 30.0, True)
                leader = status["nameserver_leader"] or 1
                by_master = sorted((await masters(network)).values())
                busiest = max(set(by_master), key=lambda node: (by_master.count(node), node))
                if scenario == "crashes":  # the second crash takes the controller's leader and the masters it hosts
                    victims = {busiest} if step == 0 else {leader}
                    for victim in victims:
                        nodes[victim].crash()
                    for victim in victims:
                        await nodes[victim].stopped.wait()
                elif scenario == "partitions":
                    victims = {busiest} if step == 0 else {leader}
                    (network.split if step == 0 else network.isolated).update(victims)
                else:
                    followers = [node for node in by_master if node != leader] or by_master
                    victims = {max(set(followers), key=followers.count)}
                    network.controller_cut.update(victims)
                acked_before = len(writers.acks)
                faulted_at = trio.current_time()
                with trio.move_on_after(10):
                    while len(writers.acks) == acked_before:
                        await trio.sleep(0.05)
                report["faults"].append({"step": step, "victims": sorted(victims), "nameserver_leader": leader,
                                         "first_ack_after_s": round(trio.current_time() - faulted_at, 2)})
                await trio.sleep(4 + network.random.random() * 2)
                if scenario == "crashes":
                    for victim in victims:
                        await nursery.start(nodes[victim].run)
                else:
                    network.split.clear(), network.isolated.clear(), network.controller_cut.clear()
                await trio.sleep(4)
            stop.set()
            await written.wait()
            consumed = {queue: await consume_queue(network, "orders", queue) for queue in range(8)}
            report.update(check_consumed(writers, consumed))
            report["compared_entries"] = check_controlled_logs(nodes)
            asked = next(node.config.listen for node in nodes.values() if node.up)
            described = await network.call(0, (asked.host, asked.port), "StorageClasses", {"name": "pair"}, 30.0, True)
            report["elections"] = len(described["classes"][0]["elections"])
            report.update({"batches": len(writers.acks), "resends": writers.resends, "answers_lost": network.lost,
                           "simulated_s": round(trio.current_time(), 1)})
            for node in nodes.values():
                node.crash()
    report["two_masters_in_an_epoch"] = {f"{group}@{epoch}": sorted(found)
                                         for (group, epoch), found in master_log.masters.items() if len(found) > 1}
    return report


REPLAYED_FAULTS = NetworkFaults(drop=0.02, call_loss=0.01)  # what a replay is checked under: every random draw in use


def failover_trace(seed: int, base: Path) -> list[str]:
    """The network's trace of one failover run under REPLAYED_FAULTS, on trio's mock clock."""
    trace: list[str] = []
    trio.run(functools.partial(run_failover, seed, base, REPLAYED_FAULTS, trace=trace),
             clock=trio.testing.MockClock(autojump_threshold=0))
    return trace


if __name__ == "__main__":  # python -m tests.sim.roles_sim SEED DIRECTORY: print a failover run's trace
    import sys

    print("\n".join(failover_trace(int(sys.argv[1]), Path(sys.argv[2]))))
