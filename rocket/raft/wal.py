"""The node's Raft write-ahead log: every group's entries, hard states and snapshot descriptors in one commit log, so
one fdatasync makes a whole round of Ready durable for all groups. Blocking file I/O; replay rebuilds each group."""

from __future__ import annotations

import dataclasses
import os
import struct
import zlib
from pathlib import Path

from rocket import limits
from rocket.errors import Code, RocketError
from rocket.raft import codec
from rocket.raft.core import Entry, HardState, Snapshot
from rocket.disk.commitlog import HEADER_BYTES, CommitLog
from rocket.disk.files import fsync_directory
from rocket.disk.record import Body

ENTRIES, HARD_STATE, SNAPSHOT = 1, 2, 3
DATA = 4  # bytes kept for a state machine outside any entry (a replica's backfilled batches): replay skips it
_group_count = struct.Struct("<QI")  # group, entry count
_group = struct.Struct("<Q")
_entry_head_bytes = codec.ENTRY_HEAD_BYTES
_mark = struct.Struct("<QI")  # replay-from position, crc32 of it
MARK_FILE = "replay-from"


@dataclasses.dataclass
class GroupState:
    """What a group restarts from."""

    hard_state: HardState = HardState()
    entries: list[Entry] = dataclasses.field(default_factory=list)
    snapshot: Snapshot | None = None
    positions: dict[int, int] = dataclasses.field(default_factory=dict)  # entry index -> where its data lies


@dataclasses.dataclass(slots=True)
class Update:
    """One group's part of a Ready that must be durable before its messages go out."""

    group: int
    hard_state: HardState | None
    entries: list[Entry]
    snapshot: Snapshot | None


class Wal:
    """Every group's entries, hard states and snapshots in one commit log. A snapshot record holds only the descriptor
    of the snapshot's file beside the WAL (snapshots.py), written and made durable before it. The rounds write in the
    event loop's thread (into the page cache) and fsync in the syncer thread (rounds.py). Replay rebuilds each
    group: later entries at an index replace the suffix.

    The WAL is also where entries' data stays: write() tells where each entry's data lies, so that a state machine
    can index a produce batch where it already is instead of writing it a second time. A checkpoint rewrites every
    live group into fresh segments and marks where replay starts from; the segments before the mark are deleted
    unless the WAL keeps data (a storage node: they are deleted by retention instead)."""

    def __init__(self, commit_log: CommitLog, groups: dict[int, GroupState], keep_segments: bool = False):
        self.log = commit_log
        self.groups = groups
        self.keep_segments = keep_segments
        self._replay_start = max(_read_mark(commit_log.directory), commit_log.start_position)

    @classmethod
    def open(cls, directory: Path, segment_bytes_max: int = limits.raft_wal_segment_bytes_default,
             keep_segments: bool = False, cached_bytes: int = 0, direct: bool = False) -> "Wal":
        if direct and not cached_bytes:
            cached_bytes = limits.wal_direct_cached_bytes_default
        commit_log = CommitLog.open(directory, segment_bytes_max, cached_bytes, direct)
        groups: dict[int, GroupState] = {}
        wal = cls(commit_log, groups, keep_segments)
        for position, kind, body in commit_log.scan(wal.replay_start()):
            view = memoryview(body)
            try:
                _replay(groups, kind, view, position)
            except (RocketError, struct.error) as error:
                problem = error.message if isinstance(error, RocketError) else str(error)
                raise RocketError(Code.CORRUPT_DATA, f"Raft WAL record at {position}: {problem}") from None
        return wal

    def write(self, updates: list[Update]) -> dict[int, dict[int, int]]:
        """Append the updates (no sync). Returns, per group, where each entry's data now lies.
        `groups` stays what was replayed at open (the host updates a group it stops hosting)."""
        records: list[tuple[int, Body]] = []
        chunks: list[tuple[int, int, list[Entry]]] = []  # record number, group, entries
        for update in updates:
            if update.snapshot is not None:
                records.append((SNAPSHOT, _group.pack(update.group) + codec.encode_snapshot(update.snapshot)))
            for chunk in _entry_chunks(update.entries, self.log.segment_bytes_max // 4):
                parts = codec.encode_entries(chunk)
                chunks.append((len(records), update.group, chunk))
                records.append((ENTRIES, (_group_count.pack(update.group, len(chunk)), *parts)))
            if update.hard_state is not None:
                records.append((HARD_STATE, _group.pack(update.group) + codec.encode_hard_state(update.hard_state)))
        record_positions = self.log.append(records)
        positions: dict[int, dict[int, int]] = {}
        for record, group, chunk in chunks:
            _entry_positions(positions.setdefault(group, {}), chunk, record_positions[record])
        return positions

    def write_data(self, blobs: list[bytes]) -> list[int]:
        """Append blobs as DATA records (no sync); returns where each blob's bytes lie."""
        return [position + HEADER_BYTES for position in self.log.append([(DATA, blob) for blob in blobs])]

    def sync(self) -> None:
        self.log.sync()

    def sealed_segments(self) -> int:
        """Sealed segments that a replay reads: those from the checkpoint mark on (cheap: no file access)."""
        return sum(1 for start in self.log.segment_starts() if start >= self._replay_start) - 1

    def replay_bytes(self) -> int:
        """The bytes a replay reads: from the checkpoint mark to the end (cheap: no file access)."""
        return self.log.end_position - self._replay_start

    def checkpoint(self, groups: list[Update]) -> int:
        """Rewrite every live group (snapshot, entries after it, hard state) into fresh segments, make
        that durable, then mark replay to start there and delete what came before (unless the WAL keeps
        data). A crash between the steps only leaves records that the checkpoint overrides."""
        start = self.log.roll()
        self.write(groups)
        self.log.sync()
        _write_mark(self.log.directory, start)
        self._replay_start = start
        return 0 if self.keep_segments else self.log.delete_before(start)

    def replay_start(self) -> int:
        return self._replay_start

    def close(self) -> None:
        self.log.close()


def _entry_positions(into: dict[int, int], chunk: list[Entry], record_position: int) -> None:
    """Where each entry's data lies in the log, given the position of the ENTRIES record holding them."""
    at = record_position + HEADER_BYTES + _group_count.size
    for entry in chunk:
        into[entry.index] = at + _entry_head_bytes
        at += _entry_head_bytes + len(entry.data)


def _read_mark(directory: Path) -> int:
    try:
        raw = (directory / MARK_FILE).read_bytes()
    except FileNotFoundError:
        return 0
    if len(raw) != _mark.size:
        raise RocketError(Code.CORRUPT_DATA, f"{directory / MARK_FILE} is damaged")
    position, crc = _mark.unpack(raw)
    if zlib.crc32(raw[:8]) != crc:
        raise RocketError(Code.CORRUPT_DATA, f"{directory / MARK_FILE} failed its checksum")
    return position


def _write_mark(directory: Path, position: int) -> None:
    """Atomically: a temporary file, fsync'ed, renamed over the mark, and the directory fsync'ed."""
    temporary = directory / (MARK_FILE + ".tmp")
    with open(temporary, "wb") as file:
        file.write(_mark.pack(position, zlib.crc32(struct.pack("<Q", position))))
        file.flush()
        os.fdatasync(file.fileno())
    os.replace(temporary, directory / MARK_FILE)
    fsync_directory(directory)


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


def _replay(groups: dict[int, GroupState], kind: int, view: memoryview, position: int) -> None:
    if kind == ENTRIES:
        group, count = _group_count.unpack_from(view)
        entries, _ = codec.decode_entries(view, _group_count.size, count)
        state = groups.setdefault(group, GroupState())
        if entries:
            # Usually the record follows the log: extend it. Rebuilding the list for every record made a replay
            # quadratic in a group's entries (seconds for a WAL of hundreds of MB since its checkpoint).
            first = entries[0].index
            if state.entries and state.entries[-1].index >= first:
                state.entries = [e for e in state.entries if e.index < first]
            state.entries.extend(entries)
            _entry_positions(state.positions, entries, position)
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
    elif kind != DATA:
        raise RocketError(Code.CORRUPT_DATA, f"unknown record kind {kind}")
