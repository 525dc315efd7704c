"""Orderly consumers' queue locks as a storage group applies them: one holder per queue until it unlocks or stops
renewing for limits.remoting_lock_expiry_s, bounded, kept across restarts and a lost index, carried by snapshots, and
dropped with their topic."""

from __future__ import annotations

import shutil

import pytest

from rocket import limits
from rocket.errors import Code, RocketError
from rocket.raft.core import Entry
from rocket.store import commands
from rocket.store.commands import encode_lock
from tests.unit.test_store import GROUP, Node
from tests.unit.test_store_drop import drop_entry

T = 1_700_000_000_000
EXPIRY_MS = int(limits.remoting_lock_expiry_s * 1000)


def lock(index: int, client: str, queues: list[int], at_ms: int, op: str = "lock", group: str = "g",
         topic: str = "t") -> Entry:
    return Entry(1, index, encode_lock(op, group, topic, client, queues, at_ms))


def test_a_queue_has_one_holder_until_it_unlocks_or_stops_renewing(tmp_path):
    store = Node(tmp_path)
    assert store.apply(GROUP, [lock(1, "a", [0, 1], T), lock(2, "b", [1, 2], T + 1)]) == [[0, 1], [2]]
    # a renews; b still cannot take 1; another consumer group's locks are its own
    assert store.apply(GROUP, [lock(3, "a", [0, 1], T + 20_000), lock(4, "b", [1], T + 30_000),
                               lock(5, "b", [1], T + 30_000, group="other")]) == [[0, 1], [], [1]]
    # a gives 0 back (and cannot give back b's 2); b takes 0 at once, and 1 once a's lock lapsed
    assert store.apply(GROUP, [lock(6, "a", [0, 2], T + 31_000, op="unlock"), lock(7, "b", [0, 1], T + 32_000),
                               lock(8, "b", [1], T + 20_000 + EXPIRY_MS + 1)]) == [[0], [0], [1]]
    assert store.store.machine.locks[(GROUP, "g", "t", 1)] == ("b", T + 20_000 + EXPIRY_MS + 1)
    assert sorted(map(tuple, map(dict.values, store.reads.consumed("t", [0, 1])[3]))) == [
        ("g", 0, "b"), ("g", 1, "b"), ("other", 1, "b")]
    # a dropped topic's locks go with it
    store.apply(GROUP, [drop_entry(9, "topic", "t", [0, 1, 2])])
    assert [key for key in store.store.machine.locks if key[2] == "t"] == []


def test_locks_survive_a_restart_and_a_lost_index_and_ride_in_snapshots(tmp_path):
    source = Node(tmp_path / "source")
    source.apply(GROUP, [lock(1, "a", [0], T), lock(2, "a", [1], T + 1000), lock(3, "c", [3], T + 1500),
                         lock(4, "c", [3], T + 1600, op="unlock")])
    replica = Node(tmp_path / "replica")
    replica.restore(GROUP, source.store.snapshot(GROUP))
    assert replica.apply(GROUP, [lock(5, "b", [0, 1, 2], T + 2000)]) == [[2]]  # a's locks came with the snapshot
    replica.close()
    source.store.sync()
    source.close()
    for lost_index in (False, True):  # reopened from its index (past the lock entries), then from its WAL alone
        if lost_index:
            shutil.rmtree(tmp_path / "source" / "index")
        source = Node(tmp_path / "source")
        assert {key: held for key, held in source.store.machine.locks.items() if held[0] == "a"} == {
            (GROUP, "g", "t", 0): ("a", T), (GROUP, "g", "t", 1): ("a", T + 1000)}
        assert source.apply(GROUP, [lock(6 + lost_index, "b", [0, 1, 3], T + 5000)]) == [[3]]  # c gave 3 back
        source.store.sync()
        source.close()
    replica = Node(tmp_path / "replica")
    assert replica.store.machine.locks[(GROUP, "g", "t", 2)] == ("b", T + 2000)


def test_locks_are_bounded_and_lapsed_ones_make_room(tmp_path, monkeypatch):
    monkeypatch.setattr(limits, "remoting_locks_max", 5)
    store = Node(tmp_path)
    assert store.apply(GROUP, [lock(1, "a", list(range(10)), T)]) == [[0, 1, 2, 3, 4]]
    assert store.apply(GROUP, [lock(2, "b", [7, 8, 9], T + 1000, group="g2")]) == [[]]  # the held ones are live
    assert store.apply(GROUP, [lock(3, "b", [7, 8, 9], T + EXPIRY_MS + 1, group="g2")]) == [[7, 8, 9]]
    assert len(store.store.machine.locks) == 3


@pytest.mark.parametrize("op", ["steal", ""])
def test_a_lock_entry_with_an_unknown_op_is_damage(op):
    with pytest.raises(RocketError) as damaged:
        commands.decode(encode_lock(op, "g", "t", "a", [0], T))
    assert damaged.value.code == Code.CORRUPT_DATA
