"""The telemetry spool (rotation, the byte bound, crash recovery) and its shipper to the object store."""

from __future__ import annotations

import logging
import os
import tempfile
from pathlib import Path

import fastavro
from fastavro.validation import ValidationError
import pytest
import trio
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from rocket.errors import Code, RocketError
from rocket.telemetry.ship import object_key, read_samples, ship_forever, ship_now, ship_once
from rocket.telemetry.spool import OPEN_NAME, Spool, parse_closed_name
from rocket.tier.local import LocalDirectoryStore

TIME_MS = 1_700_000_000_000  # 2023-11-14T22:13:20Z
NODE_ID = 7


def sample(time_ms: int, index: int = 0) -> dict:
    return {"time_ms": time_ms, "node": NODE_ID, "metric": "rocket_queue_in_bytes_total",
            "labels": {"queue": f"q{index}", "topic": f"topic-{index * 7919 % 10007}"},
            "value": float(index), "rate": None if index % 2 else index / 10}


def samples(time_ms: int, count: int) -> list[dict]:
    return [sample(time_ms, index) for index in range(count)]


class FakeClock:
    def __init__(self, now: float = 1000.0):
        self.now = now

    def __call__(self) -> float:
        return self.now


def read_path(path: Path) -> list[dict]:
    return read_samples(path.read_bytes())


def spooled_records(spool: Spool) -> list[dict]:
    records = [record for path in spool.closed() for record in read_path(path)]
    if spool.open_path.exists():
        records += read_path(spool.open_path)
    return records


def spool_in(directory: Path, **limits) -> Spool:
    limits = {"file_age_s": 60.0, "file_bytes_max": 1 << 20, "spool_bytes_max": 8 << 20} | limits
    return Spool(directory, **limits)


class FailingStore:
    """An object store that is down (UNAVAILABLE) for its first `failures` puts, then stores in memory."""

    def __init__(self, failures: int, objects_wanted: int = 0):
        self.failures = failures
        self.objects: dict[str, bytes] = {}
        self.put_times: list[float] = []
        self.objects_wanted = objects_wanted
        self.has_objects_wanted = trio.Event() if objects_wanted else None

    async def put(self, key: str, data: bytes):
        if self.has_objects_wanted is not None:
            self.put_times.append(trio.current_time())
        if self.failures > 0:
            self.failures -= 1
            raise RocketError(Code.UNAVAILABLE, "the store is down")
        self.objects[key] = data
        if self.has_objects_wanted is not None and len(self.objects) >= self.objects_wanted:
            self.has_objects_wanted.set()


def test_appends_are_blocks_of_one_file_closed_by_rotate(tmp_path):
    """Appends go to one open Avro file that reads back equal; rotate closes it under <first>-<last>-<records>.avro."""
    spool = spool_in(tmp_path / "telemetry")
    spool.append(samples(TIME_MS, 3))
    spool.append(samples(TIME_MS + 10_000, 2))
    assert spool.closed() == []
    with open(spool.open_path, "rb") as file:
        reader = fastavro.reader(file)
        assert reader.metadata["rocket.telemetry.schema"] == "rocket.v1.TelemetrySample"
        assert reader.codec == "deflate"
        assert len(list(fastavro.block_reader(open(spool.open_path, "rb")))) == 2
    spool.rotate()
    [path] = spool.closed()
    assert path.name == f"{TIME_MS:013d}-{TIME_MS + 10_000:013d}-5.avro"
    assert read_path(path) == samples(TIME_MS, 3) + samples(TIME_MS + 10_000, 2)
    assert not spool.open_path.exists() and spool.bytes == path.stat().st_size
    spool.rotate()  # nothing open: nothing to do
    assert spool.closed() == [path]


def test_open_file_rotates_by_age(tmp_path):
    """A file older than file_age_s is closed before the next append, which starts a new one."""
    clock = FakeClock()
    spool = spool_in(tmp_path, file_age_s=60.0, clock=clock)
    spool.append(samples(TIME_MS, 2))
    clock.now += 30
    spool.append(samples(TIME_MS + 30_000, 2))
    assert spool.closed() == []
    clock.now += 31
    spool.append(samples(TIME_MS + 61_000, 2))
    [path] = spool.closed()
    assert parse_closed_name(path.name) == (TIME_MS, TIME_MS + 30_000, 4, 0)
    assert read_path(spool.open_path) == samples(TIME_MS + 61_000, 2)


def test_open_file_rotates_by_size_and_names_sort_by_time(tmp_path):
    """A file that reaches file_bytes_max is closed right after the append; closed files come oldest first."""
    spool = spool_in(tmp_path, file_bytes_max=4000)
    appended = []
    for step in range(30):
        batch = [sample(TIME_MS + step * 10_000, step * 100 + index) for index in range(20)]
        spool.append(batch)
        appended += batch
    closed = spool.closed()
    assert len(closed) >= 3
    assert [path.name for path in closed] == sorted(path.name for path in closed)
    assert all(path.stat().st_size >= 4000 for path in closed)
    assert spool.open_path.stat().st_size < 4000
    assert spooled_records(spool) == appended
    assert spool.dropped_records == 0


def test_bound_drops_the_oldest_closed_files_and_counts_their_records(tmp_path):
    """Beyond spool_bytes_max the oldest closed files go, counted; the newest data (the open file) stays."""
    spool = spool_in(tmp_path, file_bytes_max=3000, spool_bytes_max=10_000)
    appended = []
    for step in range(60):
        batch = [sample(TIME_MS + step * 10_000, step * 100 + index) for index in range(15)]
        spool.append(batch)
        appended += batch
        assert spool.bytes <= 10_000
        assert sum(path.stat().st_size for path in tmp_path.iterdir()) == spool.bytes
        assert read_path(spool.open_path)[-15:] == batch if spool.open_path.exists() else spool.closed()
    kept = spooled_records(spool)
    assert spool.dropped_files > 0
    assert spool.dropped_records == len(appended) - len(kept)
    assert kept == appended[len(appended) - len(kept):]  # what is gone is the oldest


def test_one_append_beyond_the_bound_is_closed_and_dropped(tmp_path):
    """An append bigger than the whole bound cannot stay: it is closed, dropped and counted."""
    spool = spool_in(tmp_path, file_bytes_max=2000, spool_bytes_max=2000)
    spool.append(samples(TIME_MS, 1))
    spool.append([sample(TIME_MS + 10_000, index) for index in range(500)])
    assert spool.bytes == 0 and spool.closed() == [] and not spool.open_path.exists()
    assert spool.dropped_records == 501 and spool.dropped_files == 1  # both appends were in the one open file


def test_a_rejected_append_leaves_the_open_file_as_it_was(tmp_path):
    """A record the schema refuses fails the append whole: earlier blocks stay readable and later appends follow."""
    spool = spool_in(tmp_path)
    spool.append(samples(TIME_MS, 2))
    size = spool.bytes
    with pytest.raises(ValidationError):
        spool.append([sample(TIME_MS + 1, 0), {"time_ms": TIME_MS + 1, "node": "seven"}])
    with pytest.raises(ValueError):
        spool.append([{"time_ms": -1}])
    assert spool.bytes == size == spool.open_path.stat().st_size
    spool.append(samples(TIME_MS + 2, 1))
    assert read_path(spool.open_path) == samples(TIME_MS, 2) + samples(TIME_MS + 2, 1)


def test_reopen_closes_the_open_file_a_crash_left(tmp_path):
    """An intact open file from a previous run is closed on open, whole, with nothing counted lost."""
    spool = spool_in(tmp_path)
    spool.append(samples(TIME_MS, 4))
    del spool
    spool = spool_in(tmp_path)
    [path] = spool.closed()
    assert read_path(path) == samples(TIME_MS, 4)
    assert (spool.torn_files, spool.unreadable_files, spool.dropped_records) == (0, 0, 0)


def test_reopen_keeps_the_complete_blocks_of_a_torn_open_file(tmp_path, caplog):
    """A crash mid-block leaves a torn tail: reopening keeps the complete blocks (rewritten) and counts a torn file."""
    spool = spool_in(tmp_path)
    for step in range(3):
        spool.append(samples(TIME_MS + step * 10_000, 5))
    size = spool.open_path.stat().st_size
    del spool
    os.truncate(tmp_path / OPEN_NAME, size - 10)
    with caplog.at_level(logging.WARNING, logger="rocket.telemetry"):
        spool = spool_in(tmp_path)
    [path] = spool.closed()
    assert parse_closed_name(path.name) == (TIME_MS, TIME_MS + 10_000, 10, 0)
    assert read_path(path) == samples(TIME_MS, 5) + samples(TIME_MS + 10_000, 5)
    assert spool.torn_files == 1 and "torn tail" in caplog.text
    assert sorted(os.listdir(tmp_path)) == [path.name]
    spool.append(samples(TIME_MS + 30_000, 1))
    assert read_path(spool.open_path) == samples(TIME_MS + 30_000, 1)


@pytest.mark.parametrize("content", [b"garbage, not Avro", b"Obj\x01", b""])
def test_reopen_deletes_an_unreadable_open_file(tmp_path, caplog, content):
    """An open file without a readable header is deleted with a warning, and the spool works on; a leftover
    temporary file goes too."""
    (tmp_path / OPEN_NAME).write_bytes(content)
    (tmp_path / "0000000000001-0000000000002-3.avro.tmp").write_bytes(b"half a rewrite")
    with caplog.at_level(logging.WARNING, logger="rocket.telemetry"):
        spool = spool_in(tmp_path)
    assert os.listdir(tmp_path) == [] and spool.closed() == []
    assert spool.unreadable_files == 1 and "cannot be read" in caplog.text
    spool.append(samples(TIME_MS, 1))
    assert read_path(spool.open_path) == samples(TIME_MS, 1)


def test_reopen_finds_closed_files_and_applies_the_bound(tmp_path):
    """Closed files of a previous run are the spool's again, and a smaller bound drops the oldest of them."""
    spool = spool_in(tmp_path)
    for step in range(4):
        spool.append(samples(TIME_MS + step * 10_000, 50))
        spool.rotate()
    sizes = [path.stat().st_size for path in spool.closed()]
    spool = spool_in(tmp_path, file_bytes_max=1000, spool_bytes_max=sum(sizes[2:]))
    assert [parse_closed_name(path.name)[0] for path in spool.closed()] == [TIME_MS + 20_000, TIME_MS + 30_000]
    assert (spool.dropped_files, spool.dropped_records) == (2, 100)


async def test_ship_once_puts_partitioned_keys_and_deletes_locally(tmp_path):
    """Each closed file goes to the store under v1/node=<id>/date=<UTC day of its first sample>/<name>, then away."""
    spool = spool_in(tmp_path / "spool")
    spool.append(samples(TIME_MS, 3))
    spool.rotate()
    spool.append(samples(TIME_MS + 86_400_000, 2))
    spool.rotate()
    names = [path.name for path in spool.closed()]
    store = LocalDirectoryStore(tmp_path / "store")
    assert await ship_once(spool, store, NODE_ID) == 2
    keys = [info.key for info in await store.list("telemetry/")]
    assert keys == [f"telemetry/v1/node=7/date=2023-11-14/{names[0]}", f"telemetry/v1/node=7/date=2023-11-15/{names[1]}"]
    assert read_samples(await store.get(keys[0])) == samples(TIME_MS, 3)
    assert spool.closed() == [] and spool.bytes == 0 and os.listdir(tmp_path / "spool") == []
    assert await ship_once(spool, store, NODE_ID) == 0


async def test_ship_now_rotates_and_ships_everything(tmp_path):
    """On a graceful stop the open file's records are shipped too."""
    spool = spool_in(tmp_path / "spool")
    spool.append(samples(TIME_MS, 2))
    store = LocalDirectoryStore(tmp_path / "store")
    assert await ship_now(spool, store, NODE_ID, prefix="t/") == 1
    [info] = await store.list("t/v1/node=7/")
    assert read_samples(await store.get(info.key)) == samples(TIME_MS, 2)
    assert os.listdir(tmp_path / "spool") == []


async def test_failed_put_keeps_the_files_for_a_later_pass(tmp_path):
    """A store that is down fails the pass and keeps every file; the next pass ships them all, in order."""
    spool = spool_in(tmp_path)
    for step in range(3):
        spool.append(samples(TIME_MS + step * 10_000, 2))
        spool.rotate()
    names = [path.name for path in spool.closed()]
    store = FailingStore(failures=1)
    with pytest.raises(RocketError):
        await ship_once(spool, store, NODE_ID)
    assert [path.name for path in spool.closed()] == names
    assert await ship_once(spool, store, NODE_ID) == 3
    assert list(store.objects) == [object_key("telemetry/", NODE_ID, name) for name in names]
    assert spool.closed() == []


async def test_a_file_that_vanished_meanwhile_is_skipped(tmp_path):
    """A closed file gone between listing and reading (the bound dropped it) is skipped, not an error."""
    spool = spool_in(tmp_path)
    for step in range(3):
        spool.append(samples(TIME_MS + step * 10_000, 2))
        spool.rotate()
    paths = spool.closed()
    store = FailingStore(failures=0)
    original_put = store.put

    async def put_then_lose_the_next(key, data):
        paths[1].unlink(missing_ok=True)
        await original_put(key, data)

    store.put = put_then_lose_the_next
    assert await ship_once(spool, store, NODE_ID) == 2
    assert sorted(store.objects) == [object_key("telemetry/", NODE_ID, paths[index].name) for index in (0, 2)]


async def test_ship_forever_backs_off_warns_once_per_outage_and_catches_up(tmp_path, autojump_clock, caplog):
    """Through an outage of several passes the waits double up to the bound, one warning is logged, and then the
    files kept meanwhile are shipped."""
    spool = spool_in(tmp_path)
    for step in range(2):
        spool.append(samples(TIME_MS + step * 10_000, 2))
        spool.rotate()
    store = FailingStore(failures=4, objects_wanted=2)
    with caplog.at_level(logging.INFO, logger="rocket.telemetry"):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(lambda: ship_forever(spool, store, NODE_ID, interval_s=10.0, retry_s_max=40.0))
            # No deadline of our own here: the clock jumps only to the shipper's waits, which makes them exact.
            await store.has_objects_wanted.wait()
            nursery.cancel_scope.cancel()
    passes = [time - store.put_times[0] for time in store.put_times]
    assert passes == [0.0, 10.0, 30.0, 70.0, 110.0, 110.0]  # waits 10, 20, 40, 40 (capped), then both files
    assert caplog.text.count("shipping to the object store failed") == 1
    assert "works again" in caplog.text
    assert spool.closed() == []


# Random runs of append, rotate, reopen and shipping (to a store up or down) against a tight bound.
operations = st.lists(
    st.one_of(st.tuples(st.just("append"), st.integers(1, 300)), st.just(("rotate",)), st.just(("reopen",)),
              st.just(("ship",)), st.just(("ship_down",))),
    max_size=25)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(operations)
def test_every_record_is_shipped_dropped_or_spooled(steps):
    """No record is lost uncounted: records shipped + dropped + still spooled == records appended."""
    with tempfile.TemporaryDirectory() as temporary:
        root = Path(temporary)
        clock = FakeClock()

        def open_spool() -> Spool:
            return Spool(root / "spool", file_age_s=25.0, file_bytes_max=3000, spool_bytes_max=9000, clock=clock)

        spool = open_spool()
        dropped_before = appended = time_ms = 0
        for step in steps:
            if step[0] == "append":
                spool.append([sample(TIME_MS + time_ms, time_ms + index) for index in range(step[1])])
                appended += step[1]
                time_ms += 10_000
                clock.now += 10.0
                assert spool.bytes <= 9000
            elif step[0] == "rotate":
                spool.rotate()
            elif step[0] == "reopen":
                dropped_before += spool.dropped_records
                spool = open_spool()
            else:
                store = LocalDirectoryStore(root / "store") if step[0] == "ship" else FailingStore(failures=1)
                try:
                    trio.run(ship_once, spool, store, NODE_ID)
                except RocketError:
                    assert step[0] == "ship_down"

        async def shipped_records() -> int:
            store = LocalDirectoryStore(root / "store")
            return sum([len(read_samples(await store.get(info.key))) for info in await store.list("")])

        shipped = trio.run(shipped_records)
        dropped = dropped_before + spool.dropped_records
        event(f"records dropped: {dropped > 0}, shipped: {shipped > 0}")
        assert shipped + dropped + len(spooled_records(spool)) == appended
