"""The KV client (RIP-22): buckets of keys with revisions, compare-and-set, transactions, ranges, watches, and export and
import of a bucket as a file (KV).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import AsyncIterator, Sequence
from typing import BinaryIO, cast

from rocket import limits
from rocket.errors import Code, RocketError
from rocket.model import shard_of
from rocket.serde import kv_export
from rocket.transport.channel import Channel


@dataclasses.dataclass(frozen=True, slots=True)
class Entry:
    key: str
    value: bytes
    revision: int  # the shard's revision of the key's last change
    create_revision: int
    version: int  # changes since it was created
    expires_ms: int = 0  # 0: never

    @classmethod
    def from_wire(cls, wire: dict) -> "Entry":
        return cls(wire["key"], bytes(wire["value"]), wire["revision"], wire["create_revision"], wire["version"],
                   wire["expires_ms"])


@dataclasses.dataclass(frozen=True, slots=True)
class Event:
    shard: int
    kind: str  # put, delete or expired
    key: str
    value: bytes
    revision: int
    create_revision: int = 0
    version: int = 0
    expires_ms: int = 0


def _ttl_ms(ttl_s: float | None) -> int:
    """None: the bucket's TTL; 0: none."""
    return -1 if ttl_s is None else int(ttl_s * 1000)


class KV:
    """The KV client over a channel:

        async with connect(server) as channel:
            kv = KV(channel)
            await kv.create_bucket("config", shards=1)
            revision = await kv.put("config", "feature/x", b"on")
            entry = await kv.get("config", "feature/x")
            await kv.put("config", "feature/x", b"off", if_revision=entry.revision)  # CAS_FAILED if it moved
    """

    def __init__(self, channel: Channel):
        self.channel = channel

    # ---- buckets -------------------------------------------------------------------------------------

    async def create_bucket(self, name: str, shards: int = 1, history: int = 1, ttl_s: float = 0,
                            storage_class: str = "raft") -> dict:
        """A bucket whose shards are groups of storage_class (a controller-mode class keeps two copies, say)."""
        return await self.channel.call("KvCreateBucket", {"bucket": name, "shards": shards, "history": history,
                                                          "ttl_ms": int(ttl_s * 1000), "storage_class": storage_class})

    async def list_buckets(self) -> list[dict]:
        return (await self.channel.call("KvListBuckets", {}))["buckets"]

    async def describe_bucket(self, name: str) -> dict:
        return await self.channel.call("KvDescribeBucket", {"bucket": name})

    async def delete_bucket(self, name: str) -> None:
        await self.channel.call("KvDeleteBucket", {"bucket": name})

    # ---- keys ----------------------------------------------------------------------------------------

    async def put(self, bucket: str, key: str, value: bytes, *, ttl_s: float | None = None,
                  if_revision: int | None = None, if_absent: bool = False) -> int:
        """The key's new revision. if_revision puts only if the key is at that revision (CAS_FAILED otherwise);
        if_absent only if there is no such key."""
        response = await self.channel.call("KvPut", {
            "bucket": bucket, "key": key, "value": value, "ttl_ms": _ttl_ms(ttl_s),
            "if_revision": -1 if if_revision is None else if_revision, "if_absent": if_absent})
        return response["revision"]

    async def get(self, bucket: str, key: str, *, revision: int = 0, serializable: bool = False) -> Entry:
        """The key (NOT_FOUND if absent), linearizable unless serializable (then a replica in sync may answer)."""
        response = await self.channel.call("KvGet", {"bucket": bucket, "key": key, "revision": revision,
                                                     "serializable": serializable})
        return Entry.from_wire(response["entries"][0])

    async def compare_and_set(self, bucket: str, key: str, expected: bytes | None, value: bytes) -> int:
        """Put value if the key holds expected (None: if it is absent), RIP-22's compare-and-set; CAS_FAILED
        otherwise."""
        compare = ({"key": key, "target": "create_revision", "op": "==", "number": 0, "value": b""} if expected is None
                   else {"key": key, "target": "value", "op": "==", "number": 0, "value": expected})
        result = await self.txn(bucket, [compare], [{"op": "put", "key": key, "value": value}],
                                [{"op": "get", "key": key}])
        if not result["succeeded"]:
            found = result["results"][0]["entries"]
            raise RocketError(Code.CAS_FAILED, f"key {key!r} " + (
                f"holds another value at revision {found[0]['revision']}" if found else "is absent"))
        return result["results"][0]["revision"]

    async def delete(self, bucket: str, key: str, *, if_revision: int | None = None) -> int:
        """How many keys went (0 or 1)."""
        response = await self.channel.call("KvDelete", {"bucket": bucket, "key": key, "prefix": False,
                                                        "if_revision": -1 if if_revision is None else if_revision})
        return response["deleted"]

    async def delete_prefix(self, bucket: str, prefix: str) -> int:
        response = await self.channel.call("KvDelete", {"bucket": bucket, "key": prefix, "prefix": True,
                                                        "if_revision": -1})
        return response["deleted"]

    async def range_page(self, bucket: str, prefix: str = "", *, start: str = "", end: str = "", after: str = "",
                         limit: int = 0, keys_only: bool = False, serializable: bool = False) -> tuple[list[Entry], bool]:
        """One page of keys in order: (entries, whether more follow after the last)."""
        response = await self.channel.call("KvRange", {
            "bucket": bucket, "prefix": prefix, "start": start, "end": end, "after": after, "limit": limit,
            "keys_only": keys_only, "count_only": False, "serializable": serializable})
        return [Entry.from_wire(entry) for entry in response["entries"]], response["more"]

    async def range(self, bucket: str, prefix: str = "", *, start: str = "", end: str = "", page: int = 0,
                    keys_only: bool = False, serializable: bool = False) -> AsyncIterator[Entry]:
        """Every key in order, a page at a time (each page linearizable on its own, not the whole scan)."""
        after = ""
        while True:
            entries, more = await self.range_page(bucket, prefix, start=start, end=end, after=after, limit=page,
                                                  keys_only=keys_only, serializable=serializable)
            for entry in entries:
                yield entry
            if not more or not entries:
                return
            after = entries[-1].key

    async def count(self, bucket: str, prefix: str = "", *, start: str = "", end: str = "") -> int:
        response = await self.channel.call("KvRange", {
            "bucket": bucket, "prefix": prefix, "start": start, "end": end, "after": "", "limit": 0,
            "keys_only": True, "count_only": True, "serializable": False})
        return response["count"]

    async def txn(self, bucket: str, compare: list[dict], success: list[dict], failure: Sequence[dict] = ()) -> dict:
        """etcd's Txn on one shard: compares {key, target: revision|create_revision|version|value, op: ==|!=|<|>,
        number | value}, operations {op: put|delete|delete_prefix|get, key, value, ttl_ms}.
        {succeeded, revision, results: [{revision, deleted, entries}]}"""
        def op(wire: dict) -> dict:
            return {"op": wire["op"], "key": wire["key"], "value": wire.get("value", b""),
                    "ttl_ms": wire.get("ttl_ms", -1)}

        return await self.channel.call("KvTxn", {
            "bucket": bucket, "compare": [{"number": 0, "value": b"", **wire} for wire in compare],
            "success": [op(wire) for wire in success], "failure": [op(wire) for wire in failure]})

    async def watch(self, bucket: str, prefix: str = "", *, from_revision: int = 0,
                    from_revisions: dict[int, int] | None = None) -> AsyncIterator[Event]:
        """Changes in revision order per shard, from from_revision (every shard) or from_revisions (shard ->
        revision), else from now on; COMPACTED when a revision is no longer kept. Resume after a disconnect from
        the last revision seen + 1."""
        request = {"bucket": bucket, "prefix": prefix, "from_revision": from_revision,
                   "from_revisions": [{"shard": shard, "revision": revision}
                                      for shard, revision in (from_revisions or {}).items()]}
        async for batch in self.channel.stream("KvWatch", request):
            for event in batch["events"]:
                yield Event(event["shard"], event["kind"], event["key"], bytes(event["value"]), event["revision"],
                            event["create_revision"], event["version"], event["expires_ms"])

    # ---- export and import ---------------------------------------------------------------------------

    async def export(self, bucket: str, target: BinaryIO) -> dict:
        """Write the bucket to target in the export format (serde/kv_export.py): each shard as of one revision,
        streamed page by page. {"keys", "shards": {shard: revision}}"""
        spec = next((info for info in await self.list_buckets() if info["name"] == bucket), None)
        if spec is None:
            raise RocketError(Code.UNKNOWN_BUCKET, f"bucket {bucket!r} does not exist")
        target.write(kv_export.start())
        target.write(kv_export.json_record(kv_export.HEAD, {
            "bucket": bucket, "shards": spec["shards"], "history": spec["history"], "ttl_ms": spec["ttl_ms"],
            "created_ms": spec["created_ms"], "exported_ms": int(time.time() * 1000)}))
        shards: dict[int, int] = {}
        keys = 0
        async for page in self.channel.stream("KvExport", {"bucket": bucket}):
            if page["shard"] not in shards:
                shards[page["shard"]] = page["revision"]
                target.write(kv_export.json_record(kv_export.SHARD, {"shard": page["shard"],
                                                                     "revision": page["revision"]}))
            for found in page["entries"]:
                target.write(kv_export.key_record(found["key"], bytes(found["value"]), found["revision"],
                                                  found["create_revision"], found["version"], found["expires_ms"]))
            keys += len(page["entries"])
        target.write(kv_export.json_record(kv_export.END, {"keys": keys, "shards": {
            str(shard): revision for shard, revision in shards.items()}}))
        return {"keys": keys, "shards": shards}

    async def import_(self, bucket: str, source: BinaryIO, mode: str = "merge") -> dict:
        """Put an export's keys into a bucket (created with the export's settings if it does not exist). merge
        keeps keys the export lacks; replace deletes them first. Keys get new revisions here; a key whose TTL
        passed is skipped, others keep their expiry time. Streamed: a transaction of keys per shard at a time.
        The whole file is checked first (a damaged file changes nothing). {"keys", "skipped"}"""
        if mode not in ("merge", "replace"):
            raise RocketError(Code.BAD_REQUEST, f"mode is merge or replace, not {mode!r}")
        at = source.tell()
        for _ in kv_export.read(source):
            pass
        source.seek(at)
        records = kv_export.read(source)
        _, head = next(records)
        head = cast(dict, head)  # the first record is the HEAD, a JSON kind
        if not any(info["name"] == bucket for info in await self.list_buckets()):
            await self.create_bucket(bucket, head["shards"], head["history"], head["ttl_ms"] / 1000)
        elif mode == "replace":
            await self.delete_prefix(bucket, "")
        shards = (await self.describe_bucket(bucket))["bucket"]["shards"]
        pending: dict[int, list[dict]] = {}
        sizes: dict[int, int] = {}
        counts = {"keys": 0, "skipped": 0}

        async def flush(shard: int) -> None:
            ops = pending.pop(shard, [])
            sizes.pop(shard, None)
            if ops:
                await self.txn(bucket, [], ops)
                counts["keys"] += len(ops)

        for kind, payload in records:
            if kind != kv_export.KEY:
                continue
            key, value, _, _, _, expires_ms = kv_export.decode_key(cast(bytes, payload))  # KEY payloads are raw
            ttl_ms = 0
            if expires_ms:
                ttl_ms = expires_ms - int(time.time() * 1000)
                if ttl_ms <= 0:
                    counts["skipped"] += 1
                    continue
            shard = shard_of(key, shards)
            if sizes.get(shard, 0) + len(key) + len(value) > limits.kv_txn_bytes_max // 2:
                await flush(shard)
            pending.setdefault(shard, []).append({"op": "put", "key": key, "value": value, "ttl_ms": ttl_ms})
            sizes[shard] = sizes.get(shard, 0) + len(key) + len(value)
            if len(pending[shard]) >= limits.kv_txn_ops_max:
                await flush(shard)
            elif sum(sizes.values()) > limits.kv_txn_bytes_max:  # bounded memory over many shards
                await flush(max(sizes, key=sizes.__getitem__))
        for shard in list(pending):
            await flush(shard)
        return counts
