"""The HDFS object store (WebHDFS) against WebHdfsServer, a WebHDFS server written to the Hadoop documentation: what
the contract suite (test_tier_contract.py) does not cover: listing across directories, keys to quote, redirects
really followed to the datanode, the stored MD5, a namenode failing over (StandbyException), a stopped server and
refused permissions."""

from __future__ import annotations

import os
import uuid

import pytest
import trio

from rocket.errors import Code, RocketError
from rocket.tier import ObjectInfo
from rocket.tier.hdfs import open_hdfs_store
from tests.integration.test_tier_objectstore import expect_error, md5_hex
from tests.integration.webhdfs_server import WebHdfsServer

FAST_RETRIES = {"attempts_max": 3, "retry_s_max": 3.0, "backoff_s_min": 0.05, "backoff_s_max": 0.2}


@pytest.fixture(scope="module")
def webhdfs(tmp_path_factory):
    """One WebHDFS server for the module; each test gets its own root directory."""
    base = tmp_path_factory.mktemp("webhdfs")
    server = WebHdfsServer(base / "data", base / "webhdfs.log", denied_users=("mallory",)).start()
    yield server
    server.stop()


@pytest.fixture
async def store(webhdfs):
    async with open_hdfs_store(webhdfs.url, root=f"/rocket-{uuid.uuid4().hex[:12]}", user="rocket") as hdfs:
        yield hdfs





async def test_list_by_string_prefix_across_directories(store):
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
    assert "topic-ab" in [info.key for info in await store.list("topic-a")]
    assert [info.key for info in await store.list("topic-b/0/")] == ["topic-b/0/00000000000000000000.seg"]
    assert await store.list("topic-c/") == []
    assert await store.list("topic-ab/") == []  # a file, not a directory
    assert await store.list("topic-a/0/00000000000000000010.seg") == [
        next(info for info in expected if info.key == "topic-a/0/00000000000000000010.seg")]


async def test_list_of_an_empty_store(store):
    assert await store.list() == []
    assert await store.list("nothing/") == []





async def test_keys_needing_url_quoting(store):
    """Keys with characters that mean something in a URL reach HDFS as the same names."""
    keys = ["q?x=1&y=2", "hash#frag", "per%cent", "sp ace/plus+", "uni/ключ-ü"]
    for key in keys:
        assert (await store.put(key, key.encode())).key == key
    for key in keys:
        assert await store.get(key) == key.encode()
    assert [info.key for info in await store.list()] == sorted(keys)



async def test_bytes_travel_through_the_datanode(store, webhdfs):
    """CREATE and OPEN are redirected (307) by the namenode; the datanode is the one that takes and serves bytes."""
    data = os.urandom(5000)
    created, opened = len(webhdfs.datanode_requests("CREATE")), len(webhdfs.datanode_requests("OPEN"))
    await store.put("redirect/object", data)
    assert await store.get("redirect/object") == data
    assert await store.get("redirect/object", 100, 300) == data[100:300]
    new_creates = webhdfs.datanode_requests("CREATE")[created:]
    new_opens = webhdfs.datanode_requests("OPEN")[opened:]
    assert len(new_creates) == 1 and new_creates[0].endswith(f" {len(data)} bytes"), new_creates
    assert [line.rsplit(" ", 2)[1] for line in new_opens] == [str(len(data)), "200"], new_opens
    assert "/.rocket-put-" in new_creates[0]  # written under a temporary name, then renamed onto the key


async def test_whole_get_checks_the_stored_md5(store, webhdfs):
    """Bytes changed behind the store's back fail the whole get with CORRUPT_DATA; ranged gets are not checked."""
    await store.put("checked/object", b"original bytes")
    root = store.root.lstrip("/")
    local = webhdfs.base_dir / "fs" / root / "checked" / "object"
    with open(local, "r+b") as file:  # same inode: the xattr stays, the bytes change
        file.write(b"X")
    await expect_error(Code.CORRUPT_DATA, store.get, "checked/object")
    assert await store.get("checked/object", 0, 4) == b"Xrig"


async def test_standby_namenode_is_retried(store, webhdfs):
    """StandbyException (a namenode failing over) is transient: the call is tried again and succeeds."""
    webhdfs.inject_standby(2)
    assert (await store.put("failover/object", b"data")).size == 4
    webhdfs.inject_standby(2)
    assert await store.get("failover/object") == b"data"


async def test_refused_permission_is_unavailable(webhdfs):
    """AccessControlException (the user may not write the root) is UNAVAILABLE at once, not retried."""
    async with open_hdfs_store(webhdfs.url, root="/rocket-denied", user="mallory", **FAST_RETRIES) as denied:
        started = trio.current_time()
        for call, arguments in [(denied.put, ("k", b"v")), (denied.get, ("k",)), (denied.head, ("k",)),
                                (denied.list, ("",)), (denied.delete, ("k",))]:
            error = await expect_error(Code.UNAVAILABLE, call, *arguments)
            assert "AccessControlException" in error.message, error
        assert trio.current_time() - started < 2.0
    lines = [line for line in webhdfs.log_path.read_text().splitlines() if "user=mallory" in line]
    assert lines, "user.name reaches the namenode"


async def test_stopped_server_is_unavailable_within_bounds(tmp_path):
    server = WebHdfsServer(tmp_path / "data", tmp_path / "webhdfs.log").start()
    try:
        async with open_hdfs_store(server.url, root="/rocket", **FAST_RETRIES) as hdfs:
            await hdfs.put("k", b"v")
            server.stop()
            for call, arguments in [(hdfs.get, ("k",)), (hdfs.put, ("k", b"w")), (hdfs.list, ("",)),
                                    (hdfs.head, ("k",)), (hdfs.delete, ("k",))]:
                started = trio.current_time()
                error = await expect_error(Code.UNAVAILABLE, call, *arguments)
                assert trio.current_time() - started < FAST_RETRIES["retry_s_max"] + 2.0
                assert "attempts" in error.message, error
            server.start()  # the same port and files: the store recovers
            assert await hdfs.get("k") == b"v"
    finally:
        server.stop()


async def test_bad_configuration_is_config_invalid():
    for url, options in [("ftp://namenode", {}), ("http://127.0.0.1:1", {"root": "relative"}),
                         ("http://127.0.0.1:1", {"root": "/a/../b"}), ("http://127.0.0.1:1", {"user": ""})]:
        with pytest.raises(RocketError) as caught:
            async with open_hdfs_store(url, **options):
                pass
        assert caught.value.code == Code.CONFIG_INVALID, caught.value
