"""A controller-mode (RIP-44) cluster of separate `rocket run` processes: three nameservers (the controller), two
storage nodes and a broker, writers producing through the broker, the kill -9 of the busiest master measured until
every writer is acknowledged again, and handovers measured by the writers' stalls. Shared by
tests/integration/test_controller_mode.py and benchmarks/controller_failover.py; the processes and writers are
tests/integration/test_cluster.py's.
"""

from __future__ import annotations

import collections
import dataclasses
import re
import sys
import time
from pathlib import Path

import trio

from rocket.client import Admin, connect
from rocket.errors import Code, RocketError
from rocket.transport.listen import free_ports
from tests.integration.test_cluster import Node, Writers, cluster_status

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import faults  # noqa: E402  (benchmarks/faults.py: its TCP fault proxy)

NAMESERVERS = (1, 2, 3)
STORAGE = (11, 12)
BROKER = 21
STORAGE_CLASS = "pair"
GROUPS = 3
QUEUES = 6
# The default (Raft) class: no topic of this cluster uses it, but its settings must fit two storage nodes.
ENVIRONMENT = {"ROCKET_STORAGE_GROUPS": "2", "ROCKET_REPLICATION": "2"}
FAILOVER_WAIT_S_MAX = 30.0  # a failover slower than this fails the run; the figures themselves are reported
# A restarted replica back in every group's sync state set within this (under load it has taken 38 s: it joins only
# when the master, asking every controller_sync_state_s, finds it holding everything committed)
IN_SYNC_WAIT_S_MAX = 90.0
POLL_S = 0.1
LOG_TIME = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3}) ")


class NameserverProxies:
    """benchmarks/faults.py's TCP proxy in front of each nameserver, in this process, for one storage node: cut()
    stops them (the node's connections to the controller drop, new ones are refused), heal() starts them again."""

    def __init__(self, routes: list[tuple[int, int, int]], control: Path):
        self.routes = routes  # (nameserver id, proxy port, nameserver port)
        self.control = control  # faults.py's control file; absent, the proxies forward unchanged
        self.scope: trio.CancelScope | None = None

    @property
    def members(self) -> str:
        """The --nameservers of the node behind them."""
        return ",".join(f"{node}@127.0.0.1:{port}" for node, port, _ in self.routes)

    async def start(self, nursery: trio.Nursery) -> None:
        self.scope = await nursery.start(self._serve)

    async def _serve(self, task_status=trio.TASK_STATUS_IGNORED) -> None:
        with trio.CancelScope() as scope:
            async with trio.open_nursery() as nursery:
                for _, port, target in self.routes:
                    await nursery.start(faults.run_proxy, ("127.0.0.1", port), ("127.0.0.1", target), self.control)
                task_status.started(scope)

    def cut(self) -> None:
        self.scope.cancel()
        self.scope = None

    async def heal(self, nursery: trio.Nursery) -> None:
        await self.start(nursery)


class ControllerCluster:
    """The processes, with fixed ports and data directories under base; the storage nodes in proxied reach the
    nameservers through NameserverProxies of their own (started by start_proxies, in the caller's nursery). With
    controllers, those nodes run the standalone controller (`--role controller`), and every node points at them."""

    def __init__(self, base: Path, proxied: tuple[int, ...] = (), controllers: tuple[int, ...] = (),
                 storage: tuple[int, ...] = STORAGE):
        ports = iter(free_ports(len(NAMESERVERS) + len(storage) + 1 + len(NAMESERVERS) * len(proxied)
                                + len(controllers)))
        nameserver_ports = {node: next(ports) for node in NAMESERVERS}
        members = ",".join(f"{node}@127.0.0.1:{port}" for node, port in nameserver_ports.items())
        controller_ports = {node: next(ports) for node in controllers}
        environment = dict(ENVIRONMENT)
        if controllers:
            environment["ROCKET_CONTROLLERS"] = ",".join(f"{node}@127.0.0.1:{port}"
                                                         for node, port in controller_ports.items())
        self.base = base
        self.nameservers = {node: Node(node, port, members, base, "nameserver", environment)
                            for node, port in nameserver_ports.items()}
        self.proxies = {node: NameserverProxies([(ns, next(ports), port) for ns, port in nameserver_ports.items()],
                                                base / f"proxies{node}.json") for node in proxied}
        self.storage = {node: Node(node, next(ports), self.proxies[node].members if node in proxied else members, base,
                                   "storage", environment) for node in storage}
        self.broker = Node(BROKER, next(ports), members, base, "broker", environment)
        self.controllers = {node: Node(node, port, members, base, "controller", environment)
                            for node, port in controller_ports.items()}

    @property
    def nodes(self) -> list[Node]:
        return [*self.controllers.values(), *self.nameservers.values(), *self.storage.values(), self.broker]

    def add_controllers(self, controllers: tuple[int, ...]) -> str:
        """Start standalone controllers (`--role controller`) on free ports beside a running cluster; returns their
        group, as ROCKET_CONTROLLERS names it (the other nodes take it when they restart)."""
        ports = free_ports(len(controllers))
        members = ",".join(f"{node}@127.0.0.1:{port}" for node, port in zip(controllers, ports))
        nameservers = next(iter(self.nameservers.values())).nameservers
        for node, port in zip(controllers, ports):
            self.controllers[node] = Node(node, port, nameservers, self.base, "controller",
                                          {**ENVIRONMENT, "ROCKET_CONTROLLERS": members})
            self.controllers[node].start()
        return members

    async def start_proxies(self, nursery: trio.Nursery) -> None:
        for proxies in self.proxies.values():
            await proxies.start(nursery)

    async def start(self, timeout_s: float = 60.0) -> None:
        """Every process ready, and both storage nodes up in the nameservers' view."""
        for node in self.nodes:
            node.start()
        for node in self.nodes:
            await node.wait_ready(timeout_s)
        with trio.fail_after(timeout_s):
            while True:
                status = await cluster_status([self.broker.server])
                if status is not None and {entry["id"] for entry in status["nodes"] if entry["state"] == "up"
                                           and "storage" in entry["roles"]} >= set(self.storage):
                    return
                await trio.sleep(0.2)

    def kill(self) -> None:
        for node in self.nodes:
            node.kill()

    async def queue_groups(self) -> list[int]:
        """The storage group of each queue of topic "orders" (a nameserver's route)."""
        async with connect(self.nameservers[NAMESERVERS[0]].server) as channel:
            return (await channel.call("GetRoute", {"topic": "orders"}))["queue_groups"]

    def died(self) -> list[str]:
        """Each process that ended although nobody killed it, with its log's tail."""
        return [f"node {node.node_id} exited with {node.exited_by_itself()}: {node.log_path.read_text()[-2000:]}"
                for node in self.nodes if node.exited_by_itself() is not None]


async def create_topic(admin: Admin, queues: int = QUEUES) -> dict:
    """The controller class (2 replicas, GROUPS groups) and topic "orders" on it; returns the class."""
    made = await admin.create_storage_class(STORAGE_CLASS, "controller", replicas=2, groups=GROUPS)
    await admin.create_topic("orders", queues, storage_class=STORAGE_CLASS)
    return made


async def described(admin: Admin) -> dict:
    [storage_class] = await admin.storage_classes(STORAGE_CLASS)
    return storage_class


def in_sync(storage_class: dict) -> bool:
    """Every group has a master and both replicas in its sync state set."""
    return all(group["master"] in STORAGE and sorted(group["sync_state_set"]) == list(STORAGE)
               for group in storage_class["groups"])


def epochs(storage_class: dict) -> dict[int, tuple[int, int]]:
    """group -> (master_epoch, sync_state_set_epoch)"""
    return {group["id"]: (group["master_epoch"], group["sync_state_set_epoch"]) for group in storage_class["groups"]}


async def wait_in_sync(admin: Admin, timeout_s: float = IN_SYNC_WAIT_S_MAX) -> dict:
    """Poll the controller until both replicas are in every group's sync state set; returns the class."""
    last = None
    with trio.move_on_after(timeout_s):
        while True:
            last = await described(admin)
            if in_sync(last):
                return last
            await trio.sleep(0.2)
    raise AssertionError(f"not every group's sync state set holds both replicas after {timeout_s} s: "
                         f"{[(group['id'], group['master'], group['sync_state_set']) for group in last['groups']]}")


def log_times(path: Path, pattern: str) -> list[tuple[float, str]]:
    """(wall-clock time, line) of each line of a node log that contains pattern."""
    found = []
    for line in path.read_text(errors="replace").splitlines():
        stamp = LOG_TIME.match(line)
        if stamp and pattern in line:
            seconds = time.mktime(time.strptime(stamp.group(1), "%Y-%m-%d %H:%M:%S"))
            found.append((seconds + int(stamp.group(2)) / 1000, line))
    return found


@dataclasses.dataclass
class Failover:
    victim: int
    survivor: int
    mastered: int  # groups the victim mastered when killed
    killed_at: float  # trio.current_time() of the kill
    killed_wall: float  # time.time() of the kill, to compare with the node logs
    # writer's queue -> seconds from the kill to the acknowledgement of the first batch it sent after the kill (a
    # reply that crossed the kill would say 0 for a writer whose next batch then waits for the new master)
    writers_s: dict[int, float] = dataclasses.field(default_factory=dict)
    promoted_s: dict[int, float] = dataclasses.field(default_factory=dict)  # group -> the survivor serves as master
    elected_s: float | None = None  # kill -> the controller shows a new master for each group (polled)
    epochs_after: dict[int, tuple[int, int]] = dataclasses.field(default_factory=dict)
    ready_s: float = 0.0  # restart -> the process ready
    in_sync_s: float = 0.0  # ready -> both replicas in every group's sync state set again

    @property
    def failover_s(self) -> float:
        """Kill -> every writer acknowledged again (the slowest writer's)."""
        return max(self.writers_s.values())

    def complete(self, queues: list[int], groups: set[int]) -> bool:
        return set(self.writers_s) == set(queues) and set(self.promoted_s) == groups and self.elected_s is not None


async def _watch_writers(record: Failover, writers: Writers, first_ack: int) -> None:
    while True:
        for ack in writers.acks[first_ack:]:
            if ack.sent_at > record.killed_at:
                record.writers_s.setdefault(ack.queue, ack.at - record.killed_at)
        first_ack = len(writers.acks)
        await trio.sleep(POLL_S / 2)


async def _watch_election(record: Failover, admin: Admin) -> None:
    while True:
        after = await described(admin)
        if all(group["master"] != record.victim for group in after["groups"]):
            record.elected_s = trio.current_time() - record.killed_at
            record.epochs_after = epochs(after)
            return
        await trio.sleep(POLL_S)


async def _watch_promotion(record: Failover, server: str, queue_of: dict[int, int]) -> None:
    """Ask the survivor for a read only a master serves, of each group, until it serves them all."""
    async with connect(server) as channel:
        while len(record.promoted_s) < len(queue_of):
            for group, queue in queue_of.items():
                if group in record.promoted_s:
                    continue
                try:
                    await channel.call("StorageRead", {
                        "group": group, "topic": "orders", "queues": [{"queue": queue, "offset": 0}], "max_bytes": 1,
                        "wait_ms": 0, "at_least_one": False, "any_replica": False, "follower_ok": False})
                except RocketError as error:
                    if error.code != Code.UNAVAILABLE:  # not the master (yet)
                        raise
                    continue
                record.promoted_s[group] = trio.current_time() - record.killed_at
            await trio.sleep(POLL_S / 2)


async def kill_busiest_master(cluster: ControllerCluster, writers: Writers, admin: Admin, queues: list[int],
                              queue_groups: list[int]) -> Failover:
    """SIGKILL the storage node that masters the most groups; wait until every writer (one per queue of queues) is
    acknowledged again, the controller has elected the other replica, and that replica serves as master of every
    group; restart the node and wait until it is back in every group's sync state set."""
    before = await described(admin)
    masters = collections.Counter(group["master"] for group in before["groups"])
    victim = max(STORAGE, key=lambda node: masters.get(node, 0))
    survivor = next(node for node in STORAGE if node != victim)
    queue_of = {group: queue_groups.index(group) for group in set(queue_groups)}
    first_ack = len(writers.acks)
    record = Failover(victim, survivor, masters[victim], trio.current_time(), time.time())
    cluster.storage[victim].kill()
    with trio.move_on_after(FAILOVER_WAIT_S_MAX):
        async with trio.open_nursery() as watching:
            watching.start_soon(_watch_writers, record, writers, first_ack)
            watching.start_soon(_watch_election, record, admin)
            watching.start_soon(_watch_promotion, record, cluster.storage[survivor].server, queue_of)
            while not record.complete(queues, set(queue_of)):
                await trio.sleep(POLL_S)
            watching.cancel_scope.cancel()
    if not record.complete(queues, set(queue_of)):
        raise AssertionError(f"{FAILOVER_WAIT_S_MAX} s after killing master {victim}: writers of queues "
                             f"{sorted(set(queues) - set(record.writers_s))} not acknowledged since; new masters "
                             f"elected after {record.elected_s} s; node {survivor} serves as master of groups "
                             f"{record.promoted_s}; writer errors {dict(writers.errors)}; logs in {cluster.base}")
    restarted_at = trio.current_time()
    cluster.storage[victim].start()
    await cluster.storage[victim].wait_ready()
    record.ready_s = trio.current_time() - restarted_at
    await wait_in_sync(admin)
    record.in_sync_s = trio.current_time() - restarted_at - record.ready_s
    return record


async def hand_over_each(writers: Writers, admin: Admin, queues: list[int], queue_groups: list[int]) -> list[float]:
    """Each group's mastership handed over to its other replica under load (the other replica is in its SyncStateSet):
    the target is master at the next epoch, and its writer is acknowledged again; returns each writer's stall: the
    longest gap between its acknowledgements from the handover's call to 1 s after its writer was acknowledged again."""
    stalls = []
    for group in (await wait_in_sync(admin))["groups"]:
        target = next(node for node in STORAGE if node != group["master"])
        writer = next(queue for queue in queues if queue_groups[queue] == group["id"])
        called = trio.current_time()
        handed = await admin.handover(group["id"], target)
        assert (handed["master"], handed["master_epoch"]) == (target, group["master_epoch"] + 1), handed
        answered = trio.current_time()
        with trio.fail_after(FAILOVER_WAIT_S_MAX):  # a batch sent after the handover is acknowledged
            while not any(ack.queue == writer and ack.sent_at > answered for ack in writers.acks):
                await trio.sleep(0.05)
        await trio.sleep(1)
        times = [called] + [ack.at for ack in writers.acks if ack.queue == writer and ack.at > called]
        stalls.append(max(later - earlier for earlier, later in zip(times, times[1:])))
        await wait_in_sync(admin)  # the old master a slave in the SyncStateSet again, before the next
    return stalls


async def stop_writers(writers: Writers, queues: list[int]) -> None:
    """Stop the writers (one per queue of queues) and wait until each has had its last batch answered."""
    writers.stop.set()
    with trio.fail_after(30):
        while writers.done < len(queues):
            await trio.sleep(0.1)


def totals(result: dict, writers: Writers, started: float) -> str:
    """verify_acknowledged's result, the writers' errors and the wall time since started (time.monotonic())."""
    return (f"totals: acknowledged {result['acknowledged']} messages in {result['batches']} batches; consumed "
            f"{result['consumed']} ({result['distinct']} distinct); duplicates {result['duplicates']}; writer errors "
            f"{dict(writers.errors)}; wall {time.monotonic() - started:.1f} s")
