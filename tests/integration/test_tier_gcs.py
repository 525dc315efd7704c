"""GcsObjectStore against fake-gcs-server on 127.0.0.1 (tests/integration/gcs_server.py): what the contract suite
(test_tier_contract.py) does not cover: pages of a listing, key prefixes, a missing bucket, the caller's asyncio loop, a
wrong MD5, and a stopped server ending in UNAVAILABLE within the retry bounds."""

from __future__ import annotations

import uuid

import pytest
import trio
import trio_asyncio

from rocket.errors import Code, RocketError
from rocket.tier import ObjectInfo
from rocket.tier.gcs import open_gcs_store
from rocket.transport.listen import free_ports
from tests.integration.test_tier_objectstore import expect_error, md5_hex
from tests.integration.gcs_server import FakeGcsServer

PROXY_VARIABLES = ["HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy",
                   "STORAGE_EMULATOR_HOST", "GOOGLE_APPLICATION_CREDENTIALS"]


@pytest.fixture(autouse=True)
def only_local_network(monkeypatch):
    for variable in PROXY_VARIABLES:
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    monkeypatch.setenv("no_proxy", "127.0.0.1,localhost")


@pytest.fixture(scope="module")
def gcs(tmp_path_factory):
    """One emulator for the module; each test gets its own bucket."""
    server = FakeGcsServer(free_ports(1)[0], tmp_path_factory.mktemp("gcs") / "fake-gcs-server.log").start()
    yield server
    server.stop()


@pytest.fixture
def own_gcs(tmp_path):
    """An emulator for one test, which may stop it."""
    server = FakeGcsServer(free_ports(1)[0], tmp_path / "fake-gcs-server.log").start()
    yield server
    server.stop()


def new_bucket(server: FakeGcsServer) -> str:
    return server.create_bucket(f"rocket-{uuid.uuid4().hex[:16]}")


def gcs_store(server: FakeGcsServer, bucket: str, **options):
    return open_gcs_store(bucket, endpoint_url=server.endpoint, anonymous=True, **options)


@pytest.fixture
async def store(gcs):
    async with gcs_store(gcs, new_bucket(gcs), list_page_keys=7) as opened:
        yield opened



async def test_list_across_pages_sorted(store):
    """With pages of 7 keys, list returns every object under a string prefix, sorted by key."""
    keys = [f"topic-a/{queue}/{offset:020d}.seg" for queue in (0, 1, 10) for offset in range(0, 50, 10)]
    keys += ["topic-b/0/00000000000000000000.seg", "topic-ab"]
    contents = {key: key.encode() * (index + 1) for index, key in enumerate(keys)}
    async with trio.open_nursery() as nursery:
        for key, data in contents.items():
            nursery.start_soon(store.put, key, data)
    expected = [ObjectInfo(key, len(contents[key]), md5_hex(contents[key])) for key in sorted(keys)]
    assert await store.list() == expected
    assert [info.key for info in await store.list("topic-a/1")] == sorted(k for k in keys if k.startswith("topic-a/1"))
    assert [info.key for info in await store.list("topic-a")] == sorted(k for k in keys if k.startswith("topic-a"))





async def test_prefix_keeps_stores_apart(gcs):
    """Two stores on one bucket with different key prefixes see only their own objects, by their own keys."""
    bucket = new_bucket(gcs)
    async with (gcs_store(gcs, bucket, prefix="cluster-1/") as first,
                gcs_store(gcs, bucket, prefix="cluster-2/") as second):
        await first.put("a/x", b"1")
        await second.put("a/x", b"2")
        assert [info.key for info in await first.list()] == ["a/x"]
        assert await first.get("a/x") == b"1" and await second.get("a/x") == b"2"
        assert await first.head("a/x") == ObjectInfo("a/x", 1, md5_hex(b"1"))
        await first.delete("a/x")
        assert await second.get("a/x") == b"2"
    async with gcs_store(gcs, bucket) as whole:
        assert [info.key for info in await whole.list()] == ["cluster-2/a/x"]
    with pytest.raises(RocketError) as caught:
        async with gcs_store(gcs, bucket, prefix="no-slash"):
            pass
    assert caught.value.code == Code.CONFIG_INVALID


async def test_missing_bucket_is_unavailable(gcs):
    """Writing to or listing a bucket that does not exist is UNAVAILABLE at once, saying so."""
    async with gcs_store(gcs, "rocket-no-such-bucket", attempts_max=3) as store:
        error = await expect_error(Code.UNAVAILABLE, store.put, "k", b"v")
        assert "bucket does not exist" in error.message
        await expect_error(Code.UNAVAILABLE, store.list, "")


async def test_reuses_the_callers_asyncio_loop(gcs):
    """Inside an open trio-asyncio loop, open_gcs_store runs on that loop; after aclose calls are UNAVAILABLE."""
    async with trio_asyncio.open_loop() as loop:
        async with gcs_store(gcs, new_bucket(gcs)) as store:
            assert store._loop is loop
            await store.put("k", b"v")
            assert await store.get("k") == b"v"
            await store.aclose()
            await expect_error(Code.UNAVAILABLE, store.get, "k")
            await expect_error(Code.UNAVAILABLE, store.put, "k", b"v")
            await expect_error(Code.UNAVAILABLE, store.list, "")


async def test_stopped_server_retries_then_unavailable(own_gcs):
    """With the server down, a call is tried attempts_max times with backoff, then UNAVAILABLE within retry_s_max."""
    retry_s_max = 3.0
    async with gcs_store(own_gcs, new_bucket(own_gcs), attempts_max=4, retry_s_max=retry_s_max, backoff_s_min=0.05,
                         backoff_s_max=0.2, connect_timeout_s=0.5, read_timeout_s=1.0) as store:
        await store.put("segment", b"data")
        own_gcs.stop()
        for call, arguments in [(store.get, ("segment",)), (store.put, ("segment", b"x")), (store.list, ("",)),
                                (store.head, ("segment",)), (store.delete, ("segment",))]:
            with trio.fail_after(retry_s_max + 5):  # a liveness bound, with slack for a slow machine
                error = await expect_error(Code.UNAVAILABLE, call, *arguments)
            assert f"{call.__name__} " in error.message and "after 4 attempts" in error.message, error.message
            assert "GCS bucket" in error.message
        # A time bound shorter than the attempts ends the call by its deadline instead.
        store.retries.attempts_max, store.retries.retry_s_max = 1000, 0.5
        with trio.fail_after(0.5 + 5):
            error = await expect_error(Code.UNAVAILABLE, store.get, "segment")
        assert "out of time" in error.message and "'segment'" in error.message


async def test_put_with_wrong_md5_is_corrupt_data(gcs, monkeypatch):
    """A put whose stored object's md5Hash is not the MD5 of the data sent is CORRUPT_DATA."""
    async with gcs_store(gcs, new_bucket(gcs)) as store:
        real_upload = store._storage.upload

        async def upload_answering_wrong_md5(*arguments, **options):
            return {**await real_upload(*arguments, **options), "md5Hash": "AAAAAAAAAAAAAAAAAAAAAA=="}

        monkeypatch.setattr(store._storage, "upload", upload_answering_wrong_md5)
        error = await expect_error(Code.CORRUPT_DATA, store.put, "k", b"payload")
        assert "'k'" in error.message and md5_hex(b"payload") in error.message
