"""The multi-raft host's round loop (Rounds, a part of RaftHost, which owns the loop's state): group commit, one
fsync for every group's writes, persist before send except a leader's appends; a full disk is an operating error,
waited out."""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any

import trio

from rocket import limits
from rocket.clock import on_the_grid, sleep_periodic
from rocket.disk.files import out_of_space
from rocket.errors import Code, RocketError, invariant
from rocket.parked import Deadlines, Slot
from rocket.raft import codec, snapshots
from rocket.raft.compaction import Compaction
from rocket.raft.core import Entry, EntryKind, HardState, Message, MessageType, RaftCore, Ready, Role
from rocket.raft.planner import Outgoing, Planner, Round
from rocket.raft.snapshots import SnapshotFiles
from rocket.raft.wal import GroupState, Update, Wal
from rocket.replication import StateMachine
from rocket.world import World

log = logging.getLogger("rocket.raft")


Post = Callable[[int, bytes], None]  # queue a payload for a node without waiting; it may be lost


class Group:
    """A group this node hosts: its core, its state machine, and what waits on it."""

    def __init__(self, core: RaftCore, machine: StateMachine, written: HardState):
        self.core = core
        self.machine = machine
        self.written = written  # the last hard state written: one with the same term and vote may wait
        self.waiters: dict[int, tuple[int, Slot]] = {}  # index -> (term it was proposed in, the proposer's slot)
        self.proposals: list[tuple[bytes, Slot]] = []  # buffered for the next round, which proposes them in one go
        self.idle_ticks = 0  # ticks since the group last had work; a leader quiesces it past a bound
        self.log_bytes = 0  # bytes applied since the last snapshot: the log is compacted past a bound
        self.positions: dict[int, int] = {}  # entry index -> where its data lies in the WAL, until applied
        self.reads: dict[int, tuple[trio.Event, list]] = {}  # read request id -> (event, [index once released])
        # What the machine holds: the core counts a Ready's entries as applied when it is advanced, but
        # the host applies them only once the fsync covering them is done.
        self.applied = core.applied
        # The commit the rounds already durable justify: what a leader's appends may carry before their own fsync.
        self.durable_commit = core.commit


class Rounds:
    """The round loop. Each round takes the Ready of every touched group, writes all of it to the WAL (into the page
    cache, in this thread), and advances the cores; one syncer thread runs the fsyncs one after the other, each
    covering every round written before it. What waits for what is the planner's to say (planner.py): group commit
    while an fsync runs, a leader's appends sent once written, everything else once durable, committed entries applied
    once the rounds before them are durable; messages go out coalesced into one payload per destination node. Groups
    whose log grew long are snapshotted and compacted beside the rounds (compaction.py). A full disk is an operating
    error: a round the WAL refuses (ENOSPC) is written again once space returns, and while free space is under
    limits.disk_reserve_bytes the node refuses new data (disk_refusal)."""

    def __init__(self, node_id: int, wal: Wal, post: Post, tick_s: float, world: World):
        self.node_id = node_id
        self.world = world  # the disk's free space and the persist threads
        self.wal = wal
        self._post = post
        self.tick_s = tick_s
        self.groups: dict[int, Group] = {}
        self._wake = trio.Event()
        self.ticks = 0
        self._peers: set[int] = set()  # the other nodes of every hosted group
        # Makes durable what the machines' snapshots cover but keep outside the WAL (the storage role's
        # LevelDB); the snapshot worker calls it before it writes snapshot files, so the trio thread never waits.
        self.sync_before_snapshots: Callable[[], None] = lambda: None
        self.snapshot_files = SnapshotFiles(wal.log.directory / snapshots.DIRECTORY)
        replayed = {group: state.snapshot for group, state in wal.groups.items()
                    if state.snapshot is not None and state.snapshot.data}
        self.snapshot_files.keep_only({snapshots.file_of(group, snapshot) for group, snapshot in replayed.items()})
        durable = {group: snapshot.index for group, snapshot in replayed.items()}
        self.compaction = Compaction(self.snapshot_files, durable, self.groups, tick_s, self._start_persist,
                                     lambda: self.sync_before_snapshots(), lambda: self._wake.set())
        self._nursery: trio.Nursery | None = None  # the round loop's, for the fetches
        self._data: list[tuple[list[bytes], trio.Event, list]] = []  # blobs to write with the next round
        self._last_heard: dict[int, int] = {}  # peer node -> tick of its last message (liveness)
        self.fsyncs = 0
        self.on_fsync: Callable[[float], None] = lambda seconds: None  # telemetry: each WAL fsync's time, in its thread
        # What to write, send and apply when (planner.py): its count of rounds written and durable is the trio
        # thread's. One syncer thread at a time fsyncs them, and goes on fsyncing while rounds were written
        # meanwhile, so that the disk never waits for this thread and a busy node wakes no thread per round.
        self.planner = Planner(limits.raft_round_wait_bytes_max)
        self._durable_changed = trio.Event()
        self._sync_lock = threading.Lock()  # an fsync of rounds, or a checkpoint: one at a time
        self._syncer_lock = threading.Lock()  # guards the two below
        self._rounds_on_disk = 0  # written by the round loop or a worker thread (one round writes at a time)
        self._syncing = False  # the syncer runs (rounds.py, _sync_rounds), in a worker thread
        self._rounds_synced = 0  # as the syncer knows it
        # The round being written, until the next round (or a checkpoint) takes where its bytes lie: the
        # round loop goes on meanwhile, and the next round's write starts only after it.
        self._writing: tuple[Round, trio.Event, list] | None = None
        # Persist threads (the syncer, a round written while the disk is full or direct) are started at once,
        # not as a task that waits for the scheduler's next batch; run() does not return while one is in
        # flight, and the first one to fail fails the round loop.
        self._persisting = 0
        self._persisted = trio.Event()
        self._persist_error: BaseException | None = None
        self._stopping = threading.Event()  # the round loop ends: a round waiting for disk space fails at once
        # Why this node refuses new data now ("" while it takes it): its data disk is under limits.disk_reserve_bytes,
        # or the WAL refused a write for want of space, until the round loop's watch finds the reserve free again.
        self.disk_refusal = ""
        self.disk_free_bytes = 2**63  # as last seen; under limits.disk_floor_bytes every proposal is refused
        self._disk_looked_at = -math.inf  # when a tick last looked at the disk's free space (_look_at_disk)
        self._token: trio.lowlevel.TrioToken | None = None
        # Only groups touched since the last round are asked for a Ready, and only awake groups are
        # ticked: thousands of quiet groups then cost nothing per tick.
        self._active: set[int] = set()
        self._awake: set[int] = set()
        self._woken: trio.Event | None = None  # while the ticker waits as for an idle node (rounds.py, _ticker)
        self._proposing: set[int] = set()  # groups with proposals buffered for the next round (Group.proposals)
        self._deadlines = Deadlines()  # parked proposals with a timeout, swept each tick
        self._round_hooks: list[Callable[[], None]] = []  # on_round
        # What the round loop applies a round's entries within: the storage role's Store.holding, so that a round's
        # changes to the store are written once for all its groups.
        self.applying: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext

    @property
    def _in_trio(self) -> trio.lowlevel.TrioToken:
        """The round loop's token, for its threads to call back into it (set as run() starts)."""
        assert self._token is not None, "the round loop has not started"
        return self._token

    # ---- what the Raft host tells the round loop (host.py) ----------------------------------------------------

    def touch(self, group: int, hosted: Group) -> None:
        """The group has something for the next round (a message stepped, a proposal, a read): ask it for a Ready
        then, and tick it while it is awake."""
        self._active.add(group)
        if hosted.core.quiet:
            self._awake.discard(group)
        else:
            self._awake.add(group)
            if self._woken is not None:  # the ticker sleeps as for an idle node: tick again now
                self._woken.set()

    def wake(self) -> None:
        """Have the round loop run a round soon."""
        self._wake.set()

    def host(self, group: int, hosted: Group) -> None:
        """Take a group (new, or restored from the WAL) into the rounds."""
        self.groups[group] = hosted
        self.touch(group, hosted)
        self._wake.set()

    def drop(self, group: int) -> Group | None:
        """Stop a group's rounds. Hosted here again, it restarts from what it holds now (its WAL state is set to it),
        not from what was replayed at open: the snapshot file that referred to may be deleted since."""
        hosted = self.groups.pop(group, None)
        self.planner.deferred.pop(group, None)
        self._active.discard(group)
        self._awake.discard(group)
        if hosted is not None:
            now = self._checkpoint_of(group, hosted)
            assert now.hard_state is not None, "a checkpoint holds the hard state"
            self.wal.groups[group] = GroupState(now.hard_state, now.entries, now.snapshot, dict(hosted.positions))
        return hosted

    def heard(self, node: int) -> None:
        """A message came from the node (liveness: a follower whose leader is silent campaigns)."""
        self._last_heard[node] = self.ticks

    def gather(self, unwritten_bytes: int) -> None:
        """Bytes the next round will write came (appends from a leader): a round is written at once when enough
        gathered, not after the fsync that runs."""
        self.planner.gather(unwritten_bytes)

    def urgent(self) -> None:
        """Messages came that wait for no fsync (answers a leader counts, votes, heartbeats): a round now."""
        self.planner.urgent()
        self._wake.set()

    def buffer(self, group: int, hosted: Group, data: bytes, slot: Slot, swept: bool = False) -> None:
        """A proposal for the next round, which proposes every group's buffer in one go; swept: its slot's deadline
        is swept each tick."""
        if swept:
            self._deadlines.add(slot)
        hosted.proposals.append((data, slot))
        self._proposing.add(group)
        self.planner.gather(len(data))
        hosted.idle_ticks = 0
        self.touch(group, hosted)
        self._wake.set()

    def on_round(self, hook: Callable[[], None]) -> None:
        """hook() runs at the start of every round, before the buffered proposals are proposed."""
        self._round_hooks.append(hook)

    def start_soon(self, task: Callable[..., Awaitable[None]], *args: Any) -> bool:
        """Run a task beside the round loop (a snapshot file's fetch); False before the loop runs."""
        if self._nursery is None:
            return False
        self._nursery.start_soon(task, *args)
        return True

    async def write_data(self, blobs: list[bytes]) -> list[int]:
        """Make blobs durable in the WAL with the next round's fsync (the WAL is written by the rounds alone);
        returns where each blob's bytes lie."""
        event, positions = trio.Event(), []
        self._data.append((blobs, event, positions))
        self.planner.gather(sum(map(len, blobs)))
        self._wake.set()
        try:
            with trio.fail_after(limits.request_timeout_s_default):
                await event.wait()
        except trio.TooSlowError:
            raise RocketError(Code.TIMEOUT, f"data not written within {limits.request_timeout_s_default} s") from None
        return positions

    # ---- the round loop ------------------------------------------------------------------------------------

    @staticmethod
    def _release_reads(hosted: Group) -> None:
        for event, released in hosted.reads.values():
            if released and hosted.applied >= released[0]:
                event.set()

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        try:
            async with trio.open_nursery() as nursery:
                self._token = trio.lowlevel.current_trio_token()
                self._nursery = nursery
                nursery.start_soon(self._ticker)
                task_status.started()
                while True:
                    await self._wake.wait()
                    self._wake = trio.Event()
                    self._check_persisted()
                    if not self.planner.gathering():
                        await self._round()
        finally:
            self._stopping.set()  # a round waiting for disk space gives up: the node is going
            with trio.CancelScope(shield=True):  # the WAL is closed after this returns: let its writes end
                while self._persisting:
                    await self._persisted.wait()

    async def _ticker(self) -> None:
        """Tick every tick_s while a group is awake or a parked proposal waits for its deadline; else every
        limits.raft_idle_ticks ticks, counted as the time that passed, unless a group wakes first. On the grid of the
        node's periodic loops (clock.on_the_grid): one wake-up for all that fall due together."""
        while True:
            started = trio.current_time()
            if self._awake or self._deadlines:
                await sleep_periodic(self.tick_s)
            else:
                self._woken = woken = trio.Event()
                with trio.move_on_at(on_the_grid(self.tick_s * limits.raft_idle_ticks)):
                    await woken.wait()
                self._woken = None
            self._tick(max(1, round((trio.current_time() - started) / self.tick_s)))
            self._wake.set()

    def _look_at_disk(self) -> None:
        """At a tick, at most every limits.disk_probe_s: look at the data disk's free space, to refuse new data below
        the reserve, and take it again once space returns (a refusal after ENOSPC too), without a restart. A round's
        write looks too (_write_once): this finds what others did to the disk meanwhile."""
        now = trio.current_time()
        if now < self._disk_looked_at + limits.disk_probe_s:
            return
        self._disk_looked_at = now
        try:
            free = self.world.free_bytes(self.wal.log.directory)
        except OSError:
            return
        self.disk_free_bytes = free
        if free < limits.disk_reserve_bytes:
            self._disk_full(f"{free // limits.MiB} MiB free", free)
        elif self.disk_refusal:
            log.warning("node %d: the data disk has %d MiB free again: new data is taken", self.node_id,
                        free // limits.MiB)
            self.disk_refusal = ""

    def _disk_full(self, why: str, free: int) -> None:
        """In the trio thread: refuse new data until _look_at_disk finds the reserve free again."""
        self.disk_free_bytes = min(self.disk_free_bytes, free)
        if not self.disk_refusal:
            log.warning("node %d: the data disk is full (%s): new data is refused until %d MiB are free",
                        self.node_id, why, limits.disk_reserve_bytes // limits.MiB)
        self.disk_refusal = (f"node {self.node_id}: the disk of {self.wal.log.directory} is full ({why}); new data "
                             f"is refused until {limits.disk_reserve_bytes // limits.MiB} MiB are free")

    def _tick(self, ticks: int = 1) -> None:
        """Count ticks that passed, tick the groups that are awake, quiesce idle ones this node leads, wake quiet
        ones whose leader has gone silent, and send one liveness heartbeat to each peer node."""
        before = self.ticks
        self.ticks += ticks
        self._look_at_disk()
        self.planner.tick()
        if self._deadlines:
            self._deadlines.sweep(trio.current_time(), lambda: RocketError(
                Code.TIMEOUT, f"a write was not applied in time on node {self.node_id}: its outcome is unknown"))
        every = limits.raft_peers_refresh_ticks  # membership changes slowly: refresh the peer nodes at ticks 1, 51...
        if (before - 1) // every != (self.ticks - 1) // every:
            self._peers = set().union(*(h.core.voters | h.core.learners for h in self.groups.values())) - {self.node_id}
        silent_after = 2 * limits.raft_election_ticks
        if before // limits.raft_liveness_scan_ticks != self.ticks // limits.raft_liveness_scan_ticks:  # the
            # liveness scan of quiet groups
            for group, hosted in self.groups.items():
                core = hosted.core
                if core.quiet and core.leader != self.node_id:
                    if self.ticks - self._last_heard.get(core.leader, -silent_after) > silent_after:
                        core.wake()  # its leader's node went silent: let the election timer run again
                        self.touch(group, hosted)
        for group in list(self._awake):
            hosted = self.groups[group]
            core = hosted.core
            core.tick()
            hosted.idle_ticks += 1
            if hosted.idle_ticks >= limits.raft_quiesce_ticks and core.role == Role.LEADER and not hosted.waiters:
                core.quiesce()
            self.touch(group, hosted)
        for peer in self._peers:
            self._post(peer, codec.encode_messages([(0, Message(MessageType.HEARTBEAT, self.node_id, peer, 0))]))

    def quiet_groups(self) -> int:
        return sum(1 for hosted in self.groups.values() if hosted.core.quiet)

    async def _round(self) -> None:
        """Write this round's Readies and advance the cores, then settle what the fsyncs done so far allow.
        The round does not wait for an fsync: once its write is done the next round may be written, so that
        its entries are on disk when the fsync ends and the next fsync covers them. A round's committed
        entries need only the rounds before it: the core hands out only entries it counted stable when the
        Ready was taken, all written by earlier rounds (a leader's own copy counted towards a commit
        included), whose positions are known (_collect_written at the start of each round)."""
        await self._collect_written()
        planner = self.planner
        planner.begin()
        self._settle()  # what the fsyncs done meanwhile allow, the round just collected included
        for hook in self._round_hooks:
            hook()
        self._propose_buffered()
        candidates, self._active = self._active, set()
        readies = [(group, self.groups[group], self.groups[group].core.ready()) for group in candidates
                   if self.groups[group].core.has_ready()]
        data, self._data = self._data, []
        current, updates = planner.plan(readies, self.compaction.take(), data)
        if updates is not None:
            self._write(current, updates)
        self._post_all(planner.appends(readies))
        for group, hosted, ready in readies:
            # The core now counts this round's entries as stable: a leader may count its own copy towards
            # a commit. No one learns of that commit, and no entry is applied, before this fsync is done.
            hosted.core.advance(ready)
            if hosted.core.has_ready():
                self._active.add(group)
                self._wake.set()
        planner.queue(current)
        self._settle()
        # A checkpoint after so many sealed segments or bytes of WAL since the last one, whichever comes first,
        # so that a restart's replay stays bounded.
        if (self.wal.sealed_segments() >= limits.raft_wal_segments_max
                or self.wal.replay_bytes() >= limits.raft_wal_replay_bytes_max):
            await self._maybe_checkpoint()

    def _write(self, current: Round, updates: list[Update]) -> None:
        """Number the round and write it: here, into the page cache, where a write costs less than handing it to a
        thread (each hand-off wakes a thread, a context switch taken while this thread holds the GIL); in a worker
        thread when the WAL writes direct (each write waits for the device) or when a write here found the disk full
        (the worker writes it again until space returns). Either way the fsync runs in the syncer thread. The
        previous round's write is done (_collect_written), so rounds reach the WAL in order."""
        invariant(self._writing is None, "one round is written at a time")
        written, result = trio.Event(), []
        self._writing = (current, written, result)
        data = [blobs for blobs, _, _ in current.data]
        if not self.wal.log.direct:
            try:
                result.append(self._write_once(updates, data))
            except OSError as error:
                if not out_of_space(error):
                    raise
                self._disk_full(f"a WAL write failed: {error.strerror}", 0)
            else:
                written.set()
                if self._wrote(current.number):
                    self._start_persist(self._sync_rounds)
                return
        self._start_persist(functools.partial(self._persist, current.number, updates, data, written, result))

    def _start_persist(self, work: Callable[[], Any],
                       done: Callable[[Any], BaseException | None] | None = None) -> None:
        """Run work in a thread that run() waits for. done(outcome) runs in the trio thread once it returned, and
        says what fails the round loop (by default, the work's own error)."""
        self._persisting += 1
        self.world.start_thread_soon(
            work, lambda outcome: self._in_trio.run_sync_soon(self._thread_ended, outcome, done))

    def _thread_ended(self, outcome, done: Callable[[Any], BaseException | None] | None) -> None:
        self._persist_ended(done(outcome) if done is not None else getattr(outcome, "error", None))

    def _persist_ended(self, error: BaseException | None) -> None:
        """In the trio thread: a persist thread returned. If it failed, what the round loop waits for never
        comes: wake it, to raise the error."""
        self._persisting -= 1
        self._persisted.set()
        self._persisted = trio.Event()
        if error is not None and self._persist_error is None:
            self._persist_error = error
            self._durable_changed.set()
            self._wake.set()
            if self._writing is not None:
                self._writing[1].set()

    def _check_persisted(self) -> None:
        if self._persist_error is not None:
            raise self._persist_error

    async def _collect_written(self) -> None:
        """Wait until the round being written is written, and take where its entries and data lie."""
        if self._writing is None:
            return
        current, written, result = self._writing
        await written.wait()
        self._check_persisted()
        self._writing = None
        [(positions, current.data_positions)] = result
        for group, found in positions.items():
            if group in self.groups:
                self.groups[group].positions.update(found)

    def _settle(self) -> None:
        """Apply and release what the fsyncs done so far allow (Planner.settle). Called once the round being written
        is collected, so that a durable round's data positions are known."""
        self.planner.settle(self._apply_round, self._release)

    def _apply_round(self, current: Round) -> None:
        with self.applying():
            for group, hosted, ready in current.readies:
                if ready.snapshot is None:
                    self._apply_ready(group, hosted, ready)

    async def _maybe_checkpoint(self) -> None:
        """Snapshot every group, then checkpoint once their files are written: the checkpoint then rewrites
        little more than hard states and snapshot descriptors. The rounds go on while the files are written."""
        if self.disk_refusal:
            return  # a checkpoint adds bytes before it frees any (a storage node's WAL keeps its segments)
        if self.compaction.ready_for_checkpoint():
            await self._checkpoint()

    async def _checkpoint(self) -> None:
        """Once every round written is durable and released, so that what was persisted counts as
        stable and applied, and before any core steps again."""
        await self._collect_written()
        await self._durable(self.planner.written)
        self._settle()
        invariant(self.planner.settled(), "every round is released before a checkpoint")
        live = [self._checkpoint_of(group, hosted) for group, hosted in self.groups.items()]
        compactions, deferred = self.compaction.take(), self.planner.take_deferred()  # the checkpoint holds every
        # snapshot and every hard state
        try:
            await self.world.run_sync(self._checkpoint_now, live)
        except OSError as error:
            if not out_of_space(error):
                raise
            # Nothing is marked: replay still starts before it. What it would have held goes with the next rounds.
            self.compaction.give_back(compactions)
            self.planner.give_back(deferred)
            self._disk_full(f"a checkpoint failed: {error.strerror}", 0)
            return
        for update in live:
            self.compaction.durable(update.group, update.snapshot)

    def _persist(self, number: int, updates: list[Update], data: list[list[bytes]], written: trio.Event,
                 result: list) -> None:
        """In a worker thread: write the round (again and again while the disk is full) and tell the round loop, then
        go on as the syncer unless one runs."""
        result.append(self._write_round(updates, data))
        self._in_trio.run_sync_soon(written.set)
        if self._wrote(number):
            self._sync_rounds()

    def _wrote(self, number: int) -> bool:
        """Rounds up to number are written (in any thread); whether the caller is to run the syncer, which is
        the case when none runs: one that runs fsyncs again for them when its fsync ends, so that under load
        rounds are made durable without waking a thread for each."""
        with self._syncer_lock:
            self._rounds_on_disk = number
            if self._syncing:
                return False
            self._syncing = True
            return True

    def _sync_rounds(self) -> None:
        """The syncer, in a worker thread: fsync until every round written is durable, each fsync covering every
        round written before it began, and tell the round loop after each."""
        while True:
            with self._syncer_lock:
                covered = self._rounds_on_disk
                if self._rounds_synced >= covered:
                    self._syncing = False
                    return
            with self._sync_lock:
                started = time.perf_counter()
                self.wal.sync()
                self.on_fsync(time.perf_counter() - started)
                self.fsyncs += 1
                self._rounds_synced = covered
            self._in_trio.run_sync_soon(self._synced, covered)

    def _write_once(self, updates: list[Update], data: list[list[bytes]]) -> tuple[dict, list[list[int]]]:
        """Write the round's updates and data; a full disk refuses them (ENOSPC) with the log cut back to its last
        whole record (CommitLog.append). Free space under the reserve makes the node refuse new data."""
        written = self.wal.write(updates), [self.wal.write_data(blobs) for blobs in data]
        with contextlib.suppress(OSError):
            free = self.world.free_bytes(self.wal.log.directory)
            if free < limits.disk_reserve_bytes:
                self._in_trio.run_sync_soon(self._disk_full, f"{free // limits.MiB} MiB free", free)
        return written

    def _write_round(self, updates: list[Update], data: list[list[bytes]]) -> tuple[dict, list[list[int]]]:
        """In a persist thread: write the round, again after pauses that double while the disk is full, until space
        returns. It cannot fail instead: its cores were advanced as if it were written. Nothing of it but a leader's
        appends (Planner.appends) goes out before its fsync, and records written twice replay as once."""
        pause_s = limits.disk_full_retry_s_min
        while True:
            try:
                written = self._write_once(updates, data)
            except OSError as error:
                if not out_of_space(error) or self._stopping.is_set():
                    raise
                self._in_trio.run_sync_soon(self._disk_full, f"a WAL write failed: {error.strerror}", 0)
                self._stopping.wait(pause_s)  # (also where libfaketime makes time.sleep fail: benchmarks/chaos.py)
                pause_s = min(2 * pause_s, limits.disk_full_retry_s_max)
                continue
            if pause_s > limits.disk_full_retry_s_min:
                log.warning("node %d: the WAL took a round again after a full disk", self.node_id)
            return written

    def _checkpoint_now(self, live: list[Update]) -> None:
        self.sync_before_snapshots()  # the checkpoint holds every group's snapshot
        with self._sync_lock:  # no fsync of a round runs beside the checkpoint's own
            self.wal.checkpoint(live)

    def _synced(self, number: int) -> None:
        """In the trio thread: rounds up to number are durable."""
        if self.planner.synced(number):
            self._durable_changed.set()
            self._durable_changed = trio.Event()
            self._wake.set()  # the round loop settles the rounds this fsync made durable

    async def _durable(self, number: int) -> None:
        while self.planner.durable < number:
            self._check_persisted()
            await self._durable_changed.wait()

    def _release(self, synced: Round) -> None:
        """The round's bytes are durable: answer data writers, send its messages, and install its
        snapshots."""
        invariant(not self._writing or self._writing[0] is not synced, "a round is released once collected")
        for group, snapshot in synced.snapshots:
            self.compaction.durable(group, snapshot)
        for (_, event, positions), found in zip(synced.data, synced.data_positions):
            positions.extend(found)
            event.set()
        self._post_all(self.planner.released(synced))
        for group, hosted, ready in synced.readies:
            if ready.snapshot is not None:
                self._apply_ready(group, hosted, ready)

    def _post_all(self, outgoing: Outgoing) -> None:
        """One payload per destination node (more where they would not fit a frame)."""
        for destination, messages in outgoing.items():
            for chunk in _chunks(messages):
                self._post(destination, codec.encode_messages(chunk))

    def _apply_ready(self, group: int, hosted: Group, ready: Ready) -> None:
        """Install the Ready's snapshot, apply its committed entries and serve the reads they allow."""
        if self.groups.get(group) is not hosted:
            return  # moved off this node since
        if ready.snapshot is not None:
            # In this thread, as entries are applied; each chunk is checked before the machine gets it.
            hosted.machine.restore(self.snapshot_files.chunks(group, ready.snapshot))
            hosted.applied = ready.snapshot.index
            hosted.positions = {i: p for i, p in hosted.positions.items() if i > ready.snapshot.index}
        if ready.committed_entries:
            self._apply(hosted, ready.committed_entries)
        for request_id, index in ready.read_states:
            read = hosted.reads.get(request_id)
            if read is not None:
                read[1].append(index)
        self._release_reads(hosted)
        self.compaction.maybe_compact(group, hosted)

    @staticmethod
    def _checkpoint_of(group: int, hosted: Group) -> Update:
        core = hosted.core
        stable = [entry for entry in core.log if entry.index <= core.stable_index]
        return Update(group, HardState(core.term, core.vote, core.commit), stable, core.snapshot)

    @staticmethod
    def _apply(hosted: Group, entries: list[Entry]) -> None:
        """Apply committed entries and hand each waiting proposer its entry's result."""
        normal = [entry for entry in entries if entry.kind == EntryKind.NORMAL]
        positions = {entry.index: hosted.positions.pop(entry.index, -1) for entry in entries}
        applied = hosted.machine.apply(normal, [positions[entry.index] for entry in normal])
        results = dict(zip((entry.index for entry in normal), applied))
        hosted.log_bytes += sum(len(entry.data) for entry in entries)
        hosted.applied = entries[-1].index
        for entry in entries:
            waiter = hosted.waiters.pop(entry.index, None)
            if waiter is not None:
                term, slot = waiter
                if entry.term != term:
                    slot.complete(RocketError(Code.UNAVAILABLE, f"entry {entry.index} was lost to a leader change; "
                                              "retry"))
                else:
                    result = results.get(entry.index)
                    slot.complete(entry.index if result is None else result)

    def _propose_buffered(self) -> None:
        """Propose each group's buffered proposals in one go: one append per follower for all of them. A group whose
        leadership was lost meanwhile fails them, unproposed."""
        for group in self._proposing:
            hosted = self.groups.get(group)
            if hosted is None or not hosted.proposals:
                continue
            proposals, hosted.proposals = hosted.proposals, []
            try:
                first = hosted.core.propose_many([data for data, _ in proposals])
            except RocketError as error:
                for _, slot in proposals:
                    slot.complete(error)
                continue
            term = hosted.core.term
            for index, (_, slot) in enumerate(proposals, first):
                hosted.waiters[index] = (term, slot)
        self._proposing.clear()


def _message_bytes(message: Message) -> int:
    size = 96 + sum(len(entry.data) + 32 for entry in message.entries)
    return size + (len(message.snapshot.data) + 64 if message.snapshot is not None else 0)


def _chunks(messages: list[tuple[int, Message]]) -> list[list[tuple[int, Message]]]:
    """Split one destination's messages into payloads that each fit an RPC frame."""
    chunks: list[list[tuple[int, Message]]] = [[]]
    size = 0
    for pair in messages:
        message_size = _message_bytes(pair[1])
        if chunks[-1] and size + message_size > limits.raft_payload_bytes_max:
            chunks.append([])
            size = 0
        chunks[-1].append(pair)
        size += message_size
    return chunks
