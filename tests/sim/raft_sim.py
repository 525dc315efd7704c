"""A deterministic simulation of Raft cores over a faulty network and crash-prone disks: each Ready persisted before
anything is sent, or (rounds=True) as the node's round loop does it, planned by its own Planner, with fsyncs that take
steps and crashes that lose what no fsync covered. One seeded random source decides every delay, drop, duplicate,
partition, crash and fsync, so a failing run is replayed exactly from its seed. Checkers: election safety, log
matching, state-machine safety."""

from __future__ import annotations

import dataclasses
import json
import random

from rocket.raft.core import (Config, Entry, EntryKind, HardState, Message, MessageType, NotLeader, RaftCore, Ready,
                              Role, Snapshot)
from rocket.raft.planner import Planner, Round
from rocket.raft.wal import Update
from rocket.errors import RocketError


@dataclasses.dataclass
class Faults:
    drop: float = 0.0  # chance a message is lost
    duplicate: float = 0.0  # chance a message is delivered twice
    delay_max: int = 1  # steps a message may take (reordering comes from different delays)
    crash: float = 0.0  # chance per step that one random node crashes and restarts
    partition: float = 0.0  # chance per step that the network splits at random
    heal: float = 0.0  # chance per step that a partition heals
    quiesce: float = 0.0  # chance per step that a leader tries to quiesce its group
    wake: float = 0.0  # chance per step that a quiet node is woken by its host's liveness check
    slow_disk: float = 0.0  # chance per step that a node's fsync has not finished: its Ready waits
    membership: float = 0.0  # chance per step that the leader starts a membership change
    fsync_steps_max: int = 3  # with rounds, the steps an fsync takes: 1 to this many


@dataclasses.dataclass
class Disk:
    """What survives a crash: only what a Ready asked to persist, and it was persisted before sending."""

    hard_state: HardState = HardState()
    entries: list[Entry] = dataclasses.field(default_factory=list)
    snapshot: Snapshot | None = None


class SafetyViolation(AssertionError):
    pass


class Node:
    def __init__(self, node_id: int, voters: tuple[int, ...], learners: tuple[int, ...], seed: int,
                 wait_bytes_max: int | None = None):
        self.id = node_id
        self.voters, self.learners = voters, learners
        self.seed = seed
        self.disk = Disk()
        self.restarts = 0
        self.wait_bytes_max = wait_bytes_max  # rounds: how much a round may gather while an fsync runs; None: no rounds
        self.core = self._boot()
        self.applied: dict[int, tuple[int, bytes]] = {}
        self.kv: dict[str, object] = {}  # the register state machine of the KV workload
        self.released: dict[int, int] = {}  # ReadIndex request id -> index

    def _boot(self) -> RaftCore:
        config = Config(self.id, self.voters, self.learners, seed=self.seed * 7919 + self.restarts)
        core = RaftCore(config, self.disk.hard_state, list(self.disk.entries), self.disk.snapshot)
        self._boot_rounds(core)
        return core

    def _boot_rounds(self, core: RaftCore) -> None:
        """The round loop's state as a (re)start leaves it: nothing written but what is on the disk."""
        self.planner = Planner(self.wait_bytes_max or 0)
        self.written = self.disk.hard_state  # Planned: the last hard state written
        self.durable_commit = core.commit  # Planned
        self.unwritten: list[tuple[int, list[Update]]] = []  # (round, its updates) written but not yet durable
        self.fsync: tuple[int, int] | None = None  # (the rounds it covers, the step it ends at)

    def crash_and_restart(self) -> None:
        """Everything not persisted is gone: the core restarts from the disk and re-applies its log."""
        self.restarts += 1
        self.core = self._boot()
        self.kv = {}
        self.released = {}

    def persist(self, hard_state: HardState | None, entries: list[Entry], snapshot: Snapshot | None) -> None:
        if snapshot is not None:
            self.disk.snapshot = snapshot
            self.disk.entries = [e for e in self.disk.entries if e.index > snapshot.index]
            if self.disk.entries and self.disk.entries[0].index != snapshot.index + 1:
                self.disk.entries = []
        if entries:
            first = entries[0].index
            self.disk.entries = [e for e in self.disk.entries if e.index < first] + list(entries)
        if hard_state is not None:
            self.disk.hard_state = hard_state

    def sync(self, step: int) -> bool:
        """An fsync that ends at this step makes the rounds it covers durable; whether that is news."""
        if self.fsync is None or self.fsync[1] > step:
            return False
        covered, self.fsync = self.fsync[0], None
        while self.unwritten and self.unwritten[0][0] <= covered:
            for update in self.unwritten.pop(0)[1]:
                self.persist(update.hard_state, update.entries, update.snapshot)
        return self.planner.synced(covered)

    def compact(self) -> None:
        """Snapshot the state machine at its applied index and drop the log before it."""
        applied = self.core.applied
        if applied > self.core.snapshot.index + 5:
            self.core.compact(applied, b"state-at-%d" % applied)
            self.disk.snapshot = self.core.snapshot
            self.disk.entries = [e for e in self.disk.entries if e.index > applied]


class Cluster:
    def __init__(self, seed: int, size: int = 3, faults: Faults | None = None, learners: tuple[int, ...] = (),
                 rounds: bool = False):
        self.seed = seed
        self.random = random.Random(seed)
        self.faults = faults or Faults()
        self.rounds = rounds
        voters = tuple(range(1, size + 1))
        # With rounds, each node gathers differently: never, for a few entries, or for every fsync.
        self.nodes = {i: Node(i, voters, learners, seed, self.random.choice((0, 200, 1 << 20)) if rounds else None)
                      for i in voters + learners}
        self.in_flight: list[tuple[int, int, Message]] = []  # (deliver at step, order, message)
        self.step_number = 0
        self.order = 0
        self.blocked: set[tuple[int, int]] = set()
        self.leaders_by_term: dict[int, int] = {}
        self.committed: dict[int, tuple[int, bytes]] = {}  # index -> (term, data) applied anywhere
        self.proposed = 0
        self.apply_hook = None  # called with (node, entry) for each applied entry
        self.read_hook = None  # called with (node, read_states) from each Ready

    # ---- running ---------------------------------------------------------------------------------

    def run(self, steps: int, propose_every: int = 3) -> None:
        for _ in range(steps):
            self.step()
            if self.step_number % propose_every == 0:
                self.propose(b"v%d" % self.step_number)

    def step(self) -> None:
        self.step_number += 1
        self._maybe_inject_faults()
        for node in self.nodes.values():
            node.core.tick()
        due = [item for item in self.in_flight if item[0] <= self.step_number]
        self.in_flight = [item for item in self.in_flight if item[0] > self.step_number]
        self.random.shuffle(due)
        for _, _, message in due:
            target = self.nodes.get(message.to)
            if target is not None:
                target.core.step(message)
                if message.type == MessageType.APPEND:  # as the Raft host tells its rounds (host.py, receive)
                    target.planner.gather(sum(len(entry.data) for entry in message.entries))
                else:
                    target.planner.urgent()
        for node in self.nodes.values():
            node.planner.tick()
            if self.rounds and node.sync(self.step_number):
                self._settle(node)
            if self.random.random() >= self.faults.slow_disk:
                self._handle_ready(node)
            if self.rounds and node.fsync is None and node.unwritten:
                ends = self.step_number + self.random.randint(1, self.faults.fsync_steps_max)
                node.fsync = (node.planner.written, ends)
        self._check_election_safety()
        if self.step_number % 10 == 0:
            self._check_leader_completeness()

    def _handle_ready(self, node: Node) -> None:
        if self.rounds:
            self._rounds(node)
            return
        while node.core.has_ready():
            ready = node.core.ready()
            node.persist(ready.hard_state, ready.entries, ready.snapshot)
            for message in ready.messages:
                self._send(message)
            self._apply_ready(node, ready)
            node.core.advance(ready)

    def _rounds(self, node: Node) -> None:
        """The node's round loop, woken: rounds while it has Readies, unless its planner has them gather for the
        fsync that runs (rocket/raft/rounds.py, Rounds._round, without the I/O)."""
        planner = node.planner
        while not planner.gathering():
            planner.begin()
            self._settle(node)
            readies: list[tuple[int, Node, Ready]] = [(0, node, node.core.ready())] if node.core.has_ready() else []
            current, updates = planner.plan(readies, [], [])
            if updates is not None:
                node.unwritten.append((current.number, updates))
            for messages in planner.appends(readies).values():
                for _, message in messages:
                    self._send(message)
            for _, _, ready in readies:
                node.core.advance(ready)
            planner.queue(current)
            self._settle(node)
            if not node.core.has_ready():
                return

    def _settle(self, node: Node) -> None:
        node.planner.settle(lambda current: self._apply_round(node, current, False),
                            lambda current: self._release(node, current))

    def _release(self, node: Node, durable: Round) -> None:
        for messages in node.planner.released(durable).values():
            for _, message in messages:
                self._send(message)
        self._apply_round(node, durable, True)

    def _apply_round(self, node: Node, current: Round, snapshots: bool) -> None:
        """Apply the round's committed entries: those of a Ready with a snapshot once the round is durable, the
        others once the rounds before it are (Rounds._apply_round, Rounds._release)."""
        for _, _, ready in current.readies:
            if (ready.snapshot is not None) == snapshots:
                self._apply_ready(node, ready)

    def _apply_ready(self, node: Node, ready: Ready) -> None:
        """Install the Ready's snapshot, apply its committed entries and release its reads."""
        if ready.snapshot is not None:
            node.applied = {i: v for i, v in node.applied.items() if i <= ready.snapshot.index}
        for entry in ready.committed_entries:
            self._apply(node, entry)
            if self.apply_hook is not None:
                self.apply_hook(node, entry)
        if ready.read_states and self.read_hook is not None:
            self.read_hook(node, ready.read_states)

    def _send(self, message: Message) -> None:
        if (message.sender, message.to) in self.blocked or self.random.random() < self.faults.drop:
            return
        copies = 2 if self.random.random() < self.faults.duplicate else 1
        for _ in range(copies):
            self.order += 1
            delay = self.random.randint(1, self.faults.delay_max)
            self.in_flight.append((self.step_number + delay, self.order, message))

    def _apply(self, node: Node, entry: Entry) -> None:
        value = (entry.term, entry.data)
        known = self.committed.setdefault(entry.index, value)
        if known != value:
            raise SafetyViolation(f"seed {self.seed}: node {node.id} applied {value} at {entry.index}, "
                                  f"another node applied {known}")
        node.applied[entry.index] = value

    def propose(self, data: bytes) -> int | None:
        leaders = [n for n in self.nodes.values() if n.core.role == Role.LEADER]
        if not leaders:
            return None
        leader = self.random.choice(leaders)
        try:
            index = leader.core.propose(data)
        except (NotLeader, RocketError):
            return None
        self.proposed += 1
        self._handle_ready(leader)
        return index

    # ---- faults ----------------------------------------------------------------------------------

    def _maybe_inject_faults(self) -> None:
        for node in self.nodes.values():
            # Idle leaders go quiet when they can; a host's liveness check wakes quiet groups, late.
            if self.random.random() < self.faults.quiesce:
                node.core.quiesce()
            if node.core.quiet and self.random.random() < self.faults.wake:
                node.core.wake()
        if self.random.random() < self.faults.crash:
            self.random.choice(list(self.nodes.values())).crash_and_restart()
        if self.random.random() < self.faults.membership:
            self._change_membership()
        if self.random.random() < self.faults.partition:
            ids = list(self.nodes)
            self.random.shuffle(ids)
            cut = self.random.randint(1, len(ids) - 1)
            one_way = self.random.random() < 0.3
            self.blocked = {(a, b) for a in ids[:cut] for b in ids[cut:]}
            if not one_way:
                self.blocked |= {(b, a) for a, b in self.blocked}
        if self.blocked and self.random.random() < self.faults.heal:
            self.blocked = set()

    def _change_membership(self) -> None:
        """The leader adds back a node that was removed (as a learner), promotes a learner, or removes
        a follower while more than three voters remain: one change at a time, under all other faults."""
        leader = self.leader()
        if leader is None:
            return
        core = leader.core
        outside = [n for n in self.nodes if n not in core.voters | core.learners]
        removable = [n for n in core.voters if n != leader.id]
        try:
            if outside:
                core.propose_conf_change("add_learner", self.random.choice(outside))
            elif core.learners:
                core.propose_conf_change("promote", self.random.choice(sorted(core.learners)))
            elif len(core.voters) > 3:
                core.propose_conf_change("remove", self.random.choice(removable))
            else:
                return
        except RocketError:
            return  # another change is still in progress, or a transfer: try later
        self._handle_ready(leader)

    def heal(self) -> None:
        self.blocked = set()
        self.faults = Faults()
        for node in self.nodes.values():
            node.core.wake()

    # ---- checkers --------------------------------------------------------------------------------

    def _check_election_safety(self) -> None:
        for node in self.nodes.values():
            if node.core.role == Role.LEADER:
                known = self.leaders_by_term.setdefault(node.core.term, node.id)
                if known != node.id:
                    raise SafetyViolation(f"seed {self.seed}: nodes {known} and {node.id} both lead term {node.core.term}")

    def _check_leader_completeness(self) -> None:
        """A leader holds every entry committed before its term began."""
        for node in self.nodes.values():
            core = node.core
            if core.role != Role.LEADER:
                continue
            for index, (term, data) in self.committed.items():
                if term < core.term and index > core.snapshot.index and core.term_at(index) != term:
                    raise SafetyViolation(f"seed {self.seed}: leader {node.id} of term {core.term} lacks committed "
                                          f"entry {index} of term {term}")

    def check_log_matching(self) -> None:
        """Where two logs hold an entry with the same index and term, they agree on everything before it."""
        logs = {node.id: {e.index: e for e in node.core.log} for node in self.nodes.values()}
        ids = sorted(logs)
        for position, a in enumerate(ids):
            for b in ids[position + 1:]:
                common = sorted(set(logs[a]) & set(logs[b]))
                agreed = [i for i in common if logs[a][i].term == logs[b][i].term]
                if not agreed:
                    continue
                for index in common:
                    if index <= agreed[-1] and logs[a][index] != logs[b][index]:
                        raise SafetyViolation(f"seed {self.seed}: logs of {a} and {b} differ at {index} "
                                              f"but agree at {agreed[-1]}")

    def leader(self) -> Node | None:
        leaders = [n for n in self.nodes.values() if n.core.role == Role.LEADER]
        return max(leaders, key=lambda n: n.core.term) if leaders else None

    def conf_entries(self) -> list[Entry]:
        return [e for n in self.nodes.values() for e in n.core.log if e.kind == EntryKind.CONF_CHANGE]


class KvWorkload:
    """Clients run put, get and compare-and-set on a few registers: writes go through the leader's log,
    reads through ReadIndex. The history it records is checked for linearizability."""

    def __init__(self, cluster: Cluster, keys: tuple[str, ...] = ("a", "b"), in_flight_max: int = 4):
        self.cluster = cluster
        self.keys = keys
        self.in_flight_max = in_flight_max
        self.next_id = 0
        self.pending: dict[int, dict] = {}
        self.history: list = []
        self.results: dict[int, object] = {}  # op id -> result, the same wherever it was applied
        for node in cluster.nodes.values():
            node.kv = {}
            node.released = {}
        cluster.apply_hook = self._apply
        cluster.read_hook = self._released

    def _apply(self, node: Node, entry: Entry) -> None:
        if not entry.data.startswith(b"{"):
            return
        command = json.loads(entry.data)
        state = node.kv.get(command["key"])
        if command["kind"] == "put":
            node.kv[command["key"]], result = command["value"], None
        elif state == command["expected"]:
            node.kv[command["key"]], result = command["new"], True
        else:
            result = False
        known = self.results.setdefault(command["id"], result)
        if known != result:
            raise SafetyViolation(f"seed {self.cluster.seed}: op {command['id']} gave {result} and {known}")

    def _released(self, node: Node, read_states) -> None:
        for request_id, index in read_states:
            node.released[request_id] = index

    def invoke(self, now: float) -> None:
        # Any node that believes it leads may be asked, as by a client with a stale route.
        leaders = [n for n in self.cluster.nodes.values() if n.core.role == Role.LEADER]
        if not leaders or len(self.pending) >= self.in_flight_max:
            return
        random_source = self.cluster.random
        leader = random_source.choice(leaders)
        self.next_id += 1
        op_id = self.next_id
        key = random_source.choice(self.keys)
        kind = random_source.choice(["put", "get", "cas"])
        operation = {"id": op_id, "key": key, "kind": kind, "node": leader, "restarts": leader.restarts,
                     "invoked": now}
        try:
            if kind == "get":
                operation["argument"] = ()
                leader.core.read_index(op_id, lease=random_source.random() < 0.5)  # half by lease
            else:
                if kind == "put":
                    command = {"value": random_source.randint(1, 5)}
                    operation["argument"] = (command["value"],)
                else:
                    command = {"expected": random_source.choice([None, 1, 2, 3]), "new": random_source.randint(1, 5)}
                    operation["argument"] = (command["expected"], command["new"])
                data = json.dumps({"id": op_id, "key": key, "kind": kind, **command}).encode()
                operation["index"] = leader.core.propose(data)
                operation["entry"] = (leader.core.term, data)
        except RocketError:
            return  # refused outright (not leader, transfer in progress): never happened
        self.pending[op_id] = operation
        self.cluster._handle_ready(leader)

    def collect(self, now: float) -> None:
        from tests.sim.linearizability import Operation

        for op_id, operation in list(self.pending.items()):
            node = operation["node"]
            if node.restarts != operation["restarts"]:
                # The client's server crashed: it never hears back, and a write may or may not have happened.
                del self.pending[op_id]
                if operation["kind"] != "get":
                    self.history.append(Operation(op_id, operation["key"], operation["kind"], operation["argument"],
                                                  operation["invoked"]))
                continue
            if operation["kind"] == "get":
                index = node.released.get(op_id)
                if index is None or node.core.applied < index:
                    continue
                result = node.kv.get(operation["key"])
            else:
                applied = node.applied.get(operation["index"])
                if applied is None:
                    continue
                if applied != operation["entry"]:
                    del self.pending[op_id]  # another entry took its index: it never happened
                    continue
                result = self.results[op_id]
            del self.pending[op_id]
            self.history.append(Operation(op_id, operation["key"], operation["kind"], operation["argument"],
                                          operation["invoked"], now, result))

    def finish(self) -> list:
        from tests.sim.linearizability import Operation

        for op_id, operation in self.pending.items():
            if operation["kind"] != "get":  # an unanswered write may have happened; a read changes nothing
                self.history.append(Operation(op_id, operation["key"], operation["kind"], operation["argument"],
                                              operation["invoked"]))
        return self.history


def run_kv(cluster: Cluster, steps: int) -> KvWorkload:
    workload = KvWorkload(cluster)
    for number in range(steps):
        workload.invoke(number + 0.25)
        cluster.step()
        workload.collect(number + 0.75)
    cluster.heal()
    for number in range(steps, steps + 300):
        cluster.step()
        workload.collect(number + 0.75)
    return workload
