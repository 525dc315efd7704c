"""Figure 8 of the Raft paper, scripted message by message: a leader must not commit an entry of an
earlier term by counting replicas, because a later leader may still overwrite it."""

from __future__ import annotations

from rocket.raft.core import Config, Entry, HardState, Message, MessageType, RaftCore, Role

VOTERS = (1, 2, 3, 4, 5)


class Script:
    """Five cores whose messages are delivered only as the script says; what a Ready asked to persist
    is what a restarted core comes back with."""

    def __init__(self):
        self.disks: dict[int, tuple[HardState, list[Entry]]] = {i: (HardState(), []) for i in VOTERS}
        self.cores = {i: self._boot(i) for i in VOTERS}
        self.outbox: list[Message] = []
        self.applied: dict[int, dict[int, Entry]] = {i: {} for i in VOTERS}

    def _boot(self, node: int) -> RaftCore:
        hard_state, entries = self.disks[node]
        config = Config(node, VOTERS, entries_per_message_max=1, pre_vote=False, check_quorum=False, seed=node)
        return RaftCore(config, hard_state, list(entries))

    def restart(self, node: int) -> None:
        self.outbox = [m for m in self.outbox if m.sender != node and m.to != node]
        self.cores[node] = self._boot(node)

    def process(self, node: int) -> None:
        core = self.cores[node]
        while core.has_ready():
            ready = core.ready()
            hard_state, entries = self.disks[node]
            if ready.entries:
                first = ready.entries[0].index
                entries = [e for e in entries if e.index < first] + ready.entries
            self.disks[node] = (ready.hard_state or hard_state, entries)
            self.outbox.extend(ready.messages)
            for entry in ready.committed_entries:
                self.applied[node][entry.index] = entry
            core.advance(ready)

    def deliver(self, allowed) -> None:
        """Deliver, until none are left, the messages `allowed(message)` accepts; drop the rest."""
        while True:
            self.process_all()
            wanted = [m for m in self.outbox if allowed(m)]
            self.outbox = []
            if not wanted:
                return
            for message in wanted:
                self.cores[message.to].step(message)

    def heartbeat(self, node: int, reach: set[int]) -> None:
        """node's heartbeat timer fires; its heartbeats (which carry the commit index) reach `reach`."""
        for _ in range(self.cores[node].config.heartbeat_ticks):
            self.cores[node].tick()
        self.deliver(lambda m: {m.sender, m.to} <= reach | {node})

    def process_all(self) -> None:
        for node in VOTERS:
            self.process(node)

    def elect(self, node: int, voters: set[int]) -> None:
        """node times out (as often as it takes) until it leads with the votes of `voters`."""
        for _ in range(5):
            core = self.cores[node]
            while core.role not in (Role.CANDIDATE, Role.LEADER):
                core.tick()
            self.deliver(lambda m: m.type in (MessageType.VOTE, MessageType.VOTE_RESPONSE)
                         and {m.sender, m.to} <= voters | {node})
            if core.role == Role.LEADER:
                return
            core._become_follower(core.term, 0)
            core.election_elapsed = core.randomized_election_ticks
        raise AssertionError(f"node {node} was not elected")


def between(*nodes: int):
    return lambda message: message.sender in nodes and message.to in nodes


def run_figure_8() -> Script:
    script = Script()
    script.elect(1, set(VOTERS))
    for _ in range(3):  # term 1: everyone holds and has committed the leader's first entry
        script.heartbeat(1, set(VOTERS))
    assert all(core.commit == 1 for core in script.cores.values())

    # (a) Leader 1 appends x at index 2 and gets it to node 2 only.
    script.cores[1].propose(b"x")
    script.deliver(between(1, 2))
    # (b) Node 1 crashes. Node 5 is elected by 3, 4 and 5 and appends at index 2, then crashes.
    script.restart(1)
    script.elect(5, {3, 4})
    script.restart(5)
    # (c) Node 1 restarts and is elected by 1, 2 and 3 in a later term. It brings index 2 (x, of its old
    # term) to node 3, one entry per message, and goes down before its own term's entry (index 3) gets
    # there: node 3 sees only messages it will refuse, or that carry nothing past index 2.
    script.elect(1, {2, 3})

    def reaches_only_index_2_on_node_3(message: Message) -> bool:
        if not between(1, 2, 3)(message):
            return False
        if message.to != 3 or message.type != MessageType.APPEND:
            return True
        refused = script.cores[3].term_at(message.index) != message.log_term
        return refused or not any(entry.index >= 3 for entry in message.entries)

    for _ in range(4):
        for _ in range(script.cores[1].config.heartbeat_ticks):
            script.cores[1].tick()  # heartbeats unpause probing, so every step of the probe happens
        script.deliver(reaches_only_index_2_on_node_3)
    return script


def test_old_term_entry_on_a_majority_is_not_committed_and_may_be_overwritten():
    """x sits on a majority (1, 2, 3) but is of an old term: it must stay uncommitted, and a leader that
    never saw it (node 5, with a later last term) legitimately replaces it."""
    script = run_figure_8()
    leader = script.cores[1]
    assert [script.cores[n].term_at(2) for n in (1, 2, 3)] == [1, 1, 1]
    assert leader.role == Role.LEADER and leader.commit == 1, "committed an earlier term's entry by counting"

    # (d) Node 1 crashes; node 5 restarts and wins 2, 3 and 4, then overwrites index 2 everywhere.
    script.restart(1)
    script.elect(5, {2, 3, 4})
    for _ in range(6):
        script.heartbeat(5, {2, 3, 4})
    assert all(script.cores[n].term_at(2) == script.cores[5].term_at(2) != 1 for n in (2, 3, 4, 5))
    assert all(2 not in script.applied[n] or script.applied[n][2].data != b"x" for n in VOTERS)


def test_the_scenario_catches_commit_by_counting(monkeypatch):
    """Planted bug: a leader that commits whatever a majority holds commits x, which (d) then overwrites."""
    import rocket.raft.core as core_module

    def commits_old_terms(self):
        matches = sorted((self.tracker[v].match for v in self.voters), reverse=True)
        candidate = matches[len(self.voters) // 2]
        if candidate > self.commit:
            self._commit_to(candidate)

    monkeypatch.setattr(core_module.RaftCore, "_maybe_commit", commits_old_terms)
    assert run_figure_8().cores[1].commit >= 2
