"""The tier's ObjectStore contract, one suite run against every backend: the local directory, S3 (moto's server),
Azure Blob (Azurite), GCS (fake-gcs-server) and HDFS (a WebHDFS server written to Hadoop's documentation), each
started here on 127.0.0.1 on a free port. Puts, ranged gets, listing (across pages where the backend pages), deletes,
missing objects, overwrites, bad keys, a closed store. An emulator that is missing fails the suite under CI=true."""

from __future__ import annotations

import functools
import os
import sys
import uuid

import pytest
import trio

from rocket.errors import Code, RocketError
from rocket.tier import LocalDirectoryStore, ObjectInfo, ObjectStore
from rocket.tier.azure import open_azure_store
from rocket.tier.gcs import open_gcs_store
from rocket.tier.hdfs import open_hdfs_store
from rocket.transport.listen import free_ports
from tests.integration.azurite import Azurite
from tests.integration.gcs_server import FakeGcsServer
from tests.integration.webhdfs_server import WebHdfsServer
from tests.integration.test_tier_objectstore import (expect_error, md5_hex, moto, only_local_network,  # noqa: F401
                                                     s3_store)  # moto and only_local_network: fixtures

BACKENDS = ["local", "s3", "azure", "gcs", "hdfs"]


@pytest.fixture(scope="module")
def azurite(tmp_path_factory):
    """One Azurite for the suite; each test gets its own container."""
    base = tmp_path_factory.mktemp("azurite")
    server = Azurite(base / "data", base / "azurite.log").start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def fake_gcs(tmp_path_factory):
    """One fake-gcs-server for the suite; each test gets its own bucket."""
    server = FakeGcsServer(free_ports(1)[0], tmp_path_factory.mktemp("gcs") / "fake-gcs.log").start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def webhdfs(tmp_path_factory):
    """One WebHDFS server (written to Hadoop's documentation: no HDFS can be installed here); each test gets its
    own root directory."""
    base = tmp_path_factory.mktemp("webhdfs")
    server = WebHdfsServer(base, base / "webhdfs.log")
    server.start()
    yield server
    server.stop()


@pytest.fixture(params=BACKENDS)
async def store(request, tmp_path):
    """The same store contract on every backend; S3 and GCS list in pages of 7 keys so listing crosses pages."""
    if request.param == "local":
        async with LocalDirectoryStore(tmp_path / "tier") as local:
            yield local
    elif request.param == "s3":
        if sys.flags.dev_mode:
            pytest.skip("aiohttp rejects moto's duplicate Server header in -X dev")
        server = request.getfixturevalue("moto")
        async with s3_store(server, server.create_bucket(), list_page_keys=7) as remote:
            yield remote
    elif request.param == "azure":
        server = request.getfixturevalue("azurite")
        container = server.create_container(f"tier-{uuid.uuid4().hex[:12]}")
        async with open_azure_store(container, connection_string=server.connection_string) as remote:
            yield remote
    elif request.param == "gcs":
        server = request.getfixturevalue("fake_gcs")
        bucket = server.create_bucket(f"tier-{uuid.uuid4().hex[:12]}")
        async with open_gcs_store(bucket, endpoint_url=server.endpoint, anonymous=True, list_page_keys=7) as remote:
            yield remote
    else:
        server = request.getfixturevalue("webhdfs")
        async with open_hdfs_store(server.url, root=f"/tier-{uuid.uuid4().hex[:12]}", user="rocket") as remote:
            yield remote


async def test_put_get_head_round_trip(store):
    """put returns the key, size and MD5; get returns the bytes; head returns what put did, empty objects too."""
    assert isinstance(store, ObjectStore)
    data = os.urandom(100_000)
    info = await store.put("segments/topic-a/0/00000000000000000000.seg", data)
    assert info == ObjectInfo("segments/topic-a/0/00000000000000000000.seg", len(data), md5_hex(data))
    assert await store.get(info.key) == data
    assert await store.head(info.key) == info
    empty = await store.put("segments/empty", b"")
    assert empty == ObjectInfo("segments/empty", 0, md5_hex(b""))
    assert await store.get("segments/empty") == b""
    assert await store.head("segments/empty") == empty


async def test_put_takes_the_callers_md5(store):
    """A put given the data's MD5 (as the offloader has it) stores the same object; a malformed one is BAD_REQUEST."""
    data = os.urandom(50_000)
    info = await store.put("given", data, md5=md5_hex(data))
    assert info == ObjectInfo("given", len(data), md5_hex(data)) == await store.head("given")
    assert await store.get("given") == data
    for md5 in ["", "0" * 31, "G" * 32, md5_hex(data).upper(), 7]:
        await expect_error(Code.BAD_REQUEST, functools.partial(store.put, md5=md5), "malformed", data)
    assert await store.head("malformed") is None
    try:  # a wrong one: refused by a store that checks bodies against it, else caught by the whole read
        await store.put("wrong", data, md5="0" * 32)
    except RocketError as error:
        assert error.code == Code.CORRUPT_DATA, error
    else:
        await expect_error(Code.CORRUPT_DATA, store.get, "wrong")


async def test_put_replaces_an_object(store):
    """A second put under a key replaces the object whole."""
    await store.put("manifest", b"first version, longer than the second")
    info = await store.put("manifest", b"second")
    assert await store.get("manifest") == b"second"
    assert await store.head("manifest") == info == ObjectInfo("manifest", 6, md5_hex(b"second"))


async def test_ranged_get_is_a_slice(store):
    """get(start, end) returns data[start:end] with end exclusive, clamped at the end like a slice."""
    data = bytes(range(256)) * 40
    await store.put("ranges/object", data)
    for start, end in [(0, 1), (1, 2), (100, 5000), (0, len(data)), (5000, None), (len(data) - 1, None),
                       (0, None), (10_000, 20_000), (len(data), None), (len(data) + 5, None), (7, 7),
                       (len(data) + 5, len(data) + 9)]:
        assert await store.get("ranges/object", start, end) == data[start:end], (start, end)
    await store.put("ranges/empty", b"")
    assert await store.get("ranges/empty", 0, 10) == b""
    assert await store.get("ranges/empty", 3) == b""


async def test_list_by_prefix_across_pages(store):
    """list returns every object under a string prefix, sorted by key, across several S3 pages."""
    keys = [f"topic-a/{queue}/{offset:020d}.seg" for queue in (0, 1, 10) for offset in range(0, 90, 10)]
    keys += ["topic-b/0/00000000000000000000.seg", "topic-ab"]
    contents = {key: key.encode() * (index + 1) for index, key in enumerate(keys)}
    async with trio.open_nursery() as nursery:
        for key, data in contents.items():
            nursery.start_soon(store.put, key, data)
    expected = [ObjectInfo(key, len(contents[key]), md5_hex(contents[key])) for key in sorted(keys)]
    assert await store.list() == expected
    assert await store.list("") == expected
    assert [info.key for info in await store.list("topic-a/")] == sorted(k for k in keys if k.startswith("topic-a/"))
    assert [info.key for info in await store.list("topic-a/1")] == sorted(k for k in keys if k.startswith("topic-a/1"))
    assert [info.key for info in await store.list("topic-a")] == sorted(k for k in keys if k.startswith("topic-a"))
    assert [info.key for info in await store.list("topic-b/0/")] == ["topic-b/0/00000000000000000000.seg"]
    assert await store.list("topic-c/") == []
    assert await store.list("topic-a/0/00000000000000000010.seg") == [
        next(info for info in expected if info.key == "topic-a/0/00000000000000000010.seg")]


async def test_delete_removes_and_is_idempotent(store):
    """delete removes the object (head None, get NOT_FOUND, gone from list); deleting it again is fine."""
    await store.put("logs/a", b"a")
    await store.put("logs/b", b"b")
    assert await store.delete("logs/a") is None
    assert await store.head("logs/a") is None
    await expect_error(Code.NOT_FOUND, store.get, "logs/a")
    assert [info.key for info in await store.list("logs/")] == ["logs/b"]
    await store.delete("logs/a")
    await store.delete("never/was")
    assert await store.get("logs/b") == b"b"


async def test_missing_object_is_not_found(store):
    """A missing key is NOT_FOUND on whole, ranged and empty gets, and None on head."""
    await store.put("present/key", b"data")
    for start, end in [(0, None), (1, 3), (5, None), (2, 2)]:
        error = await expect_error(Code.NOT_FOUND, store.get, "present/other", start, end)
        assert "present/other" in error.message
    assert await store.head("present/other") is None
    assert await store.head("present") is None
    await expect_error(Code.NOT_FOUND, store.get, "present")


BAD_KEYS = ["", "/absolute", "a/../b", "..", "a/./b", "a//b", "trailing/", ".hidden", "a/.tmp", "back\\slash",
            "new\nline", "nul\x00", "x" * 1025, "a/" + "y" * 256, "bad-\udc80-surrogate"]


async def test_bad_keys_and_ranges_are_bad_requests(store):
    """Keys that are not relative '/'-separated names within bounds, and bad ranges, are BAD_REQUEST."""
    for key in BAD_KEYS + [None, 7]:
        await expect_error(Code.BAD_REQUEST, store.put, key, b"data")
        await expect_error(Code.BAD_REQUEST, store.get, key)
        await expect_error(Code.BAD_REQUEST, store.head, key)
        await expect_error(Code.BAD_REQUEST, store.delete, key)
    for prefix in ["/absolute", "a/../", "a//", None]:
        await expect_error(Code.BAD_REQUEST, store.list, prefix)
    await expect_error(Code.BAD_REQUEST, store.put, "key", "text, not bytes")
    await store.put("key", b"0123456789")
    for start, end in [(-1, None), (5, 4), (0, -1), ("0", None), (0, 2.5)]:
        await expect_error(Code.BAD_REQUEST, store.get, "key", start, end)
    longest = "/".join(["z" * 255] * 4)[:1024]
    assert (await store.put(longest, b"ok")).key == longest
    assert await store.get(longest) == b"ok"
    assert [info.key for info in await store.list()] == ["key", longest]


async def test_closed_store_is_unavailable(store):
    """After aclose, every operation is UNAVAILABLE."""
    await store.put("k", b"v")
    await store.aclose()
    await expect_error(Code.UNAVAILABLE, store.get, "k")
    await expect_error(Code.UNAVAILABLE, store.put, "k", b"v")
    await expect_error(Code.UNAVAILABLE, store.list, "")

