"""Tiered storage in the store, on a local-directory tier: the offloader uploads pieces into a replicated
manifest, local data goes only once offloaded, cold reads return every byte and detect damage, the
manifest survives a reopen, an index rebuild and a snapshot, and total retention expires pieces."""

from __future__ import annotations

import shutil
import time

import pytest
import trio

from rocket import limits
from rocket.clock import Clock
from rocket.errors import Code, RocketError
from rocket.replication import NotLeader
from rocket.serde import batch as batch_codec
from rocket.store.commands import encode_drop_local, encode_expire, encode_offloaded, encode_truncate
from rocket.tier import LocalDirectoryStore
from rocket.tier.cold import ColdReader
from rocket.roles.storage.offload import Offloader, TierSettings
from rocket.serde.piece import Piece, range_of_key, segment_key
from tests.unit.test_store import GROUP, Node, append_entry, make_batch, workload
from tests.unit.test_timers import Log

TOPIC = "t"


def make_offloader(node: Node, objects, retention: tuple[float, float] = (0.0, 1.0), leads=lambda: {GROUP: 1},
                   propose=None, **settings) -> Offloader:
    async def apply(group: int, payload: bytes):
        return Log(node).apply(payload)[0]  # the next entry of the group's log, whatever else the test applied

    options = {"piece_bytes": 12_000, "piece_age_s": 0.0, **settings}
    return Offloader(node.store, objects, TierSettings(prefix="tier", **options), propose or apply, leads,
                     lambda topic: retention, Clock())


async def scan_until_done(offloader: Offloader) -> None:
    for _ in range(100):
        if not await offloader.scan():
            return
    raise AssertionError("the offloader never finished")


async def cold_bodies(node: Node, reader: ColdReader, queue: int, force: bool = False) -> list[bytes]:
    """Every message body of the queue, from the tier where the store says so, else locally."""
    found, offset = [], 0
    while offset < node.queue_stats(TOPIC, queue)["next_offset"]:
        piece = node.tier_piece(TOPIC, queue, offset, force)
        if piece is not None:
            batches, next_offset = await reader.read(piece, offset, 20_000)
        else:
            batches, next_offset = node.read_from(TOPIC, queue, offset, 20_000)
        for base_offset, data in batches:
            found.extend(m.body for m in batch_codec.decode(data, base_offset) if m.offset >= offset)
        offset = next_offset
    return found


def expected_bodies(queue: int, batches: int = 40, per_batch: int = 50) -> list[bytes]:
    return [f"{i * per_batch + k}:".encode() + bytes(100)
            for i in range(queue, batches, 2) for k in range(per_batch)]


@pytest.mark.parametrize("built_bytes_max", [0, 1 << 30], ids=["one-at-a-time", "built-ahead"])
async def test_offload_drop_local_and_read_everything_back_cold(tmp_path, monkeypatch, built_bytes_max):
    """Every batch is offloaded in pieces, local data is dropped after that, and cold reads return every message;
    alike whether each queue's next piece is built while one uploads or only after it."""
    monkeypatch.setattr(limits, "tier_built_bytes_max", built_bytes_max)
    node = Node(tmp_path / "node")
    node.apply(GROUP, workload())
    async with LocalDirectoryStore(tmp_path / "tier") as objects:
        offloader = make_offloader(node, objects)
        await scan_until_done(offloader)
        for queue in (0, 1):
            state = node.tier_state(TOPIC, queue)
            assert state.tiered_to == node.queue_stats(TOPIC, queue)["next_offset"] == 1000
            assert [p.from_offset for p in state.pieces[1:]] == [p.to_offset for p in state.pieces[:-1]]
            assert len(state.pieces) >= 5 and state.local_from == 1000  # past local retention: dropped
            assert node.queue_stats(TOPIC, queue)["min_offset"] == 0
            assert node.index.first_offset(TOPIC, queue) is None
            keys = {info.key for info in await objects.list(f"tier/{TOPIC}/{queue}/")}
            assert keys == {p.key for p in state.pieces} | {p.index_key for p in state.pieces}
        reader = ColdReader(objects, read_ahead_bytes=30_000)
        for queue in (0, 1):
            assert await cold_bodies(node, reader, queue) == expected_bodies(queue)
        assert node.reclaim.wal_floor() is None  # nothing local is referenced any more: the WAL may go
    node.close()


class FailingPuts:
    """The tier's store, whose next `failures` puts under prefix fail after a yield (a piece's two puts are both in
    flight)."""

    def __init__(self, inner: LocalDirectoryStore, prefix: str, failures: int):
        self.inner = inner
        self.prefix = prefix
        self.failures = failures

    async def put(self, key: str, data: bytes, md5: str | None = None):
        if self.failures > 0 and key.startswith(self.prefix):
            self.failures -= 1
            await trio.sleep(0)
            raise RocketError(Code.UNAVAILABLE, "the store is down")
        return await self.inner.put(key, data, md5=md5)

    def __getattr__(self, name: str):
        return getattr(self.inner, name)


async def test_a_piece_whose_two_puts_both_fail_backs_the_queue_off_and_goes_later(tmp_path):
    """Both objects of a queue's first piece fail to upload (two errors at once): the scan carries on, the queue backs
    off, nothing built stays held, and once the store is back every batch goes in order."""
    node = Node(tmp_path / "node")
    node.apply(GROUP, workload())
    async with LocalDirectoryStore(tmp_path / "tier") as objects:
        failing = FailingPuts(objects, f"tier/{TOPIC}/0/", 2)
        offloader = make_offloader(node, failing, retention=(0.0, 0.0))
        uploaded = await offloader.scan()
        assert failing.failures == 0 and offloader.failures == 1 and offloader._built_bytes == 0
        assert node.tier_state(TOPIC, 0) is None
        assert uploaded == len(node.tier_state(TOPIC, 1).pieces) >= 5  # the other queue went meanwhile
        offloader._backoff.clear()
        await scan_until_done(offloader)
        reader = ColdReader(objects, read_ahead_bytes=30_000)
        for queue in (0, 1):
            assert node.tier_state(TOPIC, queue).tiered_to == 1000
            assert await cold_bodies(node, reader, queue, force=True) == expected_bodies(queue)
        assert offloader._built_bytes == 0
    node.close()


async def test_local_data_stays_until_offloaded_and_conditional_commands_change_nothing(tmp_path):
    """A drop past the manifest's end, or a piece not starting where the manifest ends, is refused."""
    node = Node(tmp_path / "node")
    node.apply(GROUP, workload())
    log = Log(node)
    piece = Piece(0, 100, "k.seg", 10, "0" * 32, 10, 0, 0)
    assert log.apply(encode_drop_local(TOPIC, 0, 100)) == [False]  # nothing offloaded yet
    assert log.apply(encode_offloaded(TOPIC, 0, piece)) == [True]
    assert log.apply(encode_offloaded(TOPIC, 0, piece)) == [False]  # a repeat: the manifest moved on
    assert log.apply(encode_drop_local(TOPIC, 0, 150)) == [False]  # past what is offloaded
    assert log.apply(encode_drop_local(TOPIC, 0, 100)) == [True]
    assert node.local_start(TOPIC, 0) == 100 and node.index.first_offset(TOPIC, 0) == 100
    node.close()


async def test_the_manifest_survives_reopen_index_rebuild_and_snapshot(tmp_path):
    """The manifest and the local start are rebuilt from the WAL (its entries applied again, all at once: the local
    data dropped is dropped from what that apply adds too) and carried by snapshots."""
    node = Node(tmp_path / "node")
    node.apply(GROUP, workload())
    async with LocalDirectoryStore(tmp_path / "tier") as objects:
        await scan_until_done(make_offloader(node, objects, retention=(0.0, 0.0)))  # nothing dropped locally
        await make_offloader(node, objects, retention=(0.0, 1.0)).retain(GROUP, TOPIC, 0)
        before = {q: node.tier_state(TOPIC, q) for q in (0, 1)}
        assert before[0].local_from == 1000 and before[1].local_from == 0
        snapshot = list(node.snapshot(GROUP))
        node.close()
        node = Node(tmp_path / "node")
        assert {q: node.tier_state(TOPIC, q) for q in (0, 1)} == before
        node.close()
        shutil.rmtree(tmp_path / "node" / "index")
        node = Node(tmp_path / "node")
        assert {q: node.tier_state(TOPIC, q) for q in (0, 1)} == before
        assert node.index.first_offset(TOPIC, 0) is None and node.index.first_offset(TOPIC, 1) == 0
        reader = ColdReader(objects)
        assert await cold_bodies(node, reader, 0) == expected_bodies(0)
        assert await cold_bodies(node, reader, 1, force=True) == expected_bodies(1)
        node.close()
        replica = Node(tmp_path / "replica")
        replica.restore(GROUP, snapshot)
        assert {q: replica.tier_state(TOPIC, q) for q in (0, 1)} == before
        replica.close()


async def test_a_corrupted_or_truncated_object_is_corrupt_data(tmp_path):
    """A flipped byte or a cut object in the tier is reported as CORRUPT_DATA, never returned."""
    node = Node(tmp_path / "node")
    node.apply(GROUP, workload())
    async with LocalDirectoryStore(tmp_path / "tier") as objects:
        await scan_until_done(make_offloader(node, objects))
        pieces = node.tier_state(TOPIC, 0).pieces
        data = await objects.get(pieces[1].key)
        await objects.put(pieces[1].key, data[:100] + bytes([data[100] ^ 1]) + data[101:])
        await objects.put(pieces[2].key, data[: len(data) // 2])
        for piece in pieces[1:3]:
            with pytest.raises(RocketError) as caught:
                await ColdReader(objects).read(piece, piece.from_offset, 1 << 20)
            assert caught.value.code == Code.CORRUPT_DATA
        batches, _ = await ColdReader(objects).read(pieces[0], 0, 1 << 20)
        assert batches and batches[0][0] == 0
    node.close()


async def test_total_retention_expires_pieces_and_their_objects(tmp_path):
    """Pieces past total retention leave the manifest and the store; the queue then starts after them."""
    node = Node(tmp_path / "node")
    node.apply(GROUP, workload())
    async with LocalDirectoryStore(tmp_path / "tier") as objects:
        await scan_until_done(make_offloader(node, objects, retention=(1.0, 0.0)))
        for queue in (0, 1):
            state = node.tier_state(TOPIC, queue)
            assert state.pieces == [] and state.tiered_to == 1000 and state.local_from == 1000
            assert await objects.list(f"tier/{TOPIC}/{queue}/") == []
            assert node.queue_stats(TOPIC, queue)["min_offset"] == 1000
    node.close()


async def test_objects_an_interrupted_expire_or_a_lost_upload_left_behind_are_swept(tmp_path):
    """An expire that a crash cut short between the manifest change and the deletes leaves objects before
    the manifest's start, and a deposed leader's upload leaves one from inside the manifest's range: the next
    offloader (after a restart, or a new leader) deletes them, and only them (not one past the manifest's end, which
    a leader may be about to list)."""
    node = Node(tmp_path / "node")
    node.apply(GROUP, workload())
    async with LocalDirectoryStore(tmp_path / "tier") as objects:
        await scan_until_done(make_offloader(node, objects, retention=(0.0, 0.0)))
        kept = {queue: sorted(info.key for info in await objects.list(f"tier/{TOPIC}/{queue}/")) for queue in (0, 1)}
        state = node.tier_state(TOPIC, 0)
        cut = state.pieces[2].to_offset
        log = Log(node)
        assert log.apply(encode_expire(TOPIC, 0, cut))[0]  # the crash: no object of it was deleted
        assert len(await objects.list(f"tier/{TOPIC}/0/")) == len(kept[0])
        lost = segment_key("tier", TOPIC, 1, 500, 575)  # cut elsewhere than the listed piece from 500
        upcoming = segment_key("tier", TOPIC, 1, 1000, 1050)
        for key in (lost, upcoming):
            await objects.put(key, b"x")
        node.close()

        node = Node(tmp_path / "node")  # the restart
        offloader = make_offloader(node, objects, retention=(0.0, 0.0))
        await scan_until_done(offloader)
        await offloader.scan()  # its first look at each queue's retentions (due from the round after) sweeps
        assert offloader.swept_objects == 7  # three pieces (segment and index objects) and the lost upload
        remaining = node.tier_state(TOPIC, 0).pieces
        assert sorted(info.key for info in await objects.list(f"tier/{TOPIC}/0/")) == sorted(
            key for piece in remaining for key in (piece.key, piece.index_key))
        assert sorted(info.key for info in await objects.list(f"tier/{TOPIC}/1/")) == sorted(kept[1] + [upcoming])
    node.close()


async def test_without_a_tier_total_retention_truncates_local_data(tmp_path):
    """With the tier off, batches older than the total retention go locally (and free the WAL); a batch
    appended since stays and the queue starts at it; a truncate computed from a stale start changes nothing."""
    node = Node(tmp_path / "node")
    node.apply(GROUP, workload())  # appended in 2023
    fresh = int(time.time() * 1000)
    node.apply(GROUP, [append_entry(41, TOPIC, 0, make_batch(0, 5), fresh)])
    offloader = make_offloader(node, None, retention=(3600.0, 0.0))
    await scan_until_done(offloader)
    await offloader.scan()  # retentions are looked at from the round after a queue is seen
    assert [node.queue_stats(TOPIC, queue)["min_offset"] for queue in (0, 1)] == [1000, 1000]
    assert [node.queue_stats(TOPIC, queue)["next_offset"] for queue in (0, 1)] == [1005, 1000]
    assert node.read(TOPIC, 1, 0, 1 << 20) == [] and [base for base, _ in node.read(TOPIC, 0, 0, 1 << 20)] == [1000]
    state = node.tier_state(TOPIC, 0)
    assert (state.pieces, state.local_from, state.tiered_to) == ([], 1000, 1000)
    assert state.truncated_bytes == node.queue_bytes(TOPIC, 0) - node.local_bytes(TOPIC, 0, 1000, 1005)
    live, _ = node.reclaim.wal_live(0, node.wal.log.end_position)
    assert [(queue, entry.base_offset) for _, queue, entry in live] == [(0, 1000)]
    assert not Log(node).apply(encode_truncate(TOPIC, 0, 0, 1005, 1))[0], "the queue no longer starts at 0"
    node.close()
    node = Node(tmp_path / "node")
    assert node.tier_state(TOPIC, 0).truncated_bytes == state.truncated_bytes
    assert [base for base, _ in node.read(TOPIC, 0, 0, 1 << 20)] == [1000]
    node.close()


async def test_a_partial_piece_goes_once_its_data_is_old_not_once_the_offloader_has_watched_it_that_long(tmp_path):
    """A backlog a restarted node finds (data appended long ago, below a piece) goes at the first scan; data younger
    than piece_age_s waits, however often the offloader looks."""
    node = Node(tmp_path / "node")
    node.apply(GROUP, workload(batches=4))  # appended at APPEND_MS, in 2023
    now_ms = int(time.time() * 1000)
    node.apply(GROUP, [append_entry(5, "fresh", 0, make_batch(0, 10), now_ms)])
    async with LocalDirectoryStore(tmp_path / "tier") as objects:
        offloader = make_offloader(node, objects, piece_bytes=10_000_000, piece_age_s=3600)
        assert await offloader.scan() == 2  # one partial piece for each of t's two queues, at the first look
        assert await offloader.scan() == 0
        assert node.tier_state("fresh", 0) is None


class CountingLists:
    """The tier's store, counting its lists of the objects from one offset (the offloader's look for orphans)."""

    def __init__(self, inner: LocalDirectoryStore):
        self.inner = inner
        self.lists = 0

    async def list(self, prefix: str = ""):
        self.lists += prefix.endswith("-")
        return await self.inner.list(prefix)

    def __getattr__(self, name: str):
        return getattr(self.inner, name)


async def test_orphans_are_looked_for_once_per_queue_and_term_and_deleted(tmp_path):
    """A queue's pieces offloaded in one term need one list of orphans, at the first; once the term changed (another
    leader may have uploaded meanwhile), the next piece looks again, and an orphan from its offset goes."""
    node = Node(tmp_path / "node")
    node.apply(GROUP, workload())
    terms = {GROUP: 1}
    async with LocalDirectoryStore(tmp_path / "tier") as objects:
        store = CountingLists(objects)
        offloader = make_offloader(node, store, retention=(0.0, 0.0), leads=lambda: dict(terms))
        await scan_until_done(offloader)
        assert sum(len(node.tier_state(TOPIC, queue).pieces) for queue in (0, 1)) >= 10
        assert store.lists == 2  # one per queue
        tiered_to = node.tier_state(TOPIC, 0).tiered_to
        orphan = segment_key("tier", TOPIC, 0, tiered_to, tiered_to + 7)  # another leader's upload, cut elsewhere
        await objects.put(orphan, b"x")
        node.apply(GROUP, workload(first_index=node.applied(GROUP) + 1, first_batch=40))
        terms[GROUP] = 2
        await scan_until_done(offloader)
        assert store.lists == 4 and await objects.head(orphan) is None
        assert node.tier_state(TOPIC, 0).tiered_to == node.queue_stats(TOPIC, 0)["next_offset"] > tiered_to
    node.close()


async def offloaded_on_both(old: Node, new: Node, objects) -> list[bytes]:
    """The workload on two nodes of the group, offloaded by the old one in term 1: the manifest payloads it
    committed, applied on the old node only."""
    committed: list[bytes] = []

    async def propose(group: int, payload: bytes):
        committed.append(payload)
        return Log(old).apply(payload)[0]

    for node in (old, new):
        node.apply(GROUP, workload())
    await scan_until_done(make_offloader(old, objects, retention=(0.0, 0.0), propose=propose))
    return committed


async def listed_objects_exist(node: Node, objects) -> None:
    for queue in (0, 1):
        for piece in node.tier_state(TOPIC, queue).pieces:
            assert await objects.head(piece.key) is not None and await objects.head(piece.index_key) is not None


async def test_a_new_leader_behind_its_predecessors_last_piece_deletes_none_of_its_objects(tmp_path):
    """The chaos run's CORRUPT_DATA: a new leader, its state machine still short of the old leader's last committed
    piece, built its next piece from there, cut elsewhere, took the listed objects for orphans and deleted them before
    its upload. Now orphans go only once a piece from their offset is listed: the new leader's piece loses the race
    for the manifest, and its uploader deletes its own objects."""
    old, new = Node(tmp_path / "old"), Node(tmp_path / "new")
    async with LocalDirectoryStore(tmp_path / "tier") as objects:
        committed = await offloaded_on_both(old, new, objects)
        unapplied = [encode_offloaded(TOPIC, 0, old.tier_state(TOPIC, 0).pieces[-1])]
        Log(new).apply(*[payload for payload in committed if payload not in unapplied])  # all but queue 0's last

        def apply_committed() -> None:
            Log(new).apply(*unapplied)
            unapplied.clear()

        async def propose(group: int, payload: bytes):
            apply_committed()  # earlier in the log than the new leader's own entries
            return Log(new).apply(payload)[0]

        new.apply(GROUP, workload(first_index=new.applied(GROUP) + 1, first_batch=40))
        offloader = make_offloader(new, objects, retention=(0.0, 0.0), leads=lambda: {GROUP: 2}, propose=propose,
                                   piece_bytes=30_000)  # its piece from where it thinks the manifest ends: cut elsewhere
        await scan_until_done(offloader)
        await listed_objects_exist(new, objects)
        reader = ColdReader(objects)
        for queue in (0, 1):
            assert await cold_bodies(new, reader, queue, force=True) == expected_bodies(queue, batches=80)
        ranges = sorted(range_of_key(info.key) for info in await objects.list(f"tier/{TOPIC}/0/"))
        assert ranges == sorted((piece.from_offset, piece.to_offset) for piece in new.tier_state(TOPIC, 0).pieces
                                for _ in (".seg", ".idx"))  # nothing beside the listed pieces
    old.close()
    new.close()


async def test_a_deposed_leader_deletes_none_of_its_successors_objects(tmp_path):
    """A leader deposed without knowing it (partitioned away) builds a piece from where its manifest ends, where its
    successor has since uploaded and listed one cut elsewhere: it deletes none of them (orphans go only once a piece
    is listed), and its proposal fails."""
    old, new = Node(tmp_path / "old"), Node(tmp_path / "new")
    async with LocalDirectoryStore(tmp_path / "tier") as objects:
        committed = await offloaded_on_both(old, new, objects)
        Log(new).apply(*committed)
        new.apply(GROUP, workload(batches=20, first_index=new.applied(GROUP) + 1, first_batch=40))
        await scan_until_done(make_offloader(new, objects, retention=(0.0, 0.0), leads=lambda: {GROUP: 2},
                                             piece_bytes=30_000))
        successors = [(piece.from_offset, piece.to_offset) for piece in new.tier_state(TOPIC, 0).pieces[20:]]
        assert successors[0] == (1000, 1200) and successors[-1][1] == 1500
        old.apply(GROUP, workload(batches=2, first_index=old.applied(GROUP) + 1, first_batch=40))

        async def deposed(group: int, payload: bytes):
            raise NotLeader(2)

        offloader = make_offloader(old, objects, retention=(0.0, 0.0), propose=deposed, piece_bytes=30_000)
        await offloader.scan()
        assert offloader.failures == 2 and old.tier_state(TOPIC, 0).tiered_to == 1000
        await listed_objects_exist(new, objects)
        found = {range_of_key(info.key) for info in await objects.list(f"tier/{TOPIC}/0/{1000:020d}-")}
        assert found == {(1000, 1050), (1000, 1200)}  # its own stay, to go once a leader lists another piece
    old.close()
    new.close()


async def test_a_piece_that_loses_the_race_for_the_manifest_is_deleted_by_its_uploader(tmp_path):
    """Another piece from the same offset reaches the manifest between the offloader's look and its proposal: its
    own objects, which nothing can list now, go."""
    node = Node(tmp_path / "node")
    node.apply(GROUP, workload(batches=1, queues=1))
    rival = Piece(0, 50, "tier/elsewhere.seg", 10, "0" * 32, 10, 0, 0)

    async def propose(group: int, payload: bytes):
        Log(node).apply(encode_offloaded(TOPIC, 0, rival))
        return Log(node).apply(payload)[0]

    async with LocalDirectoryStore(tmp_path / "tier") as objects:
        await make_offloader(node, objects, retention=(0.0, 0.0), propose=propose).scan()
        assert node.tier_state(TOPIC, 0).pieces == [rival] and await objects.list("tier/") == []
    node.close()
