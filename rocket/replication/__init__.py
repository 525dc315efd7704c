"""The seam between a group's state machine and the engine that replicates its log: the StateMachine and Engine
protocols, which the storage and nameserver roles speak to. raft/host.py implements them for both replication modes:
a group's core is raft/core.py (Raft, majority quorum) or raft/controlled.py (controller mode, RIP-44)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, Protocol

from rocket.errors import Code, RocketError

if TYPE_CHECKING:
    from rocket.disk.commitlog import CommitLog


class NotLeader(RocketError):
    """A call that only the group's leader (or master) serves reached another replica."""

    PREFIX = "not the leader; the leader is "

    def __init__(self, leader: int):
        super().__init__(Code.UNAVAILABLE, f"{self.PREFIX}{leader or 'unknown'}")
        self.leader = leader

    @classmethod
    def named(cls, error: RocketError) -> int | None:
        """The leader a NotLeader names, read from its message (all the wire carries): 0 if it knew none; None if
        error is another error."""
        if error.code != Code.UNAVAILABLE or not error.message.startswith(cls.PREFIX):
            return None
        leader = error.message[len(cls.PREFIX):]
        return int(leader) if leader.isdigit() else 0


@dataclasses.dataclass(frozen=True, slots=True)
class Control:
    """The controller's word on a controller-mode group: who is master at which epoch, and the SyncStateSet at its
    epoch."""

    master: int
    master_epoch: int
    sync_state_set: frozenset[int]
    sync_state_set_epoch: int
    min_in_sync_replicas: int = 1
    lag_ticks_max: int = 50  # a slave behind this many ticks leaves the SSS (ha_max_lag_s over the tick)


@dataclasses.dataclass(frozen=True, slots=True)
class SyncStateRequest:
    """A change of the SSS a controller-mode group's master asks of the controller, made against the SSS epoch it
    knows."""

    group_master: int
    master_epoch: int
    sync_state_set_epoch: int
    sync_state_set: frozenset[int]


class StateMachine(Protocol):
    """What a group applies: the storage groups' queues and KV, or the nameserver's metadata.
    apply returns one result per entry; the node that proposed an entry gets its result back.
    positions tell where each entry's data lies in the node's WAL, durable already: a
    machine may index data there instead of writing it again."""

    def apply(self, entries: list, positions: list[int]) -> list: ...

    def snapshot(self) -> Iterable[bytes]:
        """The state as applied at the moment of the call, as chunks of at most limits.snapshot_chunk_bytes_max
        bytes. It is called in the event loop's thread but iterated in a worker thread, while entries are applied
        meanwhile: a machine takes a copy (or a LevelDB snapshot) before it returns."""
        ...

    def restore(self, chunks: Iterable[bytes]) -> None:
        """Install a snapshot: exactly the chunks snapshot() gave, with the same boundaries, in order."""


class EngineWal(Protocol):
    """The node's WAL as the roles see it: entries' data lies in log, and replay needs it from replay_start() on."""

    @property
    def log(self) -> CommitLog: ...

    def replay_start(self) -> int: ...


class Engine(Protocol):
    """A replication engine hosting many groups on this node: proposals in, committed entries applied to each
    group's StateMachine, and what the roles need to know of each group's replicas."""

    # Read-only properties, so that a host may hold narrower types (a dict of its groups, its Wal class).
    @property
    def groups(self) -> Mapping[int, object]: ...  # the groups hosted here, by id

    @property
    def wal(self) -> EngineWal: ...

    @property
    def tick_s(self) -> float: ...  # the engine's clock tick: timeouts given in ticks are multiples of it

    @property
    def sync_before_snapshots(self) -> Callable[[], None]: ...  # makes the state machines' own writes durable

    @sync_before_snapshots.setter
    def sync_before_snapshots(self, sync: Callable[[], None]) -> None: ...

    @property
    def applying(self) -> Callable[[], AbstractContextManager]: ...  # held while a round applies committed entries

    @applying.setter
    def applying(self, applying: Callable[[], AbstractContextManager]) -> None: ...

    @property
    def disk_refusal(self) -> str: ...  # why the node refuses new data now, its disk being full ("" while it has room)

    def add_group(self, group: int, voters: tuple[int, ...], machine: StateMachine,
                  learners: tuple[int, ...] = (), control: Control | None = None) -> object:
        """Host a group (a controller-mode one with control), restored from the WAL if it was here before."""
        ...

    def remove_group(self, group: int) -> None: ...

    def machine_of(self, group: int) -> StateMachine | None:
        """The group's state machine, or None if the group is not hosted here."""

    def leads(self, group: int) -> bool: ...

    def term(self, group: int) -> int:
        """The group's current term on this node, 0 when not hosted (a controller-mode group's: its master epoch)."""
        ...

    def leader_of(self, group: int) -> int:
        """The node this node believes leads the group (0 when unknown or not hosted)."""
        ...

    def voters(self, group: int) -> set[int]: ...

    def replicas(self, group: int) -> set[int]:
        """The group's voters and learners."""
        ...

    def replicas_speak(self, group: int, schema_version: int) -> bool:
        """Whether every other replica of the group is known to run a release of at least this schema version (what
        its link said on connecting): only then may entries that older releases cannot apply go into the log."""
        ...

    def lagging(self, group: int) -> dict[int, int]:
        """On the leader: the replicas behind it, with the entries each lacks."""
        ...

    def caught_up(self, group: int, node: int) -> bool:
        """On the leader: whether node holds everything committed."""
        ...

    def in_sync(self, group: int, lag_entries_max: int) -> bool:
        """Whether this replica may serve reads: it leads, or follows within lag_entries_max of the leader."""
        ...

    async def propose(self, group: int, data: bytes, timeout_s: float = ...) -> Any:
        """Replicate data in the group's log; the state machine's result once it is applied here (its type is the
        machine's)."""

    def propose_parked(self, group: int, data: bytes, slot, timeout_s: float) -> None:
        """propose without waiting: slot (rocket.parked.Slot) completes once with the result or the RocketError met;
        raises RocketError, with nothing proposed, when it cannot be taken now."""

    def on_round(self, hook: Callable[[], None]) -> None:
        """hook() runs at the start of every replication round, before the proposals buffered are proposed."""

    def wake_round(self) -> None:
        """Have a round run soon."""

    async def propose_conf_change(self, group: int, action: str, node: int, timeout_s: float) -> int: ...

    async def read_barrier(self, group: int, lease: bool = False, timeout_s: float = ...) -> None: ...

    def read_now(self, group: int) -> bool:
        """Whether a linearizable read of the group may be served at once, with no wait (else read_barrier)."""
        ...

    def transfer_leadership(self, group: int, to: int) -> None: ...

    async def write_data(self, blobs: list[bytes]) -> list[int]:
        """Make blobs durable in the node's WAL; where each blob's bytes lie."""
        ...

    def unapplied_position_min(self) -> int | None: ...

    # ---- controller mode (RIP-44): groups whose master the controller names ----------------------------------

    def control(self, group: int, control: Control) -> None:
        """The controller's word on a controller-mode group hosted here (its master, epochs and SyncStateSet)."""
        ...

    def controlled_position(self, group: int) -> tuple[int, int] | None:
        """A controller-mode group's epoch and last index here; None for a Raft group or one not hosted."""
        ...

    def orphaned(self, group: int) -> bool:
        """Whether a controller-mode replica here is a slave that has heard nothing from its master for an election
        timeout: the controller may have named another."""
        ...

    def sync_state_request(self, group: int) -> SyncStateRequest | None:
        """As a controller-mode group's master: the SyncStateSet change it wants from the controller, if any."""
        ...

    def sync_state_granted(self, group: int, master: int, master_epoch: int, sync_state_set: frozenset[int],
                           sync_state_set_epoch: int) -> None:
        """The controller's answer to a sync_state_request: the group's new SyncStateSet."""
        ...

    def sync_state_refused(self, group: int, request: SyncStateRequest) -> None:
        """The controller refused the request (made against a stale epoch): ask again from what holds."""
        ...

__all__ = ["Control", "Engine", "EngineWal", "NotLeader", "StateMachine", "SyncStateRequest"]
