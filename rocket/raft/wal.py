"""The node's Raft write-ahead log: every group's entries, hard states and snapshots in one commit log,
so one fdatasync makes a whole round of Ready durable for all groups. Blocking file I/O; the host
runs it in a worker thread. Replay rebuilds each group: later entries at an index replace the suffix.
"""

from __future__ import annotations

import dataclasses
import struct
from pathlib import Path

from rocket import limits
from rocket.errors import Code, RocketError
from rocket.raft import codec
from rocket.raft.core import Entry, HardState, Snapshot
from rocket.store.commitlog import CommitLog

ENTRIES, HARD_STATE, SNAPSHOT = 1, 2, 3
_group_count = struct.Struct("<QI")  # group, entry count
_group = struct.Struct("<Q")


@dataclasses.dataclass
class GroupState:
    """What a group restarts from."""

    hard_state: HardState = HardState()
    entries: list[Entry] = dataclasses.field(default_factory=list)
    snapshot: Snapshot | None = None


@dataclasses.dataclass(slots=True)
class Update:
    """One group's part of a Ready that must be durable before its messages go out."""

    group: int
    hard_state: HardState | None
    entries: list[Entry]
    snapshot: Snapshot | None


class Wal:
    def __init__(self, commit_log: CommitLog, groups: dict[int, GroupState]):
        self.log = commit_log
        self.groups = groups

    @classmethod
    def open(cls, directory: Path, segment_bytes_max: int = limits.raft_wal_segment_bytes) -> "Wal":
        commit_log = CommitLog.open(directory, segment_bytes_max)
        groups: dict[int, GroupState] = {}
        for position, kind, body in commit_log.scan(commit_log.start_position):
            view = memoryview(body)
            try:
                _replay(groups, kind, view)
            except (RocketError, struct.error) as error:
                problem = error.message if isinstance(error, RocketError) else str(error)
                raise RocketError(Code.CORRUPT_DATA, f"Raft WAL record at {position}: {problem}") from None
        return cls(commit_log, groups)

    def write(self, updates: list[Update]) -> None:
        """Append the updates (no sync). `groups` stays what was replayed at open."""
        records: list[tuple[int, bytes | tuple]] = []
        for update in updates:
            if update.snapshot is not None:
                records.append((SNAPSHOT, _group.pack(update.group) + codec.encode_snapshot(update.snapshot)))
            for chunk in _entry_chunks(update.entries, self.log.segment_bytes_max // 4):
                parts = codec.encode_entries(chunk)
                records.append((ENTRIES, (_group_count.pack(update.group, len(chunk)), *parts)))
            if update.hard_state is not None:
                records.append((HARD_STATE, _group.pack(update.group) + codec.encode_hard_state(update.hard_state)))
        self.log.append(records)

    def sync(self) -> None:
        self.log.sync()

    def sealed_segments(self) -> int:
        return len(self.log.segments()) - 1

    def checkpoint(self, groups: list[Update]) -> int:
        """Rewrite every live group (snapshot, entries after it, hard state) into fresh segments, make
        that durable, then delete everything older. Replay of the survivors gives the same groups,
        and a crash between the two steps only leaves records that the checkpoint overrides."""
        start = self.log.roll()
        self.write(groups)
        self.log.sync()
        return self.log.delete_before(start)

    def close(self) -> None:
        self.log.close()


def _entry_chunks(entries: list[Entry], bytes_max: int) -> list[list[Entry]]:
    """Entries cut into records of bounded size: a checkpoint of a long log must still fit its segments."""
    chunks: list[list[Entry]] = []
    size = 0
    for entry in entries:
        entry_bytes = len(entry.data) + 32
        if not chunks or (chunks[-1] and size + entry_bytes > bytes_max):
            chunks.append([])
            size = 0
        chunks[-1].append(entry)
        size += entry_bytes
    return chunks


def _replay(groups: dict[int, GroupState], kind: int, view: memoryview) -> None:
    if kind == ENTRIES:
        group, count = _group_count.unpack_from(view)
        entries, _ = codec.decode_entries(view, _group_count.size, count)
        state = groups.setdefault(group, GroupState())
        if entries:
            first = entries[0].index
            state.entries = [e for e in state.entries if e.index < first] + entries
    elif kind == HARD_STATE:
        (group,) = _group.unpack_from(view)
        groups.setdefault(group, GroupState()).hard_state, _ = codec.decode_hard_state(view, _group.size)
    elif kind == SNAPSHOT:
        (group,) = _group.unpack_from(view)
        snapshot, _ = codec.decode_snapshot(view, _group.size)
        state = groups.setdefault(group, GroupState())
        state.snapshot = snapshot
        state.entries = [e for e in state.entries if e.index > snapshot.index]
        if state.entries and state.entries[0].index != snapshot.index + 1:
            state.entries = []
    else:
        raise RocketError(Code.CORRUPT_DATA, f"unknown record kind {kind}")
