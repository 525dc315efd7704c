"""The Raft core under the deterministic simulator: safety under every fault, liveness once they heal,
and each feature (ReadIndex, transfer, pre-vote, check-quorum, membership, snapshots) end to end; the fault tests
also run the cores as the round loop's planner does (rounds). A failure names its seed; `Cluster(seed, ...)` replays
it exactly."""

from __future__ import annotations


import dataclasses

import pytest

from rocket.raft.core import MessageType, Role
from rocket.raft.planner import Planner
from tests.sim.linearizability import Operation, linearizable
from tests.sim.raft_sim import Cluster, Faults, KvWorkload, Node, SafetyViolation, run_kv

NASTY = Faults(drop=0.1, duplicate=0.05, delay_max=6, crash=0.01, partition=0.02, heal=0.05, quiesce=0.02, wake=0.05)


def members(cluster: Cluster, leader: Node) -> list[Node]:
    """The nodes the leader counts as members: a removed node is left to its own devices."""
    return [n for n in cluster.nodes.values() if n.id in leader.core.voters | leader.core.learners]


def settle(cluster: Cluster, steps: int = 400) -> Node:
    """Run without faults until there is a leader; returns it."""
    cluster.heal()
    for _ in range(steps):
        cluster.step()
        leader = cluster.leader()
        if leader is not None and all(n.core.leader == leader.id for n in members(cluster, leader)):
            return leader
    raise AssertionError(f"seed {cluster.seed}: no stable leader after {steps} steps")


def commit_everywhere(cluster: Cluster, data: bytes, steps: int = 400) -> int:
    """Propose data and run until every node has applied it; returns its index."""
    for _ in range(steps):
        leader = settle(cluster)
        index = cluster.propose(data)
        if index is None:
            continue
        for _ in range(steps):
            cluster.step()
            if all(n.applied.get(index, (0, b""))[1] == data for n in members(cluster, cluster.leader() or leader)):
                return index
            if cluster.committed.get(index, (0, data))[1] != data:
                break  # lost to a leader change before it committed: propose again
    raise AssertionError(f"seed {cluster.seed}: {data!r} never committed everywhere")


def test_elects_a_leader_and_replicates():
    """Without faults three nodes elect one leader and every node applies every proposal in order."""
    cluster = Cluster(seed=1)
    settle(cluster)
    cluster.run(200)
    index = commit_everywhere(cluster, b"last")
    applied = [n.applied for n in cluster.nodes.values()]
    assert all(a == applied[0] for a in applied) and len(applied[0]) >= index >= 50
    cluster.check_log_matching()


ROUNDS = pytest.mark.parametrize("rounds", [False, True], ids=["persist-then-send", "rounds"])


@ROUNDS
def test_safety_under_faults_then_liveness(seed, rounds):
    """Drops, duplicates, reordering, partitions and crashes never break safety; healed, it makes progress."""
    cluster = Cluster(seed=seed, size=5 if seed % 2 else 3, faults=NASTY, rounds=rounds)
    cluster.run(700)
    cluster.check_log_matching()
    commit_everywhere(cluster, b"after-heal-%d" % seed)
    cluster.check_log_matching()
    assert cluster.proposed > 0


def test_read_index_confirms_leadership():
    """A ReadIndex read is released only after a quorum answers, at the commit index of its time."""
    cluster = Cluster(seed=3)
    settle(cluster)
    commit_everywhere(cluster, b"x")
    leader = cluster.leader()
    released: list[tuple[int, int]] = []
    original_advance = leader.core.advance

    def capture(ready):
        released.extend(ready.read_states)
        original_advance(ready)

    leader.core.advance = capture
    commit_at_request = leader.core.commit
    leader.core.read_index(42)
    assert leader.core.ready().read_states == []  # nobody has confirmed the leadership yet
    for _ in range(10):
        cluster.step()
    assert released == [(42, commit_at_request)]


def test_isolated_leader_steps_down_and_cannot_commit():
    """check-quorum: a leader cut off from its followers steps down; the majority elects another."""
    cluster = Cluster(seed=5)
    old = settle(cluster)
    others = [n for n in cluster.nodes if n != old.id]
    cluster.blocked = {(old.id, o) for o in others} | {(o, old.id) for o in others}
    for _ in range(60):
        cluster.step()
    assert old.core.role != Role.LEADER
    new = cluster.leader()
    assert new is not None and new.id != old.id


def test_pre_vote_keeps_a_partitioned_node_from_disrupting():
    """A node cut off for a long time does not raise its term, so rejoining does not depose the leader."""
    cluster = Cluster(seed=7)
    leader = settle(cluster)
    loner = next(n for n in cluster.nodes.values() if n.id != leader.id)
    term = leader.core.term
    cluster.blocked = {(loner.id, o) for o in cluster.nodes if o != loner.id}
    cluster.blocked |= {(b, a) for a, b in cluster.blocked}
    for _ in range(200):
        cluster.step()
    assert loner.core.term == term
    cluster.blocked = set()
    for _ in range(50):
        cluster.step()
    assert cluster.leader().id == leader.id and leader.core.term == term


def test_leadership_transfer():
    """The leader hands over to a chosen voter once it has caught up."""
    cluster = Cluster(seed=9)
    leader = settle(cluster)
    commit_everywhere(cluster, b"before")
    target = next(n for n in cluster.nodes if n != leader.id)
    leader.core.transfer_leadership(target)
    for _ in range(30):
        cluster.step()
    assert cluster.leader().id == target
    commit_everywhere(cluster, b"after")


def test_membership_change_add_learner_promote_remove():
    """A learner catches up without voting, is promoted, and an old voter is removed, one change at a time."""
    cluster = Cluster(seed=11, learners=(4,))
    leader = settle(cluster)
    assert 4 in leader.core.learners
    commit_everywhere(cluster, b"seen-by-learner")
    assert cluster.nodes[4].core.role == Role.FOLLOWER
    leader = cluster.leader()
    leader.core.propose_conf_change("promote", 4)
    cluster._handle_ready(leader)
    commit_everywhere(cluster, b"promoted")
    assert 4 in cluster.leader().core.voters
    leader = cluster.leader()
    victim = next(n for n in (1, 2, 3) if n != leader.id)
    leader.core.propose_conf_change("remove", victim)
    cluster._handle_ready(leader)
    commit_everywhere(cluster, b"removed")
    assert victim not in cluster.leader().core.voters and len(cluster.leader().core.voters) == 3


def test_snapshot_brings_a_lagging_node_back():
    """After the leader compacts its log, a node that missed those entries catches up by InstallSnapshot."""
    cluster = Cluster(seed=13)
    leader = settle(cluster)
    lagging = next(n for n in cluster.nodes.values() if n.id != leader.id)
    cluster.blocked = {(leader.id, lagging.id), (lagging.id, leader.id)}
    others = [n for n in cluster.nodes if n not in (leader.id, lagging.id)]
    cluster.blocked |= {(o, lagging.id) for o in others} | {(lagging.id, o) for o in others}
    for number in range(40):
        cluster.propose(b"while-away-%d" % number)
        cluster.step()
    for _ in range(20):
        cluster.step()
    for node in cluster.nodes.values():
        if node.id != lagging.id:
            node.compact()
    assert cluster.leader().core.snapshot.index > lagging.core.last_index
    sent = []
    original = cluster._send
    cluster._send = lambda message: (sent.append(message.type), original(message))
    commit_everywhere(cluster, b"back")
    assert MessageType.SNAPSHOT in sent
    assert lagging.core.snapshot.index > 0


@ROUNDS
def test_kv_register_is_linearizable_under_faults(seed, rounds):
    """Puts, gets (half through ReadIndex, half by leader lease) and compare-and-sets form a linearizable
    history despite faults."""
    cluster = Cluster(seed=seed, size=3, faults=Faults(drop=0.05, duplicate=0.05, delay_max=4, crash=0.005,
                                                       partition=0.01, heal=0.05, quiesce=0.02, wake=0.05),
                      rounds=rounds)
    workload = run_kv(cluster, 500)
    history = workload.finish()
    assert sum(1 for op in history if op.responded != float("inf")) > 5
    ok, problem = linearizable(history)
    assert ok, f"seed {seed}: {problem}"


def test_linearizability_checker_catches_a_stale_read():
    """The checker itself refuses a history where a read returns an overwritten value."""
    history = [Operation(1, "a", "put", (1,), 0, 1), Operation(2, "a", "put", (2,), 2, 3),
               Operation(3, "a", "get", (), 4, 5, 1)]
    assert not linearizable(history)[0]
    history[2] = Operation(3, "a", "get", (), 2.5, 5, 1)  # concurrent with the second put: fine
    assert linearizable(history)[0]


def test_checkers_catch_planted_bugs(monkeypatch):
    """Known bugs are caught: a node that votes twice in a term, a leader that commits without a quorum,
    and reads served from any replica without ReadIndex."""
    import rocket.raft.core as core_module

    original_vote = core_module.RaftCore._on_vote_request

    def votes_for_anyone(self, message):
        self.vote = core_module.NONE  # forgets its vote: may grant a second one in the same term
        original_vote(self, message)

    monkeypatch.setattr(core_module.RaftCore, "_on_vote_request", votes_for_anyone)
    assert _some_seed_fails(lambda seed: Cluster(seed=seed, size=3, faults=NASTY).run(600))
    monkeypatch.undo()

    def commits_alone(self):
        if self.term_at(self.last_index) == self.term:
            self._commit_to(self.tracker[self.id].match)

    monkeypatch.setattr(core_module.RaftCore, "_maybe_commit", commits_alone)
    assert _some_seed_fails(lambda seed: Cluster(seed=seed, size=3, faults=NASTY).run(600))
    monkeypatch.undo()

    def stale_reads(seed):
        cluster = Cluster(seed=seed, size=3, faults=Faults(drop=0.05, delay_max=4, partition=0.02, heal=0.05))
        workload = KvWorkload(cluster)
        original_invoke = workload.invoke

        def invoke(now):
            node = cluster.random.choice(list(cluster.nodes.values()))
            if cluster.random.random() < 0.5:
                key = cluster.random.choice(workload.keys)
                workload.history.append(Operation(10_000 + len(workload.history), key, "get", (), now, now + 0.1,
                                                  node.kv.get(key)))
            else:
                original_invoke(now)

        workload.invoke = invoke
        for number in range(600):
            workload.invoke(number + 0.25)
            cluster.step()
            workload.collect(number + 0.75)
        ok, problem = linearizable(workload.finish())
        if not ok:
            raise SafetyViolation(problem)

    assert _some_seed_fails(stale_reads)


def _some_seed_fails(run, seeds: int = 40) -> bool:
    for seed in range(seeds):
        try:
            run(seed)
        except SafetyViolation:
            return True
    return False


def test_idle_group_goes_quiet_and_wakes_on_traffic():
    """A fully replicated idle group stops ticking on every node; a proposal wakes it and commits."""
    cluster = Cluster(seed=21)
    leader = settle(cluster)
    commit_everywhere(cluster, b"before")
    leader = cluster.leader()
    assert leader.core.quiesce()
    for _ in range(5):
        cluster.step()
    assert all(node.core.quiet for node in cluster.nodes.values())
    terms = [node.core.term for node in cluster.nodes.values()]
    for _ in range(200):  # far beyond any election timeout: nothing happens while quiet
        cluster.step()
    assert [node.core.term for node in cluster.nodes.values()] == terms and not cluster.in_flight
    commit_everywhere(cluster, b"after")
    assert cluster.leader().id == leader.id


@ROUNDS
def test_membership_changes_and_slow_disks_under_faults(seed, rounds):
    """Voters removed, re-added as learners and promoted while the network, disks and nodes misbehave:
    safety holds throughout, and the group makes progress once the faults stop."""
    faults = Faults(drop=0.1, duplicate=0.05, delay_max=5, crash=0.01, partition=0.02, heal=0.05,
                    slow_disk=0.2, membership=0.05)
    cluster = Cluster(seed=seed, size=5, faults=faults, rounds=rounds)
    cluster.run(700)
    cluster.check_log_matching()
    commit_everywhere(cluster, b"after-heal-%d" % seed)
    cluster.check_log_matching()
    assert cluster.conf_entries(), "membership changed during the run"


def test_a_node_restarts_with_membership_changes_in_its_log():
    """Restarting from a log that holds membership changes rebuilds the membership (it once crashed)."""
    cluster = Cluster(seed=11, learners=(4,))
    settle(cluster)
    leader = cluster.leader()
    leader.core.propose_conf_change("promote", 4)
    cluster._handle_ready(leader)
    commit_everywhere(cluster, b"promoted")
    for node in cluster.nodes.values():
        node.crash_and_restart()
        assert node.core.voters == {1, 2, 3, 4} and not node.core.learners
    commit_everywhere(cluster, b"after-restarts")


def test_rounds_that_send_before_their_fsync_are_caught(monkeypatch):
    """The round planner's persist-before-send is what keeps rounds safe: a planner that sent every message as soon as
    its round was written (votes and answers included, not only a leader's appends) loses committed entries to
    crashes, and the simulator finds a seed where it does."""

    def everything_at_once(readies):
        outgoing = {}
        for group, _, ready in readies:
            for message in ready.messages:
                outgoing.setdefault(message.to, []).append((group, message))
        return outgoing

    monkeypatch.setattr(Planner, "appends", staticmethod(everything_at_once))
    monkeypatch.setattr(Planner, "released", staticmethod(lambda durable: {}))
    faults = dataclasses.replace(NASTY, crash=0.05, fsync_steps_max=8, drop=0.02, partition=0.0)
    assert _some_seed_fails(lambda seed: Cluster(seed=seed, size=3, faults=faults, rounds=True).run(600))


@ROUNDS
@pytest.mark.sim_seeds(100)
def test_read_replicas_apply_only_what_a_quorum_of_voters_holds(seed, rounds):
    """Read replicas (learners that stay, issue 53) under every fault: each entry a learner applies, and so may
    serve, is durable on a quorum of the voters by then, as the term that wrote it; a learner never campaigns.
    Healed, the learners apply what the voters committed."""
    cluster = Cluster(seed=seed, size=3, faults=NASTY, learners=(4, 5), rounds=rounds)
    voters = [cluster.nodes[n] for n in (1, 2, 3)]
    served = []

    def durable_on(node: Node, index: int, term: int) -> bool:
        snapshot = node.disk.snapshot
        return (snapshot is not None and snapshot.index >= index) or any(
            entry.index == index and entry.term == term for entry in node.disk.entries)

    def check(node: Node, entry) -> None:
        if node.id in (4, 5):
            holders = sum(durable_on(voter, entry.index, entry.term) for voter in voters)
            if holders < 2:
                raise SafetyViolation(f"seed {seed}: learner {node.id} applied entry {entry.index} held by "
                                      f"{holders} voters")
            served.append(entry.index)

    cluster.apply_hook = check
    for _ in range(700):
        cluster.step()
        if cluster.step_number % 3 == 0:
            cluster.propose(b"v%d" % cluster.step_number)
        for learner in (4, 5):
            assert cluster.nodes[learner].core.role == Role.FOLLOWER, (seed, cluster.step_number)
    cluster.check_log_matching()
    index = commit_everywhere(cluster, b"after-heal-%d" % seed)
    assert all(cluster.nodes[learner].applied.get(index) for learner in (4, 5)) and served


def test_learners_never_make_a_quorum():
    """A leader cut off from the other voters, with both learners still reachable, commits nothing: only voters
    count (tracker.committed), however many learners hold the entry. Healed, the group goes on."""
    cluster = Cluster(seed=23, size=3, learners=(4, 5))
    leader = settle(cluster)
    commit_everywhere(cluster, b"before")
    leader = cluster.leader()
    others = [n for n in (1, 2, 3) if n != leader.id]
    cluster.blocked = {(a, b) for a in others for b in cluster.nodes if b != a}
    cluster.blocked |= {(b, a) for a, b in cluster.blocked}
    index = cluster.propose(b"learners-only")
    assert index is not None
    for _ in range(60):
        cluster.step()
    assert all(n.core.last_index >= index for n in (cluster.nodes[4], cluster.nodes[5])), "the learners hold it"
    assert index not in cluster.committed and leader.core.commit < index
    commit_everywhere(cluster, b"healed")
