"""The Raft codecs round-trip and refuse garbage; the WAL restores every group after a crash."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rocket.errors import Code, RocketError
from rocket.raft import codec
from rocket.raft.core import Entry, EntryKind, HardState, Message, MessageType, Snapshot
from rocket.raft.wal import Update, Wal

entries = st.lists(st.builds(Entry, st.integers(0, 2**40), st.integers(1, 2**40), st.binary(max_size=50),
                             st.sampled_from(list(EntryKind))), max_size=4)
snapshots = st.builds(Snapshot, st.integers(0, 2**40), st.integers(0, 2**40),
                      st.lists(st.integers(1, 99), max_size=5).map(tuple),
                      st.lists(st.integers(100, 199), max_size=3).map(tuple), st.binary(max_size=40))
messages = st.builds(Message, st.sampled_from(list(MessageType)), st.integers(1, 9), st.integers(1, 9),
                     st.integers(0, 2**40), st.integers(0, 2**40), st.integers(0, 2**40), entries.map(tuple),
                     st.integers(0, 2**40), st.booleans(), st.integers(0, 2**40), st.integers(0, 2**40),
                     st.none() | snapshots, st.booleans(), st.integers(0, 2**40))


@given(st.lists(st.tuples(st.integers(0, 2**63), messages), max_size=5))
def test_messages_round_trip(batch):
    """Every field of every message, entries and snapshots included, survives encoding."""
    assert codec.decode_messages(codec.encode_messages(batch)) == batch


@settings(max_examples=400)
@given(st.binary(max_size=400))
def test_garbage_is_refused_cleanly(data):
    """Arbitrary bytes decode or fail with BAD_REQUEST, never another exception."""
    try:
        codec.decode_messages(data)
    except RocketError as error:
        assert error.code == Code.BAD_REQUEST


def test_wal_restores_groups_with_truncation_and_snapshots(tmp_path):
    """Replay gives each group its latest hard state, snapshot, and log with overwritten suffixes replaced."""
    wal = Wal.open(tmp_path)
    wal.write([Update(1, HardState(1, 1, 0), [Entry(1, 1, b"a"), Entry(1, 2, b"b"), Entry(1, 3, b"c")], None),
               Update(2, HardState(3, 2, 1), [Entry(3, 1, b"x")], None)])
    wal.write([Update(1, HardState(2, 2, 2), [Entry(2, 3, b"C"), Entry(2, 4, b"D")], None)])
    wal.write([Update(2, None, [], Snapshot(5, 3, (1, 2, 3), (), b"state"))])
    wal.sync()
    wal.close()
    restored = Wal.open(tmp_path).groups
    assert restored[1].hard_state == HardState(2, 2, 2)
    assert [(e.term, e.index, e.data) for e in restored[1].entries] == [(1, 1, b"a"), (1, 2, b"b"), (2, 3, b"C"),
                                                                        (2, 4, b"D")]
    assert restored[2].snapshot.data == b"state" and restored[2].entries == []


def test_unsynced_tail_is_lost_whole(tmp_path):
    """A torn last record disappears on restart; what was synced before it is intact."""
    wal = Wal.open(tmp_path)
    wal.write([Update(7, HardState(1, 0, 0), [Entry(1, 1, b"kept")], None)])
    wal.sync()
    wal.write([Update(7, None, [Entry(1, 2, b"torn" * 100)], None)])
    wal.close()
    segment = sorted(tmp_path.glob("*.log"))[-1]
    segment.write_bytes(segment.read_bytes()[:-50])
    restored = Wal.open(tmp_path).groups[7]
    assert [e.data for e in restored.entries] == [b"kept"]


def test_damaged_record_is_reported(tmp_path):
    """A record whose body does not decode stops the replay with CORRUPT_DATA."""
    wal = Wal.open(tmp_path)
    wal.log.append([(1, b"\x01\x00")])
    wal.sync()
    wal.close()
    with pytest.raises(RocketError) as caught:
        Wal.open(tmp_path)
    assert caught.value.code == Code.CORRUPT_DATA


def test_checkpoint_drops_old_segments_and_keeps_every_group(tmp_path):
    """A checkpoint rewrites live groups into fresh segments and deletes the rest; replay is unchanged."""
    wal = Wal.open(tmp_path, segment_bytes_max=1 << 20)
    for round_number in range(40):
        wal.write([Update(group, HardState(1, 1, round_number), [Entry(1, round_number + 1, bytes(20_000))], None)
                   for group in (1, 2, 3)])
    wal.sync()
    assert wal.sealed_segments() >= 2
    live = Wal.open(tmp_path, segment_bytes_max=1 << 20).groups
    compacted = {g: Update(g, live[g].hard_state, live[g].entries[-5:], Snapshot(35, 1, (1, 2, 3), (), b"sm"))
                 for g in live}
    removed = wal.checkpoint(list(compacted.values()))
    wal.close()
    assert removed >= 2 and len(list(tmp_path.glob("*.log"))) <= 2
    restored = Wal.open(tmp_path, segment_bytes_max=1 << 20).groups
    for group in (1, 2, 3):
        assert restored[group].snapshot.index == 35 and restored[group].hard_state == HardState(1, 1, 39)
        assert [e.index for e in restored[group].entries] == [36, 37, 38, 39, 40]


def test_a_wal_that_keeps_data_replays_from_its_checkpoint_mark(tmp_path):
    """A storage node's WAL keeps its old segments (its batches live there): after a checkpoint only the
    segments from the mark on count towards the next one, and replay starts at the mark."""
    wal = Wal.open(tmp_path, segment_bytes_max=1 << 20, keep_segments=True)
    for round_number in range(40):
        wal.write([Update(1, HardState(1, 1, round_number), [Entry(1, round_number + 1, bytes(60_000))], None)])
    wal.sync()
    sealed = wal.sealed_segments()
    assert sealed >= 2
    assert wal.checkpoint([Update(1, HardState(1, 1, 39), [], Snapshot(40, 1, (1, 2, 3), (), b"sm"))]) == 0
    assert len(list(tmp_path.glob("*.log"))) == sealed + 2  # nothing deleted: the old ones and the new one
    assert wal.sealed_segments() == 0
    [data] = wal.write_data([b"backfilled"])
    wal.sync()
    wal.close()
    reopened = Wal.open(tmp_path, segment_bytes_max=1 << 20, keep_segments=True)
    assert reopened.replay_start() > 0 and reopened.sealed_segments() == 0
    assert reopened.groups[1].snapshot.index == 40 and reopened.groups[1].entries == []
    assert reopened.log.read_slice(data, 10) == b"backfilled"


def test_payloads_to_a_peer_are_split_to_fit_a_frame():
    """A round's messages to one node are cut into payloads under the limit, in order, none lost."""
    from rocket import limits
    from rocket.raft.host import _chunks

    big = Entry(1, 1, bytes(64 * 1024))
    messages = [(group, Message(MessageType.APPEND, 1, 2, 1, entries=(big,))) for group in range(300)]
    chunks = _chunks(messages)
    assert len(chunks) > 1 and [pair for chunk in chunks for pair in chunk] == messages
    assert all(len(codec.encode_messages(chunk)) <= limits.raft_payload_bytes_max for chunk in chunks)


def test_long_logs_are_written_as_bounded_records(tmp_path):
    """Thousands of large entries for one group (as a checkpoint writes them) fit small segments."""
    wal = Wal.open(tmp_path, segment_bytes_max=1 << 20)
    entries = [Entry(1, index, bytes(64 * 1024)) for index in range(1, 201)]  # 12.5 MiB, 1 MiB segments
    wal.write([Update(5, HardState(1, 1, 200), entries, None)])
    wal.sync()
    wal.close()
    restored = Wal.open(tmp_path, segment_bytes_max=1 << 20).groups[5]
    assert [e.index for e in restored.entries] == list(range(1, 201))


def test_empty_entries_are_written_too(tmp_path):
    """Entries without data (a new leader's first entry) are records like any other."""
    wal = Wal.open(tmp_path)
    wal.write([Update(1, None, [Entry(1, 1), Entry(1, 2, b"x")], None)])
    wal.sync()
    wal.close()
    assert [e.index for e in Wal.open(tmp_path).groups[1].entries] == [1, 2]
