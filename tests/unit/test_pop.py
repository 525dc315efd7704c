"""Pop consumption state in the store: conditional pops, acks and invisible-time changes (a command
computed on stale state changes nothing), dead letters appended beside the queue, and the state's
survival across a reopen, an index rebuild and a snapshot installed on another replica."""

from __future__ import annotations

import shutil

from rocket.model import Message, dead_letter_topic
from rocket.serde import batch as batch_codec
from rocket.store.commands import encode_pop
from rocket.store.pop import PopQueue
from tests.unit.test_store import GROUP, Node, append_entry
from tests.unit.test_timers import Log

KEY = ("workers", "jobs", 0)


def command(op: str, **fields) -> bytes:
    return encode_pop({"op": op, "consumer_group": KEY[0], "topic": KEY[1], "queue": KEY[2], **fields})


def filled(tmp_path) -> tuple[Node, Log]:
    node = Node(tmp_path)
    log = Log(node)
    log.index += 1
    node.apply(GROUP, [append_entry(log.index, "jobs", 0, batch_codec.encode([Message(f"j{i}".encode()) for i in range(10)], 1))])
    return node, log


def test_pops_acks_and_changes_apply_only_to_the_state_they_were_computed_from(tmp_path):
    """A pop hands out offsets from the cursor it names; a second pop naming the old cursor applies
    nothing; an ack or change with a stale attempt is refused; redelivery bumps the attempt."""
    node, log = filled(tmp_path)
    first = command("pop", cursor=0, next=4, new=[0, 2, 3], again=[], visible_at_ms=1_000)
    assert log.apply(first, first) == [[[0, 1], [2, 1], [3, 1]], False]
    assert node.pop_state(*KEY) == PopQueue(4, {0: (1_000, 1), 2: (1_000, 1), 3: (1_000, 1)})
    assert log.apply(command("ack", receipts=[[0, 1]]), command("ack", receipts=[[0, 1], [9, 1]])) == [[True], [False, False]]
    assert log.apply(command("change", receipts=[[2, 1], [3, 7]], visible_at_ms=5_000)) == [[True, False]]
    assert log.apply(command("change", receipts=[[2, 2]], visible_at_ms=9_000)) == [[False]]
    again = command("pop", cursor=4, next=4, new=[], again=[[3, 1, 1_000]], visible_at_ms=2_000)
    stale = command("pop", cursor=4, next=4, new=[], again=[[2, 1, 1_000]], visible_at_ms=2_000)  # changed since
    assert log.apply(again, stale) == [[[3, 2]], False]
    assert node.pop_state(*KEY) == PopQueue(4, {2: (5_000, 1), 3: (2_000, 2)})
    assert node.pop_state(*KEY).done_before() == 2
    node.close()


def test_a_dead_letter_moves_the_message_once(tmp_path):
    """A message past its attempts is dropped from flight and appended to the group's dead-letter queue
    of the topic, once, even if the command comes twice."""
    node, log = filled(tmp_path)
    log.apply(command("pop", cursor=0, next=1, new=[0], again=[], visible_at_ms=1_000))
    letter = batch_codec.encode([Message(b"j0", properties={"DLQ_ATTEMPTS": "1"})], 2_000)
    dead = command("dead", offset=0, attempt=1, visible_ms=1_000, now_ms=2_000)
    assert log.apply(dead + letter, dead + letter) == [True, False]
    assert node.pop_state(*KEY).in_flight == {}
    [(base_offset, batch)] = node.read(dead_letter_topic("workers", "jobs"), 0, 0, 1 << 20)
    assert base_offset == 0 and [m.body for m in batch_codec.decode(batch)] == [b"j0"]
    node.close()


def test_pop_state_survives_a_reopen_an_index_rebuild_and_a_snapshot(tmp_path):
    """The cursor and what is in flight are the same after a reopen, after losing the index, and on a
    replica that installed the group's snapshot (replacing what it had)."""
    node, log = filled(tmp_path / "leader")
    log.apply(command("pop", cursor=0, next=5, new=[1, 4], again=[], visible_at_ms=7_000),
              command("ack", receipts=[[1, 1]]))
    expected = PopQueue(5, {4: (7_000, 1)})
    node.close()
    for lose_index in (False, True):
        if lose_index:
            shutil.rmtree(tmp_path / "leader" / "index")
        node = Node(tmp_path / "leader")
        assert node.pop_state(*KEY) == expected
        node.close()
    node = Node(tmp_path / "leader")
    replica, replica_log = filled(tmp_path / "replica")
    replica_log.apply(command("pop", cursor=0, next=9, new=[8], again=[], visible_at_ms=1))
    replica.restore(GROUP, list(node.snapshot(GROUP)))
    assert replica.pop_state(*KEY) == expected
    replica.close()
    replica = Node(tmp_path / "replica")
    assert replica.pop_state(*KEY) == expected
    replica.close()
    node.close()
