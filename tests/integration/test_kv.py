"""The KV API end to end on a dev-mode node over real sockets: buckets, put/get/CAS/delete, ranges across shards,
transactions and the hash-tag rule, TTL, watch with resume and COMPACTED, bad input with stable codes."""

from __future__ import annotations

import pytest
import trio

from rocket import limits
from rocket.client import connect
from rocket.client.kv import KV
from rocket.errors import Code, RocketError


@pytest.fixture(params=[("tcp", "json"), ("tcp", "avro"), ("http2", "json")], ids=lambda p: "-".join(p))
async def kv(request, node):
    transport, serde = request.param
    port = node.tcp_port if transport == "tcp" else node.http2_port
    async with connect(f"127.0.0.1:{port}", transport=transport, serde=serde) as channel:
        yield KV(channel)


async def expect(code: Code, call) -> RocketError:
    with pytest.raises(RocketError) as raised:
        await call
    assert raised.value.code == code, raised.value
    return raised.value


async def test_put_get_cas_delete(kv):
    await kv.create_bucket("config")
    first = await kv.put("config", "feature/x", b"on")
    entry = await kv.get("config", "feature/x")
    assert (entry.value, entry.revision, entry.create_revision, entry.version) == (b"on", first, first, 1)
    second = await kv.put("config", "feature/x", b"off", if_revision=first)
    assert second > first
    error = await expect(Code.CAS_FAILED, kv.put("config", "feature/x", b"again", if_revision=first))
    assert f"revision {second}" in error.message
    await expect(Code.CAS_FAILED, kv.put("config", "feature/x", b"new", if_absent=True))
    assert await kv.compare_and_set("config", "feature/x", b"off", b"on") > second
    await expect(Code.CAS_FAILED, kv.compare_and_set("config", "feature/x", b"off", b"on"))
    assert await kv.compare_and_set("config", "other", None, b"1") > 0
    assert (await kv.get("config", "feature/x", serializable=True)).value == b"on"
    assert await kv.delete("config", "feature/x") == 1
    await expect(Code.NOT_FOUND, kv.get("config", "feature/x"))
    assert await kv.delete("config", "feature/x") == 0
    await expect(Code.BUCKET_EXISTS, kv.create_bucket("config"))
    await expect(Code.UNKNOWN_BUCKET, kv.get("nope", "k"))


async def test_range_pages_across_shards_in_key_order(kv):
    await kv.create_bucket("users", shards=4)
    keys = [f"user/{i:04}" for i in range(230)]
    for key in keys:
        await kv.put("users", key, key.encode())
    await kv.put("users", "zzz", b"")
    found = [entry.key async for entry in kv.range("users", "user/", page=50)]
    assert found == keys
    page, more = await kv.range_page("users", start="user/0100", end="user/0110", limit=5)
    assert [entry.key for entry in page] == keys[100:105] and more
    assert await kv.count("users", "user/") == 230
    assert await kv.count("users") == 231
    keys_only, _ = await kv.range_page("users", "user/", limit=3, keys_only=True)
    assert [entry.value for entry in keys_only] == [b"", b"", b""]
    assert await kv.delete_prefix("users", "user/00") == 100
    assert await kv.count("users", "user/") == 130
    described = await kv.describe_bucket("users")
    assert [shard["shard"] for shard in described["shards"]] == [0, 1, 2, 3]
    assert sum(shard["keys"] for shard in described["shards"]) == 131


async def test_transactions_are_atomic_within_a_shard(kv):
    await kv.create_bucket("shop", shards=8)
    result = await kv.txn("shop", [{"key": "{user-1}/cart", "target": "version", "op": "==", "number": 0}],
                          [{"op": "put", "key": "{user-1}/cart", "value": b"[]"},
                           {"op": "put", "key": "{user-1}/profile", "value": b"{}"}])
    assert result["succeeded"] and len(result["results"]) == 2
    again = await kv.txn("shop", [{"key": "{user-1}/cart", "target": "version", "op": "==", "number": 0}],
                         [{"op": "delete", "key": "{user-1}/cart"}], [{"op": "get", "key": "{user-1}/cart"}])
    assert not again["succeeded"] and again["results"][0]["entries"][0]["value"] == b"[]"
    keys = [f"user-{i}" for i in range(20)]
    error = await expect(Code.CROSS_SHARD, kv.txn("shop", [], [{"op": "put", "key": key, "value": b""} for key in keys]))
    assert "hash tag" in error.message


async def test_ttl_expires_keys_and_watchers_see_it(kv):
    await kv.create_bucket("leases", ttl_s=0)
    await kv.put("leases", "lock", b"me", ttl_s=0.3)
    events = []

    async def watch():
        async for event in kv.watch("leases", from_revision=1):
            events.append(event)
            if event.kind == "expired":
                return

    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(watch)
    assert [(e.kind, e.key, e.value) for e in events] == [("put", "lock", b"me"), ("expired", "lock", b"")]
    await expect(Code.NOT_FOUND, kv.get("leases", "lock"))
    assert await kv.put("leases", "lock", b"you", if_absent=True) > 0


async def test_watch_resumes_without_gaps_or_repeats(kv):
    await kv.create_bucket("feed")
    for i in range(5):
        await kv.put("feed", f"k{i}", str(i).encode())
    seen = []
    with trio.fail_after(10):
        async for event in kv.watch("feed", from_revision=2):
            seen.append(event.revision)
            if len(seen) == 2:
                break  # a disconnect
        async for event in kv.watch("feed", from_revision=seen[-1] + 1):
            seen.append(event.revision)
            if event.revision == 5:
                break
    assert seen == [2, 3, 4, 5]


async def test_watch_from_now_and_by_prefix(kv):
    await kv.create_bucket("news", shards=2)
    await kv.put("news", "old", b"")
    got = []

    async def watch(task_status=trio.TASK_STATUS_IGNORED):
        task_status.started()
        async for event in kv.watch("news", "a/"):
            got.append((event.kind, event.key))
            if len(got) == 2:
                return

    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            await nursery.start(watch)
            await trio.sleep(0.3)
            await kv.put("news", "b/1", b"")
            await kv.put("news", "a/1", b"x")
            await kv.delete("news", "a/1")
    assert got == [("put", "a/1"), ("delete", "a/1")]


async def test_compacted_watch_names_the_oldest_revision(kv, monkeypatch):
    monkeypatch.setattr(limits, "kv_events_kept_default", 3)
    await kv.create_bucket("short")
    for i in range(6):
        await kv.put("short", "k", str(i).encode())
    with pytest.raises(RocketError) as raised:
        async for _ in kv.watch("short", from_revision=1):
            pass
    assert raised.value.code == Code.COMPACTED and "oldest kept is 4" in raised.value.message


async def test_bad_input_gets_stable_codes(kv):
    await kv.create_bucket("b")
    await expect(Code.BAD_REQUEST, kv.put("b", "", b"x"))
    await expect(Code.BAD_REQUEST, kv.put("b", "k" * (limits.kv_key_bytes_max + 1), b"x"))
    await expect(Code.BAD_REQUEST, kv.put("b", "k", bytes(limits.kv_value_bytes_max + 1)))
    await expect(Code.BAD_REQUEST, kv.txn("b", [{"key": "k", "target": "colour", "op": "==", "number": 0}], []))
    await expect(Code.BAD_REQUEST, kv.txn("b", [], [{"op": "put", "key": "k"}] * (limits.kv_txn_ops_max + 1)))
    await expect(Code.BAD_REQUEST, kv.txn("b", [], [{"op": "explode", "key": "k"}]))
    await expect(Code.BAD_REQUEST, kv.create_bucket("bad name"))
    await expect(Code.BAD_REQUEST, kv.create_bucket("b2", shards=0))
    await expect(Code.BAD_REQUEST, kv.create_bucket("b2", history=limits.kv_history_max + 1))
    await expect(Code.BAD_REQUEST, kv.get("b", "k", revision=-1))
    await kv.put("b", "k", b"still fine")
    assert (await kv.get("b", "k")).value == b"still fine"


async def test_history_gets_older_revisions_and_buckets_list_and_delete(kv):
    await kv.create_bucket("h", history=3)
    revisions = [await kv.put("h", "k", str(i).encode()) for i in range(4)]
    assert (await kv.get("h", "k", revision=revisions[2])).value == b"2"
    await expect(Code.NOT_FOUND, kv.get("h", "k", revision=revisions[0]))
    assert [bucket["name"] for bucket in await kv.list_buckets()] == ["h"]
    await kv.delete_bucket("h")
    assert await kv.list_buckets() == []
    await expect(Code.UNKNOWN_BUCKET, kv.get("h", "k"))
    await kv.create_bucket("h")
    await expect(Code.NOT_FOUND, kv.get("h", "k"))
    assert await kv.put("h", "k", b"") > revisions[-1]  # revisions are never reused


async def test_export_and_import_round_trip(kv, tmp_path):
    await kv.create_bucket("src", shards=3, history=2)
    for i in range(300):
        await kv.put("src", f"k{i:03}", bytes([i % 256]) * (i % 50), ttl_s=3600 if i % 10 == 0 else None)
    path = tmp_path / "src.rkv"
    with path.open("wb") as handle:
        written = await kv.export("src", handle)
    assert written["keys"] == 300 and sorted(written["shards"]) == [0, 1, 2]
    with path.open("rb") as handle:
        assert await kv.import_("dst", handle) == {"keys": 300, "skipped": 0}
    source = [e async for e in kv.range("src")]
    copied = [e async for e in kv.range("dst")]
    assert [(e.key, e.value) for e in copied] == [(e.key, e.value) for e in source]
    # Expiry times carry over (as a TTL from the import's clock: within the test's few seconds).
    assert all(abs(a.expires_ms - b.expires_ms) < 5000 and bool(a.expires_ms) == bool(b.expires_ms)
               for a, b in zip(copied, source))
    await kv.put("dst", "extra", b"")
    with path.open("rb") as handle:
        await kv.import_("dst", handle, "merge")
    assert await kv.count("dst") == 301
    with path.open("rb") as handle:
        await kv.import_("dst", handle, "replace")
    assert await kv.count("dst") == 300
    damaged = tmp_path / "damaged.rkv"
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    damaged.write_bytes(bytes(data))
    with damaged.open("rb") as handle:
        await expect(Code.CORRUPT_DATA, kv.import_("other", handle))
    assert [bucket["name"] for bucket in await kv.list_buckets()] == ["dst", "src"]  # nothing half-imported


async def test_concurrent_writes_batched_together_each_decide_alone(kv):
    """64 clients' CAS increments of one key arrive together and go to storage in batches (one Raft entry each):
    every success is counted once in the final value, and a bad transaction among them fails alone."""
    await kv.create_bucket("counter")
    await kv.put("counter", "n", b"0")
    successes = 0

    async def increment() -> None:
        nonlocal successes
        while True:
            entry = await kv.get("counter", "n")
            try:
                await kv.put("counter", "n", str(int(entry.value) + 1).encode(), if_revision=entry.revision)
            except RocketError as error:
                assert error.code == Code.CAS_FAILED
                continue
            successes += 1
            return

    async with trio.open_nursery() as nursery:
        for _ in range(64):
            nursery.start_soon(increment)
        nursery.start_soon(expect, Code.BAD_REQUEST, kv.txn("counter", [], [{"op": "put", "key": ""}]))
    assert successes == 64 and (await kv.get("counter", "n")).value == b"64"


async def test_gets_on_a_leader_whose_lease_holds_take_no_task(nursery, tmp_path, monkeypatch):
    """On a dev-mode node (every group led here, alone a quorum) a get is served in the connection's read loop:
    after the first (the group may be quiet), none of a hundred goes to the task path (the broker's KeyValues.kv_get
    or the storage role's kv_read), over the lane and over JSON alike."""
    from rocket.node import run_node
    from rocket.roles.broker.kv import KeyValues
    from rocket.roles.storage.kv import KeyValues as StorageKeyValues
    from tests.conftest import node_config

    tasks = []
    for cls, name in ((KeyValues, "kv_get"), (StorageKeyValues, "kv_read")):
        def counting(original):
            async def counted(self, request):
                tasks.append(name)
                return await original(self, request)
            return counted
        monkeypatch.setattr(cls, name, counting(getattr(cls, name)))
    node = await nursery.start(lambda task_status: run_node(node_config(tmp_path / "data"), handle_signals=False,
                                                            task_status=task_status))
    for serde in ("lane", "json"):
        async with connect(f"127.0.0.1:{node.tcp_port}", serde=serde) as channel:
            kv = KV(channel)
            if serde == "lane":
                await kv.create_bucket("fast")
            await kv.put("fast", "k", b"v")
            await kv.get("fast", "k")
            before = len(tasks)
            for _ in range(100):
                assert (await kv.get("fast", "k")).value == b"v"
            assert len(tasks) == before, tasks
            await expect(Code.NOT_FOUND, kv.get("fast", "absent"))
