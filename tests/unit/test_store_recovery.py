"""Recovery of the store: LevelDB, written without sync, is the store's only state besides the WAL. A restart, also
one whose LevelDB lost its writes since its last sync (a power cut), recovers every queue, consumer offset, pop and
timer: the groups' entries are applied again from the WAL. The store's own log that earlier builds kept is replayed
into the index once, at the first open, and deleted."""

from __future__ import annotations

import shutil
from pathlib import Path

import orjson
import pytest

from rocket import limits
from rocket.disk.commitlog import CommitLog
from rocket.errors import Code, RocketError
from rocket.store import records
from rocket.store.commands import encode_append, encode_offsets
from rocket.store.pop import PopQueue
from tests.unit.test_pop import KEY, command
from tests.unit.test_store import GROUP, Node, bodies, make_batch
from tests.unit.test_timers import NOW_MS, TOPIC, Log, fire_due, schedule

WIDE_QUEUES = 1000  # a commit of this many queues' offsets


def round_of_work(log: Log, round_number: int) -> None:
    """One second of a busy group, as the store sees it: batches on two topics, a wide consumer-offset commit, timers
    scheduled and some fired, a pop and an ack."""
    for queue in range(4):
        log.apply(encode_append("t", queue, NOW_MS + round_number * 1_000, make_batch(round_number * 10, 10)))
    log.apply(encode_append("jobs", 0, NOW_MS + round_number * 1_000, make_batch(round_number * 2, 2)))
    log.apply(encode_offsets("billing", "t", {queue: round_number * 10 + queue for queue in range(WIDE_QUEUES)}))
    schedule(log, round_number % 2, [NOW_MS + round_number * 1_000 + 500, NOW_MS + 10**9 + round_number],
             label=f"{round_number}/")
    fire_due(log, NOW_MS + round_number * 1_000)
    cursor = log.node.pop_state(*KEY).cursor
    log.apply(command("pop", cursor=cursor, next=cursor + 2, new=[cursor, cursor + 1], again=[],
                      visible_at_ms=NOW_MS + round_number),
              command("ack", receipts=[[cursor, 1]]))


def observed(node: Node) -> dict:
    """Everything a reader sees of the workload's queues and consumers."""
    return {
        "stats": {(topic, queue): node.queue_stats(topic, queue)
                  for topic, queues in (("t", 4), ("jobs", 1), (TOPIC, 2)) for queue in range(queues)},
        "bodies": {queue: bodies(node, "t", queue) for queue in range(4)},
        "offsets": node.fetch_offsets("billing", "t"),
        "pops": node.pop_state(*KEY),
        "timers": node.index.timers(GROUP),
        "applied": node.applied(GROUP),
    }


def copy_synced_index(node: Node, directory: Path) -> Path:
    """A copy of the index as LevelDB holds it durably now. LevelDB compacts in the background and deletes files
    then, so it compacts everything first: no file vanishes while it is copied."""
    node.store.index._db.compact_range()
    synced = directory / "index-at-sync"
    shutil.copytree(directory / "index", synced)
    return synced


def test_a_restart_recovers_everything(tmp_path):
    """After many rounds, a reopen finds every queue's offsets and messages, the consumer offsets, the pop cursor and
    what is in flight, and the pending timers as they were; the group goes on."""
    node = Node(tmp_path)
    log = Log(node)
    for round_number in range(1, 200):
        round_of_work(log, round_number)
        if round_number % 10 == 0:
            node.sync()
    before = observed(node)
    assert before["pops"].cursor == 2 * 199 and len(before["pops"].in_flight) == 199
    assert len(before["timers"]) == 200 and before["offsets"][WIDE_QUEUES - 1] == 1990 + WIDE_QUEUES - 1
    node.close()

    node = Node(tmp_path)
    assert observed(node) == before
    log = Log(node)
    round_of_work(log, 200)
    assert node.queue_stats("t", 0)["next_offset"] == 2000
    assert node.pop_state(*KEY).cursor == 400
    node.close()
    assert not (tmp_path / "log").exists()  # the store writes no log of its own


def test_an_index_that_lost_its_writes_since_its_last_sync_is_brought_up_from_the_wal(tmp_path):
    """A power cut may take LevelDB back to its last synced write: the groups' entries since, applied again from the
    WAL, bring it up to date (queues, offsets, pops, timers, applied entries)."""
    node = Node(tmp_path)
    log = Log(node)
    for round_number in range(1, 100):
        round_of_work(log, round_number)
    node.sync()
    synced = copy_synced_index(node, tmp_path)
    for round_number in range(100, 150):
        round_of_work(log, round_number)
    expected = observed(node)
    node.close()
    shutil.rmtree(tmp_path / "index")
    synced.rename(tmp_path / "index")

    node = Node(tmp_path)
    assert observed(node) == expected
    assert expected["pops"] == PopQueue(298, {offset: (NOW_MS + (offset + 1) // 2, 1) for offset in range(1, 298, 2)})
    node.close()


# ---- the store's own log of earlier builds ----------------------------------------------------------------


def write_legacy_log(node: Node) -> None:
    """From now on, also write what the store persists to the store's own log, as earlier builds did."""
    store = node.store
    legacy = CommitLog.open(node.directory / "log", limits.segment_bytes_min)
    persist, close = store._persist, store.close

    def persist_and_log(held) -> None:
        written = []
        for effects in held:
            if not effects.applied:
                continue
            written += [(records.BATCH, records.encode_batch(topic, queue, effects.group, entry))
                        for topic, queue, entry in effects.index_entries]
            written += [(records.OFFSETS, orjson.dumps({"group": group, "topic": topic, "offsets": offsets},
                                                       option=orjson.OPT_NON_STR_KEYS))
                        for group, topic, offsets in effects.commits]
            if effects.timers:
                written.append((records.TIMERS, records.encode_timers(effects.group, effects.timers)))
            if effects.pop_changes:
                written.append((records.POPS, orjson.dumps([change.to_wire() for change in effects.pop_changes])))
            if effects.producer_changes:
                written.append((records.PRODUCERS, orjson.dumps(effects.producer_changes)))
            written.append((records.APPLIED, records.encode_applied(effects.group, effects.applied)))
        legacy.append(written)
        persist(held)
        store.index._db.put(b"m/applied", legacy.end_position.to_bytes(8, "big"))

    def close_both() -> None:
        legacy.sync()
        legacy.close()
        close()

    store._persist, store.close = persist_and_log, close_both


def legacy_store(directory: Path, rounds: int, synced_at: int) -> tuple[dict, Path]:
    """A store of an earlier build: its log holds every round; its index was synced after round synced_at and lost
    what came after. Returns what a reader saw, and the index as it was when synced."""
    node = Node(directory)
    write_legacy_log(node)
    log = Log(node)
    for round_number in range(1, rounds + 1):
        round_of_work(log, round_number)
        if round_number == synced_at:
            node.sync()
            copy_synced_index(node, directory)
    expected = observed(node)
    node.wal.checkpoint([])  # what the index lacks must come from the old log: the WAL replays none of its entries
    node.close()
    return expected, directory / "index-at-sync"


@pytest.mark.parametrize("index", ["up-to-date", "behind", "without-wal-references"])
def test_the_store_log_of_an_earlier_build_is_replayed_once_and_deleted(tmp_path, index):
    """An earlier build's store log is replayed into the index at the first open (all of it for an index that
    predates WAL references), then deleted: the store holds what it held, and goes on."""
    expected, at_sync = legacy_store(tmp_path, 60, 30)
    if index == "behind":
        shutil.rmtree(tmp_path / "index")
        at_sync.rename(tmp_path / "index")
    elif index == "without-wal-references":
        node = Node(tmp_path)  # no log yet: nothing to migrate
        node.index._db.delete(b"m/refs")
        node.close()
    node = Node(tmp_path)
    assert not (tmp_path / "log").exists()
    assert observed(node) == expected
    round_of_work(Log(node), 61)
    assert node.queue_stats("t", 0)["next_offset"] == 610
    node.close()
    node = Node(tmp_path)
    assert node.queue_stats("t", 0)["next_offset"] == 610
    node.close()


def test_an_index_that_needs_the_deleted_part_of_an_old_log_is_refused(tmp_path):
    """An earlier build's checkpoints deleted its log below what LevelDB held durably: an index behind that point
    cannot be brought up to date, and the store refuses to open with CORRUPT_DATA, naming the index."""
    legacy_store(tmp_path, 20, 10)
    shutil.rmtree(tmp_path / "index")  # an index lost, beside a log whose first segment went
    start = (tmp_path / "log" / f"{0:020d}.log").stat().st_size
    (tmp_path / "log" / f"{0:020d}.log").rename(tmp_path / "log" / f"{start:020d}.log")
    with pytest.raises(RocketError) as caught:
        Node(tmp_path)
    assert caught.value.code == Code.CORRUPT_DATA
    assert "index" in caught.value.message and "cannot be rebuilt" in caught.value.message


def test_a_replayed_log_whose_deletion_a_crash_cut_short_is_deleted_at_the_next_open(tmp_path):
    """The migration syncs the index, then renames the old log before deleting it: a log found renamed was replayed
    already, and goes."""
    expected, _ = legacy_store(tmp_path, 10, 10)
    (tmp_path / "log").rename(tmp_path / "log.replayed")
    node = Node(tmp_path)
    assert not (tmp_path / "log.replayed").exists() and not (tmp_path / "log").exists()
    assert observed(node) == expected
    node.close()
