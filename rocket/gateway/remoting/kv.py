"""RocketMQ's KV config requests onto rocket's KV buckets (RIP-22 through the RocketMQ protocol): a namespace is a
bucket, a key is a key, so `mqadmin updateKvConfig` writes what `rocket kv get` reads, and back. A part of
RemotingGateway (KvConfig)."""

from __future__ import annotations

import orjson

from rocket import limits
from rocket.errors import Code, RocketError
from rocket.gateway.remoting.bridge import Bridge
from rocket.gateway.remoting.codec import Command, ResponseCode
from rocket.transport.guard import Caller

OP_TYPE = "kv_opType"  # RIP-22's name for the operation a put makes: PUT (the default) or CAS
EXPECT = "expectValue"  # a CAS's expected value; absent: the key must be absent
ABSENT = (Code.NOT_FOUND, Code.UNKNOWN_BUCKET)  # a key or a whole namespace (bucket) that is not there


class KvConfig:
    """PUT_KV_CONFIG, GET_KV_CONFIG (and GET_KV_CONFIG_BY_VALUE, which asks the same), DELETE_KV_CONFIG and
    GET_KVLIST_BY_NAMESPACE, each made as one call of rocket's KV API as the request's user (kv-read, kv-write; a
    put to a namespace no bucket holds yet creates the bucket, one shard, which takes admin).

    RocketMQ's values are text in the request header; rocket's are bytes, so a value that is not UTF-8 reads with
    U+FFFD in place of its bad bytes. RIP-22's compare-and-set is a put whose `kv_opType` is CAS: it puts only if
    the key holds `expectValue` (or is absent, without one), else answers CAS_FAILED. A namespace list takes an
    optional `prefix`, RIP-22's prefix get."""

    def __init__(self, bridge: Bridge):
        self.dispatcher = bridge.dispatcher

    async def _call(self, method: str, request: dict, caller: Caller) -> dict:
        if not self.dispatcher.serves(method):
            raise RocketError(Code.UNAVAILABLE, "KV config is served by brokers: send it to a broker's address")
        return await self.dispatcher.local(method, request, caller)

    async def put(self, command: Command, connection, caller: Caller) -> Command:
        namespace, key, value = command.ext["namespace"], command.ext["key"], command.ext["value"].encode()
        operation = command.ext.get(OP_TYPE, "PUT").upper()
        if operation not in ("PUT", "CAS"):
            raise RocketError(Code.BAD_REQUEST, f"{OP_TYPE} must be PUT or CAS, got {operation!r}")
        try:
            await self._put(namespace, key, value, operation, command.ext.get(EXPECT), caller)
        except RocketError as error:
            if error.code != Code.UNKNOWN_BUCKET:
                raise
            await self._call("KvCreateBucket", {"bucket": namespace, "shards": 1, "history": 1, "ttl_ms": 0,
                                                "storage_class": "raft"}, caller)
            await self._put(namespace, key, value, operation, command.ext.get(EXPECT), caller)
        return command.reply()

    async def _put(self, namespace: str, key: str, value: bytes, operation: str, expected: str | None,
                   caller: Caller) -> None:
        if operation == "PUT":
            await self._call("KvPut", {"bucket": namespace, "key": key, "value": value, "ttl_ms": -1,
                                       "if_revision": -1, "if_absent": False}, caller)
            return
        compare = ({"key": key, "target": "create_revision", "op": "==", "number": 0, "value": b""} if expected is None
                   else {"key": key, "target": "value", "op": "==", "number": 0, "value": expected.encode()})
        result = await self._call("KvTxn", {
            "bucket": namespace, "compare": [compare],
            "success": [{"op": "put", "key": key, "value": value, "ttl_ms": -1}], "failure": []}, caller)
        if not result["succeeded"]:
            raise RocketError(Code.CAS_FAILED, f"key {key!r} of namespace {namespace!r} does not hold "
                              + ("no value" if expected is None else f"{expected!r}"))

    async def get(self, command: Command, connection, caller: Caller) -> Command:
        namespace, key = command.ext["namespace"], command.ext["key"]
        try:
            found = await self._call("KvGet", {"bucket": namespace, "key": key, "revision": 0, "serializable": False},
                                     caller)
        except RocketError as error:
            if error.code not in ABSENT:
                raise
            return command.reply(ResponseCode.QUERY_NOT_FOUND, f"No config item, Namespace: {namespace} Key: {key}")
        return command.reply(ext={"value": found["entries"][0]["value"].decode(errors="replace")})

    async def delete(self, command: Command, connection, caller: Caller) -> Command:
        """Deleting what is not there succeeds, as in RocketMQ."""
        try:
            await self._call("KvDelete", {"bucket": command.ext["namespace"], "key": command.ext["key"],
                                          "prefix": False, "if_revision": -1}, caller)
        except RocketError as error:
            if error.code != Code.UNKNOWN_BUCKET:
                raise
        return command.reply()

    async def list(self, command: Command, connection, caller: Caller) -> Command:
        """The namespace's keys (those with the optional prefix) as RocketMQ's KVTable, at most
        limits.remoting_kv_list_keys_max of them: past that, an error that says how to read them all."""
        namespace, table, after = command.ext["namespace"], {}, ""
        while True:
            try:
                page = await self._call("KvRange", {
                    "bucket": namespace, "prefix": command.ext.get("prefix", ""), "start": "", "end": "",
                    "after": after, "limit": 0, "keys_only": False, "count_only": False, "serializable": False},
                    caller)
            except RocketError as error:
                if error.code != Code.UNKNOWN_BUCKET:
                    raise
                return command.reply(ResponseCode.QUERY_NOT_FOUND, f"No config item, Namespace: {namespace}")
            table.update((entry["key"], entry["value"].decode(errors="replace")) for entry in page["entries"])
            if len(table) > limits.remoting_kv_list_keys_max:
                raise RocketError(Code.BAD_REQUEST, f"namespace {namespace!r} has more than "
                                  f"{limits.remoting_kv_list_keys_max} keys: read them with rocket kv ls {namespace}")
            if not page["more"] or not page["entries"]:
                break
            after = page["entries"][-1]["key"]
        if not table:
            return command.reply(ResponseCode.QUERY_NOT_FOUND, f"No config item, Namespace: {namespace}")
        return command.reply(body=orjson.dumps({"table": table}))
