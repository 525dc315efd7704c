"""The multi-raft host: the Raft replication engine (rocket.replication.Engine) for every group of one node, on one
WAL. This module is the engine's interface: groups hosted, proposals, reads, leadership, and snapshot files served
to and fetched from other nodes; rounds.py is its round loop, a part of its own."""

from __future__ import annotations

import logging
import math
import time
import contextlib
from collections.abc import Awaitable, Callable
from typing import Any

import trio

from rocket import limits
from rocket.errors import Code, RocketError
from rocket.parked import Awaited, Slot
from rocket.raft import codec, snapshots
from rocket.raft.controlled import ControlledCore
from rocket.raft.core import NONE, Config, Message, MessageType, RaftCore, Role, Snapshot
from rocket.raft.compaction import Compaction
from rocket.raft.rounds import Group, Post, Rounds
from rocket.raft.wal import GroupState, Wal
from rocket.replication import Control, StateMachine, SyncStateRequest
from rocket.world import WORLD, World

log = logging.getLogger("rocket.raft")

_upkeep = {MessageType.HEARTBEAT, MessageType.HEARTBEAT_RESPONSE, MessageType.APPEND, MessageType.APPEND_RESPONSE}
# Bytes of a snapshot file on another node: (node, group, file name, offset) -> what snapshot_chunk answers there.
FetchChunk = Callable[[int, int, str, int], Awaitable[bytes | memoryview]]


class RaftHost:
    """The Raft replication engine (rocket.replication.Engine): every group this node hosts, on one WAL. Its round
    loop (rounds, rounds.py) is group commit: one fsync for every group's writes, persist before send; a leader's
    appends go out once written, with a commit durable rounds justify. The host steps the groups' cores and tells
    the rounds what each needs (Rounds.touch, buffer, urgent); the rounds write, sync, send and apply."""

    def __init__(self, node_id: int, wal: Wal, post: Post, tick_s: float = limits.raft_tick_s,
                 world: World = WORLD):
        self.node_id = node_id
        self.world = world
        self.rounds = Rounds(node_id, wal, post, tick_s, world)
        self.groups = self.rounds.groups  # the groups hosted here, by id: the rounds' own dict, read here
        self.wal = wal
        self.tick_s = tick_s
        self.snapshot_files = self.rounds.snapshot_files
        self._read_ids = 0
        # How a follower fetches the file of a snapshot its leader sent; wired by the roles (None: it cannot).
        self.fetch_snapshot_chunk: FetchChunk | None = None
        self._fetching: set[int] = set()  # groups fetching a snapshot file: one fetch per group at a time
        # Telemetry: the time from a proposal to its result, applied on this leader. Sampled: one proposal is timed
        # at a time on the node, so about one per round however many entries a round carries.
        self.on_commit: Callable[[float], None] | None = None
        self._timing = False
        # node -> the schema version its Raft link said on connecting (transport/links.py); None: not known here
        self.peer_versions: dict[int, int] | None = None

    # ---- the round loop, as the engine's users see it (replication.Engine) ----------------------------------------

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        await self.rounds.run(task_status=task_status)

    @property
    def disk_refusal(self) -> str:
        return self.rounds.disk_refusal

    @property
    def applying(self) -> Callable[[], contextlib.AbstractContextManager]:
        return self.rounds.applying

    @applying.setter
    def applying(self, applying: Callable[[], contextlib.AbstractContextManager]) -> None:
        self.rounds.applying = applying

    @property
    def sync_before_snapshots(self) -> Callable[[], None]:
        return self.rounds.sync_before_snapshots

    @sync_before_snapshots.setter
    def sync_before_snapshots(self, sync: Callable[[], None]) -> None:
        self.rounds.sync_before_snapshots = sync

    @property
    def compaction(self) -> Compaction:
        return self.rounds.compaction

    # ---- groups ----------------------------------------------------------------------------------------------

    def add_group(self, group: int, voters: tuple[int, ...], machine: StateMachine,
                  learners: tuple[int, ...] = (), control: Control | None = None) -> RaftCore:
        """Host a group, restoring it from the WAL if it was here before the restart: a Raft group, or with
        control a controller-mode group (RIP-44), whose master the controller names."""
        restored = self.wal.groups.get(group, GroupState())
        # A new group's first leader: its voters in turn by group number, so that new groups' leaders are spread.
        first_voter = sorted(voters)[group % len(voters)] if voters and control is None else NONE
        config = Config(self.node_id, voters, learners, seed=group * 7919 + self.node_id, first_voter=first_voter)
        core = (RaftCore(config, restored.hard_state, restored.entries, restored.snapshot) if control is None
                else ControlledCore(config, restored.hard_state, restored.entries, restored.snapshot))
        if restored.snapshot is not None:
            machine.restore(self.snapshot_files.chunks(group, restored.snapshot))
        if core.voters == {self.node_id}:
            core.campaign()  # alone: no one to wait for
        hosted = Group(core, machine, restored.hard_state)
        if isinstance(core, ControlledCore) and control is not None:
            core.control(control)
        hosted.positions = restored.positions
        self.rounds.host(group, hosted)
        return core

    def control(self, group: int, control: Control) -> None:
        """The controller's word on a controller-mode group hosted here (its master, epochs and SyncStateSet)."""
        hosted = self.groups.get(group)
        if hosted is not None and isinstance(hosted.core, ControlledCore):
            before = hosted.core.role, hosted.core.term, hosted.core.leader
            hosted.core.control(control)
            after = hosted.core.role, hosted.core.term, hosted.core.leader
            if after != before:
                log.info("group %d: %s at epoch %d (the controller's word)", group, "master" if after[0] == Role.LEADER
                         else f"slave of node {after[2]}", after[1])
            hosted.idle_ticks = 0
            self.rounds.touch(group, hosted)
            self.rounds.wake()

    def controlled(self, group: int) -> ControlledCore | None:
        """The group's controller-mode core, or None (a Raft group, or not hosted here)."""
        hosted = self.groups.get(group)
        return hosted.core if hosted is not None and isinstance(hosted.core, ControlledCore) else None

    def sync_state_refused(self, group: int, request: SyncStateRequest) -> None:
        core = self.controlled(group)
        if core is not None:
            core.sync_state_refused(request)

    def controlled_position(self, group: int) -> tuple[int, int] | None:
        core = self.controlled(group)
        return (core.term, core.last_index) if core is not None else None

    def orphaned(self, group: int) -> bool:
        core = self.controlled(group)
        return (core is not None and core.role != Role.LEADER
                and core.election_elapsed >= core.config.election_ticks)

    def sync_state_request(self, group: int) -> SyncStateRequest | None:
        core = self.controlled(group)
        return core.sync_state_request() if core is not None else None

    def sync_state_granted(self, group: int, master: int, master_epoch: int, sync_state_set: frozenset[int],
                           sync_state_set_epoch: int) -> None:
        core = self.controlled(group)
        if core is not None:  # the group's own settings hold: the answer changes its master and set
            self.control(group, Control(master, master_epoch, sync_state_set, sync_state_set_epoch,
                                        core.min_in_sync_replicas, core.lag_ticks_max))
            self.rounds.touch(group, self.groups[group])
            self.rounds.wake()

    def receive(self, payload: bytes | memoryview) -> None:
        """Messages from another node; ones for groups not hosted here are dropped (Raft retries).
        Group 0 carries the node-to-node heartbeat that keeps liveness known while groups are quiet."""
        urgent = False
        rounds = self.rounds
        for group, message in codec.decode_messages(payload):
            rounds.heard(message.sender)
            hosted = self.groups.get(group)
            if hosted is not None and message.to == self.node_id:
                if message.type == MessageType.SNAPSHOT and self._lacks_file(group, hosted, message):
                    continue  # stepped once its file is fetched
                hosted.core.step(message)
                rounds.touch(group, hosted)
                if message.entries or message.type not in _upkeep:
                    hosted.idle_ticks = 0
            if message.type == MessageType.APPEND:
                rounds.gather(sum(len(entry.data) for entry in message.entries))
            else:
                urgent = True
        # Appends to a follower wait for the fsync that runs, as this node's own proposals do (Planner.gathering):
        # written when it ends, they are durable as soon as if written now, since the next fsync
        # could not begin before it; and all that came meanwhile then takes one round, one fsync and one answer.
        # Anything else (answers a leader counts, votes, heartbeats) is stepped in a round now.
        if urgent:
            rounds.urgent()
        else:
            rounds.wake()

    def _lacks_file(self, group: int, hosted: Group, message: Message) -> bool:
        """Whether a snapshot the leader sent waits for its file, which a task then fetches (one per group);
        the core answers one it would not install (stale, or behind the commit) without it."""
        core, snapshot = hosted.core, message.snapshot
        if snapshot is None or message.term < core.term or snapshot.index <= core.commit:
            return False
        try:
            if self.snapshot_files.has(group, snapshot):
                return False
        except RocketError as error:
            log.warning("group %d: a snapshot from node %d is dropped: %s", group, message.sender, error.message)
            return True
        fetch = self.fetch_snapshot_chunk
        if fetch is None:
            log.warning("group %d: a snapshot from node %d is dropped: this node cannot fetch its file", group,
                        message.sender)
        elif group not in self._fetching and self.rounds.start_soon(self._fetch_snapshot, fetch, group, hosted, message,
                                                                   snapshot):
            self._fetching.add(group)
        return True

    async def _fetch_snapshot(self, fetch: FetchChunk, group: int, hosted: Group, message: Message,
                              snapshot: Snapshot) -> None:
        """Fetch a snapshot's file from the leader that sent it into a partial file, resuming from its length
        after an error, then step the message (the core installs the snapshot, the round loop restores it)."""
        name = snapshots.file_of(group, snapshot)
        download = None
        try:
            download = await self.world.run_sync(self.snapshot_files.download, group, snapshot)
            log.info("group %d: fetching snapshot %s from node %d at byte %d", group, name, message.sender,
                     download.offset)
            failures = 0
            while not download.done:
                try:
                    piece = await fetch(message.sender, group, name, download.offset)
                    await self.world.run_sync(download.append, piece)
                    failures = 0
                except RocketError as error:
                    failures += 1
                    gone = error.code in (Code.NOT_FOUND, Code.BAD_REQUEST)  # superseded there: Raft sends the next
                    if gone or failures >= limits.snapshot_fetch_attempts_max:
                        raise
                    log.info("group %d: fetching snapshot %s resumes at byte %d after: %s", group, name,
                             download.offset, error.message)
                    await trio.sleep(limits.snapshot_fetch_retry_s)
            await self.world.run_sync(download.finish)
        except (RocketError, OSError) as error:
            log.warning("group %d: snapshot %s not fetched from node %d: %s", group, name, message.sender, error)
            if download is not None:
                download.close()
            return
        finally:
            self._fetching.discard(group)
        log.info("group %d: fetched snapshot %s from node %d", group, name, message.sender)
        if self.groups.get(group) is hosted:  # if the core does not install it now, a newer snapshot deletes it
            hosted.core.step(message)
            hosted.idle_ticks = 0
            self.rounds.touch(group, hosted)
            self.rounds.urgent()

    async def snapshot_chunk(self, group: int, name: str, offset: int) -> bytes:
        """At most limits.snapshot_chunk_bytes_max bytes of one of this node's snapshot files from offset, for
        a replica fetching it (RaftSnapshotChunk)."""
        return await self.world.run_sync(self.snapshot_files.read, group, name, offset)

    def remove_group(self, group: int) -> None:
        """Stop hosting a group this node is no longer a member of (its WAL records stay until a checkpoint)."""
        hosted = self.rounds.drop(group)
        if hosted is not None:  # its proposals may have been committed by the others, or not
            unknown = RocketError(Code.TIMEOUT, f"group {group} moved off node {self.node_id}: the outcome of "
                                  "its proposal is unknown")
            for _, slot in hosted.waiters.values():
                slot.complete(unknown)
            unproposed = RocketError(Code.UNAVAILABLE, f"group {group} moved off node {self.node_id} before the "
                                     "proposal was made; retry")
            for _, slot in hosted.proposals:
                slot.complete(unproposed)

    async def write_data(self, blobs: list[bytes]) -> list[int]:
        """Make blobs durable in the WAL with the next round's fsync; returns where each blob's bytes lie."""
        return await self.rounds.write_data(blobs)

    def unapplied_position_min(self) -> int | None:
        """The lowest WAL position of an entry written but not yet applied: a state machine that indexes
        entries where they lie (a storage group) may still come to reference it."""
        return min((min(hosted.positions.values()) for hosted in self.groups.values() if hosted.positions),
                   default=None)

    def transfer_leadership(self, group: int, to: int) -> None:
        hosted = self.groups[group]
        hosted.core.transfer_leadership(to)
        self.rounds.touch(group, hosted)
        self.rounds.wake()

    def leader_of(self, group: int) -> int:
        """The node this node believes leads the group (0 when unknown or not hosted)."""
        hosted = self.groups.get(group)
        return hosted.core.leader if hosted is not None else 0

    def machine_of(self, group: int) -> StateMachine | None:
        hosted = self.groups.get(group)
        return hosted.machine if hosted is not None else None

    def leads(self, group: int) -> bool:
        hosted = self.groups.get(group)
        return hosted is not None and hosted.core.role == Role.LEADER

    def term(self, group: int) -> int:
        """The group's current term on this node (0 when not hosted)."""
        hosted = self.groups.get(group)
        return hosted.core.term if hosted is not None else 0

    def voters(self, group: int) -> set[int]:
        return set(self.groups[group].core.voters)

    def replicas(self, group: int) -> set[int]:
        core = self.groups[group].core
        return core.voters | core.learners

    def replicas_speak(self, group: int, schema_version: int) -> bool:
        if self.peer_versions is None:  # no links that say (the roles simulator: one release)
            return True
        core, versions = self.groups[group].core, self.peer_versions  # asked once per append: no set built
        for nodes in (core.voters, core.learners):
            for node in nodes:
                if node != self.node_id and versions.get(node, 0) < schema_version:
                    return False
        return True

    def lagging(self, group: int) -> dict[int, int]:
        core = self.groups[group].core
        return core.tracker.behind(core.last_index)

    def caught_up(self, group: int, node: int) -> bool:
        core = self.groups[group].core
        progress = core.tracker.get(node)
        return progress is not None and progress.match >= core.commit

    def in_sync(self, group: int, lag_entries_max: int) -> bool:
        return self.groups[group].core.in_sync(lag_entries_max)

    async def propose(self, group: int, data: bytes, timeout_s: float = limits.request_timeout_s_default):
        """Replicate data in the group's log; returns the state machine's result once it is applied here."""
        slot = Awaited()
        self.propose_parked(group, data, slot)
        try:
            await self._wait(slot.event, timeout_s, f"group {group}: the proposal was not applied")
        except RocketError:
            slot.done = True  # its result, if it comes, is dropped
            raise
        return slot.value()

    def propose_parked(self, group: int, data: bytes, slot: Slot, timeout_s: float = math.inf) -> None:
        """Propose without waiting: the entry waits in the group's buffer, which the next round proposes in one go
        (propose_many). slot completes once, in the trio thread: with the state machine's result once applied here,
        or with the RocketError the proposal met (leadership lost before or after it was proposed, the group moved
        off this node, or timeout_s passed: swept each tick; parked proposals share one timeout). Raises RocketError,
        with nothing proposed, when the proposal cannot be taken now (not hosted, not the leader, too big, no disk)."""
        hosted = self.groups.get(group)
        if hosted is None:
            raise RocketError(Code.UNAVAILABLE, f"group {group} is not hosted on node {self.node_id}")
        if len(data) > limits.raft_entry_bytes_max:
            raise RocketError(Code.BAD_REQUEST, f"an entry holds at most {limits.raft_entry_bytes_max} bytes")
        if self.rounds.disk_refusal and self.rounds.disk_free_bytes < limits.disk_floor_bytes:
            raise RocketError(Code.DISK_FULL, self.rounds.disk_refusal)  # its apply could fail writing the store
        hosted.core.wake()
        hosted.core.check_proposable()
        if self.on_commit is not None and not self._timing:  # sampled: one proposal timed at a time
            slot = self._timed(slot, self.on_commit)
        if timeout_s < math.inf:  # the sweep completes what the round would: the timing ends with it
            slot.deadline = trio.current_time() + timeout_s
        self.rounds.buffer(group, hosted, data, slot, swept=timeout_s < math.inf)

    def on_round(self, hook: Callable[[], None]) -> None:
        """hook() runs at the start of every round, before the buffered proposals are proposed: a role that merges
        what came meanwhile into few proposals (KV transactions) makes them then (propose_parked)."""
        self.rounds.on_round(hook)

    def wake_round(self) -> None:
        """Have the round loop run a round soon (for an on_round hook's work)."""
        self.rounds.wake()

    def _timed(self, slot: Slot, on_commit: Callable[[float], None]) -> Slot:
        """slot, its time from proposal to result told to on_commit (on success)."""
        self._timing, started = True, time.perf_counter()

        def finish(outcome: object) -> None:
            self._timing = False
            if not isinstance(outcome, RocketError):
                on_commit(time.perf_counter() - started)
            slot.complete(outcome)
        return Slot(finish)

    async def propose_conf_change(self, group: int, action: str, node: int,
                                  timeout_s: float = limits.request_timeout_s_default) -> int:
        hosted = self.groups[group]
        index = hosted.core.propose_conf_change(action, node)
        self.rounds.touch(group, hosted)
        return await self._wait_applied(hosted, index, timeout_s)

    async def read_barrier(self, group: int, lease: bool = False,
                           timeout_s: float = limits.request_timeout_s_default) -> None:
        """Return once this node's state machine for the group may serve a linearizable read: the node
        leads (confirmed by a quorum, or by its lease) and has applied everything committed before."""
        hosted = self.groups.get(group)
        if hosted is None:
            raise RocketError(Code.UNAVAILABLE, f"group {group} is not hosted on node {self.node_id}")
        self._read_ids += 1
        request_id = self._read_ids
        event, released = trio.Event(), []
        hosted.reads[request_id] = (event, released)
        try:
            confirmed_at = hosted.core.read_index(request_id, lease)
            self.rounds.touch(group, hosted)
            if confirmed_at is not None and hosted.applied >= confirmed_at:
                return  # the lease holds and all committed is applied: no round to wait for
            await self._wait(event, timeout_s, f"group {group}: leadership not confirmed")
        finally:
            hosted.reads.pop(request_id, None)

    def read_now(self, group: int) -> bool:
        """Whether a linearizable read of the group may be served at once, in the caller's step, with no wait: the
        group is awake, this node leads it by its lease (or alone), and it applied all it committed. Else the read
        waits in read_barrier, which wakes a quiet group. A read counts as work: the group does not go quiet under
        reads alone, which would cost the next one a round of heartbeats for its lease."""
        hosted = self.groups.get(group)
        if hosted is None or hosted.core.quiet:
            return False
        hosted.idle_ticks = 0
        at = hosted.core.readable_at(lease=True)
        return at is not None and hosted.applied >= at

    async def _wait(self, event: trio.Event, timeout_s: float, what: str) -> None:
        """Start a round and wait for the event it will set; TIMEOUT after timeout_s."""
        self.rounds.wake()
        try:
            with trio.fail_after(timeout_s):
                await event.wait()
        except trio.TooSlowError:
            raise RocketError(Code.TIMEOUT, f"{what} within {timeout_s} s") from None

    async def _wait_applied(self, hosted: Group, index: int, timeout_s: float) -> Any:
        """The entry's result once applied (the index, for membership changes)."""
        slot = Awaited()
        hosted.waiters[index] = (hosted.core.term, slot)
        try:
            await self._wait(slot.event, timeout_s, f"entry {index} not applied")
        finally:
            hosted.waiters.pop(index, None)
        return slot.value()


