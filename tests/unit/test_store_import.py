"""A topic moving to another storage class, as its groups apply it: the new group imports copied batches at their
offsets (once, however often they come), the old group is sealed (appends, commits and pops refused, reads served) and
then drops its copy; all of it holds across a restart and a lost index."""

from __future__ import annotations

import shutil

from rocket.errors import Code, RocketError
from rocket.raft.core import Entry
from rocket.serde import batch as batch_codec
from rocket.store.commands import encode_append, encode_import, encode_pop
from tests.unit.test_store import APPEND_MS, GROUP, Node, append_entry, make_batch, offsets_entry
from tests.unit.test_store_drop import drop_entry

COPY_MS = APPEND_MS + 60_000


def import_entry(index: int, topic: str, queue: int, base_offset: int, batches: list[bytes]) -> Entry:
    return Entry(1, index, encode_import(topic, queue, COPY_MS, base_offset, batches))


def names(store: Node, topic: str, queue: int, offset: int) -> list[str]:
    """The first part of each message body from offset on (make_batch names them "i:")."""
    found = []
    for base, batch in store.reads.read(topic, queue, offset, 1 << 30):
        found += [bytes(message.body).split(b":")[0].decode() for message in batch_codec.decode(batch, base)]
    return found


def test_copied_batches_join_a_new_queue_at_their_offsets_once(tmp_path):
    store = Node(tmp_path)
    first, second, third = make_batch(100, 5), make_batch(105, 3), make_batch(108, 2)
    assert store.apply(GROUP, [import_entry(1, "t", 0, 100, [first, second])]) == [108]
    assert store.reads.queue_stats("t", 0)["min_offset"] == 100
    assert store.reads.queue_stats("t", 0)["next_offset"] == 108
    # Sent again, and again overlapping with the next: only what the queue lacks joins it.
    assert store.apply(GROUP, [import_entry(2, "t", 0, 100, [first, second]),
                               import_entry(3, "t", 0, 105, [second, third])]) == [108, 110]
    # A gap, or a batch that does not start at one the queue holds, is refused.
    gap, misaligned = store.apply(GROUP, [import_entry(4, "t", 0, 111, [make_batch(111, 1)]),
                                          import_entry(5, "t", 0, 107, [make_batch(107, 4)])])
    assert isinstance(gap, RocketError) and gap.code == Code.BAD_REQUEST and "110" in gap.message
    assert isinstance(misaligned, RocketError) and misaligned.code == Code.BAD_REQUEST
    # Appends go on from there, as produced.
    assert store.apply(GROUP, [append_entry(6, "t", 0, make_batch(110, 1))]) == [(110, 1)]
    expected = [str(number) for number in range(100, 111)]
    assert names(store, "t", 0, 100) == expected
    store.close()

    store = Node(tmp_path)  # the WAL's entries applied again at open: the same queue
    assert names(store, "t", 0, 100) == expected
    store.close()
    shutil.rmtree(tmp_path / "index")
    store = Node(tmp_path)
    assert names(store, "t", 0, 100) == expected and store.reads.queue_stats("t", 0)["next_offset"] == 111


def test_a_sealed_queue_refuses_writes_serves_reads_and_answers_a_batch_it_stored(tmp_path):
    store = Node(tmp_path)
    sequenced = Entry(1, 1, encode_append("t", 0, APPEND_MS, make_batch(0, 4), (7, 1)))
    assert store.apply(GROUP, [sequenced, offsets_entry(2, "billing", "t", {0: 2})]) == [(0, 4), None]
    assert store.apply(GROUP, [drop_entry(3, "seal", "t", [0])]) == [True]
    again = Entry(1, 4, encode_append("t", 0, APPEND_MS, make_batch(0, 4), (7, 1)))
    answered, refused, commit, pop = store.apply(GROUP, [
        again, append_entry(5, "t", 0, make_batch(4, 1)), offsets_entry(6, "billing", "t", {0: 3}),
        Entry(1, 7, encode_pop({"op": "reset", "consumer_group": "billing", "topic": "t", "queue": 0, "cursor": 1}))])
    assert answered == (0, 4)  # the producer's retry of a batch stored before the seal: its first answer
    assert [error.code for error in (refused, commit, pop)] == [Code.UNKNOWN_TOPIC] * 3
    assert names(store, "t", 0, 0) == ["0", "1", "2", "3"]  # the data stays for reads
    assert store.reads.fetch_offsets("billing", "t") == {0: 2}
    committed, _, _, _ = store.reads.consumed("t", [0])
    assert committed == [{"consumer_group": "billing", "queue": 0, "offset": 2, "pop": False}]
    store.close()

    store = Node(tmp_path)
    assert store.store.machine.dropped == {(GROUP, "t")} and names(store, "t", 0, 0) == ["0", "1", "2", "3"]
    assert store.apply(GROUP, [drop_entry(8, "moved", "t", [0])]) == [True]
    assert store.reads.queue_stats("t", 0) == {"min_offset": 0, "next_offset": 0, "bytes": 0}
    assert store.reads.fetch_offsets("billing", "t") == {}
    # Moved back later: the name opens again, and the copy comes in at its offsets.
    assert store.apply(GROUP, [drop_entry(9, "reopen", "t", []), import_entry(10, "t", 0, 4, [make_batch(4, 2)])]) \
        == [True, 6]
    assert names(store, "t", 0, 4) == ["4", "5"]


def test_a_producers_answers_come_with_the_copy_so_a_batch_sent_again_is_stored_once(tmp_path):
    store = Node(tmp_path)
    answers = [(7, 1, 100, 5), (7, 2, 105, 3)]  # producer 7's batches 1 and 2, stored at 100 and 105 in the old group
    copied = Entry(1, 1, encode_import("t", 0, COPY_MS, 100, [make_batch(100, 5), make_batch(105, 3)], answers))
    answers_only = Entry(1, 2, encode_import("t", 1, COPY_MS, 0, [], [(7, 9, 40, 2)]))
    assert store.apply(GROUP, [copied, answers_only]) == [108, 0]
    assert store.reads.queue_stats("t", 1)["next_offset"] == 0  # answers alone make no queue
    again, new = store.apply(GROUP, [Entry(1, 3, encode_append("t", 0, APPEND_MS, make_batch(105, 3), (7, 2))),
                                     Entry(1, 4, encode_append("t", 0, APPEND_MS, make_batch(108, 1), (7, 3)))])
    assert (again, new) == ((105, 3), (108, 1))
    store.close()
    store = Node(tmp_path)  # remembered across a restart, as every producer's answers are
    [again_on_1] = store.apply(GROUP, [Entry(1, 5, encode_append("t", 1, APPEND_MS, make_batch(40, 2), (7, 9)))])
    assert again_on_1 == (40, 2) and store.reads.queue_stats("t", 1)["next_offset"] == 0
    committed, dead_letters, producers, _ = store.reads.consumed("t", [0])
    assert not committed and not dead_letters
    assert [(answer["producer"], answer["sequence"], answer["base_offset"]) for answer in producers] == \
        [(7, 1, 100), (7, 2, 105), (7, 3, 108)]
