"""Deleting a topic, or a consumer group's state on a topic, in a storage group: its queues, timers, dead letters,
offsets, pop states and producers leave the index and the machine, appends to it are refused until its name is
opened again, and all of it holds across a restart, a lost index and a snapshot installed on a replica."""

from __future__ import annotations

import shutil

import pytest

from rocket.errors import Code, RocketError
from rocket.model import Message, dead_letter_topic, timer_topic
from rocket.serde import batch as batch_codec
from rocket.raft.core import Entry
from rocket.store.commands import encode_drop, encode_pop, encode_timers
from tests.unit.test_store import APPEND_MS, GROUP, Node, append_entry, bodies, make_batch, offsets_entry


def drop_entry(index: int, op: str, topic: str, queues: list[int], consumer_group: str = "",
               incarnation: int = 0) -> Entry:
    return Entry(1, index, encode_drop(op, topic, queues, consumer_group, incarnation))


def timed_entry(index: int, topic: str, queue: int, due_ms: int) -> Entry:
    batch = batch_codec.encode([Message(b"later", deliver_at_ms=due_ms)], APPEND_MS)
    return Entry(1, index, encode_timers(topic, queue, APPEND_MS, batch))


def populated(store: Node) -> None:
    """Group GROUP: topic t (queues 0, 1) with a commit of two groups, a pending timer, a dead letter and a pop
    state; topic u beside it (queue 0) with a commit."""
    entries = [append_entry(1, "t", 0, make_batch(0, 5)), append_entry(2, "t", 1, make_batch(5, 3)),
               append_entry(3, "u", 0, make_batch(100, 4)), offsets_entry(4, "billing", "t", {0: 2, 1: 1}),
               offsets_entry(5, "audit", "t", {0: 5}), offsets_entry(6, "billing", "u", {0: 3}),
               timed_entry(7, "t", 0, APPEND_MS + 3_600_000),
               Entry(1, 8, encode_pop({"op": "bury", "consumer_group": "billing", "topic": "t", "queue": 1,
                                       "now_ms": APPEND_MS}, make_batch(200, 1))),
               Entry(1, 9, encode_pop({"op": "reset", "consumer_group": "billing", "topic": "t", "queue": 0,
                                       "cursor": 2}))]
    store.apply(GROUP, entries)
    assert ("billing", "t", 0) in store.store.machine.pops


def test_a_dropped_topic_leaves_nothing_and_refuses_appends_until_reopened(tmp_path):
    store = Node(tmp_path)
    populated(store)
    dead = dead_letter_topic("billing", "t")
    assert store.reads.queue_stats(dead, 1)["next_offset"] == 1
    assert store.reads.queue_stats(timer_topic("t"), 0)["next_offset"] == 1
    assert store.apply(GROUP, [drop_entry(10, "topic", "t", [0, 1])]) == [True]

    def gone() -> None:
        for topic, queue in (("t", 0), ("t", 1), (dead, 1), (timer_topic("t"), 0)):
            assert store.reads.queue_stats(topic, queue) == {"min_offset": 0, "next_offset": 0, "bytes": 0}
            assert store.reads.read(topic, queue, 0, 1 << 20) == []
        assert store.reads.fetch_offsets("billing", "t") == {}
        assert store.reads.fetch_offsets("audit", "t") == {}
        assert store.store.index.timers(GROUP) == []
        assert bodies(store, "u", 0) and store.reads.fetch_offsets("billing", "u") == {0: 3}  # the other topic stays
        assert store.store.machine.dropped == {(GROUP, "t")}
        assert not [key for key in store.store.machine.pops if key[1] == "t"]
        assert not [key for key in store.store.index.pop_states() if key[1] == "t"]

    gone()
    refused = store.apply(GROUP, [append_entry(11, "t", 0, make_batch(0, 1)), offsets_entry(12, "billing", "t", {0: 1})])
    assert [result.code for result in refused] == [Code.UNKNOWN_TOPIC] * 2
    assert store.apply(GROUP, [append_entry(13, "u", 0, make_batch(104, 1))]) == [(4, 1)]
    store.close()

    store = Node(tmp_path)  # the WAL's entries applied again at open: the same outcome
    gone()
    store.close()
    shutil.rmtree(tmp_path / "index")
    store = Node(tmp_path)
    gone()

    # Made again: the name opens, and the topic starts empty.
    assert store.apply(GROUP, [drop_entry(14, "reopen", "t", [0, 1]), append_entry(15, "t", 0, make_batch(0, 2))]) \
        == [True, (0, 2)]
    assert store.store.machine.dropped == set()
    store.close()
    store = Node(tmp_path)
    assert store.reads.queue_stats("t", 0)["next_offset"] == 2 and store.store.machine.dropped == set()
    store.close()


def test_a_drop_takes_what_the_same_apply_added_before_it(tmp_path):
    """An append and a commit applied in the same call as the drop that follows them leave nothing behind."""
    store = Node(tmp_path)
    results = store.apply(GROUP, [append_entry(1, "t", 0, make_batch(0, 5)), offsets_entry(2, "billing", "t", {0: 5}),
                                  drop_entry(3, "topic", "t", [0])])
    assert results == [(0, 5), None, True]
    assert store.reads.queue_stats("t", 0)["next_offset"] == 0
    assert store.reads.fetch_offsets("billing", "t") == {}
    assert list(store.store.index.referenced(0)) == []  # the WAL may be reclaimed
    store.close()


def test_a_consumer_groups_drop_takes_its_offsets_and_dead_letters_only(tmp_path):
    """Its own keys, found without a scan of every group's: not a group whose name starts with its name, nor its
    offsets on a topic whose name starts with the topic's."""
    store = Node(tmp_path)
    populated(store)
    store.apply(GROUP, [offsets_entry(10, "billing2", "t", {0: 4}), append_entry(11, "t2", 0, make_batch(300, 2)),
                        offsets_entry(12, "billing", "t2", {0: 1})])
    assert store.apply(GROUP, [drop_entry(13, "group", "t", [0, 1], "billing")]) == [True]
    for _ in range(2):  # and after a restart, from the index
        assert store.reads.fetch_offsets("billing", "t") == {}
        assert store.reads.fetch_offsets("audit", "t") == {0: 5}
        assert store.reads.fetch_offsets("billing2", "t") == {0: 4}
        assert store.reads.fetch_offsets("billing", "t2") == {0: 1}
        assert store.reads.fetch_offsets("billing", "u") == {0: 3}
        assert store.reads.queue_stats(dead_letter_topic("billing", "t"), 1)["next_offset"] == 0
        assert not [key for key in store.store.machine.pops if key[:2] == ("billing", "t")]
        assert not [key for key in store.store.index.pop_states() if key[:2] == ("billing", "t")]
        store.close()
        store = Node(tmp_path)
    assert store.reads.queue_stats("t", 0)["next_offset"] == 5  # the topic itself stays, open for appends
    assert store.apply(GROUP, [append_entry(14, "t", 0, make_batch(5, 1))]) == [(5, 1)]
    store.close()


def test_a_snapshot_carries_a_drop_to_a_replica_that_missed_it(tmp_path):
    """A replica that held the topic installs a snapshot taken after the drop: the queues go, the name is refused."""
    source, replica = Node(tmp_path / "source"), Node(tmp_path / "replica")
    populated(source)
    populated(replica)
    source.apply(GROUP, [drop_entry(10, "topic", "t", [0, 1]), append_entry(11, "u", 0, make_batch(104, 1))])
    replica.restore(GROUP, source.store.snapshot(GROUP))
    assert replica.store.machine.dropped == {(GROUP, "t")}
    assert replica.reads.queue_stats("t", 0)["next_offset"] == 0
    assert replica.reads.fetch_offsets("billing", "t") == {}
    assert replica.store.index.tombstones() == {(GROUP, "t")}
    with pytest.raises(RocketError):
        replica.reads.read("t", 0, 1, 100)
    source.close()
    replica.close()


def test_a_late_drop_of_an_older_incarnation_changes_nothing(tmp_path):
    """The topic made at 100 is dropped, made again at 200 (reopen); a drop of the one made at 100, proposed late by
    a deposed nameserver, is refused and the new topic keeps its data; across a restart and a snapshot too."""
    source, replica = Node(tmp_path / "source"), Node(tmp_path / "replica")
    entries = [append_entry(1, "t", 0, make_batch(0, 3)), drop_entry(2, "topic", "t", [0], incarnation=100),
               drop_entry(3, "reopen", "t", [], incarnation=200), append_entry(4, "t", 0, make_batch(10, 2))]
    assert source.apply(GROUP, entries) == [(0, 3), True, True, (0, 2)]
    assert source.apply(GROUP, [drop_entry(5, "topic", "t", [0], incarnation=100)]) == [False]
    assert source.reads.queue_stats("t", 0)["next_offset"] == 2
    source.close()
    source = Node(tmp_path / "source")
    assert source.store.machine.incarnations == {(GROUP, "t"): 200}
    assert source.apply(GROUP, [drop_entry(6, "topic", "t", [0], incarnation=150)]) == [False]
    replica.restore(GROUP, source.store.snapshot(GROUP))
    assert replica.store.machine.incarnations == {(GROUP, "t"): 200}
    assert source.apply(GROUP, [drop_entry(7, "topic", "t", [0], incarnation=200)]) == [True]  # this one's own
    assert source.reads.queue_stats("t", 0)["next_offset"] == 0
    source.close()
    replica.close()
