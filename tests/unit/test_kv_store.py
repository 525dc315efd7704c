"""KV shards in the node store: transactions decided on apply (compare, put, delete, delete_prefix, get), revisions,
TTL expiry decided by the leader's clock in the command, history, watch events, snapshots that carry the KV state,
and a KV index rebuilt by re-applying the Raft log when its directory is lost."""

from __future__ import annotations

import shutil

from hypothesis import given, settings
from hypothesis import strategies as st

from rocket.raft.core import Entry
from rocket.store.commands import encode_kv
from rocket.model import hash_tag, shard_of
from rocket.store.kv import Compare, Op, Txn
from rocket.store.store import GroupMachine
from tests.unit.test_store import GROUP, Node

NOW_MS = 1_700_000_000_000


def txn(compare=(), success=(), failure=(), now_ms=NOW_MS, history=1, bucket="b", shard=0) -> Txn:
    return Txn(bucket, shard, now_ms, history, list(compare), list(success), list(failure))


class Shard:
    """One node's store, proposing transactions to one shard as the Raft host would apply them."""

    def __init__(self, node: Node, group: int = GROUP):
        self.node, self.group, self.index = node, group, 0

    def run(self, *txns: Txn) -> list[dict]:
        entries = []
        for one in txns:
            self.index += 1
            entries.append(Entry(1, self.index, encode_kv([one])))
        return [results[0] for results in self.node.apply(self.group, entries)]

    def put(self, key, value: bytes, **options) -> dict:
        return self.run(txn(success=[Op("put", key, value, options.pop("ttl_ms", 0))], **options))[0]

    def get(self, key, bucket="b", shard=0):
        return self.node.kv.get(bucket, shard, key)


def test_put_get_and_revisions(tmp_path):
    shard = Shard(Node(tmp_path))
    assert shard.put("a", b"1") == {"succeeded": True, "revision": 1, "results": [{"revision": 1}]}
    assert shard.put("a", b"2")["revision"] == 2
    assert shard.put("b", b"x")["revision"] == 3
    state = shard.get("a")
    assert (state.value, state.revision, state.create_revision, state.version) == (b"2", 2, 1, 2)
    assert shard.run(txn(success=[Op("delete", "a")]))[0]["results"] == [{"deleted": 1}]
    assert shard.get("a") is None
    assert shard.put("a", b"3")["revision"] == 5
    assert (shard.get("a").create_revision, shard.get("a").version) == (5, 1)


def test_compare_and_set_on_revision_value_and_absence(tmp_path):
    shard = Shard(Node(tmp_path))
    shard.put("k", b"v1")
    absent = [Compare("k", "create_revision", "==", 0)]
    result = shard.run(txn(absent, [Op("put", "k", b"new")], [Op("get", "k")]))[0]
    assert not result["succeeded"] and result["results"][0]["entries"][0]["revision"] == 1
    assert shard.run(txn([Compare("k", "revision", "==", 1)], [Op("put", "k", b"v2")]))[0]["succeeded"]
    assert not shard.run(txn([Compare("k", "revision", "==", 1)], [Op("put", "k", b"v3")]))[0]["succeeded"]
    assert shard.run(txn([Compare("k", "value", "==", value=b"v2")], [Op("put", "k", b"v4")]))[0]["succeeded"]
    assert not shard.run(txn([Compare("k", "value", "==", value=b"v2")], [Op("put", "k", b"v5")]))[0]["succeeded"]
    assert shard.get("k").value == b"v4"


def test_entries_of_one_apply_see_each_other(tmp_path):
    """Two CAS on one key in one apply: the second sees the first's change (no lost update within a batch)."""
    shard = Shard(Node(tmp_path))
    first = txn([Compare("k", "version", "==", 0)], [Op("put", "k", b"1")])
    second = txn([Compare("k", "version", "==", 0)], [Op("put", "k", b"2")])
    prefix = txn(success=[Op("delete_prefix", "")])
    results = shard.run(first, second, txn(success=[Op("put", "j", b"")]), prefix)
    assert [result["succeeded"] for result in results[:2]] == [True, False]
    assert results[3]["results"] == [{"deleted": 2}]
    assert shard.get("k") is None and shard.get("j") is None


def test_ttl_expires_on_the_leaders_clock_and_watchers_see_it(tmp_path):
    node = Node(tmp_path)
    shard = Shard(node)
    shard.put("lease", b"me", ttl_ms=1000)
    assert node.kv.expiring(GROUP, NOW_MS + 999, 10) == []
    assert node.kv.expiring(GROUP, NOW_MS + 1000, 10) == [("b", 0, "lease", 1)]
    # Before its expiry a compare sees it; after, it is absent, and the expiry takes a revision of its own.
    taken = [Compare("lease", "create_revision", "==", 0)]
    assert not shard.run(txn(taken, [Op("put", "lease", b"you")], now_ms=NOW_MS + 999))[0]["succeeded"]
    result = shard.run(txn(taken, [Op("put", "lease", b"you")], now_ms=NOW_MS + 1000))[0]
    assert result["succeeded"] and result["revision"] == 3
    events, _ = node.kv.events("b", 0, 1, "", 100, 1 << 20)
    assert [(e["kind"], e["revision"], e["value"]) for e in events] == [(1, 1, b"me"), (3, 2, b""), (1, 3, b"you")]
    assert node.kv.expiring(GROUP, NOW_MS + 10**9, 10) == []


def test_history_keeps_older_revisions(tmp_path):
    node = Node(tmp_path)
    shard = Shard(node)
    for value in (b"1", b"2", b"3", b"4"):
        shard.put("k", value, history=3)
    shard.run(txn(success=[Op("delete", "k")], history=3))
    # Three revisions kept: 3, 4 and the deletion at 5.
    assert node.kv.get_at("b", 0, "k", 3).value == b"3"
    assert node.kv.get_at("b", 0, "k", 4).value == b"4"
    assert node.kv.get_at("b", 0, "k", 5) is None
    assert node.kv.get_at("b", 0, "k", 2) is None


def test_range_pages_and_counts(tmp_path):
    node = Node(tmp_path)
    shard = Shard(node)
    shard.run(*[txn(success=[Op("put", f"p/{i:03}", bytes(10))]) for i in range(25)], txn(success=[Op("put", "q", b"")]))
    page, more = node.kv.range("b", 0, "p/", "p0", None, 10, 1 << 20, NOW_MS)
    assert [key for key, _ in page] == [f"p/{i:03}" for i in range(10)] and more
    page, more = node.kv.range("b", 0, "p/", "p0", "p/019", 10, 1 << 20, NOW_MS)
    assert [key for key, _ in page] == [f"p/{i:03}" for i in range(20, 25)] and not more
    assert node.kv.count("b", 0, "p/", "p0", NOW_MS) == 25


def test_snapshot_carries_the_kv_state_to_a_new_replica(tmp_path):
    source = Node(tmp_path / "source")
    shard = Shard(source)
    shard.run(*[txn(success=[Op("put", f"k{i}", bytes([i]) * 100, 5000 if i % 2 else 0)], history=2)
                for i in range(50)])
    replica = Node(tmp_path / "replica")
    GroupMachine(replica.store, GROUP).restore(GroupMachine(source.store, GROUP).snapshot())
    assert replica.kv.digest("b", 0) == source.kv.digest("b", 0)
    assert replica.machine.kv_shards == source.machine.kv_shards
    assert replica.kv.expiring(GROUP, NOW_MS + 10**6, 100) == source.kv.expiring(GROUP, NOW_MS + 10**6, 100)
    # The replica goes on from the snapshot's revision.
    follow = Shard(replica)
    follow.index = shard.index
    assert follow.put("k0", b"after")["revision"] == 51


def test_a_lost_kv_directory_is_rebuilt_from_the_log(tmp_path):
    node = Node(tmp_path)
    shard = Shard(node)
    shard.run(*[txn(success=[Op("put", f"k{i % 7}", str(i).encode())], history=2) for i in range(40)])
    shard.run(txn(success=[Op("delete_prefix", "k1")]))
    digest = node.kv.digest("b", 0)
    node.close()
    shutil.rmtree(tmp_path / "kv")
    # Node applies the log again at open, as the Raft host does from its snapshot on: the store part skips it, the KV
    # part takes it.
    reopened = Node(tmp_path)
    assert reopened.kv.digest("b", 0) == digest
    assert reopened.machine.kv_shards[("b", 0)] == [GROUP, 41, 1]


def test_hash_tags_pin_keys_to_one_shard():
    assert hash_tag("{user-1}/profile") == hash_tag("{user-1}/cart") == "user-1"
    assert hash_tag("{}/x") == "{}/x" and hash_tag("a{b") == "a{b"
    assert len({shard_of(f"{{user-1}}/{i}", 16) for i in range(50)}) == 1
    assert len({shard_of(f"user-{i}", 16) for i in range(200)}) == 16


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["put", "delete", "cas"]), st.sampled_from("abc"), st.binary(max_size=3)),
                max_size=30))
def test_replicas_that_apply_the_same_log_agree(tmp_path_factory, operations):
    """Any sequence of puts, deletes and value CAS gives the same digest on two stores, one applying it entry by
    entry and one in a single apply, and the same as a dict model."""
    model: dict[str, bytes] = {}
    txns = []
    for op, key, value in operations:
        if op == "put":
            txns.append(txn(success=[Op("put", key, value)]))
            model[key] = value
        elif op == "delete":
            txns.append(txn(success=[Op("delete", key)]))
            model.pop(key, None)
        else:
            txns.append(txn([Compare(key, "value", "==", value=value)], [Op("put", key, value + b"!")]))
            if model.get(key) == value:
                model[key] = value + b"!"
    one, batched = (Shard(Node(tmp_path_factory.mktemp("kv"))) for _ in range(2))
    for each in txns:
        one.run(each)
    if txns:
        batched.run(*txns)
    assert one.node.kv.digest("b", 0) == batched.node.kv.digest("b", 0)
    page, _ = one.node.kv.range("b", 0, "", None, None, 100, 1 << 20, NOW_MS)
    assert {key: state.value for key, state in page} == model
