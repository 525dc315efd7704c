"""Timers of delay topics in the store: messages wait in a timer queue, are delivered once at their time
(never twice, even when a fire is proposed again or races a cancel), survive a reopen and an index
rebuild, and travel in snapshots."""

from __future__ import annotations

import random
import shutil

from rocket import limits
from rocket.model import Message, timer_topic
from rocket.raft.core import Entry
from rocket.serde import batch as batch_codec
from rocket.store.commands import encode_cancel, encode_move, encode_timers
from tests.unit.test_store import GROUP, Node

NOW_MS = 1_700_000_000_000
TOPIC = "later"


class Log:
    """A group's Raft log as far as the store sees it: entries numbered in order."""

    def __init__(self, node: Node, group: int = GROUP):
        self.node = node
        self.group = group
        self.index = node.applied(group)

    def apply(self, *payloads: bytes) -> list:
        entries = []
        for payload in payloads:
            self.index += 1
            entries.append(Entry(1, self.index, payload))
        return self.node.apply(self.group, entries)


def schedule(log: Log, queue: int, deliveries_ms: list[int], now_ms: int = NOW_MS, label: str = "") -> tuple[int, int]:
    """Message i of the batch has body 'QUEUE:DELIVERY_MS:I' (LABEL/ before it if given)."""
    messages = [Message(f"{label}{queue}:{deliver_ms}:{i}".encode(), deliver_at_ms=deliver_ms)
                for i, deliver_ms in enumerate(deliveries_ms)]
    [result] = log.apply(encode_timers(TOPIC, queue, now_ms, batch_codec.encode(messages, now_ms)))
    return result


def fire_due(log: Log, now_ms: int) -> list[Message]:
    """What the storage role does each tick: propose a fire for every delivery due; returns what applied."""
    delivered = []
    for topic, queue, offsets, batch in log.node.timers.due_deliveries(log.group, now_ms):
        [result] = log.apply(encode_move(topic, queue, now_ms, timer_topic(topic), offsets, batch))
        if result:
            delivered.extend(batch_codec.decode(batch, result[0], queue))
    return delivered


def consumed(node: Node, queue: int) -> list[Message]:
    messages = []
    for base_offset, batch in node.read(TOPIC, queue, 0, 1 << 30):
        messages.extend(batch_codec.decode(batch, base_offset, queue))
    return messages


def test_100k_timers_over_ten_minutes_fire_once_within_their_precision(tmp_path):
    """100,000 timers spread over the next ten minutes, on a simulated clock ticking as the storage role
    does: each is delivered exactly once, no earlier than its time and within one tick after it."""
    node = Node(tmp_path)
    log = Log(node)
    rng = random.Random(7)
    wanted: dict[bytes, int] = {}
    for chunk in range(100):
        deliveries = [NOW_MS + rng.randrange(1_000, 600_000) for _ in range(1_000)]
        schedule(log, chunk % 4, deliveries, label=f"{chunk}/")
        wanted.update({f"{chunk}/{chunk % 4}:{ms}:{i}".encode(): ms for i, ms in enumerate(deliveries)})
    assert len(wanted) == 100_000 and node.timers.pending_timers(GROUP) == 100_000
    tick_ms = int(limits.timer_tick_s * 1000)
    seen: dict[bytes, int] = {}
    for now_ms in range(NOW_MS, NOW_MS + 601_000, tick_ms):
        for message in fire_due(log, now_ms):
            assert message.body not in seen, "delivered twice"
            assert 0 <= now_ms - wanted[message.body] < tick_ms, "delivered early or late"
            assert message.timestamp_ms == wanted[message.body] and message.deliver_at_ms == 0
            seen[message.body] = now_ms
    assert len(seen) == 100_000 and node.timers.pending_timers(GROUP) == 0
    stored = [message.body for queue in range(4) for message in consumed(node, queue)]
    assert sorted(stored) == sorted(wanted)
    node.close()


def test_a_fire_repeated_or_racing_a_cancel_delivers_nothing_twice(tmp_path):
    """A fire proposed twice (its answer lost) applies once; a fire that includes a cancelled timer
    delivers nothing, and the next round delivers the rest; a second cancel finds nothing."""
    node = Node(tmp_path)
    log = Log(node)
    assert schedule(log, 0, [NOW_MS + 1_000] * 3) == (0, 3)
    [(topic, queue, offsets, batch)] = node.timers.due_deliveries(GROUP, NOW_MS + 1_000)
    assert (topic, queue, offsets) == (TOPIC, 0, [0, 1, 2])
    first, again = log.apply(encode_move(topic, queue, NOW_MS + 1_000, timer_topic(topic), offsets, batch),
                             encode_move(topic, queue, NOW_MS + 1_000, timer_topic(topic), offsets, batch))
    assert first == (0, 3) and again is False
    assert len(consumed(node, 0)) == 3

    schedule(log, 0, [NOW_MS + 2_000] * 2)  # timer offsets 3 and 4
    [(topic, queue, offsets, batch)] = node.timers.due_deliveries(GROUP, NOW_MS + 2_000)
    assert log.apply(encode_cancel(timer_topic(TOPIC), 0, [3]), encode_move(topic, queue, NOW_MS + 2_000, timer_topic(topic), offsets, batch)) == [True, False]
    assert log.apply(encode_cancel(timer_topic(TOPIC), 0, [3])) == [False]
    assert [m.body for m in fire_due(log, NOW_MS + 2_100)] == [b"0:1700000002000:1"]
    assert [m.body for m in consumed(node, 0)][3:] == [b"0:1700000002000:1"]
    node.close()


def test_timers_survive_a_reopen_and_an_index_rebuild(tmp_path):
    """Pending timers are derived state: after a reopen, and after losing the index, the same timers
    are pending and fire once; a message without a delivery time in a timed batch is due at once."""
    node = Node(tmp_path)
    log = Log(node)
    schedule(log, 1, [NOW_MS + 5_000, NOW_MS + 9_000, 0])
    assert [m.body for m in fire_due(log, NOW_MS)] == [b"1:0:2"]
    node.close()
    for lose_index in (False, True):
        if lose_index:
            shutil.rmtree(tmp_path / "index")
        node = Node(tmp_path)
        assert node.timers.pending_timers(GROUP) == 2
        assert node.timers.due_deliveries(GROUP, NOW_MS + 4_999) == []
        node.close()
    node = Node(tmp_path)
    log = Log(node)
    assert [m.body for m in fire_due(log, NOW_MS + 9_000)] == [b"1:1700000005000:0", b"1:1700000009000:1"]
    assert node.timers.pending_timers(GROUP) == 0 and len(consumed(node, 1)) == 3
    node.close()


def test_a_snapshot_carries_pending_timers_to_another_replica(tmp_path):
    """A replica that installs a snapshot holds the same pending timers (their messages it backfills
    like any batch), replacing any it had; a restart keeps them."""
    leader = Node(tmp_path / "leader")
    log = Log(leader)
    schedule(log, 2, [NOW_MS + 3_000])
    schedule(log, 2, [NOW_MS + 4_000])
    snapshot = list(leader.snapshot(GROUP))
    replica = Node(tmp_path / "replica")
    schedule(Log(replica), 2, [NOW_MS + 99_000])  # a stale timer the snapshot replaces
    replica.restore(GROUP, snapshot)
    expected = leader.index.timers(GROUP)
    assert replica.index.timers(GROUP) == expected and len(expected) == 2
    assert replica.gaps() == [(GROUP, timer_topic(TOPIC), 2, 2)]
    replica.close()
    replica = Node(tmp_path / "replica")
    assert replica.index.timers(GROUP) == expected
    replica.close()
    leader.close()
