"""Checkpoints of the store's own log: LevelDB is synced and the log below it deleted, so the log stays bounded under
any number of batches, a restart (also one whose LevelDB lost its writes since the last checkpoint) recovers every
queue, consumer offset, pop and timer from what is left, and an index that would need the deleted log is refused."""

from __future__ import annotations

import shutil

import pytest

from rocket import limits
from rocket.errors import Code, RocketError
from rocket.store.commands import encode_append, encode_offsets
from rocket.store.pop import PopQueue
from tests.unit.test_pop import KEY, command
from tests.unit.test_store import GROUP, Node, bodies, make_batch, segments
from tests.unit.test_timers import NOW_MS, TOPIC, Log, fire_due, schedule

CHECKPOINT_BYTES = 1 * limits.MiB  # as the store log's smallest segments: a checkpoint every some 80 rounds
WIDE_QUEUES = 1000  # a commit of this many queues' offsets is a record of some 13 KiB: the log grows fast


@pytest.fixture(autouse=True)
def small_checkpoints(monkeypatch):
    monkeypatch.setattr(limits, "store_log_checkpoint_bytes", CHECKPOINT_BYTES)


def log_bytes(node: Node) -> int:
    return sum(size for _, _, size in node.log.segments())


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


def test_the_store_log_stays_bounded_under_many_batches(tmp_path):
    """Synced once a round (as Store.run does each second), the store's log holds at most a checkpoint's bytes, a
    segment and a round's records, however much was written: here ten times the checkpoint's bytes."""
    node = Node(tmp_path)
    log = Log(node)
    largest = 0
    for round_number in range(1, 2_000):
        round_of_work(log, round_number)
        largest = max(largest, log_bytes(node))
        node.sync()
        if node.log.end_position > 10 * CHECKPOINT_BYTES:
            break
    round_bytes = node.log.end_position // round_number
    assert node.log.end_position > 10 * CHECKPOINT_BYTES
    assert largest <= CHECKPOINT_BYTES + limits.store_log_segment_bytes_max + 2 * round_bytes
    assert node.log.start_position > 0 and len(segments(tmp_path)) <= 4
    assert node.index.applied_position == node.log.end_position
    node.close()


def test_a_restart_after_checkpoints_recovers_everything(tmp_path):
    """After checkpoints deleted most of the log, a reopen finds every queue's offsets and messages, the consumer
    offsets, the pop cursor and what is in flight, and the pending timers as they were; the group goes on."""
    node = Node(tmp_path)
    log = Log(node)
    for round_number in range(1, 400):
        round_of_work(log, round_number)
        node.sync()
    assert node.log.start_position > 2 * CHECKPOINT_BYTES  # checkpoints dropped the log's first segments
    before = observed(node)
    assert before["pops"].cursor == 2 * 399 and len(before["pops"].in_flight) == 399
    assert len(before["timers"]) == 400 and before["offsets"][WIDE_QUEUES - 1] == 3990 + WIDE_QUEUES - 1
    node.close()

    node = Node(tmp_path)
    assert observed(node) == before
    log = Log(node)
    round_of_work(log, 400)
    assert node.queue_stats("t", 0)["next_offset"] == 4000
    assert node.pop_state(*KEY).cursor == 800
    node.close()


def test_an_index_that_lost_its_writes_since_the_checkpoint_is_replayed(tmp_path, monkeypatch):
    """A power cut may take LevelDB back to its last synced write, the checkpoint: the log from there on, which
    the checkpoint kept, brings it up to date again (queues, offsets, pops, timers, applied entries)."""
    node = Node(tmp_path)
    log = Log(node)
    for round_number in range(1, 200):
        round_of_work(log, round_number)
        node.sync()
    node.close()  # syncs, and checkpoints if due
    checkpointed = tmp_path / "index-at-checkpoint"
    shutil.copytree(tmp_path / "index", checkpointed)  # what LevelDB holds durably
    monkeypatch.setattr(limits, "store_log_checkpoint_bytes", 1 << 40)  # else a later checkpoint would sync it

    node = Node(tmp_path)
    assert node.log.start_position > 0
    log = Log(node)
    for round_number in range(200, 300):
        round_of_work(log, round_number)
        node.sync()
    expected = observed(node)
    node.close()
    shutil.rmtree(tmp_path / "index")
    checkpointed.rename(tmp_path / "index")

    node = Node(tmp_path)
    assert node.index.applied_position == node.log.end_position
    assert observed(node) == expected
    assert expected["pops"] == PopQueue(598, {offset: (NOW_MS + (offset + 1) // 2, 1) for offset in range(1, 598, 2)})
    node.close()


def test_an_index_lost_after_a_checkpoint_is_refused(tmp_path):
    """With the log's first segments deleted, a lost index cannot be rebuilt from the log: the store refuses to
    open with CORRUPT_DATA, naming the index and where the log starts, instead of rebuilding part of the state."""
    node = Node(tmp_path)
    log = Log(node)
    for round_number in range(1, 200):
        round_of_work(log, round_number)
        node.sync()
    start = node.log.start_position
    assert start > 0
    node.close()
    shutil.rmtree(tmp_path / "index")
    with pytest.raises(RocketError) as caught:
        Node(tmp_path)
    assert caught.value.code == Code.CORRUPT_DATA
    assert "index" in caught.value.message and f"starts at {start}" in caught.value.message
