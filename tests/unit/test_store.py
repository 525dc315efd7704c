"""The node store as the Raft state machine of its storage groups: applying committed entries whose
batches lie in the node's Raft WAL, idempotent re-apply after a restart, consumer offsets, an index
rebuilt from the WAL, refusal of damage in the WAL, snapshots that carry queue positions, long polling
and search by time."""

from __future__ import annotations

import os
import pickle
import shutil
from pathlib import Path

import orjson
import pytest
import trio

from rocket import limits
from rocket.errors import Code, RocketError
from rocket.model import Message, timer_topic
from rocket.raft.core import Entry
from rocket.raft.wal import Update, Wal
from rocket.serde import batch as batch_codec
from rocket.disk import commitlog as commitlog_module
from rocket.disk.commitlog import CommitLog
from rocket.store.commands import encode_append, encode_move, encode_offsets, encode_timers
from rocket.store.store import Store

SEGMENT = limits.segment_bytes_min  # of the WAL
GROUP = 3  # the Raft group most tests apply to
APPEND_MS = 1_700_000_000_000  # batch i of a workload is appended at APPEND_MS + i * 1000


class Node:
    """A storage node's store beside its Raft WAL, opened as the storage role opens them (the WAL keeps
    its segments). It does what the Raft host does: at open, apply again every entry the WAL holds
    (each group's since its last checkpoint), as committed; apply() writes the entries to the WAL, then
    applies them with the positions the WAL gives for their data. Everything else is the store's own
    (reads, stats, its index), so a test reads `node.read(...)` as it would `store.reads.read(...)`."""

    def __init__(self, directory: Path):
        self.directory = directory
        self.wal = Wal.open(directory / "wal", SEGMENT, keep_segments=True)
        self.store = Store.open(directory, self.wal.log)
        self.positions = {group: dict(restored.positions) for group, restored in self.wal.groups.items()}
        for path in sorted(directory.glob("snapshot-*")):
            self.store.restore(int(path.name.split("-")[1]), pickle.loads(path.read_bytes()))
        for group, restored in self.wal.groups.items():
            if restored.entries:
                self.store.apply(group, restored.entries, [restored.positions[entry.index]
                                                           for entry in restored.entries])

    def apply(self, group: int, entries: list[Entry]) -> list:
        """Entries the group's log holds already (a test applying them again) are not written again."""
        positions = self.positions.setdefault(group, {})
        new = [entry for entry in entries if entry.index > max(positions, default=0)]
        positions.update(self.wal.write([Update(group, None, new, None)]).get(group, {}) if new else {})
        return self.store.apply(group, entries, [positions[entry.index] for entry in entries])

    def restore(self, group: int, chunks) -> None:
        """Install a snapshot; one newer than the group's last is kept, as the Raft host keeps its file, and
        installed again at open."""
        chunks = list(chunks) if not isinstance(chunks, bytes) else [chunks]
        path = self.directory / f"snapshot-{group}"
        applied = orjson.loads(chunks[0])["applied"] if chunks and chunks[0] else 0
        kept = pickle.loads(path.read_bytes()) if path.exists() else []
        if applied > (orjson.loads(kept[0])["applied"] if kept else 0):
            path.write_bytes(pickle.dumps(chunks))
        self.store.restore(group, chunks)

    def __getattr__(self, name: str):
        reads = self.store.reads
        return getattr(reads if hasattr(reads, name) else self.store, name)

    def close(self) -> None:
        self.store.close()
        self.wal.close()


def make_batch(first: int, count: int, size: int = 100) -> bytes:
    return batch_codec.encode([Message(f"{first + i}:".encode() + bytes(size)) for i in range(count)], 1_700_000_000_000)


def bodies(store: Node, topic: str, queue: int) -> list[bytes]:
    found = []
    offset = 0
    while True:
        batches = store.reads.read(topic, queue, offset, 1 << 30)
        if not batches:
            return found
        for base_offset, data in batches:
            messages = batch_codec.decode(data, base_offset)
            found.extend(m.body for m in messages if m.offset >= offset)
            offset = base_offset + len(messages)


def append_entry(index: int, topic: str, queue: int, batch: bytes, append_ms: int = APPEND_MS, term: int = 1) -> Entry:
    return Entry(term, index, encode_append(topic, queue, append_ms, batch))


def offsets_entry(index: int, consumer_group: str, topic: str, offsets: dict[int, int], term: int = 1) -> Entry:
    return Entry(term, index, encode_offsets(consumer_group, topic, offsets))


def workload(batches: int = 40, per_batch: int = 50, size: int = 100, first_index: int = 1, topic: str = "t",
             queues: int = 2, first_batch: int = 0) -> list[Entry]:
    """Batch i goes to queue i % queues, holds messages named i * per_batch + k, appended at APPEND_MS + i s."""
    return [append_entry(first_index + n, topic, i % queues, make_batch(i * per_batch, per_batch, size),
                         APPEND_MS + i * 1000)
            for n, i in enumerate(range(first_batch, first_batch + batches))]


def apply_in_chunks(store: Node, group: int, entries: list[Entry], per_call: int) -> list:
    results = []
    for start in range(0, len(entries), per_call):
        results.extend(store.apply(group, entries[start:start + per_call]))
    return results


def fill(directory: Path, entries: list[Entry], group: int = GROUP, per_call: int = 1) -> list:
    store = Node(directory)
    results = apply_in_chunks(store, group, entries, per_call)
    store.close()
    return results


def index_writes(store: Node) -> list[dict[int, int]]:
    """From now on, each write to the store's queue index, as the groups' applied indexes it names."""
    writes = []
    index_apply = store.store.index.apply
    store.store.index.apply = lambda *args, **kwargs: (writes.append(args[3]), index_apply(*args, **kwargs))
    return writes


def expected_results(batches: int, per_batch: int, queues: int = 2, first_batch: int = 0) -> list[tuple[int, int]]:
    return [((i // queues) * per_batch, per_batch) for i in range(first_batch, first_batch + batches)]


def state(store: Node, topics: dict[str, int]) -> dict:
    """Everything a reader can observe of some queues, to compare a store with itself or another."""
    return {
        (topic, queue): (store.reads.queue_stats(topic, queue), bodies(store, topic, queue),
                         store.reads.read(topic, queue, 0, 1 << 30))
        for topic, count in topics.items() for queue in range(count)
    }


def overwrite_in_wal(store: Node, position: int, data: bytes) -> None:
    """Overwrite bytes of the WAL on disk at a WAL position (in whichever segment holds it)."""
    start, path, _ = [segment for segment in store.wal.log.segments() if segment[0] <= position][-1]
    with open(path, "r+b") as file:
        file.seek(position - start)
        file.write(data)


# ---- round trip ------------------------------------------------------------------------------------


def test_round_trip_across_segments_and_reopen(tmp_path):
    """Entries applied several per call, their batches spanning several WAL segments, read back whole
    before and after a reopen: offsets, stats, reads at any offset, time search and the applied index
    all survive."""
    entries = workload(batches=60, per_batch=100, size=500)
    store = Node(tmp_path)
    results = apply_in_chunks(store, GROUP, entries, per_call=7)
    assert results == expected_results(60, 100)
    assert len(store.wal.log.segments()) >= 3
    assert store.reads.applied(GROUP) == 60
    sizes = [len(make_batch(i * 100, 100, 500)) for i in range(60)]

    def check(store: Node) -> None:
        for queue in range(2):
            assert store.reads.queue_stats("t", queue) == {"min_offset": 0, "next_offset": 3000,
                                                     "bytes": sum(sizes[queue::2])}
        queue_0 = bodies(store, "t", 0)
        queue_1 = bodies(store, "t", 1)
        assert len(queue_0) == len(queue_1) == 3000
        assert queue_0[1234].startswith(b"%d:" % (24 * 100 + 34))  # batch 24 is queue 0's 13th
        assert queue_1[0].startswith(b"100:") and queue_1[-1].startswith(b"5999:")
        # A read from the middle of a batch starts at the batch that holds the offset.
        found = store.reads.read("t", 0, 1250, 1)
        assert [base for base, _ in found] == [1200]
        assert batch_codec.decode(found[0][1], 1200)[0].body.startswith(b"2400:")
        assert store.reads.read("t", 0, 1250, 1, at_least_one=False) == []
        budget = 3 * (sizes[24] + limits.read_batch_overhead_bytes)  # a read charges each batch that much more
        assert [base for base, _ in store.reads.read("t", 0, 1200, budget)] == [1200, 1300, 1400]
        assert [base for base, _ in store.reads.read("t", 0, 1200, budget - 1)] == [1200, 1300]
        assert store.reads.read("t", 0, 3000, 1 << 20) == []
        with pytest.raises(RocketError) as caught:
            store.reads.read("t", 0, 3001, 1 << 20)
        assert caught.value.code == Code.OFFSET_OUT_OF_RANGE
        # Batch i was appended at APPEND_MS + i s; queue 0 holds the even batches.
        assert store.reads.offset_for_time("t", 0, APPEND_MS + 24_000) == 1200
        assert store.reads.offset_for_time("t", 0, APPEND_MS + 23_500) == 1200
        assert store.reads.offset_for_time("t", 1, APPEND_MS + 22_500) == 1100  # batch 23
        assert store.reads.offset_for_time("t", 1, APPEND_MS + 23_500) == 1200  # batch 25
        assert store.reads.offset_for_time("t", 0, 0) == 0
        assert store.reads.offset_for_time("t", 0, APPEND_MS + 10**9) == 3000
        assert store.reads.applied(GROUP) == 60
        assert store.reads.applied(GROUP + 1) == 0

    check(store)
    store.close()
    store = Node(tmp_path)
    check(store)
    # Appends go on where the queues ended.
    assert store.apply(GROUP, workload(batches=2, per_batch=100, size=500, first_index=61, first_batch=60)) == \
        [(3000, 100), (3000, 100)]
    store.close()


def test_a_batch_is_written_once(tmp_path):
    """A batch lies only in its Raft entry in the WAL: applying MiBs of batches grows the store's own
    files (its index) by a small fraction of that, none of them holds a batch's bytes,
    and reads return the batches from where they lie in the WAL."""
    store = Node(tmp_path)
    batches = [batch_codec.encode([Message(os.urandom(1000)) for _ in range(100)], APPEND_MS + i) for i in range(48)]
    total = sum(len(batch) for batch in batches)
    assert total > 4 * limits.MiB
    wal_start = store.wal.log.end_position
    entries = [append_entry(i + 1, "t", i % 2, batch) for i, batch in enumerate(batches)]
    assert apply_in_chunks(store, GROUP, entries, per_call=4) == [((i // 2) * 100, 100) for i in range(48)]
    store.sync()
    assert store.wal.log.end_position - wal_start > total
    own_files = [path for path in (tmp_path / "index").iterdir() if path.is_file()]
    assert sum(path.stat().st_size for path in own_files) < total // 20
    contents = [path.read_bytes() for path in own_files]
    assert not any(batch[-64:] in content for batch in batches for content in contents)
    for _ in range(2):
        assert [batch for _, batch in store.reads.read("t", 0, 0, 1 << 30)] == batches[0::2]
        assert [batch for _, batch in store.reads.read("t", 1, 0, 1 << 30)] == batches[1::2]
        store.close()
        store = Node(tmp_path)
    store.close()


def test_a_rounds_applies_are_written_once_for_all_its_groups(tmp_path):
    """Within holding() (the round loop's apply), the groups' changes reach the index in one write at the end; a
    group applied again first writes what it changed before (its apply reads it), and so does a snapshot. The store
    then holds exactly what applying each group alone wrote, also after a reopen."""
    def groups_of(first_index: int) -> dict[int, list[Entry]]:
        return {group: workload(batches=4, first_index=first_index, topic=f"g{group}") for group in (3, 4, 5)}

    alone, held = Node(tmp_path / "alone"), Node(tmp_path / "held")
    for group, entries in groups_of(1).items():
        alone.apply(group, entries)
    writes = []
    index_apply = held.store.index.apply
    held.store.index.apply = lambda *args, **kwargs: (writes.append(args[3]), index_apply(*args, **kwargs))
    with held.store.holding():
        for group, entries in groups_of(1).items():
            held.apply(group, entries[:2])
        assert writes == []
        held.apply(3, groups_of(1)[3][2:])  # group 3 again: its first apply is written, with the others held so far
        assert writes == [{3: 2, 4: 2, 5: 2}]
        held.snapshot(4)
        assert writes == [{3: 2, 4: 2, 5: 2}, {3: 4}]
        for group in (4, 5):
            held.apply(group, groups_of(1)[group][2:])
    assert writes == [{3: 2, 4: 2, 5: 2}, {3: 4}, {4: 4, 5: 4}]
    topics = {f"g{group}": 2 for group in (3, 4, 5)}
    expected = state(alone, topics)
    assert all(stats["next_offset"] == 100 for stats, _, _ in expected.values())
    for _ in range(2):
        assert state(held, topics) == expected
        held.close()
        held = Node(tmp_path / "held")
    held.close()
    alone.close()


def test_only_a_groups_leader_counts_its_bytes_in_as_it_applies_them(tmp_path):
    """The load history's bytes in: a group's leader counts what it applies, a follower nothing, so that the report
    follows the leadership; what was counted is taken once, even if the leadership moved on before the taking."""
    store = Node(tmp_path)
    led = {3}
    store.store.leads = lambda group: group in led
    store.apply(3, [append_entry(1, "orders", 0, make_batch(0, 10))])
    store.apply(4, [append_entry(1, "orders", 1, make_batch(0, 10))])
    led.clear()  # group 3's leadership moved: what it counted as leader stays counted
    store.apply(3, [append_entry(2, "orders", 0, make_batch(10, 10))])
    taken = store.take_bytes_in()
    assert list(taken) == [("orders", 3)] and taken[("orders", 3)] == len(make_batch(0, 10))
    assert store.take_bytes_in() == {}
    store.close()


def test_unknown_queues_read_as_empty(tmp_path):
    """A queue nothing was applied to has no data, zero stats, and offset 0 for any time; reading
    past its end is OFFSET_OUT_OF_RANGE."""
    store = Node(tmp_path)
    assert store.reads.queue_stats("t", 0) == {"min_offset": 0, "next_offset": 0, "bytes": 0}
    assert store.reads.read("t", 0, 0, 100) == []
    assert store.reads.offset_for_time("t", 0, APPEND_MS) == 0
    assert store.reads.applied(GROUP) == 0
    with pytest.raises(RocketError) as caught:
        store.reads.read("t", 0, 5, 100)
    assert caught.value.code == Code.OFFSET_OUT_OF_RANGE
    store.close()


# ---- idempotent re-apply ---------------------------------------------------------------------------


def test_reapplying_after_reopen_is_idempotent(tmp_path):
    """After a restart the Raft group re-applies entries the store already holds: they are skipped
    (None results), nothing is written, and entries partly old partly new apply only the new ones."""
    entries = workload(batches=40, per_batch=50)
    assert fill(tmp_path, entries, per_call=5) == expected_results(40, 50)
    store = Node(tmp_path)
    before = state(store, {"t": 2})
    writes = index_writes(store)
    assert store.apply(GROUP, entries) == [None] * 40
    assert store.apply(GROUP, entries[10:20]) == [None] * 10
    assert writes == []
    assert state(store, {"t": 2}) == before

    # Entries 36..45: the first five are old, the last five new (batches 40..44).
    more = workload(batches=5, per_batch=50, first_index=41, first_batch=40)
    results = store.apply(GROUP, entries[35:] + more)
    assert results == [None] * 5 + expected_results(5, 50, first_batch=40)
    assert store.reads.applied(GROUP) == 45
    assert [len(bodies(store, "t", q)) for q in range(2)] == [1000 + 150, 1000 + 100]
    queue_0 = bodies(store, "t", 0)
    assert len(set(queue_0)) == len(queue_0)  # no message stored twice
    assert queue_0[-1].startswith(b"%d:" % (44 * 50 + 49))
    store.close()

    store = Node(tmp_path)
    assert store.reads.applied(GROUP) == 45
    assert store.apply(GROUP, entries + more) == [None] * 45
    assert store.reads.queue_stats("t", 0)["next_offset"] == 1150
    store.close()


def test_reapplying_without_a_restart_is_idempotent(tmp_path):
    """The same entries given twice to a live store are stored once."""
    store = Node(tmp_path)
    entries = workload(batches=6, per_batch=10)
    assert store.apply(GROUP, entries[:4]) == expected_results(4, 10)
    assert store.apply(GROUP, entries) == [None] * 4 + expected_results(2, 10, first_batch=4)
    assert store.apply(GROUP, entries) == [None] * 6
    assert [store.reads.queue_stats("t", q)["next_offset"] for q in range(2)] == [30, 30]
    assert store.apply(GROUP, []) == []
    store.close()


def test_empty_entries_are_skipped_but_advance_the_applied_index(tmp_path):
    """A new leader's empty entry stores nothing, yet counts as applied (also after a reopen)."""
    store = Node(tmp_path)
    assert store.apply(GROUP, [Entry(1, 1, b"")]) == [None]
    assert store.reads.applied(GROUP) == 1
    assert store.reads.queue_stats("t", 0)["next_offset"] == 0
    results = store.apply(GROUP, [append_entry(2, "t", 0, make_batch(0, 3)), Entry(2, 3, b""),
                                  append_entry(4, "t", 0, make_batch(3, 4))])
    assert results == [(0, 3), None, (3, 4)]
    store.close()
    store = Node(tmp_path)
    assert store.reads.applied(GROUP) == 4
    assert [b.split(b":")[0] for b in bodies(store, "t", 0)] == [b"%d" % i for i in range(7)]
    assert store.apply(GROUP, [Entry(3, 5, b"")]) == [None]
    assert store.reads.applied(GROUP) == 5
    store.close()


# ---- consumer offsets ------------------------------------------------------------------------------


def test_offsets_commits_are_visible_and_durable(tmp_path):
    """Offsets committed through the group's log are visible at once, survive a reopen and a lost
    index, and an old commit re-applied after a restart does not overwrite a newer one."""
    store = Node(tmp_path)
    results = store.apply(GROUP, [
        offsets_entry(1, "billing", "t", {0: 10, 3: 7}),
        append_entry(2, "t", 0, make_batch(0, 5)),
        offsets_entry(3, "audit", "t", {1: 4}),
    ])
    assert results == [None, (0, 5), None]
    assert store.reads.fetch_offsets("billing", "t") == {0: 10, 3: 7}
    assert store.apply(GROUP, [offsets_entry(4, "billing", "t", {0: 12})]) == [None]
    assert store.reads.fetch_offsets("billing", "t") == {0: 12, 3: 7}
    assert store.reads.fetch_offsets("audit", "t") == {1: 4}
    assert store.reads.fetch_offsets("billing", "u") == {}
    assert store.reads.fetch_offsets("nobody", "t") == {}
    store.close()

    store = Node(tmp_path)
    assert store.reads.fetch_offsets("billing", "t") == {0: 12, 3: 7}
    # The commit at entry 1 comes again after a restart, carrying other values: it is skipped.
    assert store.apply(GROUP, [offsets_entry(1, "billing", "t", {0: 99, 3: 99})]) == [None]
    assert store.reads.fetch_offsets("billing", "t") == {0: 12, 3: 7}
    store.close()

    shutil.rmtree(tmp_path / "index")
    store = Node(tmp_path)
    assert store.reads.fetch_offsets("billing", "t") == {0: 12, 3: 7}
    assert store.reads.fetch_offsets("audit", "t") == {1: 4}
    assert store.reads.applied(GROUP) == 4
    store.close()


# ---- the index is derived from the WAL -------------------------------------------------------------


def test_lost_index_is_rebuilt_from_the_wal(tmp_path):
    """Deleting the LevelDB index loses nothing while the WAL holds the groups' entries: applying them
    again at open (as the Raft host does) gives identical reads, stats, time search, offsets and
    applied indexes of every group."""
    store = Node(tmp_path)
    apply_in_chunks(store, GROUP, workload(batches=60, per_batch=100, size=500), per_call=4)
    store.apply(GROUP, [offsets_entry(61, "billing", "t", {0: 1500, 1: 20})])
    store.apply(9, workload(batches=6, per_batch=10, topic="u", queues=3))
    before = state(store, {"t": 2, "u": 3})
    times = [store.reads.offset_for_time("t", q, APPEND_MS + s * 1000) for q in range(2) for s in range(0, 62, 5)]
    store.close()

    shutil.rmtree(tmp_path / "index")
    store = Node(tmp_path)
    assert state(store, {"t": 2, "u": 3}) == before
    assert [store.reads.offset_for_time("t", q, APPEND_MS + s * 1000) for q in range(2) for s in range(0, 62, 5)] == times
    assert store.reads.fetch_offsets("billing", "t") == {0: 1500, 1: 20}
    assert (store.reads.applied(GROUP), store.reads.applied(9)) == (61, 6)
    # The rebuilt store goes on where it was and still skips what it holds.
    assert store.apply(GROUP, workload(batches=1, per_batch=100, size=500, first_index=61, first_batch=60)) == [None]
    assert store.apply(GROUP, [append_entry(62, "t", 1, make_batch(0, 1))]) == [(3000, 1)]
    store.close()


# ---- damage ----------------------------------------------------------------------------------------


def test_a_damaged_batch_in_the_wal_fails_the_read(tmp_path):
    """A batch damaged where it lies in the WAL (a segment before the WAL's replay mark, which the WAL
    does not read again at open) is caught by the batch's own checksum when read, never returned as
    data; the other batches still read."""
    store = Node(tmp_path)
    apply_in_chunks(store, GROUP, workload(batches=60, per_batch=100, size=500), per_call=10)
    before = state(store, {"t": 2})
    store.wal.checkpoint([])  # replay starts after these segments; a storage node's WAL keeps them
    [damaged], _ = store.index.locate("t", 0, 1000, 1)  # batch 20, in the WAL's first segments
    assert damaged.base_offset == 1000 and damaged.position < store.wal.replay_start()
    store.close()
    overwrite_in_wal(store, damaged.position + damaged.batch_bytes // 2, b"\xde\xad\xbe\xef")

    store = Node(tmp_path)
    for offset in (1000, 1050, 900):  # the damaged batch, from its start, its middle, or the one before
        with pytest.raises(RocketError) as caught:
            store.reads.read("t", 0, offset, 1 << 20)
        assert caught.value.code == Code.CORRUPT_DATA
        assert "t/0@1000" in caught.value.message and f"WAL position {damaged.position}" in caught.value.message
    assert store.reads.read("t", 0, 900, 1) == before[("t", 0)][2][9:10]
    assert store.reads.read("t", 0, 1100, 1 << 30) == before[("t", 0)][2][11:]
    assert (store.reads.queue_stats("t", 1), bodies(store, "t", 1)) == before[("t", 1)][:2]
    assert store.reads.queue_stats("t", 0) == before[("t", 0)][0]
    store.close()


def test_a_wal_cut_back_under_indexed_batches_is_damage(tmp_path):
    """The last WAL record damaged on disk is cut at open like a torn tail, though the store indexed
    the batch in it (it was fsynced before it was applied): the store must call that damage, at open or
    when the batch is read, never tell a reader that an offset below the queue's end is out of range."""
    store = Node(tmp_path)
    apply_in_chunks(store, GROUP, workload(batches=10, per_batch=10), per_call=1)
    [last], _ = store.index.locate("t", 1, 40, 1)
    assert last.position + last.batch_bytes == store.wal.log.end_position  # batch 9 ends the WAL
    store.close()
    overwrite_in_wal(store, last.position + last.batch_bytes // 2, b"\xde\xad\xbe\xef")
    try:
        store = Node(tmp_path)
    except RocketError as refused:
        assert refused.code == Code.CORRUPT_DATA
        return
    assert store.wal.log.end_position < last.position  # the WAL dropped the record holding batch 9
    assert store.reads.queue_stats("t", 1)["next_offset"] == 50
    with pytest.raises(RocketError) as caught:
        store.reads.read("t", 1, 40, 1 << 20)
    store.close()
    assert caught.value.code == Code.CORRUPT_DATA, caught.value


def test_a_wal_batch_that_disagrees_with_the_index_is_reported(tmp_path):
    """A valid batch in the WAL whose message count is not the one the index holds for that place is
    damage (the index points at the wrong bytes): CORRUPT_DATA, not messages at wrong offsets."""
    store = Node(tmp_path)
    two = batch_codec.encode([Message(b"a" * 100), Message(b"b" * 100)], APPEND_MS)
    one = next(batch for batch in (batch_codec.encode([Message(b"c" * n)], APPEND_MS) for n in range(1, 400))
               if len(batch) == len(two))
    assert store.apply(GROUP, [append_entry(1, "t", 0, two), append_entry(2, "t", 0, make_batch(2, 3))]) == \
        [(0, 2), (2, 3)]
    [placed, _], _ = store.index.locate("t", 0, 0, 1 << 20)
    assert store.wal.log.read_slice(placed.position, placed.batch_bytes) == two
    overwrite_in_wal(store, placed.position, one)
    with pytest.raises(RocketError) as caught:
        store.reads.read("t", 0, 0, 1 << 20)
    assert caught.value.code == Code.CORRUPT_DATA
    assert "1 messages" in caught.value.message and "the index says 2" in caught.value.message
    assert [base for base, _ in store.reads.read("t", 0, 2, 1 << 20)] == [2]
    store.close()


# ---- snapshots -------------------------------------------------------------------------------------


def snapshot_source(directory: Path) -> Node:
    """A store holding group GROUP (topic t, 2 queues, entries 1..20 and a commit at 21) and group 9
    (topic u, entries 1..4)."""
    store = Node(directory)
    apply_in_chunks(store, GROUP, workload(batches=20, per_batch=10), per_call=3)
    store.apply(GROUP, [offsets_entry(21, "billing", "t", {0: 5})])
    store.apply(9, workload(batches=4, per_batch=7, topic="u", queues=1))
    return store


def test_snapshots_leave_the_sync_to_the_raft_host(tmp_path, monkeypatch):
    """Taking a snapshot does no I/O (it runs on the trio thread); the sync the Raft host calls before
    writing it makes what was applied durable: a synced write to each LevelDB."""
    store = Node(tmp_path)
    store.apply(GROUP, [append_entry(1, "t", 0, make_batch(0, 2))])
    synced = []
    for name in ("index", "kv"):
        db = getattr(store.store, name)._db
        monkeypatch.setattr(getattr(store.store, name), "_db", SyncSpy(db, name, synced))
    list(store.snapshot(GROUP))
    assert store.fsyncs == 0 and synced == []
    store.sync()
    assert store.fsyncs == 1 and sorted(synced) == ["index", "kv"]
    store.close()


class SyncSpy:
    """A LevelDB that notes its synced writes."""

    def __init__(self, db, name: str, synced: list[str]):
        self._db, self._name, self._synced = db, name, synced

    def put(self, key: bytes, value: bytes, sync: bool = False) -> None:
        if sync:
            self._synced.append(self._name)
        self._db.put(key, value, sync=sync)

    def __getattr__(self, name: str):
        return getattr(self._db, name)


def test_a_sync_waits_for_one_in_flight_in_another_thread(tmp_path, monkeypatch):
    """Two threads sync the same log: the second returns only once the first one's fdatasync (of
    what the second must see durable too) is done, not as soon as it finds nothing left to sync."""
    import threading

    from rocket.disk import commitlog

    log = CommitLog.open(tmp_path / "log", segment_bytes_max=limits.segment_bytes_min)
    log.append([(1, b"record")])
    held, release = threading.Event(), threading.Event()
    real_fdatasync = commitlog.os.fdatasync

    def slow_fdatasync(descriptor: int) -> None:
        held.set()
        release.wait(10)
        real_fdatasync(descriptor)

    monkeypatch.setattr(commitlog.os, "fdatasync", slow_fdatasync)
    first = threading.Thread(target=log.sync)
    first.start()
    assert held.wait(10)
    second_done = threading.Event()
    second = threading.Thread(target=lambda: (log.sync(), second_done.set()))
    second.start()
    assert not second_done.wait(0.2)  # the first fdatasync is still in flight
    release.set()
    first.join(10)
    second.join(10)
    assert second_done.is_set()
    log.close()



def _record_drops(monkeypatch, log: CommitLog, advice: int = os.POSIX_FADV_DONTNEED) -> list[tuple[int, int]]:
    """Record a log's page-cache advice of one kind as (first, end) log positions, and give it for real too."""
    commitlog = commitlog_module
    drops: list[tuple[int, int]] = []
    real_fadvise = commitlog._fadvise

    def fadvise(descriptor: int, offset: int, length: int, given: int) -> None:
        if given == advice:
            start = int(Path(os.readlink(f"/proc/self/fd/{descriptor}")).name[: -len(commitlog.SUFFIX)])
            drops.append((start + offset, start + offset + length))
        real_fadvise(descriptor, offset, length, given)

    monkeypatch.setattr(commitlog, "_fadvise", fadvise)
    return drops


def _union(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    merged: list[tuple[int, int]] = []
    for first, end in sorted(ranges):
        if merged and first <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((first, end))
    return merged


@pytest.mark.skipif(not hasattr(os, "posix_fadvise"), reason="no posix_fadvise on this OS")
def test_a_log_with_cached_bytes_drops_the_pages_of_older_bytes_once_written_or_read(tmp_path, monkeypatch):
    """Writes drop the pages of everything but the newest cached_bytes, across segments and exactly once;
    reads before the cached part drop the pages they read, reads within it nothing; the bytes read back
    intact. Without cached_bytes the log drops nothing."""
    cached = 300_000
    log = CommitLog.open(tmp_path / "log", segment_bytes_max=limits.segment_bytes_min, cached_bytes=cached)
    drops = _record_drops(monkeypatch, log)
    bodies = [os.urandom(100_000) for _ in range(40)]  # 4 MB over several 1 MiB segments
    positions = []
    for body in bodies:
        positions += log.append([(1, body)])
        log.sync()
        assert _union(drops) == ([(0, log.cached_from)] if log.cached_from > 0 else [])
    assert len(log.segment_starts()) > 3 and sum(end - first for first, end in drops) == log.cached_from
    drops.clear()
    old, recent = positions[2], positions[-1]
    assert log.read(old) == (1, bodies[2]) and log.read(recent) == (1, bodies[-1])
    header = commitlog_module.HEADER_BYTES
    assert _union(drops) == [(old, old + header + len(bodies[2]))]  # the record header and body; the recent one stays
    drops.clear()
    assert log.read_slice(old + header, 10) == bodies[2][:10] and drops == [(old + header, old + header + 10)]
    log.close()

    plain = CommitLog.open(tmp_path / "plain", segment_bytes_max=limits.segment_bytes_min)
    drops = _record_drops(monkeypatch, plain)
    for body in bodies:
        plain.append([(1, body)])
    plain.sync()
    assert plain.read(0) == (1, bodies[0]) and drops == [] and plain.cached_from == plain.start_position
    plain.close()


@pytest.mark.parametrize("short_writes", [False, True])
def test_a_round_is_written_in_calls_of_at_most_the_write_limit(tmp_path, monkeypatch, short_writes):
    """Many records, and a record bigger than the limit, go out in writev calls of at most log_write_bytes_max
    bytes each, filled as far as the limit lets; short writes resume where they stopped; the records read back."""
    step = 256 * 1024
    monkeypatch.setattr(limits, "log_write_bytes_max", step)
    log = CommitLog.open(tmp_path / "log", segment_bytes_max=limits.segment_bytes_default)
    calls: list[int] = []
    real_writev = os.writev

    def writev(descriptor, buffers):
        calls.append(sum(len(buffer) for buffer in buffers))
        if short_writes:  # the kernel may take fewer bytes than asked, even mid-buffer
            return real_writev(descriptor, [memoryview(buffers[0])[: max(1, len(buffers[0]) // 2)]])
        return real_writev(descriptor, buffers)

    monkeypatch.setattr(commitlog_module.os, "writev", writev)
    bodies = [os.urandom(size) for size in (100_000, 100_000, 700_000, 3_000, 1_000_000)]
    positions = log.append([(1, body) for body in bodies])
    total = sum(commitlog_module.HEADER_BYTES + len(body) for body in bodies)
    assert max(calls) <= step
    if not short_writes:  # each call took as much as the limit let it: no two in a row would have fit in one
        assert sum(calls) == total and all(first + second > step for first, second in zip(calls, calls[1:]))
    assert log.end_position == total and [log.read(position)[1] for position in positions] == bodies
    log.close()


@pytest.mark.skipif(not hasattr(os, "posix_fadvise"), reason="no posix_fadvise on this OS")
def test_read_ahead_advises_each_span_in_its_segment(tmp_path, monkeypatch):
    """read_ahead asks the kernel to read each span where it lies, across segments; spans whose segment was
    deleted are skipped."""
    log = CommitLog.open(tmp_path / "log", segment_bytes_max=limits.segment_bytes_min)
    positions = [log.append([(1, os.urandom(300_000))])[0] for _ in range(8)]
    log.sync()
    advised = _record_drops(monkeypatch, log, os.POSIX_FADV_WILLNEED)
    spans = [(position + commitlog_module.HEADER_BYTES, 1000) for position in positions]
    log.read_ahead(spans)
    assert advised == [(first, first + length) for first, length in spans]
    advised.clear()
    log.delete_before(log.segment_starts()[2])
    log.read_ahead(spans)
    assert advised == [(first, first + length) for first, length in spans if first >= log.start_position]
    log.close()


def test_a_detached_read_of_a_deleted_segment_is_out_of_range(tmp_path):
    """A detached read (a worker thread's, with a descriptor of its own) of bytes whose segment was deleted
    says so with OFFSET_OUT_OF_RANGE, while the segments left read as before, detached or not."""
    log = CommitLog.open(tmp_path / "log", segment_bytes_max=limits.segment_bytes_min)
    bodies = [os.urandom(300_000) for _ in range(8)]
    positions = [log.append([(1, body)])[0] for body in bodies]
    log.sync()
    header = commitlog_module.HEADER_BYTES
    assert log.read_slice(positions[0] + header, 100, detached=True) == bodies[0][:100]
    assert log.delete_before(log.segment_starts()[2]) == 2
    with pytest.raises(RocketError) as caught:
        log.read_slice(positions[0] + header, 100, detached=True)
    assert caught.value.code == Code.OFFSET_OUT_OF_RANGE
    last = positions[-1] + header
    assert log.read_slice(last, 100, detached=True) == log.read_slice(last, 100) == bodies[-1][:100]
    log.close()


def test_snapshot_restore_makes_replicas_assign_the_same_offsets(tmp_path):
    """A replica that installs a group's snapshot takes its applied index and queue positions (and
    nothing of other groups), so later entries get the same offsets on both."""
    source = snapshot_source(tmp_path / "one")
    data = list(source.snapshot(GROUP))
    replica = Node(tmp_path / "two")
    replica.restore(GROUP, data)
    assert replica.applied(GROUP) == source.applied(GROUP) == 21
    assert replica.applied(9) == 0
    for queue in range(2):
        assert replica.queue_stats("t", queue)["next_offset"] == source.queue_stats("t", queue)["next_offset"] == 100
        assert replica.queue_stats("t", queue)["bytes"] == source.queue_stats("t", queue)["bytes"]
    assert replica.queue_stats("u", 0)["next_offset"] == 0  # group 9's queue is not in group GROUP's snapshot

    more = workload(batches=6, per_batch=10, first_index=22, first_batch=20)
    expected = expected_results(6, 10, first_batch=20)
    assert expected[0] == (100, 10)
    assert source.apply(GROUP, more) == replica.apply(GROUP, more) == expected
    assert replica.read("t", 1, 110, 1 << 20) == source.read("t", 1, 110, 1 << 20)
    assert replica.apply(GROUP, more) == [None] * 6

    # The replica keeps what it installed across a reopen.
    replica.close()
    replica = Node(tmp_path / "two")
    assert replica.applied(GROUP) == 27
    assert [replica.queue_stats("t", q)["next_offset"] for q in range(2)] == [130, 130]
    later = workload(batches=2, per_batch=10, first_index=28, first_batch=26)
    assert source.apply(GROUP, later) == replica.apply(GROUP, later) == [(130, 10), (130, 10)]
    replica.close()
    source.close()


def test_a_restored_replica_refuses_reads_of_batches_it_lacks(tmp_path):
    """Offsets before the installed snapshot are not on the replica: UNAVAILABLE (a broker then asks
    another replica), never a silent skip to later batches; min_offset says where its data starts."""
    source = snapshot_source(tmp_path / "one")
    replica = Node(tmp_path / "two")
    replica.restore(GROUP, list(source.snapshot(GROUP)))
    replica.apply(GROUP, workload(batches=2, per_batch=10, first_index=22, first_batch=20))
    with pytest.raises(RocketError) as refused:
        replica.read("t", 0, 0, 1 << 20)
    assert refused.value.code == Code.UNAVAILABLE
    assert replica.queue_stats("t", 0)["min_offset"] == 100
    assert [base for base, _ in replica.read("t", 0, 100, 1 << 20)] == [100]
    replica.close()
    source.close()


def test_a_restored_replica_backfills_its_gap_in_chunks_and_keeps_it(tmp_path):
    """The batches a replica lacks, fetched from another one in chunks and written to its WAL, make it
    hold what the source holds, across a reopen; a chunk that leaves a hole or a last chunk that ends
    short of the gap is refused. An index rebuilt from the snapshot and the WAL has the gap again, to
    be fetched again (what backfill writes is not in the group's log)."""
    source = snapshot_source(tmp_path / "one")
    replica = Node(tmp_path / "two")
    replica.restore(GROUP, list(source.snapshot(GROUP)))
    later = workload(batches=2, per_batch=10, first_index=22, first_batch=20)
    assert replica.apply(GROUP, later) == source.apply(GROUP, later)
    assert replica.gaps() == [(GROUP, "t", 0, 100), (GROUP, "t", 1, 100)]
    fetched = [(base, batch) for base, batch in source.read("t", 0, 0, 1 << 30) if base < 100]  # the gap
    first, second = fetched[:4], fetched[4:]
    start = replica.backfill("t", 0, first, replica.wal.write_data([batch for _, batch in first]), None, last=False)
    assert start == first[-1][0] + 10 and replica.gaps()[0] == (GROUP, "t", 0, 100)
    with pytest.raises(RocketError) as hole:
        replica.backfill("t", 0, second[1:], replica.wal.write_data([batch for _, batch in second[1:]]), start,
                         last=True)
    assert hole.value.code == Code.CORRUPT_DATA
    with pytest.raises(RocketError) as short:
        replica.backfill("t", 0, second[:-1], replica.wal.write_data([batch for _, batch in second[:-1]]), start,
                         last=True)
    assert short.value.code == Code.CORRUPT_DATA
    replica.backfill("t", 0, second, replica.wal.write_data([batch for _, batch in second]), start, last=True)
    assert replica.gaps() == [(GROUP, "t", 1, 100)]
    assert replica.read("t", 0, 0, 1 << 30) == source.read("t", 0, 0, 1 << 30)
    assert replica.queue_stats("t", 0) == source.queue_stats("t", 0)
    replica.close()
    replica = Node(tmp_path / "two")
    assert replica.gaps() == [(GROUP, "t", 1, 100)]
    assert replica.read("t", 0, 0, 1 << 30) == source.read("t", 0, 0, 1 << 30)
    replica.close()
    shutil.rmtree(tmp_path / "two" / "index")
    replica = Node(tmp_path / "two")
    assert replica.gaps() == [(GROUP, "t", 0, 100), (GROUP, "t", 1, 100)]
    assert replica.read("t", 0, 100, 1 << 30) == source.read("t", 0, 100, 1 << 30)
    replica.close()
    source.close()


def test_restoring_an_old_snapshot_is_a_no_op(tmp_path):
    """A snapshot at or below what the store applied (as on a restart) changes nothing, nor does an
    empty one."""
    store = snapshot_source(tmp_path)
    old = list(store.snapshot(GROUP))
    store.apply(GROUP, workload(batches=2, per_batch=10, first_index=22, first_batch=20))
    current = list(store.snapshot(GROUP))
    before = state(store, {"t": 2})
    writes = index_writes(store)
    for data in (old, current, b""):
        store.restore(GROUP, data)
    store.restore(GROUP + 100, [])
    assert state(store, {"t": 2}) == before
    assert writes == []
    assert store.reads.applied(GROUP) == 23 and store.reads.applied(GROUP + 100) == 0

    replica = Node(tmp_path / "replica")
    replica.restore(GROUP, current)
    writes = index_writes(replica)
    replica.restore(GROUP, current)
    replica.restore(GROUP, old)
    assert writes == []
    assert replica.applied(GROUP) == 23
    assert [replica.queue_stats("t", q)["next_offset"] for q in range(2)] == [110, 110]
    replica.close()
    store.close()


def test_snapshot_after_a_reopen_carries_the_queue_positions(tmp_path):
    """A snapshot taken after a restart still carries the group's queue positions."""
    snapshot_source(tmp_path / "one").close()
    source = Node(tmp_path / "one")
    replica = Node(tmp_path / "two")
    replica.restore(GROUP, list(source.snapshot(GROUP)))
    assert replica.applied(GROUP) == 21
    assert [replica.queue_stats("t", q)["next_offset"] for q in range(2)] == [100, 100]
    more = workload(batches=2, per_batch=10, first_index=22, first_batch=20)
    assert replica.apply(GROUP, more) == source.apply(GROUP, more)
    replica.close()
    source.close()


def test_restored_positions_survive_an_index_rebuild(tmp_path):
    """The index is derived from the snapshot and the WAL: a replica that installed a snapshot and
    appended after it can lose its index and rebuild it."""
    source = snapshot_source(tmp_path / "one")
    replica = Node(tmp_path / "two")
    replica.restore(GROUP, list(source.snapshot(GROUP)))
    more = workload(batches=2, per_batch=10, first_index=22, first_batch=20)
    assert replica.apply(GROUP, more) == [(100, 10), (100, 10)]
    replica.close()
    shutil.rmtree(tmp_path / "two" / "index")
    replica = Node(tmp_path / "two")
    assert replica.applied(GROUP) == 23
    assert [replica.queue_stats("t", q)["next_offset"] for q in range(2)] == [110, 110]
    replica.close()
    source.close()


# ---- many groups in one store ----------------------------------------------------------------------


def test_interleaved_groups_keep_separate_applied_indexes(tmp_path):
    """Two groups applying in turn into one store: each skips only its own old entries, and their
    applied indexes survive a reopen and an index rebuild."""
    store = Node(tmp_path)
    a = workload(batches=30, per_batch=10, topic="a")
    b = workload(batches=5, per_batch=4, topic="b", queues=1)
    for step in range(5):
        assert store.apply(1, a[step * 6:(step + 1) * 6]) == expected_results(6, 10, first_batch=step * 6)
        assert store.apply(7, b[step:step + 1]) == [(step * 4, 4)]
    assert (store.reads.applied(1), store.reads.applied(7)) == (30, 5)
    # Index 6 is old for group 1 but new for group 7, and the other way round for nothing.
    assert store.apply(1, a[5:6]) == [None]
    assert store.apply(7, [append_entry(6, "b", 0, make_batch(20, 4))]) == [(20, 4)]
    assert (store.reads.applied(1), store.reads.applied(7)) == (30, 6)
    before = state(store, {"a": 2, "b": 1})
    store.close()

    for lose_index in (False, True):
        if lose_index:
            shutil.rmtree(tmp_path / "index")
        store = Node(tmp_path)
        assert (store.reads.applied(1), store.reads.applied(7)) == (30, 6)
        assert state(store, {"a": 2, "b": 1}) == before
        assert store.apply(7, b) == [None] * 5
        assert store.apply(1, a) == [None] * 30
        store.close()


# ---- long polling and the background sync ----------------------------------------------------------


async def test_wait_for_data_returns_at_once_when_data_is_there(tmp_path, autojump_clock):
    store = Node(tmp_path)
    store.apply(GROUP, [append_entry(1, "t", 0, make_batch(0, 5))])
    started = trio.current_time()
    await store.reads.wait_for_data({("t", 0): 4}, 30)
    await store.reads.wait_for_data({("t", 1): 0, ("t", 0): 0}, 30)
    assert trio.current_time() == started
    store.close()


async def test_wait_for_data_times_out_without_data(tmp_path, autojump_clock):
    """No data at or past the wanted offsets: it returns after the timeout, and forgets its watch."""
    store = Node(tmp_path)
    store.apply(GROUP, [append_entry(1, "t", 0, make_batch(0, 5))])
    started = trio.current_time()
    await store.reads.wait_for_data({("t", 0): 5, ("t", 1): 0}, 7)
    assert trio.current_time() - started == pytest.approx(7)
    assert store._watchers == {}
    store.close()


async def test_wait_for_data_wakes_when_an_apply_adds_data(tmp_path, autojump_clock):
    """A waiter wakes when an apply adds data to a queue it watches, not for other queues."""
    store = Node(tmp_path)
    store.apply(GROUP, [append_entry(1, "t", 0, make_batch(0, 5))])
    woke_at = []

    async def waiter():
        await store.reads.wait_for_data({("t", 0): 5, ("t", 1): 0}, 30)
        woke_at.append(trio.current_time())

    async with trio.open_nursery() as nursery:
        started = trio.current_time()
        nursery.start_soon(waiter)
        await trio.sleep(1)
        assert not woke_at
        store.apply(GROUP, [append_entry(2, "t", 2, make_batch(5, 1)), offsets_entry(3, "g", "t", {1: 0})])
        await trio.sleep(1)
        assert not woke_at
        store.apply(GROUP, [append_entry(4, "t", 1, make_batch(6, 1))])
        with trio.fail_after(1):
            while not woke_at:
                await trio.sleep(0.01)
    assert woke_at[0] - started < 3
    assert store._watchers == {}
    store.close()


async def test_background_sync_flushes_applied_entries(tmp_path, monkeypatch):
    """run() fsyncs applied writes within its interval, and only when there is something to sync."""
    interval_s = 0.02  # the real clock: the sync runs in a worker thread, which a mock clock jumps over
    monkeypatch.setattr(limits, "store_sync_s", interval_s)
    store = Node(tmp_path)
    async with trio.open_nursery() as nursery:
        await nursery.start(store.run)
        await trio.sleep(interval_s * 5)
        assert store.fsyncs == 0
        store.apply(GROUP, [append_entry(1, "t", 0, make_batch(0, 5))])
        with trio.fail_after(5):
            while store.fsyncs == 0:
                await trio.sleep(interval_s / 4)
        await trio.sleep(interval_s * 5)
        assert store.fsyncs == 1
        list(store.snapshot(GROUP))  # nothing left for it to sync
        assert store.fsyncs == 1
        nursery.cancel_scope.cancel()
    store.close()


# ---- reclaiming the WAL ------------------------------------------------------------------------------

def timed_batch(first: int, count: int, deliver_at_ms: int) -> bytes:
    return batch_codec.encode([Message(f"{first + i}:".encode(), deliver_at_ms=deliver_at_ms)
                               for i in range(count)], APPEND_MS)


def test_wal_references_list_live_batches_in_wal_order_and_follow_moves(tmp_path):
    """The index lists the batches lying in a WAL range; a batch copied forward reads from its copy, also
    after a restart; a move of a batch dropped meanwhile changes nothing. An index rebuilt from the WAL
    points at the batches where their entries lie, which stay until the moves are synced."""
    store = Node(tmp_path)
    apply_in_chunks(store, GROUP, workload(batches=20, per_batch=10, size=2000), per_call=1)
    live, settled = store.reclaim.wal_live(0, store.wal.log.end_position)
    assert settled == [] and [entry.position for _, _, entry in live] == sorted(entry.position for _, _, entry in live)
    assert [(topic, queue, entry.base_offset) for topic, queue, entry in live] == [
        ("t", i % 2, (i // 2) * 10) for i in range(20)]
    assert store.reclaim.wal_floor() == live[0][2].position
    before = {queue: bodies(store, "t", queue) for queue in range(2)}

    first_two = live[:2]
    positions = store.wal.write_data([store.reads.read_entry(topic, queue, entry) for topic, queue, entry in first_two])
    moved = store.reclaim.move_batches([(topic, queue, entry, position)
                                for (topic, queue, entry), position in zip(first_two, positions)])
    assert moved == sum(entry.batch_bytes for _, _, entry in first_two)
    assert store.reclaim.wal_floor() == live[2][2].position
    assert store.reclaim.move_batches([(*first_two[0], 1 << 40)]) == 0, "no longer where the move expects it"
    assert [store.timers.batch_entry(topic, queue, entry.base_offset).position
            for topic, queue, entry in first_two] == positions
    assert {queue: bodies(store, "t", queue) for queue in range(2)} == before
    store.close()

    store = Node(tmp_path)
    assert store.timers.batch_entry("t", 0, 0).position == positions[0]
    assert {queue: bodies(store, "t", queue) for queue in range(2)} == before
    store.close()
    shutil.rmtree(tmp_path / "index")
    store = Node(tmp_path)
    assert {queue: bodies(store, "t", queue) for queue in range(2)} == before
    assert store.reclaim.wal_floor() == live[0][2].position
    store.close()


def test_settled_timer_batches_are_forgotten_and_pending_ones_stay_live(tmp_path):
    """A timer batch whose messages all fired is forgotten (also after a restart; an index rebuilt from
    the WAL finds it settled again); one with a pending timer stays live."""
    store = Node(tmp_path)
    soon, late = APPEND_MS + 1_000, APPEND_MS + 10**9
    store.apply(GROUP, [Entry(1, 1, encode_timers("t", 0, APPEND_MS, timed_batch(0, 3, soon))),
                        Entry(1, 2, encode_timers("t", 0, APPEND_MS, timed_batch(3, 2, late)))])
    [(topic, queue, offsets, batch)] = store.timers.due_deliveries(GROUP, soon)
    store.apply(GROUP, [Entry(1, 3, encode_move(topic, queue, soon, timer_topic("t"),
                                                             offsets, batch))])
    live, settled = store.reclaim.wal_live(0, store.wal.log.end_position)
    assert settled == [(timer_topic("t"), 0, 0)]
    assert [(topic, entry.base_offset) for topic, _, entry in live] == [(timer_topic("t"), 3), ("t", 0)]
    store.reclaim.forget(settled)
    assert store.reclaim.wal_live(0, store.wal.log.end_position) == (live, [])
    store.close()
    store = Node(tmp_path)
    assert store.reclaim.wal_live(0, store.wal.log.end_position) == (live, [])
    store.close()
    shutil.rmtree(tmp_path / "index")
    store = Node(tmp_path)
    assert store.reclaim.wal_live(0, store.wal.log.end_position) == (live, settled)
    store.close()


async def test_fetch_reads_from_the_disk_in_a_thread_and_again_after_a_reclamation_race(tmp_path, monkeypatch):
    """With a WAL that keeps only its newest bytes cached, fetch() reads older batches in a worker thread. When
    WAL reclamation moves the batches on and deletes their segment between the index lookup and that read, the
    read fails and fetch() reads again from the index: the same batches, from where they lie now."""
    wal = Wal.open(tmp_path / "wal", SEGMENT, keep_segments=True, cached_bytes=SEGMENT)
    store = Store.open(tmp_path, wal.log)
    entries = workload(batches=16, per_batch=10, size=30_000, queues=1)
    written = wal.write([Update(GROUP, None, entries, None)])[GROUP]
    store.apply(GROUP, entries, [written[entry.index] for entry in entries])
    wal.sync()
    expected = store.reads.read("t", 0, 0, 4 * SEGMENT)
    assert len(expected) > 2 and len(wal.log.segment_starts()) > 3

    found, _ = await store.reads.fetch("t", 0, 0, 4 * SEGMENT)  # from the disk, in a thread: nothing raced
    assert found == expected

    real_read_entries = store.reads.read_entries
    raced = []

    def read_after_reclamation(topic, queue, entries, detached=False):
        if detached and not raced:  # what WalReclaim.reclaim does, just before this thread reads
            live, _ = store.reclaim.wal_live(wal.log.start_position, wal.log.end_position)
            positions = wal.write_data([real_read_entries(t, q, [e])[0][1] for t, q, e in live])
            store.reclaim.move_batches([(t, q, e, position) for (t, q, e), position in zip(live, positions)])
            wal.sync()
            store.sync()
            raced.append(wal.log.delete_before(store.reclaim.wal_floor()))
        return real_read_entries(topic, queue, entries, detached)

    monkeypatch.setattr(store.reads, "read_entries", read_after_reclamation)
    found, _ = await store.reads.fetch("t", 0, 0, 4 * SEGMENT)
    assert raced and raced[0] > 0 and found == expected
    store.close()
    wal.close()
