"""Log compaction of the multi-raft host's groups (Compaction, a mixin of RaftHost beside the round loop): a group's log
is compacted once the snapshot file of its machine's state is durable, and a snapshot file outlives no core's need."""

from __future__ import annotations

import dataclasses
import functools
import logging
from typing import TYPE_CHECKING

import trio

from rocket import limits
from rocket.disk.files import fsync_directory
from rocket.errors import RocketError
from rocket.raft import snapshots
from rocket.raft.core import Snapshot
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
    chunks: object  # the machine's Iterable[bytes], iterated in the worker thread


class Compaction:
    """A group whose applied log grew long is snapshotted in the event loop's thread (its machine's state as applied),
    one worker thread writes the snapshot files beside the rounds (snapshots.py) and drops the files no core needs,
    and the group's log is compacted once its file is durable: the compaction's WAL record goes with the next round.
    A snapshot file a replica is fetching outlives the group's next snapshot (SnapshotFiles.delete_older), so that a
    new replica catches up under heavy writes."""

    def _maybe_compact(self, group: int, hosted: Group) -> None:
        """Snapshot a group whose log grew long, so its log (and the WAL) can shrink; but not before the log
        applied since the last snapshot is 1/limits.raft_snapshot_log_ratio of that snapshot's size, so that a big
        state (a KV shard of gigabytes) is not rewritten whole for every few entries, nor while a follower catches up
        (it installs a snapshot, then needs the entries after it), within limits.raft_catch_up_log_bytes_max."""
        core = hosted.core
        if hosted.applied - core.snapshot.index < limits.raft_log_entries_max and hosted.log_bytes < limits.raft_log_bytes_max:
            return
        if core.snapshot.data and hosted.log_bytes * limits.raft_snapshot_log_ratio < snapshots.Descriptor.decode(
                core.snapshot.data).size:
            return
        if hosted.log_bytes < limits.raft_catch_up_log_bytes_max and core.follower_lacks(
                hosted.applied, int(limits.raft_catch_up_heard_s / self.tick_s)):
            return  # a follower catches up: keep the entries it needs, up to a bound
        self._compact(group, hosted)

    def _compact(self, group: int, hosted: Group) -> None:
        """Take a snapshot of the group's machine now, as applied, and hand it to the snapshot worker; the log is
        compacted once its file is written (_snapshots_written)."""
        core = hosted.core
        if hosted.applied <= core.snapshot.index or group in self._snapshotting:
            return  # also when a snapshot installed in the core is not yet in the machine
        index = hosted.applied
        self._snapshotting.add(group)
        self._snapshot_jobs.append(SnapshotJob(group, hosted, index, core.term_at(index), hosted.machine.snapshot()))
        self._snapshot_jobs_queued += 1
        hosted.log_bytes = 0
        self._start_snapshot_worker()

    def _start_snapshot_worker(self) -> None:
        """Hand what waits to the snapshot worker thread, unless it runs: one at a time, so that a burst of
        compactions is written in turn and the rounds never wait for a snapshot file."""
        if self._snapshot_worker or not (self._snapshot_jobs or self._snapshot_drops):
            return
        jobs, drops = self._snapshot_jobs, self._snapshot_drops
        self._snapshot_jobs, self._snapshot_drops = [], []
        self._snapshot_worker = True
        self._persisting += 1
        trio.lowlevel.start_thread_soon(
            functools.partial(self._write_snapshots, jobs, drops),
            lambda outcome: self._token.run_sync_soon(self._snapshots_written, jobs, outcome))

    def _write_snapshots(self, jobs: list[SnapshotJob], drops: list[str | tuple[int, int]]) -> list[bytes | Exception]:
        """In the snapshot worker: delete files no core needs (by name, or a group's below an index), then write
        each job's file and fsync them and their directory, so that they are durable before a WAL record refers
        to them. What the snapshots cover outside the WAL (the storage role's LevelDB) is made durable first."""
        for drop in drops:
            if isinstance(drop, str):
                self.snapshot_files.delete([drop])
            else:
                self.snapshot_files.delete_older(*drop)
        if not jobs:
            return []
        self.sync_before_snapshots()
        written: list[bytes | Exception] = []
        for job in jobs:
            try:
                written.append(self.snapshot_files.write(job.group, job.index, job.term, job.chunks))
            except (OSError, RocketError) as error:  # a full disk, say: the group keeps its log
                written.append(error)
        fsync_directory(self.snapshot_files.directory)
        return written

    def _snapshots_written(self, jobs: list[SnapshotJob], outcome) -> None:
        """In the trio thread: the worker is done. Compact each group whose snapshot file was written and is
        still news (a snapshot installed from the leader meanwhile may be newer); the WAL records of the
        compactions go with the next round."""
        self._snapshot_worker = False
        error = getattr(outcome, "error", None)
        if error is not None and not isinstance(error, OSError):
            self._persist_ended(error)  # a bug: fail the round loop
            return
        for job, written in zip(jobs, [error] * len(jobs) if error is not None else outcome.value):
            self._snapshotting.discard(job.group)
            if isinstance(written, Exception):
                log.warning("group %d: the snapshot at entry %d was not written, so its log is kept: %s", job.group,
                            job.index, written)
            elif self.groups.get(job.group) is not job.hosted or job.hosted.core.snapshot.index >= job.index:
                # Stale (a newer snapshot was installed, or the group left): its index is at or below the commit,
                # so no core installs it, and no Ready names it.
                self._snapshot_drops.append(snapshots.file_name(
                    job.group, job.index, job.term, snapshots.Descriptor.decode(written).checksum))
            else:
                job.hosted.core.compact(job.index, written)
                self._compactions.append(Update(job.group, None, [], job.hosted.core.snapshot))
        self._snapshot_jobs_done += len(jobs)
        self._wake.set()
        self._persist_ended(None)
        self._start_snapshot_worker()

    def _snapshot_durable(self, group: int, snapshot: Snapshot) -> None:
        """A WAL record of the group's snapshot is durable, and the rounds before it are released (their
        snapshots restored): the group's files from before it are needed no more."""
        if not snapshot.data or snapshot.index <= self._snapshots_durable.get(group, 0):
            return
        self._snapshots_durable[group] = snapshot.index
        self._snapshot_drops.append((group, snapshot.index))
        self._start_snapshot_worker()
