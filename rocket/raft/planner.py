"""The round loop's decisions without I/O (Planner): when a round waits to gather, what it writes and defers, which
appends leave before its fsync and with what commit, and in which order rounds are applied and released. The round
loop (rounds.py) and the Raft simulator (tests/sim/raft_sim.py) both run it."""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Callable
from typing import Any, Protocol

from rocket.raft.core import HardState, Message, MessageType, Ready, Snapshot
from rocket.raft.wal import Update

Outgoing = dict[int, list[tuple[int, Message]]]  # destination node -> (group, message), in order


class Planned(Protocol):
    """What the planner keeps per group, on the host's own object for it."""

    written: HardState  # the last hard state written: one with the same term and vote may wait
    durable_commit: int  # the commit the durable rounds justify: what a leader's appends may carry before their fsync


@dataclasses.dataclass(slots=True)
class Round:
    """A round written to the WAL whose effects wait for fsyncs: its committed entries to apply (once the
    rounds before it are durable), then messages to send, data writers to answer, and the snapshots to
    install (with the entries committed after them) once it is durable itself."""

    number: int  # the count of rounds written to the WAL, this one included (previous if it wrote nothing)
    previous: int  # the rounds written before it: its committed entries lie in them
    readies: list[tuple[int, Any, Ready]]  # (group, the host's Planned object for it, its Ready)
    data: list[Any]  # what the host writes beside the updates (blobs and their writers); opaque here
    data_positions: list[list[int]] = dataclasses.field(default_factory=list[list[int]])
    applied: bool = False
    snapshots: list[tuple[int, Snapshot]] = dataclasses.field(default_factory=list[tuple[int, Snapshot]])  # it writes


class Planner:
    """Rounds are numbered as they are written; an fsync makes every round written before it durable (synced). A
    round waits while an fsync runs, to be written when it ends with all that came meanwhile (group commit), unless
    wait_bytes_max gathered or something needs a round now (urgent). Hard states in which only the commit moved are
    deferred to the next round that writes anything else, or to a round after a tick that finds the WAL idle: Raft
    needs no commit on disk. A leader's appends leave as soon as their round is written, their commit capped at what
    durable rounds justify; everything else a round sends leaves once it is durable (persist before send)."""

    def __init__(self, wait_bytes_max: int):
        self.wait_bytes_max = wait_bytes_max
        self.written = 0  # rounds numbered for writing
        self.durable = 0  # rounds an fsync covered
        self._durable_seen = 0  # durable when the last round took its Readies
        self._received = False  # messages other than appends came since then: they do not wait for an fsync
        self._unwritten_bytes = 0  # entries proposed or appended, and data to write, since then
        self.deferred: dict[int, HardState] = {}
        self._deferred_due = False
        self._pending: collections.deque[Round] = collections.deque()  # rounds not yet released, in order

    def gather(self, size: int) -> None:
        """Bytes the next round will write came: a round is written at once when enough gathered."""
        self._unwritten_bytes += size

    def urgent(self) -> None:
        """Messages came that wait for no fsync (answers a leader counts, votes, heartbeats)."""
        self._received = True

    def tick(self) -> None:
        """A tick passed: deferred hard states are written by the next round if the WAL is idle then."""
        self._deferred_due = bool(self.deferred)

    def gathering(self) -> bool:
        """Whether the next round waits for the fsync that runs: yes while what came is small and nothing else
        needs a round."""
        return (self.written > self.durable == self._durable_seen and not self._received
                and self._unwritten_bytes < self.wait_bytes_max)

    def begin(self) -> None:
        """A round starts: what came so far goes with it."""
        self._durable_seen, self._received, self._unwritten_bytes = self.durable, False, 0

    def plan(self, readies: list[tuple[int, Any, Ready]], compactions: list[Update],
             data: list[Any]) -> tuple[Round, list[Update] | None]:
        """The round for these Readies, and what it writes (None: nothing; the round is not numbered)."""
        updates: list[Update] = []
        for group, hosted, ready in readies:
            hard_state = ready.hard_state
            if hard_state is not None and not ready.entries and ready.snapshot is None \
                    and (hard_state.term, hard_state.vote) == (hosted.written.term, hosted.written.vote):
                self.deferred[group] = hard_state
            elif hard_state is not None or ready.entries or ready.snapshot is not None:
                if hard_state is not None:
                    hosted.written = hard_state
                    self.deferred.pop(group, None)
                updates.append(Update(group, hard_state, ready.entries, ready.snapshot))
        # Compactions first: a snapshot installed from the leader since is newer, and replay keeps the last one.
        updates = compactions + updates
        current = Round(self.written, self.written, readies, data)
        current.snapshots = [(update.group, update.snapshot) for update in updates if update.snapshot is not None]
        if not (updates or data or (self.deferred and self._deferred_due and self.durable == self.written)):
            return current, None
        updates = [Update(group, hard_state, [], None) for group, hard_state in self.take_deferred().items()] + updates
        self.written = current.number = self.written + 1
        return current, updates

    def queue(self, current: Round) -> None:
        """The round's Readies were advanced: it waits for its fsyncs, unless it holds nothing."""
        if current.readies or current.data or current.snapshots:
            self._pending.append(current)

    def synced(self, number: int) -> bool:
        """Rounds up to number are durable; whether that is news."""
        if number <= self.durable:
            return False
        self.durable = number
        return True

    def settle(self, apply: Callable[[Round], None], release: Callable[[Round], None]) -> None:
        """In round order: apply each round's committed entries once the rounds before it are durable, and release
        it once it is durable itself."""
        while self._pending:
            current = self._pending[0]
            if not current.applied:
                if self.durable < current.previous:
                    return
                current.applied = True
                apply(current)
            if self.durable < current.number:
                return
            self._pending.popleft()
            release(current)

    def settled(self) -> bool:
        return not self._pending

    def take_deferred(self) -> dict[int, HardState]:
        deferred, self.deferred, self._deferred_due = self.deferred, {}, False
        return deferred

    def give_back(self, deferred: dict[int, HardState]) -> None:
        """Deferred hard states a write failed to hold go with the next rounds (newer ones win)."""
        self.deferred = {**deferred, **self.deferred}

    @staticmethod
    def appends(readies: list[tuple[int, Any, Ready]]) -> Outgoing:
        """A leader's appends, which leave as soon as their round is written, not after its fsync: the followers
        write and fsync their copies while the leader fsyncs its own (the Raft thesis, 10.2.1). The term and vote of
        a leader are durable (its vote requests left after their fsync). The commit an append carries is capped at
        what the durable rounds justify: the leader's own copy counts towards a commit once written, and no one
        learns of that commit, nor applies it, before the fsync covering it."""
        outgoing: Outgoing = {}
        for group, hosted, ready in readies:
            for message in ready.messages:
                if message.type == MessageType.APPEND:
                    if message.commit > hosted.durable_commit:
                        message = dataclasses.replace(message, commit=hosted.durable_commit)
                    outgoing.setdefault(message.to, []).append((group, message))
        return outgoing

    @staticmethod
    def released(durable: Round) -> Outgoing:
        """What a durable round sends (all but its appends, which left once it was written), and the commit its
        groups' appends may carry from now on."""
        outgoing: Outgoing = {}
        for group, hosted, ready in durable.readies:
            if ready.hard_state is not None and ready.hard_state.commit > hosted.durable_commit:
                hosted.durable_commit = ready.hard_state.commit
            for message in ready.messages:
                if message.type != MessageType.APPEND:
                    outgoing.setdefault(message.to, []).append((group, message))
        return outgoing
