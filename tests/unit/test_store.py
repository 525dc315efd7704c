"""The group store: durable appends with group commit, recovery of torn tails, refusal of damage,
an index rebuilt from the log, consumer offsets, long polling and search by time."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import trio
import trio.testing

from rocket import limits
from rocket.errors import Code, RocketError
from rocket.model import Message
from rocket.serde import batch as batch_codec
from rocket.store.commitlog import CommitLog
from rocket.store.group import Store

SEGMENT = limits.segment_bytes_min


def make_batch(first: int, count: int, size: int = 100) -> bytes:
    return batch_codec.encode([Message(f"{first + i}:".encode() + bytes(size)) for i in range(count)], 1_700_000_000_000)


def bodies(store: Store, topic: str, queue: int) -> list[bytes]:
    found = []
    offset = 0
    while True:
        batches = store.read(topic, queue, offset, 1 << 30)
        if not batches:
            return found
        for base_offset, data in batches:
            messages = batch_codec.decode(data, base_offset)
            found.extend(m.body for m in messages if m.offset >= offset)
            offset = base_offset + len(messages)


async def fill(directory: Path, batches: int = 40, per_batch: int = 50, size: int = 100) -> None:
    store = Store.open(directory, SEGMENT)
    async with trio.open_nursery() as nursery:
        await nursery.start(store.run)
        for index in range(batches):
            await store.append("t", index % 2, make_batch(index * per_batch, per_batch, size))
        nursery.cancel_scope.cancel()
    store.close()


async def test_round_trip_across_segments_and_reopen(tmp_path):
    """Appends spanning several segments read back whole, before and after a reopen."""
    await fill(tmp_path, batches=60, per_batch=100, size=500)
    log = CommitLog.open(tmp_path / "log", SEGMENT)
    assert len(log.segments()) >= 3
    log.close()
    store = Store.open(tmp_path, SEGMENT)
    assert store.queue_stats("t", 0)["next_offset"] == 3000
    assert len(bodies(store, "t", 0)) == 3000 and len(bodies(store, "t", 1)) == 3000
    assert bodies(store, "t", 0)[1234].startswith(b"%d:" % (24 * 100 + 34))
    store.close()


async def test_group_commit_uses_few_fsyncs(tmp_path):
    """200 concurrent appends are made durable by far fewer fsyncs."""
    store = Store.open(tmp_path, SEGMENT)
    async with trio.open_nursery() as nursery:
        await nursery.start(store.run)
        async with trio.open_nursery() as appenders:
            for index in range(200):
                appenders.start_soon(store.append, "t", index % 4, make_batch(0, 10))
        assert store.fsyncs < 50
        assert sum(store.queue_stats("t", q)["next_offset"] for q in range(4)) == 2000
        nursery.cancel_scope.cancel()
    store.close()


def last_segment(directory: Path) -> Path:
    return sorted((directory / "log").glob("*.log"))[-1]


@pytest.mark.parametrize("damage", ["cut", "garbage", "zeros"])
async def test_torn_tail_is_cut_back(tmp_path, damage):
    """A tail torn mid-record, or followed by junk, is cut to the last good record; appends then go on."""
    await fill(tmp_path)
    segment = last_segment(tmp_path)
    size = segment.stat().st_size
    with open(segment, "r+b") as file:
        if damage == "cut":
            file.truncate(size - 37)
        else:
            file.seek(size)
            file.write(os.urandom(5000) if damage == "garbage" else bytes(5000))
    store = Store.open(tmp_path, SEGMENT)
    kept = store.queue_stats("t", 1)["next_offset"]
    assert kept == (1000 if damage != "cut" else 950)
    async with trio.open_nursery() as nursery:
        await nursery.start(store.run)
        base_offset, _ = await store.append("t", 1, make_batch(9999, 5))
        nursery.cancel_scope.cancel()
    assert base_offset == kept
    assert len(bodies(store, "t", 1)) == kept + 5
    store.close()


async def test_damage_before_good_records_is_reported(tmp_path):
    """A flipped byte in the middle of the last segment refuses to open, naming the file and position."""
    await fill(tmp_path)
    segment = last_segment(tmp_path)
    with open(segment, "r+b") as file:
        file.seek(segment.stat().st_size // 2)
        byte = file.read(1)
        file.seek(-1, os.SEEK_CUR)
        file.write(bytes([byte[0] ^ 0xFF]))
    with pytest.raises(RocketError) as caught:
        Store.open(tmp_path, SEGMENT)
    assert caught.value.code == Code.CORRUPT_DATA
    assert segment.name in caught.value.message and "valid records after it" in caught.value.message


async def test_damage_in_a_sealed_segment_fails_the_read(tmp_path):
    """Damage in an older segment is caught by the checksum when read, never returned as data."""
    await fill(tmp_path, batches=60, per_batch=100, size=500)
    first = sorted((tmp_path / "log").glob("*.log"))[0]
    with open(first, "r+b") as file:
        file.seek(1000)
        file.write(b"\xde\xad\xbe\xef")
    store = Store.open(tmp_path, SEGMENT)
    with pytest.raises(RocketError) as caught:
        store.read("t", 0, 0, 1 << 20)
    assert caught.value.code == Code.CORRUPT_DATA
    store.close()


async def test_lost_index_is_rebuilt_from_the_log(tmp_path):
    """Deleting the LevelDB index loses nothing: it is replayed from the log with identical reads."""
    await fill(tmp_path)
    store = Store.open(tmp_path, SEGMENT)
    before = [bodies(store, "t", q) for q in range(2)]
    store.close()
    import shutil

    shutil.rmtree(tmp_path / "index")
    store = Store.open(tmp_path, SEGMENT)
    assert [bodies(store, "t", q) for q in range(2)] == before
    store.close()


async def test_offsets_are_durable(tmp_path):
    """Committed consumer offsets survive a reopen, and a lost index."""
    store = Store.open(tmp_path, SEGMENT)
    async with trio.open_nursery() as nursery:
        await nursery.start(store.run)
        await store.commit_offsets("billing", "t", {0: 10, 3: 7})
        await store.commit_offsets("billing", "t", {0: 12})
        nursery.cancel_scope.cancel()
    store.close()
    import shutil

    shutil.rmtree(tmp_path / "index")
    store = Store.open(tmp_path, SEGMENT)
    assert store.fetch_offsets("billing", "t") == {0: 12, 3: 7}
    assert store.fetch_offsets("audit", "t") == {}
    store.close()


async def test_long_poll_wakes_on_append_and_times_out(tmp_path):
    """wait_for_data returns as soon as data is durable, and after the timeout when none comes."""
    store = Store.open(tmp_path, SEGMENT)
    async with trio.open_nursery() as nursery:
        await nursery.start(store.run)
        with trio.move_on_after(0.2) as idle:
            await store.wait_for_data({("t", 0): 0}, 0.05)
        assert not idle.cancelled_caught
        woke = trio.Event()

        async def waiter():
            await store.wait_for_data({("t", 0): 0, ("t", 1): 0}, 30)
            woke.set()

        nursery.start_soon(waiter)
        await trio.sleep(0.05)
        assert not woke.is_set()
        await store.append("t", 1, make_batch(0, 1))
        with trio.fail_after(5):
            await woke.wait()
        nursery.cancel_scope.cancel()
    store.close()


async def test_offset_for_time(tmp_path):
    """Search by time finds the first batch appended at or after the moment."""
    now = [1000.0]
    store = Store.open(tmp_path, SEGMENT, clock=lambda: now[0])
    async with trio.open_nursery() as nursery:
        await nursery.start(store.run)
        for second in range(5):
            now[0] = 1000.0 + second
            await store.append("t", 0, make_batch(second * 10, 10))
        nursery.cancel_scope.cancel()
    assert store.offset_for_time("t", 0, 1_002_000) == 20
    assert store.offset_for_time("t", 0, 0) == 0
    assert store.offset_for_time("t", 0, 9_999_999) == 50
    store.close()


async def test_failed_fsync_refuses_further_writes(tmp_path, monkeypatch):
    """After an fsync error the store answers UNAVAILABLE instead of acknowledging unknown state."""
    store = Store.open(tmp_path, SEGMENT)
    async with trio.open_nursery() as nursery:
        await nursery.start(store.run)
        await store.append("t", 0, make_batch(0, 1))

        def broken(descriptor):
            raise OSError(5, "Input/output error")

        monkeypatch.setattr(os, "fdatasync", broken)
        for _ in range(2):
            with pytest.raises(RocketError) as caught:
                await store.append("t", 0, make_batch(1, 1))
            assert caught.value.code == Code.UNAVAILABLE
        nursery.cancel_scope.cancel()
    monkeypatch.undo()
    store.close()


async def test_bad_batches_and_offsets_are_refused(tmp_path):
    """A damaged batch is refused before it is stored; reading past the end is OFFSET_OUT_OF_RANGE."""
    store = Store.open(tmp_path, SEGMENT)
    damaged = bytearray(make_batch(0, 3))
    damaged[-1] ^= 1
    with pytest.raises(RocketError) as caught:
        await store.append("t", 0, bytes(damaged))
    assert caught.value.code == Code.BAD_BATCH
    with pytest.raises(RocketError) as caught:
        store.read("t", 0, 5, 100)
    assert caught.value.code == Code.OFFSET_OUT_OF_RANGE
    store.close()


async def test_appends_beyond_the_queue_bound_are_refused_in_time(tmp_path, monkeypatch):
    """When the disk cannot keep up, an append waits a bounded time for room, then gets OVERLOADED."""
    monkeypatch.setattr(limits, "append_queue_bytes_max", 1000)
    monkeypatch.setattr(limits, "append_queue_wait_s_max", 0.1)
    store = Store.open(tmp_path, SEGMENT)  # its flusher is not running: nothing drains the queue
    async with trio.open_nursery() as nursery:
        nursery.start_soon(store.append, "t", 0, make_batch(0, 20))  # queued, never flushed
        await trio.sleep(0.01)
        with pytest.raises(RocketError) as caught:
            await store.append("t", 0, make_batch(20, 1))
        assert caught.value.code == Code.OVERLOADED
        nursery.cancel_scope.cancel()
    store.close()


async def test_empty_newest_segment_after_a_roll_is_dropped(tmp_path):
    """A crash right after a roll leaves an empty segment: it is removed and appends continue at the end."""
    await fill(tmp_path, batches=60, per_batch=100, size=500)
    segments = sorted((tmp_path / "log").glob("*.log"))
    end = int(segments[-1].name[:-4]) + segments[-1].stat().st_size
    (tmp_path / "log" / f"{end:020d}.log").touch()
    store = Store.open(tmp_path, SEGMENT)
    assert store.log.end_position == end
    assert len(sorted((tmp_path / "log").glob("*.log"))) == len(segments)
    assert store.queue_stats("t", 0)["next_offset"] == 3000
    store.close()


async def test_a_sealed_segment_of_the_wrong_size_is_reported(tmp_path):
    """Bytes missing from the end of a sealed segment are damage, not a tail to cut."""
    await fill(tmp_path, batches=60, per_batch=100, size=500)
    first = sorted((tmp_path / "log").glob("*.log"))[0]
    with open(first, "r+b") as file:
        file.truncate(first.stat().st_size - 10)
    with pytest.raises(RocketError) as caught:
        Store.open(tmp_path, SEGMENT)
    assert caught.value.code == Code.CORRUPT_DATA and first.name in caught.value.message
