"""What a Raft leader knows of each member (etcd's tracker): a Progress per follower, with its flow control, and the
ProgressTracker that holds them and answers the quorum's questions. Its own state only: the core (core.py) passes in
the voters and its clock, and does the sending. No I/O and no clock, as the core.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Iterator


class Progress:
    """What the leader knows of one follower: PROBE sends one message at a time until the follower's
    position is found; REPLICATE pipelines up to append_messages_in_flight_max; SNAPSHOT waits for one."""

    PROBE, REPLICATE, SNAPSHOT = 1, 2, 3

    def __init__(self, next_index: int):
        self.match = 0
        self.next = next_index
        self.state = self.PROBE
        self.paused = False
        self.inflight: deque[int] = deque()  # last index of each append in flight
        self.recent_active = False
        self.pending_snapshot = 0
        self.snapshot_tick = 0  # the leader's tick when the pending snapshot was sent
        self.lease_tick = -1  # the leader's tick at which it sent the last heartbeat this follower answered

    def become_probe(self) -> None:
        self.state, self.paused, self.next = self.PROBE, False, self.match + 1
        self.inflight.clear()

    def become_replicate(self) -> None:
        self.state, self.paused, self.next = self.REPLICATE, False, self.match + 1
        self.inflight.clear()

    def acknowledge(self, index: int) -> bool:
        """Record that the follower holds up to index; returns whether that is news."""
        while self.inflight and self.inflight[0] <= index:
            self.inflight.popleft()
        if index > self.match:
            self.match = index
            self.next = max(self.next, index + 1)
            self.paused = False
            return True
        return False


class ProgressTracker:
    """Every member's Progress while this node leads (etcd's tracker.ProgressTracker), and what a quorum of them holds,
    answered and heard."""

    def __init__(self) -> None:
        self._members: dict[int, Progress] = {}

    def reset(self, members: Iterable[int], next_index: int) -> None:
        """A new leader's view: every member's position unknown, probed from next_index."""
        self._members = {member: Progress(next_index) for member in members}

    def set_members(self, members: set[int], next_index: int) -> None:
        """After a membership change: a Progress for each new member, none for one removed."""
        for member in members:
            self._members.setdefault(member, Progress(next_index))
        for member in [member for member in self._members if member not in members]:
            del self._members[member]

    def __getitem__(self, member: int) -> Progress:
        return self._members[member]

    def __contains__(self, member: int) -> bool:
        return member in self._members

    def __iter__(self) -> Iterator[int]:
        return iter(self._members)

    def get(self, member: int) -> Progress | None:
        return self._members.get(member)

    def items(self) -> Iterable[tuple[int, Progress]]:
        return self._members.items()

    def committed(self, voters: set[int]) -> int:
        """The highest index a quorum of the voters holds (0 while too few are tracked)."""
        matches = sorted((self._members[v].match for v in voters if v in self._members), reverse=True)
        return matches[len(voters) // 2] if len(matches) > len(voters) // 2 else 0

    def quorum_active(self, voters: set[int], leader: int) -> bool:
        """Whether a quorum (the leader counted) was heard from since the last call, which starts the count anew."""
        active = {leader} | {member for member, progress in self._members.items() if progress.recent_active}
        for progress in self._members.values():
            progress.recent_active = False
        return len(active & voters) > len(voters) // 2

    def quorum_lease_tick(self, voters: set[int], leader: int, now: int) -> int:
        """The leader's tick at which it sent the oldest heartbeat a quorum has answered since (the leader's own
        counted as sent now), or -1 while no quorum has answered one."""
        sent = sorted((now if v == leader else self._members[v].lease_tick for v in voters
                       if v == leader or v in self._members), reverse=True)
        quorum = len(voters) // 2 + 1
        return sent[quorum - 1] if len(sent) >= quorum else -1

    def all_hold(self, index: int) -> bool:
        """Whether every member holds exactly up to index."""
        return all(progress.match == index for progress in self._members.values())

    def behind(self, index: int) -> dict[int, int]:
        """The members that lack entries up to index, with how many each lacks."""
        return {member: index - progress.match for member, progress in self._members.items() if progress.match < index}

    def follower_lacks(self, index: int, heard_since_tick: int, leader: int) -> bool:
        """Whether a follower that answered a heartbeat sent at heard_since_tick or later lacks entries up to index."""
        return any(progress.match < index and progress.lease_tick >= heard_since_tick
                   for member, progress in self._members.items() if member != leader)

    def woken(self) -> None:
        """After a quiet spell, in which no ticks passed: every member counts as heard, and a lease needs fresh
        answers."""
        for progress in self._members.values():
            progress.recent_active = True
            progress.lease_tick = -1
