"""The KV client (RIP-22): buckets of keys with revisions, compare-and-set, transactions, ranges, watches, and export and
import of a bucket as a file.

    async with connect(server) as channel:
        kv = KV(channel)
        await kv.create_bucket("config", shards=1)
        revision = await kv.put("config", "feature/x", b"on")
        entry = await kv.get("config", "feature/x")
        await kv.put("config", "feature/x", b"off", if_revision=entry.revision)  # CAS_FAILED if it moved
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator

from rocket.errors import Code, RocketError
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
    def __init__(self, channel: Channel):
        self.channel = channel

    # ---- buckets -------------------------------------------------------------------------------------

    async def create_bucket(self, name: str, shards: int = 1, history: int = 1, ttl_s: float = 0) -> dict:
        return await self.channel.call("KvCreateBucket", {"bucket": name, "shards": shards, "history": history,
                                                          "ttl_ms": int(ttl_s * 1000)})

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

    async def txn(self, bucket: str, compare: list[dict], success: list[dict], failure: list[dict] = ()) -> dict:
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
