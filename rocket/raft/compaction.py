"""Log compaction of the multi-raft host's groups (Compaction, a part of RaftHost beside its round loop): a group's log
is compacted once the snapshot file of its machine's state is durable, and a snapshot file outlives no core's need."""

from __future__ import annotations

import dataclasses
import functools
import logging
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from rocket import limits
from rocket.disk.files import fsync_directory
from rocket.errors import RocketError
from rocket.raft import snapshots
from rocket.raft.core import Snapshot
from rocket.raft.snapshots import SnapshotFiles
from rocket.raft.wal import Update

if TYPE_CHECKING:
    from rocket.raft.rounds import Group

log = logging.getLogger("rocket.raft")


@dataclasses.dataclass(slots=True)
class SnapshotJob:
    """A snapshot taken of a group's machine at index, whose file the snapshot worker writes."""

    group: int
    hosted: Group
    index: int
    term: int
    chunks: Iterable[bytes]  # the machine's snapshot, iterated in the worker thread


# Run work in a thread the round loop counts as persisting; done(outcome) runs in the trio thread after it and returns
# the error that fails the round loop, if any.
StartThread = Callable[[Callable[[], Any], Callable[[Any], BaseException | None]], None]


class Compaction:
    """A group whose applied log grew long is snapshotted in the event loop's thread (its machine's state as applied),
    one worker thread writes the snapshot files beside the rounds (snapshots.py) and drops the files no core needs,
    and the group's log is compacted once its file is durable: the compaction's WAL record goes with the next round
    (take). A snapshot file a replica is fetching outlives the group's next snapshot (SnapshotFiles.delete_older), so
    that a new replica catches up under heavy writes."""

    def __init__(self, files: SnapshotFiles, durable: dict[int, int], groups: Mapping[int, Group], tick_s: float,
                 start_thread: StartThread, sync_before: Callable[[], None], wake: Callable[[], None]):
        self.files = files
        self.groups = groups  # the host's, by id
        self.tick_s = tick_s
        self._start_thread = start_thread
        self._sync_before = sync_before  # what the snapshots cover outside the WAL, made durable first
        self._wake = wake  # the round loop: compactions wait for it
        self._durable = durable  # group -> the index of its newest snapshot durable in the WAL
        self._compactions: list[Update] = []  # snapshots taken since the last round, to write with it
        self._jobs: list[SnapshotJob] = []  # snapshots taken, for the snapshot worker to write
        # For it to delete: a file by name, or (group, index) a group's files from before index.
        self._drops: list[str | tuple[int, int]] = []
        self._worker = False  # it runs
        self._snapshotting: set[int] = set()  # groups whose snapshot it has yet to write
        self._jobs_queued = self._jobs_done = 0
        self._checkpoint_after: int | None = None  # a checkpoint waits until this many snapshot jobs are done

    def take(self) -> list[Update]:
        """The compactions' WAL records for the round being written (or a checkpoint, which holds them all)."""
        compactions, self._compactions = self._compactions, []
        return compactions

    def give_back(self, compactions: list[Update]) -> None:
        """Records a checkpoint that failed did not write: they go with the next round, before those taken since."""
        self._compactions = compactions + self._compactions

    def ready_for_checkpoint(self) -> bool:
        """Snapshot every group once, then True once all those snapshots are written (asked again each round
        meanwhile): a checkpoint then rewrites little more than hard states and snapshot descriptors."""
        if self._checkpoint_after is None:
            for group, hosted in self.groups.items():
                self.compact(group, hosted)
            self._checkpoint_after = self._jobs_queued
        if self._jobs_done < self._checkpoint_after:
            return False
        self._checkpoint_after = None
        return True

    def maybe_compact(self, group: int, hosted: Group) -> None:
        """Snapshot a group whose log grew long, so its log (and the WAL) can shrink; but not before the log
        applied since the last snapshot is 1/limits.raft_snapshot_log_ratio of that snapshot's size, so that a big
        state (a KV shard of gigabytes) is not rewritten whole for every few entries, nor while a follower catches up
        (it installs a snapshot, then needs the entries after it), within limits.raft_catch_up_log_bytes_max."""
        core = hosted.core
        if (hosted.applied - core.snapshot.index < limits.raft_log_entries_max
                and hosted.log_bytes < limits.raft_log_bytes_max):
            return
        if core.snapshot.data and hosted.log_bytes * limits.raft_snapshot_log_ratio < snapshots.Descriptor.decode(
                core.snapshot.data).size:
            return
        if hosted.log_bytes < limits.raft_catch_up_log_bytes_max and core.follower_lacks(
                hosted.applied, int(limits.raft_catch_up_heard_s / self.tick_s)):
            return  # a follower catches up: keep the entries it needs, up to a bound
        self.compact(group, hosted)

    def compact(self, group: int, hosted: Group) -> None:
        """Take a snapshot of the group's machine now, as applied, and hand it to the snapshot worker; the log is
        compacted once its file is written (_snapshots_written)."""
        core = hosted.core
        if hosted.applied <= core.snapshot.index or group in self._snapshotting:
            return  # also when a snapshot installed in the core is not yet in the machine
        index = hosted.applied
        term = core.term_at(index)
        assert term is not None, "an applied entry after the snapshot is in the log"
        self._snapshotting.add(group)
        self._jobs.append(SnapshotJob(group, hosted, index, term, hosted.machine.snapshot()))
        self._jobs_queued += 1
        hosted.log_bytes = 0
        self._start_worker()

    def _start_worker(self) -> None:
        """Hand what waits to the snapshot worker thread, unless it runs: one at a time, so that a burst of
        compactions is written in turn and the rounds never wait for a snapshot file."""
        if self._worker or not (self._jobs or self._drops):
            return
        jobs, drops = self._jobs, self._drops
        self._jobs, self._drops = [], []
        self._worker = True
        self._start_thread(functools.partial(self._write_snapshots, jobs, drops),
                           functools.partial(self._snapshots_written, jobs))

    def _write_snapshots(self, jobs: list[SnapshotJob], drops: list[str | tuple[int, int]]) -> list[bytes | Exception]:
        """In the snapshot worker: delete files no core needs (by name, or a group's below an index), then write
        each job's file and fsync them and their directory, so that they are durable before a WAL record refers
        to them. What the snapshots cover outside the WAL (the storage role's LevelDB) is made durable first."""
        for drop in drops:
            if isinstance(drop, str):
                self.files.delete([drop])
            else:
                self.files.delete_older(*drop)
        if not jobs:
            return []
        self._sync_before()
        written: list[bytes | Exception] = []
        for job in jobs:
            try:
                written.append(self.files.write(job.group, job.index, job.term, job.chunks))
            except (OSError, RocketError) as error:  # a full disk, say: the group keeps its log
                written.append(error)
        fsync_directory(self.files.directory)
        return written

    def _snapshots_written(self, jobs: list[SnapshotJob], outcome) -> BaseException | None:
        """In the trio thread: the worker is done. Compact each group whose snapshot file was written and is
        still news (a snapshot installed from the leader meanwhile may be newer); the WAL records of the
        compactions go with the next round. An error other than OSError is a bug: it fails the round loop."""
        self._worker = False
        error = getattr(outcome, "error", None)
        if error is not None and not isinstance(error, OSError):
            return error
        for job, written in zip(jobs, [error] * len(jobs) if error is not None else outcome.value):
            self._snapshotting.discard(job.group)
            if isinstance(written, Exception):
                log.warning("group %d: the snapshot at entry %d was not written, so its log is kept: %s", job.group,
                            job.index, written)
            elif self.groups.get(job.group) is not job.hosted or job.hosted.core.snapshot.index >= job.index:
                # Stale (a newer snapshot was installed, or the group left): its index is at or below the commit,
                # so no core installs it, and no Ready names it.
                self._drops.append(snapshots.file_name(
                    job.group, job.index, job.term, snapshots.Descriptor.decode(written).checksum))
            else:
                job.hosted.core.compact(job.index, written)
                self._compactions.append(Update(job.group, None, [], job.hosted.core.snapshot))
        self._jobs_done += len(jobs)
        self._wake()
        self._start_worker()
        return None

    def durable(self, group: int, snapshot: Snapshot | None) -> None:
        """A WAL record of the group's snapshot is durable, and the rounds before it are released (their
        snapshots restored): the group's files from before it are needed no more."""
        if snapshot is None or not snapshot.data or snapshot.index <= self._durable.get(group, 0):
            return
        self._durable[group] = snapshot.index
        self._drops.append((group, snapshot.index))
        self._start_worker()
