"""Raft core regressions found outside the simulator: a follower that was down must always catch up."""

from rocket.raft.core import Config, MessageType, RaftCore, Role


def cluster() -> dict[int, RaftCore]:
    return {node: RaftCore(Config(node, (1, 2, 3), seed=node)) for node in (1, 2, 3)}


def pump(cores: dict[int, RaftCore], down: frozenset = frozenset(), rounds: int = 50, lose=lambda message: False) -> None:
    """Deliver messages until none are left; everything to or from a node that is down is lost, and
    so is every message `lose` picks."""
    for _ in range(rounds):
        moved = False
        for core in cores.values():
            if not core.has_ready():
                continue
            ready = core.ready()
            core.advance(ready)
            for message in ready.messages:
                moved = True
                if message.to not in down and message.sender not in down and not lose(message):
                    cores[message.to].step(message)
        if not moved:
            return


def tick(cores: dict[int, RaftCore], times: int, down: frozenset = frozenset(), lose=lambda message: False) -> None:
    for _ in range(times):
        for node, core in cores.items():
            if node not in down:
                core.tick()
        pump(cores, down, lose=lose)


def restart(cores: dict[int, RaftCore], node: int) -> None:
    """The node comes back from what it persisted."""
    old = cores[node]
    cores[node] = RaftCore(Config(node, (1, 2, 3), seed=node), old._last_hard_state, list(old.log), old.snapshot)


def leader_of(cores: dict[int, RaftCore]) -> RaftCore:
    cores[1].campaign()
    pump(cores)
    tick(cores, 30)
    leader = cores[1]
    assert leader.role == Role.LEADER
    return leader


def test_a_follower_back_after_its_appends_were_lost_catches_up():
    """While node 3 is down the leader fills its in-flight window with appends that are lost; once it
    is back, heartbeat responses must free the window (they did not: it stayed behind for good)."""
    cores = cluster()
    leader = leader_of(cores)
    down = frozenset({3})
    for _ in range(200):
        leader.propose(b"y")
        pump(cores, down)
    assert len(leader.tracker[3].inflight) == leader.config.append_messages_in_flight_max
    restart(cores, 3)
    tick(cores, 30)
    assert cores[3].last_index == leader.last_index == 201
    assert cores[3].commit == leader.commit


def test_a_follower_back_after_its_snapshot_was_lost_gets_it_again():
    """The leader compacted while node 3 was down and sends it a snapshot once it is back; that one is
    lost. The leader must send it again (it waited for an answer forever)."""
    cores = cluster()
    leader = leader_of(cores)
    down = frozenset({3})
    for _ in range(50):
        leader.propose(b"y")
        pump(cores, down)
    for core in cores.values():
        if core is not cores[3]:
            core.compact(core.applied, b"state")
    restart(cores, 3)
    tick(cores, 5, lose=lambda message: message.type == MessageType.SNAPSHOT)
    assert leader.tracker[3].state == leader.tracker[3].SNAPSHOT
    tick(cores, 40)
    assert cores[3].snapshot.index == 51 and cores[3].last_index == leader.last_index == 51
