"""A deterministic simulation of controller-mode groups (RIP-44): two or three ControlledCores replicate master to
slaves, and a model controller names the master and holds the SyncStateSet. One seeded random source decides every
fault, so a failure replays from its seed. Checkers: no acknowledged entry is lost, one acknowledging master per
epoch, committed prefixes never diverge (and a committed entry is never truncated). A replica can be replaced under
the faults, in the steps the nameservers' moves take (Group.replace, Mover)."""

from __future__ import annotations

import collections
import dataclasses
import random

from rocket.errors import InvariantViolation, RocketError
from rocket.raft.controlled import Control, ControlledCore, SyncStateRequest
from rocket.raft.core import NONE, Config, Entry, Role
from tests.sim.raft_sim import Node, SafetyViolation

CONTROLLER = 0  # the controller's address on the simulated network: replica ids start at 1
UNSYNCED_FLUSH_STEPS = 5  # how often a slave that answers before persisting (a planted bug) writes to its disk


@dataclasses.dataclass
class Faults:
    drop: float = 0.0  # chance a message between replicas is lost
    delay_max: int = 1  # steps a message between replicas may take (different delays reorder them)
    crash: float = 0.0  # chance per step that one replica crashes, losing all it had not persisted
    down_steps_max: int = 1  # a crashed replica restarts from its disk 1 to this many steps later
    partition: float = 0.0  # chance per step that the replicas split at random (each side still reaches the controller)
    controller_partition: float = 0.0  # chance per step that one replica is cut from the controller
    master_cut: float = 0.0  # chance per step that the master is cut from the controller (it reaches the rest)
    heal: float = 0.0  # chance per step that every partition and cut heals
    controller_drop: float = 0.0  # chance a heartbeat, word, request or answer to or from the controller is lost
    answer_drop: float = 0.0  # chance, besides, that the controller's answer to a SyncStateSet request is lost
    controller_delay_max: int = 1  # steps a message to or from the controller may take: a late word is a stale one
    controller_down: float = 0.0  # chance per step that the controller goes down (its Raft leader changes, or all fail)
    controller_down_steps_max: int = 1
    handover: float = 0.0  # chance per step that an operator hands the mastership to another replica in the SSS


@dataclasses.dataclass(frozen=True)
class Acknowledgement:
    entry_id: int
    index: int
    epoch: int
    master: int
    step: int


class Controller:
    """The nameservers' controller for one group, as one linearizable object: the group's Control state and each
    replica's last heartbeat. While down it hears nothing, elects no one and answers nothing."""

    def __init__(self, replicas: tuple[int, ...], lapse_steps: int, lag_ticks_max: int, unclean: bool = False):
        self.replicas = replicas
        self.master = NONE
        self.master_epoch = 0
        self.sync_state_set = frozenset(replicas)  # a new group's replicas are empty, so all hold everything
        self.sync_state_set_epoch = 0
        self.lapse_steps = lapse_steps
        self.lag_ticks_max = lag_ticks_max
        self.unclean = unclean  # elect from outside the SSS when no member of it is alive (loses entries)
        self.down = False
        self.heard: dict[int, int] = {}  # replica -> step of its last heartbeat
        self.last_index: dict[int, int] = {}  # replica -> the log end its last heartbeat reported
        self.leaving = NONE  # a replica being replaced: not let into the SSS again, never elected
        self.outcomes: list[tuple[int, SyncStateRequest, str]] = []  # (step, request, applied, fenced or refused)
        self.elections: list[tuple[int, int, int]] = []  # (step, master, master epoch)

    def word(self) -> Control:
        return Control(self.master, self.master_epoch, self.sync_state_set, self.sync_state_set_epoch,
                       min_in_sync_replicas=1, lag_ticks_max=self.lag_ticks_max)

    def fresh(self, node: int, now: int) -> bool:
        return node in self.heard and now - self.heard[node] <= self.lapse_steps

    def heartbeat(self, node: int, last_index: int, now: int) -> Control:
        self.heard[node] = now
        self.last_index[node] = last_index
        return self.word()

    def alter(self, request: SyncStateRequest, now: int) -> str:
        """Apply a change of the SSS made against the current master, epoch and SSS epoch; any other is stale."""
        current = (self.master, self.master_epoch, self.sync_state_set_epoch)
        if (request.group_master, request.master_epoch, request.sync_state_set_epoch) != current:
            outcome = "fenced"
        elif self.master not in request.sync_state_set:
            outcome = "refused"  # for good: no resend of it can ever apply (refusals that could would be unsafe)
        else:  # a replica leaving is not let in again (metadata.alter): a subset of the set asked for
            self.sync_state_set = request.sync_state_set - ({self.leaving} - self.sync_state_set)
            self.sync_state_set_epoch += 1
            outcome = "applied"
        self.outcomes.append((now, request, outcome))
        return outcome

    def elect(self, now: int) -> int | None:
        """When the master's heartbeats lapsed, name the SSS member alive with the longest log (from outside the
        SSS only if unclean); the new SSS is the new master alone. Returns the new master, if any."""
        if self.master != NONE and self.fresh(self.master, now):
            return None
        candidates = sorted(node for node in self.sync_state_set if node != self.master and self.fresh(node, now))
        if not candidates and self.unclean:
            candidates = sorted(node for node in self.replicas
                                if node not in (self.master, self.leaving) and self.fresh(node, now))
        if not candidates:
            return None
        chosen = max(candidates, key=lambda node: self.last_index[node])
        self.master, self.master_epoch = chosen, self.master_epoch + 1
        self.sync_state_set, self.sync_state_set_epoch = frozenset({chosen}), self.sync_state_set_epoch + 1
        self.elections.append((now, chosen, self.master_epoch))
        return chosen

    def hand_over(self, target: int, now: int) -> bool:
        """An operator's handover (rocket cluster handover): the target, alive and in the SSS, is master at the next
        epoch, alone in the new SSS, as an election makes it; else nothing changes."""
        if self.down or target == self.master or target not in self.sync_state_set or not self.fresh(target, now):
            return False
        self.master, self.master_epoch = target, self.master_epoch + 1
        self.sync_state_set, self.sync_state_set_epoch = frozenset({target}), self.sync_state_set_epoch + 1
        self.elections.append((now, target, self.master_epoch))
        return True

    def drop(self, node: int) -> bool:
        """The controller drops a replica being replaced from the SSS (Nameserver._hand_off): a shrink at the next
        SSS epoch, never of the master."""
        if self.down or node == self.master or node not in self.sync_state_set:
            return False
        self.sync_state_set, self.sync_state_set_epoch = self.sync_state_set - {node}, self.sync_state_set_epoch + 1
        return True

    def go_down(self) -> None:
        self.down = True

    def come_up(self, now: int, new_leader: bool) -> None:
        """A new leader of the nameservers has no heartbeats of its own: it gives every replica it knows of a
        lapse's grace rather than depose a master that was talking to the old leader."""
        self.down = False
        if new_leader:
            self.heard = {node: now for node in self.heard}


@dataclasses.dataclass
class Mover:
    """A replica replacement under way: old gives way to new (Group._move takes one step of it per step)."""

    old: int
    new: int
    removed_at: int = 0  # the index of the master's entry removing old
    done: bool = False


class Replica(Node):
    """A raft_sim node whose core is a ControlledCore; its disk loses what was not persisted at a crash."""

    def _boot(self) -> ControlledCore:
        config = Config(self.id, self.voters, self.learners, seed=self.seed * 7919 + self.restarts)
        return ControlledCore(config, self.disk.hard_state, list(self.disk.entries), self.disk.snapshot)


class Group:
    """One controller-mode group on a simulated network with its controller and its clients. Each step: faults,
    ticks, the controller's election, heartbeats, SyncStateSet requests, deliveries, a client's proposal, Readies,
    then the checkers. Tests may hold messages back (intercept) and release them in an order of their choosing."""

    def __init__(self, seed: int, size: int = 2, faults: Faults | None = None, *, unclean: bool = False,
                 lapse_steps: int = 10, heartbeat_steps: int = 3, request_steps: int = 4, lag_ticks_max: int = 12,
                 propose_chance: float = 0.5, slaves_answer_before_persisting: bool = False):
        self.seed = seed
        self.random = random.Random(seed)
        self.faults = faults or Faults()
        voters = tuple(range(1, size + 1))
        self.nodes = {node: Replica(node, voters, (), seed) for node in voters}
        self.controller = Controller(voters, lapse_steps, lag_ticks_max, unclean)
        self.heartbeat_steps = heartbeat_steps
        self.request_steps = request_steps
        self.propose_chance = propose_chance
        # A planted bug: a slave answers at once but its writes reach the disk only every UNSYNCED_FLUSH_STEPS (a
        # page cache flushed now and then): a crash in between loses what it acknowledged.
        self.slaves_answer_before_persisting = slaves_answer_before_persisting
        self.unsynced: dict[int, list[tuple]] = {node: [] for node in voters}
        self.step_number = 0
        self.order = 0
        self.in_flight: list[tuple[int, int, str, int, int, object]] = []  # (due step, order, kind, from, to, payload)
        self.blocked: set[tuple[int, int]] = set()  # (sender, receiver) pairs of replicas that cannot talk
        self.cut: set[tuple[int, int]] = set()  # the same between replicas and the controller
        self.down: dict[int, int] = {}  # crashed replica -> the step it restarts at
        self.controller_up_at = 0
        self.intercept = None  # a test's (kind, sender, to, payload) -> bool: True holds the message back
        self.held: list[tuple[str, int, int, object]] = []
        self.next_entry_id = 0
        self.proposals: dict[int, dict[int, tuple[int, int]]] = {node: {} for node in voters}  # index -> (id, epoch)
        self.acknowledged: dict[int, Acknowledgement] = {}
        self.acknowledging_masters: dict[int, int] = {}  # epoch -> the master that acknowledged entries in it
        self.masters: dict[int, int] = {}  # epoch -> the replica whose core was master in it
        self.takeovers: set[tuple[int, int, int]] = set()  # (replica, epoch, restarts) seen as master
        self.committed: dict[int, Entry] = {}  # index -> the entry some replica committed there
        self.checked_commit: dict[int, int] = {node: 0 for node in voters}
        self.events: collections.deque[str] = collections.deque(maxlen=30)
        self.mover: Mover | None = None

    # ---- replacing a replica ---------------------------------------------------------------------

    def replace(self, old: int) -> int:
        """Start replacing replica old by a new, empty one (its id: the next free); the Mover carries it out, a step
        at a time, among the faults. Returns the new replica's id."""
        new = max(self.nodes) + 1
        members = tuple(sorted(self.nodes))
        self.nodes[new] = Replica(new, members, (new,), self.seed)
        self.unsynced[new], self.proposals[new], self.checked_commit[new] = [], {}, 0
        self.controller.replicas = self.controller.replicas + (new,)
        self.controller.leaving = old
        self.mover = Mover(old, new)
        self.events.append(f"step {self.step_number}: replacing replica {old} by {new}")
        return new

    def _move(self) -> None:
        mover, controller = self.mover, self.controller
        if mover is None or mover.done or controller.down:
            return
        master = self.nodes.get(controller.master)
        if master is None or master.id in self.down or master.core.role != Role.LEADER \
                or master.core.term != controller.master_epoch:
            return  # the nameserver leader calls the group's master: none now
        core, old, new = master.core, mover.old, mover.new
        try:
            if new not in core.voters | core.learners:
                core.propose_conf_change("add_learner", new)
            elif new in core.learners:
                progress = core.tracker.get(new)
                if progress is not None and progress.match >= core.commit:  # caught up: it may become a slave
                    core.propose_conf_change("promote", new)
            elif new not in controller.sync_state_set:
                return  # the master asks the controller to let it in once it holds everything committed
            elif controller.master == old:
                if controller.hand_over(new, self.step_number):
                    self._tell(f"handed over to {new} at epoch {controller.master_epoch} (replacing {old})")
            elif old in controller.sync_state_set:
                if controller.drop(old):
                    self._tell(f"dropped {old} from the SSS (replacing it)")
            elif old in core.voters:
                mover.removed_at = core.propose_conf_change("remove", old)
            elif core.commit >= mover.removed_at > 0:
                mover.done = True
                del self.nodes[old]  # the storage node stops hosting it
                self.down.pop(old, None)
                self.unsynced.pop(old, None)
                controller.replicas = tuple(node for node in controller.replicas if node != old)
                controller.leaving = NONE
                self.events.append(f"step {self.step_number}: replica {old} replaced by {new}")
        except RocketError:
            pass  # a change in progress, not caught up, or still in the master's set: asked again next step

    def _tell(self, what: str) -> None:
        """The controller's new word, to every replica (lossy, late), as after an election."""
        self.events.append(f"step {self.step_number}: the controller {what}")
        if self.controller.master in self.nodes:
            self.check_holds_acknowledged(self.controller.master, what)
        for node in self.nodes:
            self._send("word", CONTROLLER, node, self.controller.word())

    # ---- running ---------------------------------------------------------------------------------

    def run(self, steps: int) -> None:
        for _ in range(steps):
            self.step()

    def run_until(self, condition, steps_max: int = 300, what: str = "the condition") -> None:
        """Step until condition() holds; fail (naming the seed and step) if it does not within steps_max."""
        for _ in range(steps_max):
            if condition():
                return
            self.step()
        if not condition():
            raise AssertionError(f"seed {self.seed}: {what} did not come about by step {self.step_number}: "
                                 f"{self.describe()}")

    def master(self) -> Replica | None:
        """The replica whose core is master at the highest epoch (a deposed one may not know yet)."""
        masters = [node for node in self._up() if node.core.role == Role.LEADER]
        return max(masters, key=lambda node: node.core.term) if masters else None

    def step(self, propose: bool = True) -> None:
        self.step_number += 1
        try:
            self._inject_faults()
            self._flush_unsynced()
            self._restart_due()
            for node in self._up():
                node.core.tick()
            self._controller_step()
            self._move()
            self._heartbeats()
            self._sync_state_requests()
            self._deliver_due()
            if propose and self.random.random() < self.propose_chance:
                self.propose()
            for node in self._up():
                self._handle_ready(node)
        except InvariantViolation as error:
            raise self.violation(f"a core's invariant failed: {error}") from error
        self._check_masters()
        self._check_committed(full=self.step_number % 20 == 0)

    def _up(self) -> list[Replica]:
        return [node for node in self.nodes.values() if node.id not in self.down]

    def _handle_ready(self, node: Replica) -> None:
        """Persist, then send, then apply: a proposal is acknowledged when the master that made it applies it
        with the epoch it was proposed at (as the host compares terms)."""
        core = node.core
        while core.has_ready():
            ready = core.ready()
            if self.slaves_answer_before_persisting and core.role != Role.LEADER:
                self.unsynced[node.id].append((ready.hard_state, ready.entries, ready.snapshot))
            else:
                node.persist(ready.hard_state, ready.entries, ready.snapshot)
            for message in ready.messages:
                self._send("raft", message.sender, message.to, message)
            for entry in ready.committed_entries:
                self._maybe_acknowledge(node, entry)
            core.advance(ready)

    def _flush_unsynced(self) -> None:
        if self.step_number % UNSYNCED_FLUSH_STEPS:
            return
        for node_id, writes in self.unsynced.items():
            for write in writes:
                self.nodes[node_id].persist(*write)
            writes.clear()

    def _maybe_acknowledge(self, node: Replica, entry: Entry) -> None:
        proposal = self.proposals[node.id].pop(entry.index, None)
        if proposal is None:
            return
        entry_id, epoch = proposal
        if entry.term != epoch:
            return  # lost to a change of master: the client is told to retry
        if entry.data != b"e%d" % entry_id:
            raise self.violation(f"replica {node.id} proposed e{entry_id} at {entry.index} in epoch {epoch} but "
                                 f"applied {entry.data!r} of the same epoch there")
        known = self.acknowledging_masters.setdefault(epoch, node.id)
        if known != node.id:
            raise self.violation(f"masters {known} and {node.id} both acknowledged entries in epoch {epoch}")
        self.acknowledged[entry_id] = Acknowledgement(entry_id, entry.index, epoch, node.id, self.step_number)

    def propose(self) -> int | None:
        """A client sends an entry to a replica that believes it is master (a route may be stale)."""
        masters = [node for node in self._up() if node.core.role == Role.LEADER]
        if not masters:
            return None
        node = self.random.choice(masters)
        self.next_entry_id += 1
        try:
            index = node.core.propose(b"e%d" % self.next_entry_id)
        except RocketError:
            return None
        self.proposals[node.id][index] = (self.next_entry_id, node.core.term)
        return index

    # ---- the network -----------------------------------------------------------------------------

    def _send(self, kind: str, sender: int, to: int, payload: object) -> None:
        if self.intercept is not None and self.intercept(kind, sender, to, payload):
            self.held.append((kind, sender, to, payload))
            return
        faults = self.faults
        if kind == "raft":
            if (sender, to) in self.blocked or self.random.random() < faults.drop:
                return
            delay = self.random.randint(1, faults.delay_max)
        else:
            if (sender, to) in self.cut or self.random.random() < faults.controller_drop:
                return
            if kind in ("answer", "refused") and self.random.random() < faults.answer_drop:
                return
            delay = self.random.randint(1, faults.controller_delay_max)
        self.order += 1
        self.in_flight.append((self.step_number + delay, self.order, kind, sender, to, payload))

    def deliver_now(self, which=lambda kind, sender, to, payload: True) -> int:
        """Deliver the held messages which(...) accepts at once, past partitions and losses (then handle the
        Readies): a script's late message arriving exactly when it wants. Returns how many."""
        marks = [which(*item) for item in self.held]  # asked once per item: which may accept only the first
        chosen = [item for item, mark in zip(self.held, marks) if mark]
        self.held = [item for item, mark in zip(self.held, marks) if not mark]
        try:
            for item in chosen:
                self._deliver(*item)
            for node in self._up():
                self._handle_ready(node)
        except InvariantViolation as error:
            raise self.violation(f"a core's invariant failed: {error}") from error
        self._check_masters()
        self._check_committed(full=True)
        return len(chosen)

    def _deliver_due(self) -> None:
        due = [item for item in self.in_flight if item[0] <= self.step_number]
        self.in_flight = [item for item in self.in_flight if item[0] > self.step_number]
        self.random.shuffle(due)
        for _, _, kind, sender, to, payload in due:
            self._deliver(kind, sender, to, payload)

    def _deliver(self, kind: str, sender: int, to: int, payload) -> None:
        if to == CONTROLLER:
            self._controller_receives(kind, sender, payload)
            return
        if to in self.down or to not in self.nodes:  # down, or replaced
            return
        core = self.nodes[to].core
        if kind == "raft":
            core.step(payload)
        elif kind in ("word", "answer"):
            core.control(payload)
        elif kind == "refused":
            core.sync_state_refused(payload)

    # ---- the controller --------------------------------------------------------------------------

    def _controller_receives(self, kind: str, sender: int, payload) -> None:
        controller = self.controller
        if controller.down:
            return
        if kind == "heartbeat":
            self._send("word", CONTROLLER, sender, controller.heartbeat(sender, payload, self.step_number))
        elif kind == "request":
            before = controller.sync_state_set
            outcome = controller.alter(payload, self.step_number)
            if outcome == "applied":
                self.events.append(f"step {self.step_number}: the controller applied SSS {sorted(before)} -> "
                                   f"{sorted(controller.sync_state_set)} (epoch {controller.sync_state_set_epoch})")
            if outcome == "refused":
                self._send("refused", CONTROLLER, sender, payload)
            else:
                self._send("answer", CONTROLLER, sender, controller.word())

    def _controller_step(self) -> None:
        controller = self.controller
        if controller.down:
            if self.step_number >= self.controller_up_at:
                new_leader = self.random.random() < 0.5
                controller.come_up(self.step_number, new_leader)
                self.events.append(f"step {self.step_number}: the controller is up again"
                                   f"{' (a new leader)' if new_leader else ''}")
            return
        chosen = controller.elect(self.step_number)
        how = "elected"
        if chosen is None and self.random.random() < self.faults.handover:
            target = self.random.choice(controller.replicas)
            chosen, how = (target if controller.hand_over(target, self.step_number) else None), "was handed over to"
        if chosen is None:
            return
        self.events.append(f"step {self.step_number}: the controller {how} {chosen} at epoch "
                           f"{controller.master_epoch}")
        self.check_holds_acknowledged(chosen, f"elected at epoch {controller.master_epoch}")
        for node in self.nodes:  # the controller tells the group at once (lossy, late)
            self._send("word", CONTROLLER, node, controller.word())

    def _heartbeats(self) -> None:
        for node in self._up():
            if (self.step_number + node.id) % self.heartbeat_steps == 0:
                self._send("heartbeat", node.id, CONTROLLER, node.core.last_index)

    def _sync_state_requests(self) -> None:
        """A master asks for the change of SSS it wants, and asks again (the same request) until answered."""
        for node in self._up():
            if node.core.role == Role.LEADER and (self.step_number + node.id) % self.request_steps == 0:
                request = node.core.sync_state_request()
                if request is not None:
                    self._send("request", node.id, CONTROLLER, request)

    # ---- faults ----------------------------------------------------------------------------------

    def _inject_faults(self) -> None:
        faults, chance = self.faults, self.random.random
        if chance() < faults.crash and self._up():
            self.crash(self.random.choice(self._up()).id, self.random.randint(1, faults.down_steps_max))
        if chance() < faults.partition:
            ids = list(self.nodes)
            self.random.shuffle(ids)
            cut = self.random.randint(1, len(ids) - 1)
            self.partition(set(ids[:cut]), set(ids[cut:]), one_way=chance() < 0.3)
        if chance() < faults.controller_partition:
            self.cut_from_controller(self.random.choice(list(self.nodes)))
        if chance() < faults.master_cut:
            masters = [node.id for node in self._up() if node.core.role == Role.LEADER]
            if masters:
                self.cut_from_controller(self.random.choice(masters))
        if (self.blocked or self.cut) and chance() < faults.heal:
            self.blocked, self.cut = set(), set()
            self.events.append(f"step {self.step_number}: partitions healed")
        if not self.controller.down and chance() < faults.controller_down:
            self.controller_down(self.random.randint(1, faults.controller_down_steps_max))

    def crash(self, node_id: int, down_steps: int) -> None:
        """The replica loses what it had not persisted and stays down down_steps; its clients give up."""
        node = self.nodes[node_id]
        self.unsynced[node_id] = []
        node.crash_and_restart()
        self.down[node_id] = self.step_number + down_steps
        self.proposals[node_id] = {}
        self.checked_commit[node_id] = 0
        self.events.append(f"step {self.step_number}: replica {node_id} crashed for {down_steps} steps")

    def _restart_due(self) -> None:
        for node_id, at in list(self.down.items()):
            if at <= self.step_number:
                del self.down[node_id]
                self.events.append(f"step {self.step_number}: replica {node_id} restarted")

    def partition(self, side: set[int], other: set[int], one_way: bool = False) -> None:
        self.blocked = {(a, b) for a in side for b in other}
        if not one_way:
            self.blocked |= {(b, a) for a, b in self.blocked}
        self.events.append(f"step {self.step_number}: partition {sorted(side)} / {sorted(other)}"
                           f"{' (one way)' if one_way else ''}")

    def cut_from_controller(self, node_id: int) -> None:
        self.cut |= {(node_id, CONTROLLER), (CONTROLLER, node_id)}
        self.events.append(f"step {self.step_number}: replica {node_id} cut from the controller")

    def controller_down(self, steps: int) -> None:
        self.controller.go_down()
        self.controller_up_at = self.step_number + steps
        self.events.append(f"step {self.step_number}: the controller is down for {steps} steps")

    def heal(self) -> None:
        self.faults = Faults()
        self.blocked, self.cut = set(), set()
        for node_id in self.down:
            self.down[node_id] = self.step_number
        self.controller_up_at = min(self.controller_up_at, self.step_number)
        self.events.append(f"step {self.step_number}: healed")

    def settle(self, steps_max: int = 600) -> Replica:
        """Heal everything; run until a new entry is acknowledged and every replica holds the master's log, all of
        it committed; check that every acknowledged entry is in every replica's log. Returns the master."""
        self.heal()
        acknowledged_before = len(self.acknowledged)
        for _ in range(steps_max):
            self.step(propose=len(self.acknowledged) == acknowledged_before)
            master = self._settled_master()
            if master is not None and len(self.acknowledged) > acknowledged_before:
                self._check_committed(full=True)
                for node in self.nodes:
                    self.check_holds_acknowledged(node, "after healing")
                return master
        raise AssertionError(f"seed {self.seed}: no settled master {steps_max} steps after healing (at step "
                             f"{self.step_number}): {self.describe()}")

    def _settled_master(self) -> Replica | None:
        controller = self.controller
        master = self.nodes.get(controller.master)
        if master is None or master.core.role != Role.LEADER or master.core.term != controller.master_epoch:
            return None
        core = master.core
        if core.commit != core.last_index or core.applied != core.commit:
            return None
        for node in self.nodes.values():
            other = node.core
            if other.last_index != core.last_index or other.last_term != core.last_term or other.commit != core.commit:
                return None
        return master

    # ---- checkers --------------------------------------------------------------------------------

    def violation(self, what: str) -> SafetyViolation:
        return SafetyViolation(f"seed {self.seed}, step {self.step_number}: {what}\nrecent events:\n  "
                               + "\n  ".join(self.events))

    def check_holds_acknowledged(self, node_id: int, when: str) -> None:
        """Every acknowledged entry is in this replica's log at its index (checker 1)."""
        core = self.nodes[node_id].core
        for acknowledgement in self.acknowledged.values():
            index = acknowledgement.index
            if index <= core.snapshot.index:
                continue
            held = core.log[index - core.snapshot.index - 1] if index <= core.last_index else None
            if held is None or held.term != acknowledgement.epoch or held.data != b"e%d" % acknowledgement.entry_id:
                raise self.violation(f"replica {node_id} ({when}) lacks acknowledged entry e{acknowledgement.entry_id}"
                                     f" at {index} (epoch {acknowledgement.epoch}, acknowledged by master "
                                     f"{acknowledgement.master} at step {acknowledgement.step}); it holds {held}")

    def _check_masters(self) -> None:
        """One master per epoch (its core's word), and a replica that becomes master holds every acknowledged
        entry (checker 1, as the new master takes over)."""
        for node in self._up():
            core = node.core
            if core.role != Role.LEADER:
                continue
            known = self.masters.setdefault(core.term, node.id)
            if known != node.id:
                raise self.violation(f"replicas {known} and {node.id} are both master in epoch {core.term}")
            takeover = (node.id, core.term, node.restarts)
            if takeover not in self.takeovers:
                self.takeovers.add(takeover)
                self.events.append(f"step {self.step_number}: replica {node.id} is master at epoch {core.term}, "
                                   f"SSS {sorted(core.sync_state_set)}")
                self.check_holds_acknowledged(node.id, f"master at epoch {core.term}")

    def _check_committed(self, full: bool) -> None:
        """Committed prefixes agree across replicas and committed entries stay (checker 3): each step the newly
        committed entries and the last one checked, every 20 steps the whole prefix."""
        for node in self.nodes.values():
            core = node.core
            if core.commit > core.last_index:
                raise self.violation(f"replica {node.id} committed {core.commit} but its log ends at "
                                     f"{core.last_index}: committed entries were truncated")
            low = 1 if full else max(self.checked_commit[node.id], 1)
            for index in range(max(low, core.snapshot.index + 1), core.commit + 1):
                entry = core.log[index - core.snapshot.index - 1]
                known = self.committed.setdefault(index, entry)
                if known is not entry and known != entry:
                    raise self.violation(f"replica {node.id} has {entry} committed at {index}; another replica "
                                         f"committed {known} there")
            self.checked_commit[node.id] = core.commit

    def describe(self) -> str:
        controller = self.controller
        cores = "; ".join(f"{node.id}: {node.core.role.name} epoch {node.core.term} last {node.core.last_index} "
                          f"commit {node.core.commit} SSS {sorted(node.core.sync_state_set)}"
                          f"{' down' if node.id in self.down else ''}" for node in self.nodes.values())
        return (f"controller: master {controller.master} epoch {controller.master_epoch} SSS "
                f"{sorted(controller.sync_state_set)} (epoch {controller.sync_state_set_epoch}); {cores}\n  "
                + "\n  ".join(self.events))


def simulate(seed: int, size: int, faults: Faults, steps: int = 400, **options) -> Group:
    """A run: steps under faults, then healed and settled; the checkers raise on the first violation."""
    group = Group(seed, size, faults, **options)
    group.run(steps)
    group.settle()
    return group
