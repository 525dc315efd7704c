"""The Raft codecs round-trip and refuse garbage; the WAL restores every group after a crash; the host's
rounds overlap writes with fsyncs, yet nothing leaves a node or is applied before its fsync."""

from __future__ import annotations

import errno
import struct
import threading
import time
import zlib
from contextlib import asynccontextmanager

import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st

from rocket import limits
from rocket.errors import Code, RocketError, collapse_single_error
from rocket.raft import codec
from rocket.raft.core import Entry, EntryKind, HardState, Message, MessageType, Snapshot
from rocket.raft.host import RaftHost
from rocket.raft.wal import Update, Wal
from rocket.disk.commitlog import CommitLog
from rocket.disk.record import LEGACY_MAGIC

entries = st.lists(st.builds(Entry, st.integers(0, 2**40), st.integers(1, 2**40), st.binary(max_size=50),
                             st.sampled_from(list(EntryKind))), max_size=4)
snapshots = st.builds(Snapshot, st.integers(0, 2**40), st.integers(0, 2**40),
                      st.lists(st.integers(1, 99), max_size=5).map(tuple),
                      st.lists(st.integers(100, 199), max_size=3).map(tuple), st.binary(max_size=40))
messages = st.builds(Message, st.sampled_from(list(MessageType)), st.integers(1, 9), st.integers(1, 9),
                     st.integers(0, 2**40), st.integers(0, 2**40), st.integers(0, 2**40), entries.map(tuple),
                     st.integers(0, 2**40), st.booleans(), st.integers(0, 2**40), st.integers(0, 2**40),
                     st.none() | snapshots, st.booleans(), st.integers(0, 2**40)).filter(
    lambda message: message.type != MessageType.SNAPSHOT or message.snapshot is not None)


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


def test_a_snapshot_message_without_its_snapshot_is_refused():
    """A peer's SNAPSHOT message must carry the snapshot: without it the core had nothing to install, and failed."""
    payload = codec.encode_messages([(7, Message(MessageType.SNAPSHOT, 2, 1, 3))])
    with pytest.raises(RocketError, match="snapshot message without its snapshot") as caught:
        codec.decode_messages(payload)
    assert caught.value.code == Code.BAD_REQUEST


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
    from rocket.raft.rounds import _chunks

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


class _GatedWal(Wal):
    """A WAL whose fsyncs each wait for the test to let them finish; it knows, per group, the last entry
    index that a finished fsync made durable."""

    def __init__(self, *arguments, **keywords):
        super().__init__(*arguments, **keywords)
        self.gate = threading.Semaphore(0)
        self.writes = 0
        self.syncs_begun = 0
        self.written: dict[int, int] = {}  # group -> last entry index written
        self.commits: dict[int, int] = {}  # group -> the commit of the last hard state written
        self.durable: dict[int, int] = {}  # group -> last entry index made durable by a finished fsync

    def write(self, updates):
        self.writes += 1
        for update in updates:
            if update.entries:
                self.written[update.group] = update.entries[-1].index
            if update.hard_state is not None:
                self.commits[update.group] = update.hard_state.commit
        return super().write(updates)

    def sync(self):
        covered = dict(self.written)
        self.syncs_begun += 1
        self.gate.acquire()
        super().sync()
        self.durable = covered


class _CheckedMachine:
    """Records what it applies, and fails the test if an entry arrives before it is durable here."""

    def __init__(self, wal: _GatedWal, group: int):
        self.wal, self.group = wal, group
        self.applied: list[bytes] = []
        self.early: list[int] = []

    def apply(self, entries, positions):
        self.early += [e.index for e in entries if e.index > self.wal.durable.get(self.group, 0)]
        self.applied += [entry.data for entry in entries]
        return [None] * len(entries)

    def snapshot(self) -> list[bytes]:
        return []

    def restore(self, chunks) -> None:
        pass


async def _eventually(condition, what: str) -> None:
    with trio.move_on_after(10):
        while not condition():
            await trio.sleep(0.005)
        return
    raise AssertionError(f"not within 10 s: {what}")


@asynccontextmanager
async def _running(host, wal: _GatedWal):
    """Run the host; on the way out, however it is left, open every gate so that no fsync stays held."""
    async with trio.open_nursery() as nursery:
        await nursery.start(host.run)
        try:
            yield nursery
        finally:
            wal.gate.release(1000)
            nursery.cancel_scope.cancel()


def _append(group: int, index: int, commit: int) -> bytes:
    """Leader 2's append of entry index (term 1) to node 1, telling it commit."""
    message = Message(MessageType.APPEND, 2, 1, 1, 1 if index > 1 else 0, index - 1,
                      (Entry(1, index, b"e%d" % index),), commit)
    return codec.encode_messages([(group, message)])


def _with_heartbeat(group: int, payload: bytes) -> bytes:
    """The payload's messages and a heartbeat of leader 2: a message other than an append, which takes a round now
    instead of waiting for the fsync that runs."""
    heartbeat = Message(MessageType.HEARTBEAT, 2, 1, 1, 0, 0, (), 0)
    return codec.encode_messages(codec.decode_messages(payload) + [(group, heartbeat)])


def _acknowledged(sent: list[Message]) -> list[int]:
    """The entry indexes node 1 acknowledged, in the order it sent them."""
    return [m.index for m in sent if m.type == MessageType.APPEND_RESPONSE and not m.reject]


def test_a_rounds_messages_and_entries_wait_for_its_fsync_while_the_next_round_is_written(tmp_path):
    """Persist before send with overlapped rounds: while a round's fsync is held back, the next round's
    entries are written (a heartbeat came with them: it takes a round now), yet no acknowledgement leaves the node
    and no entry is applied until the fsync covering it is done."""
    group = 7
    wal = _GatedWal.open(tmp_path)
    machine = _CheckedMachine(wal, group)
    sent: list[Message] = []
    early: list[Message] = []

    def post(node: int, payload: bytes) -> None:
        for _, message in codec.decode_messages(payload):
            sent.append(message)
            if message.type == MessageType.APPEND_RESPONSE and message.index > wal.durable.get(group, 0):
                early.append(message)

    async def scenario() -> None:
        host = RaftHost(1, wal, post, tick_s=3600)
        async with _running(host, wal):
            host.add_group(group, (1, 2, 3), machine)
            host.receive(_append(group, 1, 0))
            await _eventually(lambda: wal.syncs_begun == 1, "the first round's fsync begins")
            host.receive(_with_heartbeat(group, _append(group, 2, 1)))  # commits entry 1
            await _eventually(lambda: wal.writes == 2, "the second round is written during the first fsync")
            await trio.sleep(0.05)
            assert _acknowledged(sent) == [] and machine.applied == []
            wal.gate.release()  # the first round is durable: entry 1 is acknowledged and applied, not entry 2
            await _eventually(lambda: _acknowledged(sent) == [1] and machine.applied == [b"e1"], "entry 1 released")
            await trio.sleep(0.05)
            assert _acknowledged(sent) == [1]
            wal.gate.release()  # the second round is durable: entry 2 is acknowledged
            await _eventually(lambda: _acknowledged(sent) == [1, 2], "entry 2 acknowledged")

    trio.run(scenario)
    wal.close()
    assert early == [] and machine.early == []


def test_a_proposal_is_answered_only_after_the_fsync_of_its_entry(tmp_path):
    """A leader alone in its group counts its own written copy towards the commit at once, yet its
    proposers hear back only after the fsync that covers their entries."""
    wal = _GatedWal.open(tmp_path)
    machine = _CheckedMachine(wal, 3)
    answers: list[tuple[int, int]] = []  # (entry index, last durable index when answered)

    async def scenario() -> None:
        host = RaftHost(1, wal, lambda node, payload: None, tick_s=3600)
        async with _running(host, wal) as nursery:
            host.add_group(3, (1,), machine)

            async def slow_fsyncs() -> None:  # each fsync is held a while, then let through
                released = 0
                while True:
                    await trio.sleep(0.01)
                    if wal.syncs_begun > released:
                        released += 1
                        wal.gate.release()

            async def propose(number: int) -> None:
                index = await host.propose(3, b"p%d" % number)
                answers.append((index, wal.durable.get(3, 0)))

            nursery.start_soon(slow_fsyncs)
            async with trio.open_nursery() as proposers:
                for number in range(20):
                    proposers.start_soon(propose, number)
                    await trio.sleep(0.004)

    trio.run(scenario)
    wal.close()
    assert len(answers) == 20 and all(index <= durable for index, durable in answers)
    assert machine.early == [] and sorted(d for d in machine.applied if d) == sorted(b"p%d" % n for n in range(20))


def test_a_leaders_small_proposals_gather_while_an_fsync_runs_and_a_large_one_is_written_at_once(tmp_path):
    """Group commit: proposals made while an fsync runs are written together when it ends, as one round
    with one fsync (a round costs the event loop more than an entry); once limits.raft_round_wait_bytes_max
    of them wait, the round is written at once, its write overlapping the fsync."""
    wal = _GatedWal.open(tmp_path)
    machine = _CheckedMachine(wal, 3)
    answered: list[int] = []

    async def scenario() -> None:
        host = RaftHost(1, wal, lambda node, payload: None, tick_s=3600)
        async with _running(host, wal) as nursery:
            host.add_group(3, (1,), machine)
            await _eventually(lambda: wal.syncs_begun == 1, "the election's round is being synced")
            wal.gate.release()

            async def propose(data: bytes) -> None:
                answered.append(await host.propose(3, data))

            nursery.start_soon(propose, b"first")
            await _eventually(lambda: wal.syncs_begun == 2, "the first proposal's fsync begins")
            writes = wal.writes
            for number in range(5):  # spread out: each would be a round of its own if rounds did not wait
                nursery.start_soon(propose, b"small %d" % number)
                await trio.sleep(0.01)
            assert wal.writes == writes and answered == []
            wal.gate.release()  # the first fsync ends: the five are written as one round
            await _eventually(lambda: wal.syncs_begun == 3, "the five's fsync begins")
            assert wal.writes == writes + 1
            await _eventually(lambda: len(answered) == 1, "the first proposal answered")
            nursery.start_soon(propose, bytes(limits.raft_round_wait_bytes_max))
            await _eventually(lambda: wal.writes == writes + 2, "the large proposal is written at once")
            assert wal.syncs_begun == 3 and len(answered) == 1  # while the five's fsync is still held
            wal.gate.release(2)
            await _eventually(lambda: len(answered) == 7, "every proposal answered")

    trio.run(scenario)
    wal.close()
    assert machine.early == [] and len([data for data in machine.applied if data]) == 7


def test_appends_that_arrive_during_an_fsync_wait_for_it_and_take_one_round_and_one_fsync(tmp_path):
    """A follower's appends that arrive during a long fsync wait for it, as a node's own proposals do: written
    when it ends, in one round, they are made durable by one fsync, and only then acknowledged. They are no later
    than if written at once: the next fsync could not begin before this one ended."""
    group = 7
    wal = _GatedWal.open(tmp_path)
    sent: list[Message] = []

    def post(node: int, payload: bytes) -> None:
        sent.extend(message for _, message in codec.decode_messages(payload))

    async def scenario() -> None:
        host = RaftHost(1, wal, post, tick_s=3600)
        async with _running(host, wal):
            host.add_group(group, (1, 2, 3), _CheckedMachine(wal, group))
            host.receive(_append(group, 1, 0))
            await _eventually(lambda: wal.syncs_begun == 1, "the first round's fsync begins")
            writes = wal.writes
            for index in (2, 3, 4):
                host.receive(_append(group, index, 0))
                await trio.sleep(0.05)
            assert wal.written[group] == 1 and wal.writes == writes, "appends written during the fsync"
            assert wal.syncs_begun == 1 and _acknowledged(sent) == []
            wal.gate.release(2)  # the first fsync, then the one that covers entries 2 to 4
            await _eventually(lambda: _acknowledged(sent) == [1, 2, 3, 4], "every entry acknowledged")
            assert wal.syncs_begun == 2 and wal.durable[group] == 4
            assert wal.writes == writes + 1, "entries 2 to 4 took one round"
            wal.gate.release(1000)
            host.receive(_append(group, 5, 0))  # alone: the end of its fsync, not a tick, releases it
            await _eventually(lambda: _acknowledged(sent)[-1:] == [5], "entry 5 acknowledged without a tick")

    trio.run(scenario)
    wal.close()


def test_a_commit_alone_waits_for_the_next_write_and_a_restarted_node_commits_again(tmp_path):
    """A hard state in which only the commit moved takes no round of its own: it is written with the next
    round's entries, or once a tick finds the WAL idle. Raft needs no commit on disk: a node restarted from
    an older one applies every entry once it commits them again."""
    proposals = 10

    async def propose_all(wal: _GatedWal, tick_s: float) -> _CheckedMachine:
        machine = _CheckedMachine(wal, 3)
        host = RaftHost(1, wal, lambda node, payload: None, tick_s=tick_s)
        async with _running(host, wal):
            wal.gate.release(1000)
            host.add_group(3, (1,), machine)
            for number in range(proposals):
                await host.propose(3, b"p%d" % number)
            if tick_s < 1:  # idle at a tick: the last commit is written (with the round that applied the last
                # entry, if a tick fell before that round), and then the idle WAL gets no more writes
                await _eventually(lambda: wal.commits.get(3) == wal.written[3], "the last commit written at a tick")
                writes = wal.writes
                await trio.sleep(10 * tick_s)
                assert wal.writes == writes
        return machine

    # Ticks never come: the last commit stays in memory. Each proposal took one write, not two.
    wal = _GatedWal.open(tmp_path / "lagging")
    trio.run(propose_all, wal, 3600)
    assert wal.writes <= proposals + 2
    wal.close()
    restored = Wal.open(tmp_path / "lagging").groups[3]
    last = restored.entries[-1].index
    assert restored.hard_state.commit < last
    machine = _CheckedMachine(_GatedWal.open(tmp_path / "lagging"), 3)

    async def restart() -> None:
        host = RaftHost(1, machine.wal, lambda node, payload: None, tick_s=3600)
        async with _running(host, machine.wal):
            machine.wal.gate.release(1000)
            host.add_group(3, (1,), machine)
            await _eventually(lambda: len([d for d in machine.applied if d]) == proposals, "every entry applied")

    trio.run(restart)
    machine.wal.close()
    assert [d for d in machine.applied if d] == [b"p%d" % n for n in range(proposals)]

    # With ticks, an idle WAL gets the last commit.
    wal = _GatedWal.open(tmp_path / "ticking")
    trio.run(propose_all, wal, 0.01)
    wal.close()
    restored = Wal.open(tmp_path / "ticking").groups[3]
    assert restored.hard_state.commit == restored.entries[-1].index


def test_records_of_the_legacy_format_are_read_beside_new_ones(tmp_path):
    """A log whose records were written with zlib's CRC-32 (before CRC-32C) opens, reads and recovers; new
    records are appended after them in the current format; damage to either kind is still damage."""
    log = CommitLog.open(tmp_path, 1 << 20)
    log.append([(9, b"new before")])
    log.close()
    segment = sorted(tmp_path.glob("*.log"))[0]
    with open(segment, "ab") as file:  # as the code before wrote them
        for body in (b"legacy one", b"legacy two"):
            crc = zlib.crc32(body, zlib.crc32(struct.pack("<IB", len(body), 7)))
            file.write(struct.pack("<IIIB", LEGACY_MAGIC, len(body), crc, 7) + body)
    log = CommitLog.open(tmp_path, 1 << 20)
    log.append([(9, b"new after")])
    assert [(kind, body) for _, kind, body in log.scan(0)] == [
        (9, b"new before"), (7, b"legacy one"), (7, b"legacy two"), (9, b"new after")]
    log.close()
    data = bytearray(segment.read_bytes())
    data[data.index(b"legacy one") + 3] ^= 0xFF  # damage with good records after it
    segment.write_bytes(bytes(data))
    with pytest.raises(RocketError) as caught:
        CommitLog.open(tmp_path, 1 << 20)
    assert caught.value.code == Code.CORRUPT_DATA


def test_a_compactions_outside_state_is_synced_in_a_worker_thread_before_its_snapshot_is_written(tmp_path,
                                                                                                  monkeypatch):
    """A group that compacts its log hands the sync of what its snapshot covers outside the WAL (the store's
    log) to the snapshot worker thread, which runs it before the snapshot is written: never on the trio thread."""
    monkeypatch.setattr(limits, "raft_log_entries_max", 5)
    wal = _GatedWal.open(tmp_path)
    machine = _CheckedMachine(wal, 3)
    hooks: list[tuple[bool, int]] = []  # (in the trio thread, WAL writes before it)
    snapshot_writes: list[int] = []  # the WAL write (numbered from 1) that carried a snapshot
    trio_thread = threading.current_thread()
    real_write = wal.write

    def write(updates):
        if any(update.snapshot is not None and update.snapshot.index for update in updates):
            snapshot_writes.append(wal.writes + 1)
        return real_write(updates)

    wal.write = write

    async def scenario() -> None:
        host = RaftHost(1, wal, lambda node, payload: None, tick_s=3600)
        host.sync_before_snapshots = lambda: hooks.append((threading.current_thread() is trio_thread, wal.writes))
        async with _running(host, wal) as nursery:
            host.add_group(3, (1,), machine)

            async def fsyncs() -> None:
                while True:
                    await trio.sleep(0.002)
                    wal.gate.release()

            nursery.start_soon(fsyncs)
            for number in range(12):
                await host.propose(3, b"p%d" % number)
            await _eventually(lambda: snapshot_writes, "a snapshot is written")

    trio.run(scenario)
    wal.close()
    assert hooks and not any(in_trio for in_trio, _ in hooks)
    assert all(any(before < write for _, before in hooks) for write in snapshot_writes)


def test_a_failed_wal_write_or_fsync_fails_the_round_loop_and_no_proposal_is_answered(tmp_path):
    """The persist thread's error reaches RaftHost.run, whether the write or the fsync failed: nothing
    waits forever for a round that was never made durable, and no proposer hears success."""
    for failing in ("write", "sync"):
        wal = _GatedWal.open(tmp_path / failing)
        wal.gate.release(1000)
        real = getattr(wal, failing)
        armed = []

        def fail(*arguments, real=real, armed=armed):
            if armed:
                raise OSError(errno.EIO, "the disk went away")
            return real(*arguments)

        setattr(wal, failing, fail)
        answered = []

        async def scenario() -> None:
            host = RaftHost(1, wal, lambda node, payload: None, tick_s=0.01)
            with trio.fail_after(10), pytest.raises(OSError) as caught, collapse_single_error():
                async with trio.open_nursery() as nursery:
                    await nursery.start(host.run)
                    host.add_group(3, (1,), _CheckedMachine(wal, 3))
                    await host.propose(3, b"before")  # the group works, then the disk fails
                    armed.append(True)

                    async def propose() -> None:
                        answered.append(await host.propose(3, b"lost"))

                    nursery.start_soon(propose)
                    await trio.sleep_forever()
            assert caught.value.errno == errno.EIO

        trio.run(scenario)
        wal.close()
        assert answered == []


def test_the_round_loop_returns_only_after_its_persist_threads(tmp_path):
    """Cancelled while a round's fsync is held, RaftHost.run returns only once the persist thread is done,
    so that the WAL is never closed under a write or an fsync."""
    wal = _GatedWal.open(tmp_path)
    released = []

    def release() -> None:
        released.append(time.monotonic())
        wal.gate.release(1000)  # this fsync, and any of a round written after it

    async def scenario() -> None:
        host = RaftHost(1, wal, lambda node, payload: None, tick_s=3600)
        async with trio.open_nursery() as nursery:
            await nursery.start(host.run)
            host.add_group(3, (1,), _CheckedMachine(wal, 3))
            await _eventually(lambda: wal.syncs_begun == 1, "an fsync is held")
            threading.Timer(0.2, release).start()
            nursery.cancel_scope.cancel()
        assert released and time.monotonic() >= released[0] and 3 in wal.durable

    trio.run(scenario)
    wal.close()
