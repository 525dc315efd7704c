"""KV reads and writes a gateway makes through the broker's KV methods (Buckets): the remoting gateway's RocketMQ KV
config, the MQTT gateway's sessions and retained messages."""

from __future__ import annotations

from rocket.errors import Code, RocketError
from rocket.transport.guard import Caller
from rocket.transport.rpc import Dispatcher


class Buckets:
    """Each call as caller (None: the node itself, for what the gateway keeps on its own account). A key or a bucket
    that is not there reads as nothing; a put to a bucket not made yet makes it, with one shard."""

    def __init__(self, dispatcher: Dispatcher):
        self.dispatcher = dispatcher

    async def _call(self, method: str, request: dict, caller: Caller | None) -> dict:
        if not self.dispatcher.serves(method):
            raise RocketError(Code.UNAVAILABLE, "KV is served by brokers: send it to a broker's address")
        return await self.dispatcher.local(method, request, caller)

    async def get(self, bucket: str, key: str, caller: Caller | None = None) -> bytes | None:
        try:
            found = await self._call("KvGet", {"bucket": bucket, "key": key, "revision": 0, "serializable": False},
                                     caller)
        except RocketError as error:
            if error.code in (Code.UNKNOWN_BUCKET, Code.NOT_FOUND):
                return None
            raise
        return found["entries"][0]["value"] if found["entries"] else None

    async def put(self, bucket: str, key: str, value: bytes, ttl_ms: int = 0, caller: Caller | None = None,
                  compare: dict | None = None) -> bool:
        """Put the value (ttl_ms as KvPut takes it); with compare (one of KvTxn's comparisons), only if it holds:
        whether it did."""
        try:
            return await self._put(bucket, key, value, ttl_ms, caller, compare)
        except RocketError as error:
            if error.code != Code.UNKNOWN_BUCKET:
                raise
        try:
            await self._call("KvCreateBucket", {"bucket": bucket, "shards": 1, "history": 1, "ttl_ms": 0,
                                                "storage_class": "raft"}, caller)
        except RocketError as error:
            if error.code != Code.BUCKET_EXISTS:
                raise
        return await self._put(bucket, key, value, ttl_ms, caller, compare)

    async def _put(self, bucket: str, key: str, value: bytes, ttl_ms: int, caller: Caller | None,
                   compare: dict | None) -> bool:
        if compare is None:
            await self._call("KvPut", {"bucket": bucket, "key": key, "value": value, "ttl_ms": ttl_ms,
                                       "if_revision": -1, "if_absent": False}, caller)
            return True
        result = await self._call("KvTxn", {"bucket": bucket, "compare": [compare], "failure": [],
                                            "success": [{"op": "put", "key": key, "value": value, "ttl_ms": ttl_ms}]},
                                  caller)
        return bool(result["succeeded"])

    async def delete(self, bucket: str, key: str, caller: Caller | None = None) -> None:
        """Deleting what is not there succeeds."""
        try:
            await self._call("KvDelete", {"bucket": bucket, "key": key, "prefix": False, "if_revision": -1}, caller)
        except RocketError as error:
            if error.code != Code.UNKNOWN_BUCKET:
                raise

    async def scan(self, bucket: str, prefix: str, limit: int, caller: Caller | None = None
                   ) -> list[tuple[str, bytes]]:
        """Up to limit entries whose keys start with prefix, in key order."""
        entries: list[tuple[str, bytes]] = []
        after = ""
        while len(entries) < limit:
            try:
                page = await self._call("KvRange", {
                    "bucket": bucket, "prefix": prefix, "start": "", "end": "", "after": after,
                    "limit": limit - len(entries), "keys_only": False, "count_only": False, "serializable": False},
                    caller)
            except RocketError as error:
                if error.code == Code.UNKNOWN_BUCKET:
                    return entries
                raise
            entries += [(entry["key"], entry["value"]) for entry in page["entries"]]
            if not page["more"] or not page["entries"]:
                break
            after = page["entries"][-1]["key"]
        return entries
