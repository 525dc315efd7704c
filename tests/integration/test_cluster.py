"""Three all-role `rocket run` processes (nameserver, storage and broker in each), 100 storage groups with
three replicas, written to continuously by writers that fail over between brokers. Three SIGKILLs, each
followed by a restart on the same data directory: the node leading the most storage groups, the
nameserver leader, and a node whose broker a writer is using. Each restarted node must catch up: its
replicas of the written queues reach what the others held when it came back (asked of each storage node
directly with the internal StorageQueues method). Afterwards every acknowledged message is consumed, intact,
at the offset it was acknowledged at, in per-queue order, with no gaps in the offsets, and exactly once: a batch
resent after an unknown outcome is the same numbered request (idempotent producers), stored once.

Run with -s to see one line per kill (how long until produce resumes and until the survivors lead every
group) and the totals. Node logs are in the test's tmp_path (node<N>.log, stdout in node<N>.out).
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import trio

from rocket.client import Consumer, connect
from rocket.client.producer import Sequencer
from rocket.errors import Code, RocketError
from rocket.model import Message
from rocket.serde import batch as batch_codec
from rocket.transport.listen import free_ports

NODES = (1, 2, 3)
GROUPS = 100
QUEUES = 32
WRITER_QUEUES = (0, 4, 8, 12, 16, 20, 24, 28)  # one writer, one sequential stream of batches, per queue
BATCH = 20
# Sequence numbers of queue q are q * SEQ_SPAN + n: unique over the test, and over a soak of hours
# (benchmarks/controller_failover.py wrote 1.7 million messages to one queue in 14 minutes).
SEQ_SPAN = 1_000_000_000
FAILOVER = (Code.CONNECTION_LOST, Code.UNAVAILABLE, Code.TIMEOUT)  # outcome unknown: reconnect and resend
BOUND_S = 30.0  # loose bound for each failover figure; the figures themselves are printed
CAUGHT_UP_ENTRIES = 200  # a replica this close to its leader's log has caught up (writes go on meanwhile)
READY = re.compile(rb"rocket ready tcp=[^ ]+ http2=off node=(\d+)")
ROOT = Path(__file__).resolve().parents[2]  # the tree whose rocket the nodes run


def make_message(queue: int, seq: int) -> Message:
    return Message(f"q{queue}-s{seq}-".encode() + bytes(range(seq % 61)), key=f"k{queue}", tag=f"t{seq % 3}",
                   properties={"seq": str(seq), "queue": str(queue)})


def check_intact(message: Message) -> int:
    seq = int(message.properties["seq"])
    expected = make_message(int(message.properties["queue"]), seq)
    assert (message.body, message.key, message.tag, message.properties) == (
        expected.body, expected.key, expected.tag, expected.properties), f"message {seq} damaged"
    assert message.queue == seq // SEQ_SPAN, f"message {seq} stored in queue {message.queue}"
    return seq


class Node:
    """One `python -m rocket run` process with a fixed port and data dir, killable and restartable."""

    root = ROOT  # the tree whose rocket it runs (test_upgrade.py sets an older release's)
    launcher: tuple[str, ...] = ("-m", "rocket")  # what python runs (test_partitions.py: benchmarks/routed.py)
    ready_pattern = READY  # its ready line, as command() starts it

    def __init__(self, node_id: int, port: int, nameservers: str, base: Path, roles: str = "all",
                 environment: dict[str, str] | None = None):
        self.node_id = node_id
        self.roles = roles
        self.environment = environment or {"ROCKET_STORAGE_GROUPS": str(GROUPS), "ROCKET_REPLICATION": "3"}
        self.port = port
        self.nameservers = nameservers
        self.data_dir = base / f"data{node_id}"
        self.out_path = base / f"node{node_id}.out"
        self.log_path = base / f"node{node_id}.log"
        self.process: subprocess.Popen | None = None
        self.starts = 0
        self.out_from = 0  # where the process started last began writing its stdout

    @property
    def server(self) -> str:
        return f"127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        """The `rocket run` command line (benchmarks/kill_loop.py's nodes take theirs from a config file)."""
        return [sys.executable, *self.launcher, "run", "--role", self.roles, "--node-id", str(self.node_id),
                "--nameservers", self.nameservers, "--listen", self.server, "--http2-listen", "off",
                "--data-dir", str(self.data_dir)]

    def start(self) -> None:
        # The process runs this tree's rocket, not whatever an editable install points at.
        path = os.pathsep.join(filter(None, [str(self.root), os.environ.get("PYTHONPATH")]))
        env = {**os.environ, "PYTHONPATH": path, **self.environment}
        command = self.command()
        with open(self.out_path, "ab") as out, open(self.log_path, "ab") as log:
            self.out_from = out.tell()
            log.write(f"---- start {self.starts + 1} at {time.strftime('%H:%M:%S')}\n".encode())
            log.flush()
            # cwd too: `python -m` puts the working directory first on the path.
            self.process = subprocess.Popen(command, stdout=out, stderr=log, env=env, cwd=self.root)
        self.starts += 1

    def ready_lines(self) -> int:
        return len(self.ready_pattern.findall(self.out_path.read_bytes())) if self.out_path.exists() else 0

    def started_ready(self) -> bool:
        """Whether the process started last printed its ready line (one killed before it did, never will)."""
        if not self.out_path.exists():
            return False
        with open(self.out_path, "rb") as out:
            out.seek(self.out_from)
            return self.ready_pattern.search(out.read()) is not None

    async def wait_ready(self, timeout_s: float = 40.0) -> None:
        with trio.fail_after(timeout_s):
            while not self.started_ready():
                if self.process.poll() is not None:
                    raise AssertionError(f"node {self.node_id} exited with {self.process.returncode}: "
                                         f"{self.log_path.read_text()[-3000:]}")
                await trio.sleep(0.05)

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait()

    def exited_by_itself(self) -> int | None:
        """The exit status if the process ended although nobody killed it."""
        return self.process.poll() if self.process is not None else None


LOG_TAIL_LINES = 60  # of each node, printed when a test running them fails


@contextlib.contextmanager
def running(nodes: dict[int, Node], ready_s: float = 90.0):
    """Start the nodes, wait until each printed its ready line, and kill them all at the end."""
    try:
        for node in nodes.values():
            node.start()

        async def ready() -> None:
            for node in nodes.values():
                await node.wait_ready(ready_s)
        trio.run(ready)
        yield nodes
    except BaseException:  # what each node said last, beside the failure (the temporary directory may be gone)
        for node in nodes.values():
            tail = node.log_path.read_text(errors="replace").splitlines()[-LOG_TAIL_LINES:] \
                if node.log_path.exists() else []
            print(f"---- node {node.node_id}: the last {len(tail)} lines of {node.log_path.name} ----", *tail, sep="\n")
        raise
    finally:
        for node in nodes.values():
            node.kill()


@pytest.fixture
def cluster(tmp_path):
    ports = free_ports(len(NODES))
    nameservers = ",".join(f"{node}@127.0.0.1:{port}" for node, port in zip(NODES, ports))
    nodes = {node: Node(node, port, nameservers, tmp_path) for node, port in zip(NODES, ports)}
    try:
        yield nodes
    finally:
        for node in nodes.values():
            node.kill()


async def cluster_status(servers: list[str], timeout_s: float = 3.0) -> dict | None:
    """ClusterStatus from the first of servers that answers within timeout_s, else None."""
    for server in servers:
        with trio.move_on_after(timeout_s):
            try:
                async with connect(server) as channel:
                    return await channel.call("ClusterStatus", {}, timeout_s=timeout_s)
            except RocketError:
                continue
    return None


@dataclasses.dataclass
class Ack:
    at: float  # trio.current_time() when the reply came
    queue: int
    base_offset: int
    seqs: list[int]
    node: int  # whose broker acknowledged
    sent_at: float = 0.0  # trio.current_time() when this send of the batch went out


@dataclasses.dataclass
class Writers:
    servers: dict[int, str]
    stop: trio.Event = dataclasses.field(default_factory=trio.Event)
    acks: list[Ack] = dataclasses.field(default_factory=list)
    sent: set[int] = dataclasses.field(default_factory=set)  # every seq sent at least once
    using: dict[int, int] = dataclasses.field(default_factory=dict)  # queue -> node whose broker it is using
    done: int = 0  # writers that have stopped
    failovers: int = 0
    resends: int = 0
    errors: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    timeout_s: float = 30.0  # of each produce call: past it the outcome is unknown, and the next broker gets it
    failover: tuple[Code, ...] = FAILOVER  # answers after which the next broker gets the batch, as the same request

    async def write(self, queue: int, first_node_index: int) -> None:
        """One sequential stream of batches to queue; on an unknown outcome, the next broker gets the same batch, as
        the same request: numbered by its producer (client/producer.py's Sequencer), so it is stored once."""
        order = list(self.servers)
        index = first_node_index
        count = 0
        pending: list[int] | None = None
        sequencer = Sequencer()
        while True:
            node = order[index % len(order)]
            try:
                async with connect(self.servers[node]) as channel:
                    self.using[queue] = node
                    while True:
                        if pending is None:
                            if self.stop.is_set():
                                self.done += 1
                                return
                            assert count + BATCH <= SEQ_SPAN, f"queue {queue}'s writer ran out of sequence numbers"
                            pending = [queue * SEQ_SPAN + count + i for i in range(BATCH)]
                            count += BATCH
                            request = sequencer.produce_request("orders", queue, batch_codec.encode(
                                [make_message(queue, seq) for seq in pending], 1_700_000_000_000))
                        else:
                            self.resends += 1
                        self.sent.update(pending)
                        sent_at = trio.current_time()
                        reply = await channel.call("Produce", request, timeout_s=self.timeout_s)
                        assert reply["queue"] == queue and reply["count"] == len(pending), reply
                        self.acks.append(Ack(trio.current_time(), queue, reply["base_offset"], pending, node, sent_at))
                        pending = None
            except RocketError as error:
                if error.code not in self.failover:
                    raise
                self.errors[error.code.name] += 1
                self.failovers += 1
                self.using.pop(queue, None)
                index += 1
                await trio.sleep(0.05)


@dataclasses.dataclass
class Kill:
    what: str
    victim: int
    led: int
    first_ack_s: float | None = None
    all_writers_s: float | None = None
    all_led_s: float | None = None
    back_up_s: float | None = None
    caught_up_s: float | None = None


async def wait_all_groups_led(servers: list[str], among: set[int], timeout_s: float, groups: int = GROUPS) -> dict:
    with trio.fail_after(timeout_s):
        while True:
            status = await cluster_status(servers)
            if status is not None and len(status["groups"]) == groups and all(
                    group["leader"] in among for group in status["groups"]):
                return status
            await trio.sleep(0.2)


async def kill_and_restart(nodes: dict[int, Node], writers: Writers, victim: int, what: str,
                           led: int) -> Kill:
    """SIGKILL victim, measure until produce resumes and the survivors lead every group, then restart it
    and wait until it is up and its replicas of the written queues have caught up."""
    record = Kill(what, victim, led)
    survivors = [node for node in nodes if node != victim]
    survivor_servers = [nodes[node].server for node in survivors]
    killed_at = trio.current_time()
    nodes[victim].kill()
    acks_before = len(writers.acks)
    resumed: dict[int, float] = {}  # writer queue -> time of its first acknowledgement after the kill
    with trio.move_on_after(BOUND_S + 15):
        while record.first_ack_s is None or record.all_writers_s is None or record.all_led_s is None:
            after = writers.acks[acks_before:]
            after = [ack for ack in after if ack.at > killed_at]
            if after and record.first_ack_s is None:
                record.first_ack_s = after[0].at - killed_at
            for ack in after:
                resumed.setdefault(ack.queue, ack.at)
            if len(resumed) == len(WRITER_QUEUES) and record.all_writers_s is None:
                record.all_writers_s = max(resumed.values()) - killed_at
            if record.all_led_s is None:
                status = await cluster_status(survivor_servers)
                if status is not None and len(status["groups"]) == GROUPS and all(
                        group["leader"] in survivors for group in status["groups"]):
                    record.all_led_s = trio.current_time() - killed_at
            await trio.sleep(0.1)
    if record.first_ack_s is None or record.all_writers_s is None or record.all_led_s is None:
        pytest.fail(f"kill {what} (node {victim}): {BOUND_S + 15:.0f} s later, still not all of: a produce "
                    f"acknowledged ({record.first_ack_s}), every writer producing ({record.all_writers_s}), every "
                    f"group led by a survivor ({record.all_led_s}); writers of queues "
                    f"{sorted(set(WRITER_QUEUES) - set(resumed))} acknowledged nothing since the kill; brokers "
                    f"in use {writers.using}; writer errors {dict(writers.errors)}; "
                    f"logs in {nodes[victim].log_path.parent}")
    restarted_at = trio.current_time()
    nodes[victim].start()
    await nodes[victim].wait_ready()
    with trio.fail_after(30):
        while True:
            status = await cluster_status(survivor_servers)
            if status is not None and {entry["id"]: entry["state"] for entry in status["nodes"]}.get(victim) == "up":
                break
            await trio.sleep(0.2)
    record.back_up_s = trio.current_time() - restarted_at
    record.caught_up_s = await wait_caught_up(survivor_servers, victim, timeout_s=20)
    print(f"kill {what}: node {victim} (led {record.led} of {GROUPS} groups); first produce acknowledged after "
          f"{record.first_ack_s:.2f} s; every writer producing again after {record.all_writers_s:.2f} s; "
          f"survivors led all {GROUPS} groups after {record.all_led_s:.2f} s; restarted and up in "
          f"{record.back_up_s:.2f} s, its replicas of the written queues caught up {record.caught_up_s:.2f} s later",
          flush=True)
    return record


def leader_counts(status: dict) -> collections.Counter:
    return collections.Counter(group["leader"] for group in status["groups"])


async def consume_all(server: str) -> tuple[list[Message], dict[int, int]]:
    async with connect(server, serde="avro") as channel:
        consumer = Consumer(channel, "orders", "verify", start="earliest", wait_ms=300)
        await consumer.open()
        received: list[Message] = []
        while messages := await consumer.poll():
            received.extend(messages)
        described = await channel.call("DescribeTopic", {"topic": "orders"})
    return received, {entry["queue"]: entry["next_offset"] for entry in described["queues"]}


async def verify_acknowledged(writers: Writers, server: str, tmp_path: Path) -> dict:
    """Consume everything from earliest through server with a fresh group; every acknowledged message
    is there at its offset, intact, offsets per queue are 0..next-1, per-queue order kept."""
    consumed, next_offsets = await consume_all(server)
    by_queue: dict[int, list[Message]] = collections.defaultdict(list)
    for message in consumed:
        by_queue[message.queue].append(message)
    seq_at = {(message.queue, message.offset): check_intact(message) for message in consumed}
    queues_of_topic = range(len(next_offsets))
    gaps = [queue for queue in queues_of_topic
            if [message.offset for message in by_queue[queue]] != list(range(next_offsets[queue]))]
    acked_order: dict[int, list[int]] = collections.defaultdict(list)
    missing: list[tuple[int, int, int]] = []  # (queue, offset, seq) acknowledged but not consumed there
    for ack in writers.acks:
        acked_order[ack.queue].extend(ack.seqs)
        missing += [(ack.queue, ack.base_offset + index, seq) for index, seq in enumerate(ack.seqs)
                    if seq_at.get((ack.queue, ack.base_offset + index)) != seq]
    if gaps or missing:
        queues = sorted(set(gaps) | {queue for queue, _, _ in missing})
        pytest.fail(f"queues with offsets other than 0..next-1: {gaps}; {len(missing)} acknowledged messages not "
                    f"consumed where acknowledged (first {missing[:3]}); DescribeTopic through {server} gave next "
                    f"offsets {[next_offsets[queue] for queue in queues]} for queues {queues}, consumed "
                    f"{[len(by_queue[queue]) for queue in queues]}; logs in {tmp_path}")
    acked = {seq for seqs in acked_order.values() for seq in seqs}
    distinct: set[int] = set()
    for queue in queues_of_topic:
        first_seen = []
        for message in by_queue[queue]:
            seq = int(message.properties["seq"])
            if seq not in distinct:
                distinct.add(seq)
                first_seen.append(seq)
        assert [seq for seq in first_seen if seq in acked] == acked_order[queue], f"queue {queue} out of order"
        assert first_seen == sorted(first_seen), f"queue {queue}: first occurrences out of send order"
    assert distinct <= writers.sent, "consumed a message nobody sent"
    offsets_of: dict[int, list[tuple[int, int]]] = collections.defaultdict(list)
    for message in consumed:
        offsets_of[int(message.properties["seq"])].append((message.queue, message.offset))
    acked_at = {(ack.queue, ack.base_offset): ack for ack in writers.acks}
    previous_at: dict[tuple[int, int], float] = {}  # (queue, base offset) -> the queue's acknowledgement before
    last: dict[int, float] = {}
    for ack in writers.acks:
        previous_at[(ack.queue, ack.base_offset)] = last.get(ack.queue, ack.at)
        last[ack.queue] = ack.at
    wall_offset = time.time() - trio.current_time()
    duplicated = []  # (queue, offsets of each copy, when and how long after the queue's previous ack)
    for seq, where in sorted(offsets_of.items()):
        if len(where) > 1 and seq % BATCH == 0:
            spot = next((spot for spot in where if spot in acked_at), None)
            if spot is None:
                duplicated.append((where[0][0], [offset for _, offset in where], "never acknowledged"))
                continue
            ack = acked_at[spot]
            wall = ack.at + wall_offset
            duplicated.append((where[0][0], [offset for _, offset in where],
                               f"acknowledged at offset {spot[1]} at {time.strftime('%H:%M:%S', time.localtime(wall))}"
                               f".{int(wall % 1 * 1000):03d} via node {ack.node}, "
                               f"{ack.at - previous_at[spot]:.2f} s after the queue's previous acknowledgement"))
    return {"acknowledged": len(acked), "batches": len(writers.acks), "consumed": len(consumed),
            "distinct": len(distinct), "duplicates": len(consumed) - len(distinct),
            "never_acknowledged": len(distinct - acked), "acked": acked,
            "duplicated_batches": duplicated}


async def wait_caught_up(servers: list[str], node_id: int, timeout_s: float) -> float:
    """Wait until no group's leader reports node_id more than CAUGHT_UP_ENTRIES behind (cluster status,
    from heartbeats); returns the seconds taken. A restarted replica that never catches up fails the test."""
    started = trio.current_time()
    behind: list = []
    with trio.move_on_after(timeout_s):
        while True:
            await trio.sleep(1.2)  # a heartbeat interval: the lag reported is then from after the restart
            status = await cluster_status(servers)
            if status is not None:
                behind = [(group["id"], lag["entries"]) for group in status["groups"] for lag in group["lagging"]
                          if lag["node"] == node_id and lag["entries"] > CAUGHT_UP_ENTRIES]
                if not behind:
                    return trio.current_time() - started
    pytest.fail(f"node {node_id}, restarted, is still behind after {timeout_s} s: (group, entries) {behind}")


async def test_three_kills_under_load_lose_no_acknowledged_message(cluster, tmp_path):
    """Kill -9 the busiest storage leader, the nameserver leader and a writer's broker, each restarted;
    everything acknowledged is consumed intact at its offset, per-queue order kept, offsets without gaps."""
    nodes: dict[int, Node] = cluster
    servers = [node.server for node in nodes.values()]
    started = time.monotonic()
    for node in nodes.values():
        node.start()
    for node in nodes.values():
        await node.wait_ready()
    async with connect(servers[0]) as channel:
        await channel.call("CreateTopic", {"topic": "orders", "queues": QUEUES}, timeout_s=30)
    status = await wait_all_groups_led(servers, set(nodes), timeout_s=30)
    print(f"\ncluster up with {GROUPS} groups led {dict(sorted(leader_counts(status).items()))} after "
          f"{time.monotonic() - started:.1f} s; logs in {tmp_path}", flush=True)

    writers = Writers({node.node_id: node.server for node in nodes.values()})
    kills: list[Kill] = []
    async with trio.open_nursery() as nursery:
        for index, queue in enumerate(WRITER_QUEUES):
            nursery.start_soon(writers.write, queue, index)
        await trio.sleep(3)

        # (a) the node leading the most storage groups
        status = await cluster_status(servers)
        counts = leader_counts(status)
        victim = max(nodes, key=lambda node: counts.get(node, 0))
        kills.append(await kill_and_restart(nodes, writers, victim, "busiest storage leader", counts[victim]))
        await trio.sleep(2)

        # (b) the nameserver leader
        status = await cluster_status(servers)
        victim = status["nameserver_leader"]
        assert victim in nodes, status["nameserver_leader"]
        kills.append(await kill_and_restart(nodes, writers, victim, "nameserver leader",
                                            leader_counts(status).get(victim, 0)))
        await trio.sleep(2)

        # (c) a node whose broker writers are using (the one most of them use)
        status = await cluster_status(servers)
        using = collections.Counter(writers.using.values())
        victim = using.most_common(1)[0][0]
        kills.append(await kill_and_restart(nodes, writers, victim, f"broker of {using[victim]} writers",
                                            leader_counts(status).get(victim, 0)))
        await trio.sleep(2)

        writers.stop.set()  # each writer ends once its batch in flight is acknowledged
        with trio.fail_after(40):
            while writers.done < len(WRITER_QUEUES):
                await trio.sleep(0.1)
    for node in nodes.values():
        assert node.exited_by_itself() is None, f"node {node.node_id} died: {node.log_path.read_text()[-3000:]}"

    result = await verify_acknowledged(writers, servers[0], tmp_path)
    print(f"totals: acknowledged {result['acknowledged']} messages in {result['batches']} batches; consumed "
          f"{result['consumed']} ({result['distinct']} distinct); duplicates {result['duplicates']} "
          f"{result['duplicated_batches']}; stored but never acknowledged {result['never_acknowledged']}; writer "
          f"failovers {writers.failovers} {dict(writers.errors)}, resends {writers.resends}; wall "
          f"{time.monotonic() - started:.1f} s", flush=True)
    acked = result["acked"]
    assert len(acked) > 1000
    assert result["duplicates"] == 0, result["duplicated_batches"]  # idempotent producers: resends stored once
    for kill in kills:
        assert kill.first_ack_s < BOUND_S and kill.all_writers_s < BOUND_S and kill.all_led_s < BOUND_S, kill
