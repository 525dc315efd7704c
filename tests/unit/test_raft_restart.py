"""What a restart costs the Raft host: a group whose only voter is this node leads at once, with no election timeout,
while groups with other voters still wait theirs; and the WAL a restart replays stays bounded in bytes."""

from __future__ import annotations

import trio

from rocket import limits
from rocket.raft.core import Config, HardState, MessageType, RaftCore, Role
from rocket.raft.host import RaftHost
from rocket.raft.wal import Wal


class ListMachine:
    """Keeps every value applied; its snapshot has one chunk per value."""

    def __init__(self):
        self.values: list[bytes] = []

    def apply(self, entries, positions) -> list:
        self.values.extend(entry.data for entry in entries if entry.data)
        return [None] * len(entries)

    def snapshot(self) -> list[bytes]:
        return list(self.values)

    def restore(self, chunks) -> None:
        self.values = list(chunks)


def open_host(directory) -> RaftHost:
    return RaftHost(1, Wal.open(directory, 64 * limits.MiB), lambda node, payload: None, tick_s=0.01)


async def propose_all(host: RaftHost, group: int, values: list[bytes]) -> None:
    async with trio.open_nursery() as nursery:
        await nursery.start(host.run)
        for value in values:
            await host.propose(group, value, timeout_s=10)
        nursery.cancel_scope.cancel()


def test_the_only_voter_campaigns_on_its_first_tick_and_others_wait_a_timeout():
    """A core whose configuration has one voter, itself, leads after one tick; a core with other voters that held
    an election before its restart does not campaign before its election timeout. In a group that never held one
    (a new group), the first voter asks for votes after raft_first_election_ticks, and again as often until one is
    held, while the others wait out the timeout; and its replicas, which never voted, grant pre-votes at once."""
    alone = RaftCore(Config(1, (1,)))
    alone.tick()
    assert alone.role == Role.LEADER and alone.leader == 1
    restarted = RaftCore(Config(1, (1, 2, 3)), HardState(term=3, vote=2))
    for _ in range(limits.raft_election_ticks - 1):
        restarted.tick()
    assert restarted.role == Role.FOLLOWER and restarted.votes == {}
    new = [RaftCore(Config(node, (1, 2, 3), first_voter=1)) for node in (1, 2, 3)]
    for _ in range(limits.raft_first_election_ticks):
        for core in new:
            core.tick()
    assert [core.role for core in new] == [Role.PRE_CANDIDATE, Role.FOLLOWER, Role.FOLLOWER]
    [pre_vote, _] = new[0].ready().messages
    assert pre_vote.type == MessageType.PRE_VOTE and pre_vote.term == 1
    new[1].step(pre_vote)
    [granted] = new[1].ready().messages
    assert granted.type == MessageType.PRE_VOTE_RESPONSE and not granted.reject
    new[0].step(granted)  # a quorum: the real vote follows, at term 1
    assert new[0].role == Role.CANDIDATE and new[0].term == 1
    for _ in range(limits.raft_first_election_ticks):
        new[2].tick()  # not asked, and not the first voter: it waits out the timeout
    assert new[2].role == Role.FOLLOWER and new[2].votes == {}
    learner = RaftCore(Config(2, (1,), learners=(2,)))  # one voter, but not this node: it never campaigns
    for _ in range(3 * limits.raft_election_ticks):
        learner.tick()
    assert learner.role == Role.FOLLOWER


async def test_a_restarted_single_voter_group_leads_before_any_tick(tmp_path):
    """After a restart, a group whose only voter is this node leads as soon as it is added, in a new term, and
    serves a proposal with its replayed state; a three-voter group restarted alongside waits for an election."""
    host = open_host(tmp_path)
    first = ListMachine()
    host.add_group(1, (1,), first)
    host.add_group(2, (1, 2, 3), ListMachine())
    await propose_all(host, 1, [b"a", b"b", b"c"])
    term_before = host.groups[1].core.term
    host.wal.close()

    restarted = open_host(tmp_path)
    machine = ListMachine()
    alone = restarted.add_group(1, (1,), machine)
    among_three = restarted.add_group(2, (1, 2, 3), ListMachine())
    assert alone.role == Role.LEADER and alone.term == term_before + 1
    assert among_three.role == Role.FOLLOWER and among_three.leader == 0
    # It never held an election (its other voters never ran): as that new group's first voter (group 2 of voters 1-3:
    # node 3), this node would ask soon; it is not, and waits.
    assert among_three.randomized_election_ticks >= limits.raft_election_ticks
    await propose_all(restarted, 1, [b"d"])
    assert machine.values == [b"a", b"b", b"c", b"d"]
    restarted.wal.close()


async def test_wal_bytes_since_the_checkpoint_trigger_a_checkpoint(tmp_path, monkeypatch):
    """With segments far bigger than what is written (so the segment count never triggers one), a checkpoint still
    comes once limits.raft_wal_replay_bytes_max bytes were written since the last: what a restart replays stays
    bounded, and it restores every value."""
    monkeypatch.setattr(limits, "raft_wal_replay_bytes_max", 1 * limits.MiB)
    host = open_host(tmp_path)
    machine = ListMachine()
    host.add_group(1, (1,), machine)
    values = [b"%03d" % number + bytes(100 * limits.KiB) for number in range(40)]  # 4 MB in all
    await propose_all(host, 1, values)
    assert host.wal.sealed_segments() == 0
    assert host.wal.replay_start() > 0, "no checkpoint was taken"
    assert host.wal.replay_bytes() < 2 * limits.MiB
    host.wal.close()

    restarted = open_host(tmp_path)
    replayed = ListMachine()
    restarted.add_group(1, (1,), replayed)
    await propose_all(restarted, 1, [b"after"])
    assert replayed.values == values + [b"after"]
    restarted.wal.close()
