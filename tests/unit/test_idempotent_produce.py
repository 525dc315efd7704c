"""Idempotent produce on the storage side (store/producers.py): a batch sent again with its producer's id and
sequence is stored once and gets its first answer, across a restart of the store, a snapshot installed on another
replica, and with batches applied out of order; what is remembered is bounded."""

from __future__ import annotations

import pytest

from rocket import limits
from rocket.errors import Code, RocketError
from rocket.raft.core import Entry
from rocket.store import commands
from rocket.store.commands import encode_append, encode_half, encode_timers
from rocket.store.producers import Producers
from tests.unit.test_store import APPEND_MS, GROUP, Node, bodies, make_batch

PRODUCER = 0x5EED_0000_0000_0001


def sequenced(index: int, sequence: int, first: int, queue: int = 0, producer: int = PRODUCER,
              append_ms: int = APPEND_MS) -> Entry:
    return Entry(1, index, encode_append("t", queue, append_ms, make_batch(first, 2), (producer, sequence)))


def test_a_sequenced_entry_decodes_to_its_append_with_the_batch_where_it_lies():
    batch = make_batch(0, 3)
    for encode in (lambda: encode_append("t", 1, 5, batch, (PRODUCER, 9)),
                   lambda: encode_timers("t", 1, 5, batch, (PRODUCER, 9)),
                   lambda: encode_half("t", 1, 5, 7, batch, (PRODUCER, 9))):
        data = encode()
        command = commands.decode(data)
        assert (command.producer, command.sequence, command.topic, command.queue) == (PRODUCER, 9, "t", 1)
        assert bytes(data[command.batch_at:]) == batch == bytes(command.batch)
    plain = commands.decode(encode_append("t", 1, 5, batch))
    assert plain.producer == 0 and bytes(plain.batch) == batch
    with pytest.raises(RocketError) as caught:  # a sequence prefix before anything but a produced batch
        commands.decode(bytes(encode_append("t", 1, 5, batch, (1, 1))[:17]) + commands.encode_offsets("g", "t", {0: 1}))
    assert caught.value.code == Code.CORRUPT_DATA


def test_a_batch_sent_again_is_stored_once_and_gets_its_first_answer(tmp_path):
    store = Node(tmp_path)
    first = store.apply(GROUP, [sequenced(1, 0, 0), sequenced(2, 1, 2)])
    assert first == [(0, 2), (2, 2)]
    # The retry of sequence 0 lands after both (a lost answer, sent again through another broker), and again in
    # the same apply as a new batch.
    again = store.apply(GROUP, [sequenced(3, 0, 0), sequenced(4, 2, 4), sequenced(5, 2, 4)])
    assert again == [(0, 2), (4, 2), (4, 2)]
    assert bodies(store, "t", 0) == [f"{n}:".encode() + bytes(100) for n in range(6)]
    # The same sequence from another producer, or on another queue, is another batch.
    assert store.apply(GROUP, [sequenced(6, 0, 6, producer=PRODUCER + 1), sequenced(7, 0, 8, queue=1)]) == [
        (6, 2), (0, 2)]
    store.close()


def test_what_a_group_remembers_survives_a_restart_and_a_snapshot(tmp_path):
    store = Node(tmp_path / "one")
    store.apply(GROUP, [sequenced(index, index - 1, 2 * (index - 1)) for index in range(1, 6)])
    data = list(store.snapshot(GROUP))
    store.close()
    reopened = Node(tmp_path / "one")  # the index's rows, reloaded
    assert reopened.apply(GROUP, [sequenced(6, 3, 6), sequenced(7, 5, 10)]) == [(6, 2), (10, 2)]
    reopened.close()
    replica = Node(tmp_path / "two")  # a replica that installs the snapshot, then applies the same entries
    replica.restore(GROUP, data)
    assert replica.apply(GROUP, [sequenced(6, 3, 6), sequenced(7, 5, 10)]) == [(6, 2), (10, 2)]
    replica.close()
    replayed = Node(tmp_path / "two")  # the snapshot's rows, from the store's log record of it
    assert replayed.apply(GROUP, [sequenced(8, 4, 8), sequenced(9, 6, 12)]) == [(8, 2), (12, 2)]
    replayed.close()


def test_batches_in_flight_may_apply_out_of_order_and_older_than_the_window_is_unknown():
    producers = Producers()
    key = (PRODUCER, "t", 0)
    changes: list = []
    kept = limits.producer_sequences_kept_max
    for sequence in range(1, kept):  # sequence 0 is in flight while the other batches in flight apply
        producers.record(GROUP, key, sequence, (sequence, 1), sequence, APPEND_MS, changes)
    assert producers.check(GROUP, key, 0) is None  # the window is not full: 0 was never applied
    producers.record(GROUP, key, 0, (0, 1), kept, APPEND_MS, changes)
    assert producers.check(GROUP, key, 0) == (0, 1)
    producers.record(GROUP, key, kept + 5, (kept + 5, 1), kept + 1, APPEND_MS, changes)  # a gap: allowed
    assert producers.check(GROUP, key, kept + 5) == (kept + 5, 1)
    assert producers.check(GROUP, key, kept + 3) is None  # above the window's smallest, never applied
    refused = producers.check(GROUP, key, 0)  # fell out of a full window: it may or may not have been applied
    assert isinstance(refused, RocketError) and refused.code == Code.UNKNOWN_SEQUENCE
    assert len(producers.groups[GROUP][key].answers) == kept
    # What was remembered and forgotten, in order, rebuilds the same state.
    rows = {}
    for change in changes:
        if len(change) == 5:
            del rows[change]
        else:
            rows[change[:5]] = change
    assert Producers.load(rows.values()).groups == producers.groups


def test_producers_are_forgotten_least_recently_used_first_and_when_idle(monkeypatch):
    monkeypatch.setattr(limits, "producer_states_per_group_max", 3)
    producers = Producers()
    changes: list = []
    for producer in range(1, 5):
        producers.record(GROUP, (producer, "t", 0), 0, (producer, 1), producer, APPEND_MS, changes)
    assert list(producers.groups[GROUP]) == [(2, "t", 0), (3, "t", 0), (4, "t", 0)]
    assert (GROUP, 1, "t", 0, 0) in changes  # its row goes too
    producers.record(GROUP, (2, "t", 0), 1, (9, 1), 5, APPEND_MS, changes)  # used again: the most recent
    later = APPEND_MS + limits.producer_state_idle_s_max * 1000 + 1
    producers.record(GROUP, (5, "t", 0), 0, (10, 1), 6, later, changes)
    assert list(producers.groups[GROUP]) == [(5, "t", 0)]  # the others were idle past the limit
    assert producers.check(GROUP, (2, "t", 0), 1) is None


def test_the_state_is_the_same_on_every_replica_that_applies_the_same_entries(tmp_path, monkeypatch):
    """What is forgotten depends on the entries alone, so replicas answer a retry alike."""
    monkeypatch.setattr(limits, "producer_states_per_group_max", 4)
    entries = [sequenced(index, index % 3, 2 * index, producer=1 + index % 7, append_ms=APPEND_MS + index)
               for index in range(1, 40)]
    one, two = Node(tmp_path / "one"), Node(tmp_path / "two")
    one.apply(GROUP, entries)
    for start in range(0, len(entries), 5):
        two.apply(GROUP, entries[start:start + 5])
    assert one.machine.producers.groups == two.machine.producers.groups
    one.close()
    two.close()
    assert Node(tmp_path / "one").machine.producers.groups == Node(tmp_path / "two").machine.producers.groups


def test_numbered_entries_wait_until_every_replica_runs_a_release_that_applies_them(tmp_path):
    """In a rolling upgrade a replica of an older release cannot apply a SEQUENCED entry: the leader numbers a
    group's batches only once every other replica's link said a schema version that has them (an unknown one
    counts as older); a group of one numbers at once."""
    from rocket.raft.host import RaftHost
    from rocket.raft.wal import Wal
    from rocket.store.commands import SEQUENCED_SINCE_SCHEMA
    from tests.unit.test_raft_restart import ListMachine

    host = RaftHost(1, Wal.open(tmp_path, 64 * limits.MiB), lambda node, payload: None, tick_s=0.01)
    host.add_group(1, (1,), ListMachine())
    host.add_group(2, (1, 2, 3), ListMachine())
    host.peer_versions = {}
    assert host.replicas_speak(1, SEQUENCED_SINCE_SCHEMA)
    assert not host.replicas_speak(2, SEQUENCED_SINCE_SCHEMA)  # nothing known of nodes 2 and 3 yet
    host.peer_versions.update({2: SEQUENCED_SINCE_SCHEMA, 3: SEQUENCED_SINCE_SCHEMA - 1})
    assert not host.replicas_speak(2, SEQUENCED_SINCE_SCHEMA)
    host.peer_versions[3] = SEQUENCED_SINCE_SCHEMA
    assert host.replicas_speak(2, SEQUENCED_SINCE_SCHEMA)
    host.wal.close()
