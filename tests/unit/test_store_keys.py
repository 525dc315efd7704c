"""The key index a storage group keeps of its messages' keys and client message ids: built behind the appends by the
key indexer (Store.index_keys), read by find_keyed (the batches that may hold a key, and those not indexed yet),
kept through WAL reclaim's moves, dropped with the batches, and rebuilt from the WAL when the index is lost."""

from __future__ import annotations

import shutil
from array import array

import trio

from rocket import limits
from rocket.model import ID_PROPERTY, KEYS_PROPERTY, Message
from rocket.serde import batch as batch_codec
from tests.unit.test_store import GROUP, Node, append_entry
from tests.unit.test_store_drop import drop_entry

T = 1_700_000_000_000


def keyed(keys: list[str], properties: dict | None = None) -> bytes:
    return batch_codec.encode([Message(f"body-{key}".encode(), key=key, properties=properties or {})
                               for key in keys], T)


def find(node: Node, key: str, message_id: bool = False, start: int = 0, stop: int = 2**62,
         batches_max: int = 100, topic: str = "t") -> list[int]:
    found, _, _ = node.store.index.find_keyed(topic, 0, batch_codec.key_term(key, message_id), start, stop,
                                               batches_max)
    return [entry.base_offset for entry in found]


def index_all(node: Node) -> int:
    """Run the key indexer until it is done: how many steps it took."""
    steps = 1
    while trio.run(node.store.index_keys):
        steps += 1
    return steps


def test_key_terms_name_keys_rocketmq_keys_and_message_ids_once_each():
    batch = batch_codec.encode([Message(b"a", key="k1", properties={ID_PROPERTY: "id-1"}),
                                Message(b"b", key="k1", properties={KEYS_PROPERTY: "k2 k3", "other": "x"}),
                                Message(b"c")], T)
    terms = array("I", batch_codec.key_terms(batch))
    assert sorted(terms) == sorted([batch_codec.key_term("k1"), batch_codec.key_term("k2"),
                                    batch_codec.key_term("k3"), batch_codec.key_term("id-1", message_id=True)])
    assert batch_codec.key_term("id-1") != batch_codec.key_term("id-1", message_id=True)  # a key is not an id
    assert batch_codec.key_terms(batch_codec.encode([Message(b"plain")] * 3, T)) == b""
    assert batch_codec.key_terms(batch_codec.encode_lines(b"one\ntwo\n", T)) == b""


def test_a_lookup_reads_the_batches_that_hold_the_key_and_those_not_indexed_yet(tmp_path):
    node = Node(tmp_path)
    batches = [keyed([f"order-{n}", f"order-{n + 100}"]) for n in range(10)]  # two messages a batch
    node.apply(GROUP, [append_entry(index, "t", 0, batch) for index, batch in enumerate(batches, 1)])
    assert find(node, "order-3") == list(range(0, 20, 2))  # not indexed yet: every batch is read
    index_all(node)
    node.apply(GROUP, [append_entry(11, "t", 0, batch_codec.encode([Message(b"m", properties={
        ID_PROPERTY: "7F00-1", KEYS_PROPERTY: "order-3 order-x"})], T))])
    assert find(node, "order-3") == [6, 20] and find(node, "nope") == [20]  # the newest is not indexed yet
    index_all(node)
    assert find(node, "order-3") == [6, 20] and find(node, "nope") == []
    assert find(node, "order-105") == [10]
    assert find(node, "7F00-1", message_id=True) == [20] and find(node, "7F00-1") == []
    assert find(node, "order-3", start=7) == [6, 20]  # from the batch that holds offset 7
    assert find(node, "order-3", start=8) == [20] and find(node, "order-3", start=8, stop=20) == []
    found, next_offset, read = node.store.index.find_keyed("t", 0, batch_codec.key_term("order-3"), 0, 2**62, 1)
    assert [entry.base_offset for entry in found] == [6] and next_offset == 8 and read == 4
    batches_found, next_offset, done = trio.run(node.store.reads.find_keyed, "t", 0, batch_codec.key_term("order-3"),
                                                0, 0, -1, 1 << 20)
    assert [base for base, _ in batches_found] == [6, 20] and done
    assert batch_codec.decode(batches_found[0][1], 6)[0].key == "order-3"


def test_the_indexer_takes_steps_and_queues_take_turns(tmp_path, monkeypatch):
    monkeypatch.setattr(limits, "key_index_step_bytes", 1)  # a batch a step
    node = Node(tmp_path)
    node.apply(GROUP, [append_entry(index, topic, 0, keyed([f"{topic}{index}"]))
                       for index, topic in enumerate(["t", "u", "t", "u", "t"], 1)])
    assert trio.run(node.store.index_keys)
    assert trio.run(node.store.index_keys)
    assert find(node, "t1") == [0, 1, 2] and find(node, "u2", topic="u") == [0, 1]  # one batch of each indexed
    index_all(node)
    assert find(node, "t5") == [2] and find(node, "u4", topic="u") == [1]


def test_the_index_follows_moves_and_drops_and_is_rebuilt_from_the_wal(tmp_path):
    node = Node(tmp_path)
    node.apply(GROUP, [append_entry(index, "t", 0, keyed([f"k{index}"])) for index in range(1, 5)])
    node.apply(GROUP, [append_entry(5, "u", 0, keyed(["k1"]))])
    index_all(node)
    entry = node.store.index.locate("t", 0, 2, 1)[0][0]
    assert node.store.index.move([("t", 0, 2, entry.position, entry.position)]) == [True]  # rewritten, still marked
    assert find(node, "k3") == [2]
    node.store.index.forget([("t", 0, 0)])
    assert find(node, "k1") == [] and find(node, "k1", topic="u") == [0]
    node.store.sync()
    node.close()
    shutil.rmtree(tmp_path / "index")
    node = Node(tmp_path)  # the index rebuilt from the WAL, and its keys by the indexer, which starts over
    index_all(node)
    assert find(node, "k1") == [0] and find(node, "k3") == [2]
    node.apply(GROUP, [drop_entry(6, "topic", "t", [0])])
    assert find(node, "k3") == [] and find(node, "k1", topic="u") == [0]
    assert list(node.store.index._db.iterator(prefix=b"kt")) == []
    assert not trio.run(node.store.index_keys)
