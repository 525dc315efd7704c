"""Controller-mode groups (RIP-44) under the deterministic simulator: whatever the seed, with elections and handovers,
no acknowledged entry is lost, one master acknowledges per epoch, and committed prefixes agree; planted bugs are caught;
RocketMQ's races around a SyncStateSet change during a master switch (apache/rocketmq #5663, #7689) play out scripted.
Two bugs the simulator found in ControlledCore (a late EPOCH_ANSWER truncating acknowledged entries; a master
restarted at its epoch forgetting its pending SyncStateSet request) have regression tests at the end. A failure names
its seed."""

from __future__ import annotations

import dataclasses

import pytest

from rocket.raft.controlled import ControlledCore, SyncStateRequest
from rocket.raft.types import Message, MessageType, Role
from tests.sim.controller_sim import Faults, Group, SafetyViolation, simulate

CRASHES = Faults(drop=0.05, delay_max=3, crash=0.02, down_steps_max=25, controller_drop=0.05, answer_drop=0.1,
                 controller_delay_max=4)
MASTER_CUT = Faults(drop=0.02, delay_max=2, master_cut=0.03, heal=0.04, controller_drop=0.02, answer_drop=0.1,
                    controller_delay_max=4)
PARTITIONS = Faults(drop=0.02, delay_max=3, partition=0.03, controller_partition=0.02, heal=0.05, controller_down=0.01,
                    controller_down_steps_max=40, controller_delay_max=4)
EVERYTHING = Faults(drop=0.05, delay_max=4, crash=0.015, down_steps_max=25, partition=0.02, controller_partition=0.02,
                    master_cut=0.02, heal=0.05, controller_drop=0.05, answer_drop=0.1, controller_delay_max=5,
                    controller_down=0.01, controller_down_steps_max=40)
HANDOVERS = dataclasses.replace(EVERYTHING, handover=0.03)
PLANTED_SEEDS_MAX = 200  # a planted bug must be caught within this many seeds


def run(seed: int, size: int, faults: Faults, **options) -> Group:
    try:
        group = simulate(seed, size, dataclasses.replace(faults), **options)
    except AssertionError:
        print(f"controller simulation failed with seed {seed}: replay with pytest {__file__} --seed {seed}")
        raise
    assert group.acknowledged and group.controller.elections
    return group


# ---- random runs ----------------------------------------------------------------------------------------------------

def test_two_replicas_under_crashes_and_losses(seed):
    """Two replicas crash (losing what they had not persisted), messages and the controller's answers are lost or
    late: no acknowledged entry is lost, one master acknowledges per epoch, committed prefixes agree."""
    run(seed, 2, CRASHES)


def test_two_replicas_with_the_master_cut_from_the_controller(seed):
    """The master is cut from the controller while it still reaches its slave and the clients: the controller elects
    the slave from the SSS, and the old master cannot acknowledge anything the new one lacks."""
    run(seed, 2, MASTER_CUT)


def test_three_replicas_with_partitions_and_controller_downtime(seed):
    """Three replicas split at random, each may be cut from the controller, which goes down for a while (its Raft
    leader changes): the SSS shrinks and grows and masters change without losing an acknowledged entry."""
    run(seed, 3, PARTITIONS)


def test_all_faults_together(seed):
    """Crashes, losses, delays, partitions, the master cut from the controller, controller downtime and lost answers,
    with two replicas for even seeds and three for odd ones."""
    run(seed, 2 + seed % 2, EVERYTHING)


def test_handovers_among_all_faults(seed):
    """Besides every fault, an operator hands the mastership over to a live member of the SSS now and then (rocket
    cluster handover): the old master is fenced by the new epoch, and nothing it acknowledged is lost."""
    run(seed, 2 + seed % 2, HANDOVERS)


# ---- planted bugs ---------------------------------------------------------------------------------------------------

def _commit_counting_the_master_alone(self) -> None:
    if self.role == Role.LEADER and self.sync_state_set:
        candidate = self.tracker[self.id].match
        if candidate > self.commit and self.term_at(candidate) == self.term:
            self._commit_to(candidate)
            self._broadcast_append()


SYNC_STATE_REQUEST = ControlledCore.sync_state_request


def _adopting_its_own_request(self) -> SyncStateRequest | None:
    request = SYNC_STATE_REQUEST(self)
    if request is not None:  # the master changes its SSS without waiting for the controller's word
        self.sync_state_set, self.requested = request.sync_state_set, None
        self._maybe_commit()
    return request


PLANTED = {  # bug: (faults, options of the Group, (ControlledCore attribute, replacement) or None)
    "the master acknowledges once it alone persisted": (
        CRASHES, {}, ("_maybe_commit", _commit_counting_the_master_alone)),
    "slaves answer before persisting": (
        dataclasses.replace(CRASHES, crash=0.05), {"slaves_answer_before_persisting": True}, None),
    "elections from outside the SSS": (EVERYTHING, {"unclean": True}, None),
    "the master shrinks its SSS without the controller": (
        EVERYTHING, {}, ("sync_state_request", _adopting_its_own_request)),
}


@pytest.mark.parametrize("bug", list(PLANTED))
def test_a_planted_bug_is_caught(bug, monkeypatch):
    """The checkers have teeth: each planted bug makes one fire within PLANTED_SEEDS_MAX seeds."""
    faults, options, patch = PLANTED[bug]
    if patch is not None:
        monkeypatch.setattr(ControlledCore, *patch)
    for seed in range(PLANTED_SEEDS_MAX):
        try:
            simulate(seed, 2 + seed % 2, dataclasses.replace(faults), **options)
        except SafetyViolation as violation:
            print(f"{bug}: caught with seed {seed} (after {seed + 1} seeds): {str(violation).splitlines()[0]}")
            return
        except AssertionError:
            continue  # a liveness failure is not what this test looks for
    pytest.fail(f"{bug} went unnoticed in {PLANTED_SEEDS_MAX} seeds")


# ---- scripted races -------------------------------------------------------------------------------------------------

def two_in_sync(seed: int = 1) -> tuple[Group, int, int]:
    """A group of two whose master and controller both hold SSS {master, slave}, with entries acknowledged;
    returns it, its master and its slave."""
    group = Group(seed, 2)
    group.run_until(lambda: group.master() is not None and len(group.acknowledged) > 10
                    and group.master().core.sync_state_set == frozenset({1, 2})
                    and group.controller.sync_state_set == frozenset({1, 2}), what="two replicas in sync")
    master = group.master().id
    return group, master, 3 - master


def shrink_then_hold_the_expand(group: Group, master: int, slave: int) -> None:
    """Split the two until the SSS is the master alone, heal, and hold the master's requests until it asks to add
    the slave back."""
    group.partition({master}, {slave})
    group.run_until(lambda: group.nodes[master].core.sync_state_set == frozenset({master}), what="the shrink")
    group.blocked = set()
    group.intercept = requests_of(master)
    group.run_until(lambda: any(item[3].sync_state_set == frozenset({master, slave}) for item in group.held),
                    what="the expand asked")


def requests_of(master: int):
    return lambda kind, sender, to, payload: kind == "request" and sender == master


def first_of(predicate):
    """A predicate that accepts the first item predicate accepts, and no other (a request may be held twice)."""
    taken: list[bool] = []

    def accepts(*item) -> bool:
        if not taken and predicate(*item):
            taken.append(True)
            return True
        return False

    return accepts


def on_disk(group: Group, node: int, ack) -> bool:
    return any(entry.index == ack.index and entry.data == b"e%d" % ack.entry_id
               for entry in group.nodes[node].disk.entries)


def cut_off(master: int):
    """Hold the controller's answers and words to the master, and its heartbeats and requests to the controller."""
    return lambda kind, sender, to, payload: (to == master and kind in ("answer", "word")) or (
        sender == master and kind in ("heartbeat", "request"))


def test_race_the_shrink_loses_to_the_election_and_is_fenced():
    """Race (i), the election first: the master, split from its slave, asks to shrink the SSS to itself, but its
    heartbeats lapsed and the controller elected the slave before the request arrived: the request is fenced, and the
    old master acknowledged only what the slave holds (its commit waited for the old set and the asked-for one)."""
    group, master, slave = two_in_sync()
    group.partition({master}, {slave})
    acknowledged = len(group.acknowledged)
    group.intercept = requests_of(master)
    group.run_until(lambda: group.held, what="the shrink asked")
    shrink = group.held[0][3]
    assert shrink.sync_state_set == frozenset({master})
    group.intercept = lambda kind, sender, to, payload: sender == master and kind in ("request", "heartbeat")
    group.run_until(lambda: group.controller.master == slave, what="the slave elected")
    group.deliver_now(requests_of(master))
    assert group.controller.outcomes[-1][1:] == (shrink, "fenced")
    assert group.controller.sync_state_set == frozenset({slave})
    assert all(on_disk(group, slave, ack) for ack in list(group.acknowledged.values())[acknowledged:])
    group.intercept = None
    group.settle()


def test_race_the_shrink_wins_and_the_election_cannot_happen():
    """Race (i), the shrink first: the controller applies SSS {master}; when the master's heartbeats then lapse it
    cannot elect the slave, which is outside the SSS: the master goes on acknowledging alone and nothing is lost."""
    group, master, slave = two_in_sync()
    group.partition({master}, {slave})
    group.intercept = requests_of(master)
    group.run_until(lambda: group.held, what="the shrink asked")
    group.deliver_now(requests_of(master))
    assert group.controller.outcomes[-1][2] == "applied" and group.controller.sync_state_set == frozenset({master})
    elections = len(group.controller.elections)
    group.intercept = lambda kind, sender, to, payload: sender == master and kind == "heartbeat"
    acknowledged = len(group.acknowledged)
    group.run(group.controller.lapse_steps + 30)
    assert len(group.controller.elections) == elections and group.controller.master == master
    assert len(group.acknowledged) > acknowledged  # alone, and safely: the SSS says so
    group.intercept = None
    group.settle()


def test_race_the_shrink_applied_but_its_answer_lost():
    """Race (ii): the controller applies the shrink but the answer is lost: the master keeps waiting for the old set
    (it acknowledges nothing), sends the same request again (now fenced), and goes on once the controller's word
    reaches it."""
    group, master, slave = two_in_sync()
    group.partition({master}, {slave})
    group.intercept = lambda kind, sender, to, payload: to == master and kind in ("answer", "word")
    group.run_until(lambda: group.controller.sync_state_set == frozenset({master}), what="the shrink applied")
    acknowledged = len(group.acknowledged)
    group.run(40)
    core = group.nodes[master].core
    assert core.sync_state_set == frozenset({master, slave}) and core.requested is not None
    assert len(group.acknowledged) == acknowledged
    shrink = core.requested
    assert [outcome for _, request, outcome in group.controller.outcomes if request == shrink][:2] == [
        "applied", "fenced"]
    group.intercept = None
    group.deliver_now(lambda kind, sender, to, payload: kind == "answer")
    assert core.sync_state_set == frozenset({master}) and core.requested is None
    group.run(10)
    assert len(group.acknowledged) > acknowledged
    group.settle()


def expand_then_elect(group: Group, master: int, slave: int, check_joining: bool = True) -> int:
    """Race (iii)'s script: with SSS {master}, the slave catches up and the master asks to add it; while the request
    is in flight, the master acknowledges. Then the controller applies it, its answer is lost, the two are split and
    the master's heartbeats stop: the controller elects the slave. Returns the acknowledgements made meanwhile."""
    shrink_then_hold_the_expand(group, master, slave)
    acknowledged = len(group.acknowledged)
    for _ in range(30):
        group.step()
        for ack in list(group.acknowledged.values())[acknowledged:]:
            assert on_disk(group, slave, ack) or not check_joining, f"e{ack.entry_id} is not on the joining slave"
    made = len(group.acknowledged) - acknowledged
    group.intercept = cut_off(master)
    group.deliver_now(first_of(lambda kind, sender, to, payload: payload.sync_state_set == frozenset({master, slave})))
    assert group.controller.outcomes[-1][2] == "applied"
    group.partition({master}, {slave})
    group.run_until(lambda: group.controller.master == slave, what="the slave elected")  # checker 1 runs here
    group.intercept = None
    group.settle()
    return made


def test_race_an_expand_pending_needs_the_joining_slave():
    """Race (iii), apache/rocketmq #5663: while SSS {master} -> {master, slave} is in flight, every entry the master
    acknowledges is on the joining slave's disk; the controller applies the expand, the answer is lost, the controller
    elects the slave: it holds everything acknowledged."""
    group, master, slave = two_in_sync()
    assert expand_then_elect(group, master, slave) > 0


def test_race_an_expand_pending_without_the_union_loses_entries(monkeypatch):
    """The same script with the commit counting the current SSS alone (RocketMQ before #5663's fix): the master
    acknowledges what the slave lacks, and checker 1 fires when the controller elects the slave."""
    def commit_by_the_current_set(self):
        if self.role == Role.LEADER and self.sync_state_set:
            candidate = min(self.tracker[node].match for node in self.sync_state_set | {self.id})
            if candidate > self.commit and self.term_at(candidate) == self.term:
                self._commit_to(candidate)
                self._broadcast_append()

    monkeypatch.setattr(ControlledCore, "_maybe_commit", commit_by_the_current_set)
    group, master, slave = two_in_sync()
    with pytest.raises(SafetyViolation, match=f"replica {slave} .elected at epoch"):
        expand_then_elect(group, master, slave, check_joining=False)


def test_a_handover_makes_the_slave_master_and_the_old_master_its_slave():
    """rocket cluster handover, scripted: the slave in the SSS is master at the next epoch while writes go on; the old
    master, fenced, follows it, rejoins the SSS, and everything acknowledged before and after holds."""
    group, master, slave = two_in_sync()
    acknowledged = len(group.acknowledged)
    epoch = group.controller.master_epoch
    assert group.controller.hand_over(slave, group.step_number)
    group.run_until(lambda: group.master() is not None and group.master().id == slave
                    and group.controller.sync_state_set == frozenset({1, 2})
                    and len(group.acknowledged) > acknowledged + 10, what="the slave master, both in sync again")
    assert group.controller.master_epoch == epoch + 1 and group.nodes[master].core.role != Role.LEADER
    assert not group.controller.hand_over(3, group.step_number)  # not a replica: nothing changes
    group.settle()


def test_master_and_controller_fail_together_and_writes_resume_at_once():
    """apache/rocketmq #7689's setting: the master and the controller go down together; both come back and clients
    write at once. The restarted master keeps its whole log (not only what was confirmed), so no new entry takes the
    index of one a slave holds: logs and acknowledgements survive."""
    group, master, slave = two_in_sync()
    group.controller_down(8)
    group.crash(master, 4)
    group.run_until(lambda: group.master() is not None and not group.controller.down, what="both back")
    group.run(60)
    group.settle()


# ---- bugs the simulator found in ControlledCore, fixed: their scripts stay as regression tests ---------------------

def late_epoch_answer(seed: int = 1) -> tuple[Group, int, int]:
    """Bug 1's script: the slave restarts and asks the master for its epochs; the first answer is late, and arrives
    after a second one let the slave sync and acknowledge more entries."""
    group, master, slave = two_in_sync(seed)
    group.crash(slave, 3)
    late: list[Message] = []

    def hold_the_first_answer(kind, sender, to, payload) -> bool:
        if kind == "raft" and payload.type == MessageType.EPOCH_ANSWER and not late:
            late.append(payload)
            return True
        return False

    def synced_past_the_late_answer() -> bool:
        core = group.nodes[slave].core
        return bool(late) and core.last_index > late[0].index + 2 and max(
            ack.index for ack in group.acknowledged.values()) > core.commit

    group.intercept = hold_the_first_answer
    group.run_until(synced_past_the_late_answer,
                    what="the slave synced past the late answer, with acknowledged entries above its commit")
    group.intercept = None
    group.deliver_now()
    return group, master, slave


def test_a_late_epoch_answer_truncates_nothing():
    """A late EPOCH_ANSWER (the master's log end when it answered an earlier query) is ignored: it used to truncate the
    entries the slave accepted and acknowledged since, which the master had counted (seed 1, step 47: replica 1
    dropped e23 at 24, acknowledged by master 2 that step). The answer now echoes its query."""
    group, master, slave = late_epoch_answer()
    group.check_holds_acknowledged(slave, "after a late epoch answer")


def test_a_late_epoch_answer_leaves_the_slave_catching_up():
    """After the late answer the slave still catches up and rejoins the SSS once every fault is healed (it used to be
    stuck: the master's match for it lay past its truncated log, and its rejections looked stale)."""
    group, _, _ = late_epoch_answer()
    group.settle()


def test_a_restarted_master_waits_for_every_replica_until_its_own_request_applies():
    """The master asks to add the slave (SSS {master} -> {master, slave}) and crashes before the request arrives; it
    restarts, the controller names it master again with SSS {master} (the request is not applied yet), and it
    would acknowledge alone. Then the request arrives and is applied, its answer lost: the controller's SSS has the
    slave, the master's does not. Split from the slave, its heartbeats lapsing, the master used to acknowledge entries
    the slave never got, lost when the controller elected the slave (seed 1: e25 at 27, step 70). Now a master back
    at its epoch waits for every replica until a request of its own is applied: nothing acknowledged is lost."""
    group, master, slave = two_in_sync()
    shrink_then_hold_the_expand(group, master, slave)
    expand = next(item for item in group.held if item[3].sync_state_set == frozenset({master, slave}))
    group.crash(master, 1)
    group.run_until(lambda: group.master() is not None and group.master().id == master, what="the master back")
    group.partition({master}, {slave})
    group.intercept = cut_off(master)
    group.deliver_now(first_of(lambda *item: item[3] is expand[3]))
    assert group.controller.outcomes[-1][1:] == (expand[3], "applied")
    group.run_until(lambda: group.controller.master == slave, what="the slave elected")


# ---- replacing a replica --------------------------------------------------------------------------------------------

def replace_under_faults(seed: int) -> tuple[Group, int, int]:
    """Settled, then replica old (the master for even seeds) replaced by new under every fault for 300 steps."""
    group = Group(seed, 2 + seed % 2, dataclasses.replace(EVERYTHING))
    group.run(60)
    group.settle()
    old = group.controller.master if seed % 2 == 0 else next(node for node in group.nodes
                                                             if node != group.controller.master)
    new = group.replace(old)
    group.faults = dataclasses.replace(EVERYTHING)
    group.run(300)
    return group, old, new


def test_a_replica_is_replaced_among_all_faults(seed):
    """A replica (the master for even seeds) is replaced by a new one under every fault, in the nameservers' steps:
    learner, slave, into the SSS, handover if it was master, dropped from the SSS by the controller, removed by the
    master. Nothing acknowledged is lost (the new replica, once master or in the set, holds it all), and once healed
    the replacement completes."""
    try:
        group, old, new = replace_under_faults(seed)
    except AssertionError:
        print(f"controller simulation failed with seed {seed}: replay with pytest {__file__} --seed {seed}")
        raise
    group.settle()
    group.run_until(lambda: group.mover.done, steps_max=600, what=f"replacing {old} by {new}")
    master = group.settle()
    assert old not in group.nodes and new in master.core.voters and old not in master.core.voters
    assert new in group.controller.replicas and old not in group.controller.replicas


def test_a_new_replica_let_into_the_set_before_it_caught_up_is_caught(monkeypatch):
    """A planted bug in the replacement: the controller lets the new replica into the SSS as soon as it is a slave,
    before it holds everything committed; a handover to it, or an election of it, then loses acknowledged entries."""
    move = Group._move

    def admitting_at_once(self) -> None:
        mover, controller = self.mover, self.controller
        master = self.nodes.get(controller.master)
        if (mover is not None and not mover.done and master is not None and mover.new in master.core.voters
                and mover.new not in controller.sync_state_set and not controller.down):
            controller.sync_state_set |= {mover.new}
            controller.sync_state_set_epoch += 1
            self._tell(f"let {mover.new} into the SSS at once (the planted bug)")
        move(self)

    monkeypatch.setattr(Group, "_move", admitting_at_once)
    for seed in range(PLANTED_SEEDS_MAX):
        try:
            group, _, _ = replace_under_faults(seed)
            group.settle()
        except SafetyViolation as violation:
            print(f"caught with seed {seed}: {str(violation).splitlines()[0]}")
            return
        except AssertionError:
            continue
    pytest.fail(f"admitting a new replica before it caught up went unnoticed in {PLANTED_SEEDS_MAX} seeds")
