"""Leader-lease reads assume that every node's clock ticks at about the same rate (as etcd's do). A
scripted run breaks that assumption: the leader is cut off while the other nodes' clocks run three
times faster, so they elect a new leader and commit a write while the old leader still trusts its
lease. Its lease read then returns the overwritten value, and the linearizability checker says so.
(The two other clocks run at different rates, three and two times faster, so that their elections
do not collide.)
With clocks at one rate the same script gives no stale read: the lease runs out before anyone else
can lead, and a ReadIndex read never completes without a quorum."""

from __future__ import annotations

from rocket.raft.core import Config, NotLeader, RaftCore, Role
from tests.sim.linearizability import Operation, linearizable
from tests.unit.test_raft_core import pump

NODES = (1, 2, 3)


def deliver(cores: dict[int, RaftCore], cut: int | None) -> None:
    """Every Ready handled until none is left; messages to or from `cut` are lost."""
    pump(cores, frozenset() if cut is None else frozenset({cut}))


def committed_value(core: RaftCore) -> bytes:
    """The register's value as this node applied it: the last non-empty entry it holds up to commit."""
    return next(entry.data for entry in reversed(core.log) if entry.index <= core.commit and entry.data)


def run(drift: dict[int, int]) -> tuple[list[Operation], bool]:
    """The history of: put 1 (node 1 leads), node 1 cut off, nodes 2 and 3 tick drift[node] times per
    tick of node 1 until one of them leads, put 2 there, then a lease read on node 1. Returns the
    history and whether node 1 answered the read."""
    cores = {node: RaftCore(Config(node, NODES, seed=node)) for node in NODES}
    cores[1].campaign()
    deliver(cores, None)
    for _ in range(30):  # leadership settles and node 1's lease is fresh
        for core in cores.values():
            core.tick()
        deliver(cores, None)
    assert cores[1].role == Role.LEADER
    cores[1].propose(b"1")
    deliver(cores, None)
    history = [Operation(1, "a", "put", ("1",), 0, 1)]
    now = 2.0
    new_leader = None
    for _ in range(60):
        cores[1].tick()
        for node in (2, 3):
            for _ in range(drift[node]):
                cores[node].tick()
        deliver(cores, cut=1)
        leaders = [node for node in (2, 3) if cores[node].role == Role.LEADER]
        if leaders and new_leader is None:
            new_leader = cores[leaders[0]]
            new_leader.propose(b"2")
            deliver(cores, cut=1)
            assert committed_value(new_leader) == b"2"
            history.append(Operation(2, "a", "put", ("2",), now, now + 0.5))
            now += 1
            break
        now += 1
    try:
        cores[1].read_index(7, lease=True)
    except NotLeader:  # it found out it no longer leads: no answer
        pass
    ready = cores[1].ready()
    cores[1].advance(ready)
    answered = any(request == 7 for request, _ in ready.read_states)
    value = committed_value(cores[1]).decode() if answered else None
    history.append(Operation(3, "a", "get", (), now, now + 0.5 if answered else float("inf"), value))
    return history, answered


def test_a_lease_read_under_clock_drift_is_stale_and_the_checker_catches_it():
    history, answered = run(drift={2: 3, 3: 2})
    assert answered, "node 1 should still trust its lease"
    assert history[-1].result == "1" and len(history) == 3  # a new leader committed 2 meanwhile
    ok, problem = linearizable(history)
    assert not ok and "a" in problem


def test_without_drift_the_lease_expires_before_anyone_else_can_lead():
    history, answered = run(drift={2: 1, 3: 1})
    assert not answered  # the lease ran out: a read needs a quorum that node 1 cannot reach
    assert linearizable(history)[0]
