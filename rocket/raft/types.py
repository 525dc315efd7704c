"""The Raft core's vocabulary: roles, messages, entries, snapshots, the hard state, Ready and Config
(rocket.raft.core is the state machine that speaks it; hosts, transports and the simulator use these types).
"""

from __future__ import annotations

import dataclasses
import enum
import typing

from rocket import limits
from rocket.errors import invariant

NONE = 0  # no node: node ids start at 1


class Role(enum.IntEnum):
    FOLLOWER = 1
    PRE_CANDIDATE = 2
    CANDIDATE = 3
    LEADER = 4


class MessageType(enum.IntEnum):
    PRE_VOTE = 1
    PRE_VOTE_RESPONSE = 2
    VOTE = 3
    VOTE_RESPONSE = 4
    APPEND = 5
    APPEND_RESPONSE = 6
    HEARTBEAT = 7
    HEARTBEAT_RESPONSE = 8
    SNAPSHOT = 9
    TIMEOUT_NOW = 10
    EPOCH_QUERY = 11  # controller mode: a slave's last epoch (log_term) and log end (index), to a new master
    EPOCH_ANSWER = 12  # ... the master's largest epoch up to it (log_term) and where it ends (index); context and
    # reject_hint echo the query's log_term and index, so that a late answer is known


class EntryKind(enum.IntEnum):
    NORMAL = 0
    CONF_CHANGE = 1  # data: b"add_learner:N", b"promote:N" or b"remove:N"


class Entry(typing.NamedTuple):  # made for every entry proposed or received: a frozen dataclass costs 3x to make
    term: int
    index: int  # pyright: ignore[reportIncompatibleMethodOverride]: the field hides tuple.index, unused
    data: bytes = b""
    kind: EntryKind = EntryKind.NORMAL


@dataclasses.dataclass(frozen=True, slots=True)
class Snapshot:
    index: int
    term: int
    voters: tuple[int, ...]
    learners: tuple[int, ...]
    data: bytes = b""  # opaque here: the host's descriptor of the snapshot's file


@dataclasses.dataclass(frozen=True, slots=True)
class Message:
    type: MessageType
    sender: int
    to: int
    term: int
    log_term: int = 0
    index: int = 0
    entries: tuple[Entry, ...] = ()
    commit: int = 0
    reject: bool = False
    reject_hint: int = 0
    context: int = 0  # ReadIndex request id carried by heartbeats; 1 on votes forced by a transfer
    snapshot: Snapshot | None = None
    quiesce: bool = False  # on a heartbeat: the group is idle and fully replicated, stop ticking
    leader_commit: int = 0  # on a heartbeat: the leader's commit (commit is capped at what the follower holds)


class HardState(typing.NamedTuple):  # a tuple, as Entry
    term: int = 0
    vote: int = NONE
    commit: int = 0


@dataclasses.dataclass(slots=True)
class Ready:
    hard_state: HardState | None  # None when unchanged since the last Ready
    entries: list[Entry]  # to persist before sending messages
    snapshot: Snapshot | None  # to persist and install before applying committed entries
    committed_entries: list[Entry]  # to apply, in order
    messages: list[Message]
    read_states: list[tuple[int, int]]  # (read request id, index): serve the read once applied up to index


@dataclasses.dataclass(frozen=True, slots=True)
class Config:
    node_id: int
    voters: tuple[int, ...]
    learners: tuple[int, ...] = ()
    election_ticks: int = limits.raft_election_ticks
    first_election_ticks: int = limits.raft_first_election_ticks
    # In a group that never held an election (a new one), the voter that asks for votes first, every
    # first_election_ticks, while the others wait out election_ticks: no split vote (NONE: none asks early).
    first_voter: int = NONE
    heartbeat_ticks: int = limits.raft_heartbeat_ticks
    append_messages_in_flight_max: int = limits.raft_append_messages_in_flight_max
    entries_per_message_max: int = limits.raft_entries_per_message_max
    message_bytes_max: int = limits.raft_message_bytes_max
    pre_vote: bool = True
    check_quorum: bool = True
    seed: int = 0

    def validate(self) -> None:
        invariant(self.node_id != NONE, "node ids start at 1")
        invariant(self.heartbeat_ticks >= 1 and self.election_ticks > self.heartbeat_ticks,
                  "elections must take longer than heartbeats")
        invariant(1 <= self.first_election_ticks < self.election_ticks, "the first election comes before the timeout")
        invariant(self.append_messages_in_flight_max >= 1 and self.entries_per_message_max >= 1, "flow control needs room")
        invariant(not set(self.voters) & set(self.learners), "a node is a voter or a learner, not both")


