"""LocalDirectoryStore's file format and failure handling, and the key rules every ObjectStore shares."""

from __future__ import annotations

import errno
import hashlib
import os

import pytest

from rocket.errors import Code, RocketError
from rocket.tier import LocalDirectoryStore, ObjectInfo, check_key, check_prefix
from rocket.tier import local as local_module
from rocket.tier.local import FOOTER_BYTES, FOOTER_MAGIC


async def expect_error(code: Code, call, *arguments) -> RocketError:
    with pytest.raises(RocketError) as caught:
        await call(*arguments)
    assert caught.value.code == code, caught.value
    return caught.value


def test_valid_keys_and_prefixes_pass_unchanged():
    """Relative '/'-separated names within bounds are keys; a prefix may be empty or end with '/'."""
    for key in ["a", "segments/topic-a/0/00000000000000000000.seg", "ünïcode/キー", "a.b/c..d", "x" * 255]:
        assert check_key(key) == key
    for prefix in ["", "a", "a/", "segments/topic-a/0/0000"]:
        assert check_prefix(prefix) == prefix
    with pytest.raises(RocketError) as caught:
        check_key("a/")
    assert caught.value.code == Code.BAD_REQUEST


async def test_object_file_is_data_then_md5_footer(tmp_path):
    """An object is the file root/<key>: its bytes, their MD5, then the footer magic; no temporary file remains."""
    store = LocalDirectoryStore(tmp_path)
    info = await store.put("topic/0/segment", b"payload")
    path = tmp_path / "topic" / "0" / "segment"
    assert path.read_bytes() == b"payload" + hashlib.md5(b"payload").digest() + FOOTER_MAGIC
    assert info == ObjectInfo("topic/0/segment", 7, hashlib.md5(b"payload").hexdigest())
    assert sorted(os.listdir(path.parent)) == ["segment"]


async def test_flipped_byte_is_corrupt_data_on_whole_reads(tmp_path):
    """A changed byte fails the MD5 on a whole-object read (CORRUPT_DATA); ranged reads return the bytes as stored."""
    store = LocalDirectoryStore(tmp_path)
    await store.put("k", b"0123456789")
    path = tmp_path / "k"
    damaged = bytearray(path.read_bytes())
    damaged[3] ^= 0xFF
    path.write_bytes(bytes(damaged))
    error = await expect_error(Code.CORRUPT_DATA, store.get, "k")
    assert "'k'" in error.message
    await expect_error(Code.CORRUPT_DATA, store.get, "k", 0, 10)
    assert await store.get("k", 4, 8) == b"4567"


async def test_file_without_footer_is_reported_not_skipped(tmp_path):
    """A truncated or foreign file under the root is CORRUPT_DATA on get, head and list, naming its key."""
    store = LocalDirectoryStore(tmp_path)
    await store.put("good", b"fine")
    (tmp_path / "foreign").write_bytes(b"x" * (FOOTER_BYTES + 3))
    (tmp_path / "short").write_bytes(b"abc")
    for key in ("foreign", "short"):
        assert key in (await expect_error(Code.CORRUPT_DATA, store.get, key)).message
        await expect_error(Code.CORRUPT_DATA, store.head, key)
    await expect_error(Code.CORRUPT_DATA, store.list, "")
    assert [info.key for info in await store.list("good")] == ["good"]


async def test_leftover_temporary_file_is_invisible(tmp_path):
    """A temporary file left by a crash mid-put is not listed and does not change the object."""
    store = LocalDirectoryStore(tmp_path)
    await store.put("dir/key", b"committed")
    (tmp_path / "dir" / ".rocket-tmp-0123456789abcdef").write_bytes(b"half written")
    assert [info.key for info in await store.list()] == ["dir/key"]
    assert await store.get("dir/key") == b"committed"


async def test_failed_rename_keeps_old_object_and_no_temporary(tmp_path, monkeypatch):
    """When the rename fails, the old object stays whole, the temporary file goes, and the error is UNAVAILABLE."""
    store = LocalDirectoryStore(tmp_path)
    await store.put("key", b"old")

    def failing_replace(source, destination):
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(local_module.os, "replace", failing_replace)
    error = await expect_error(Code.UNAVAILABLE, store.put, "key", b"new")
    assert "put 'key'" in error.message and "Input/output error" in error.message
    monkeypatch.undo()
    assert await store.get("key") == b"old"
    assert os.listdir(tmp_path) == ["key"]


async def test_full_disk_is_unavailable_saying_so(tmp_path, monkeypatch):
    """ENOSPC while writing is UNAVAILABLE with 'the disk is full', not an OSError."""
    store = LocalDirectoryStore(tmp_path)

    def full_disk_fsync(descriptor):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(local_module.os, "fsync", full_disk_fsync)
    error = await expect_error(Code.UNAVAILABLE, store.put, "key", b"data")
    assert "the disk is full" in error.message


async def test_key_and_sub_key_conflict_is_bad_request(tmp_path):
    """A file system cannot hold both 'a' and 'a/b': the second put is BAD_REQUEST and the first object stays."""
    store = LocalDirectoryStore(tmp_path)
    await store.put("a", b"file")
    await expect_error(Code.BAD_REQUEST, store.put, "a/b", b"under a file")
    await store.put("c/d", b"under a directory")
    await expect_error(Code.BAD_REQUEST, store.put, "c", b"over a directory")
    assert await store.get("a") == b"file" and await store.get("c/d") == b"under a directory"
    assert await store.head("c") is None
    await store.delete("c")
    assert await store.get("c/d") == b"under a directory"
