"""RocketMQ's KV config requests onto rocket's KV buckets (RIP-22 through the RocketMQ protocol): a namespace is a
bucket, a key is a key, so `mqadmin updateKvConfig` writes what `rocket kv get` reads, and back. A part of
RemotingGateway (KvConfig)."""

from __future__ import annotations

import orjson

from rocket import limits
from rocket.errors import Code, RocketError
from rocket.gateway.buckets import Buckets
from rocket.gateway.remoting.bridge import Bridge
from rocket.gateway.remoting.codec import Command, ResponseCode
from rocket.transport.guard import Caller

OP_TYPE = "kv_opType"  # RIP-22's name for the operation a put makes: PUT (the default) or CAS
EXPECT = "expectValue"  # a CAS's expected value; absent: the key must be absent


class KvConfig:
    """PUT_KV_CONFIG, GET_KV_CONFIG (and GET_KV_CONFIG_BY_VALUE, which asks the same), DELETE_KV_CONFIG and
    GET_KVLIST_BY_NAMESPACE, each made as one call of rocket's KV API as the request's user (kv-read, kv-write; a
    put to a namespace no bucket holds yet creates the bucket, one shard, which takes admin).

    RocketMQ's values are text in the request header; rocket's are bytes, so a value that is not UTF-8 reads with
    U+FFFD in place of its bad bytes. RIP-22's compare-and-set is a put whose `kv_opType` is CAS: it puts only if
    the key holds `expectValue` (or is absent, without one), else answers CAS_FAILED. A namespace list takes an
    optional `prefix`, RIP-22's prefix get."""

    def __init__(self, bridge: Bridge):
        self.buckets = Buckets(bridge.dispatcher)

    async def put(self, command: Command, connection, caller: Caller) -> Command:
        namespace, key, value = command.ext["namespace"], command.ext["key"], command.ext["value"].encode()
        operation = command.ext.get(OP_TYPE, "PUT").upper()
        if operation not in ("PUT", "CAS"):
            raise RocketError(Code.BAD_REQUEST, f"{OP_TYPE} must be PUT or CAS, got {operation!r}")
        expected = command.ext.get(EXPECT)
        compare = None if operation == "PUT" else (
            {"key": key, "target": "create_revision", "op": "==", "number": 0, "value": b""} if expected is None
            else {"key": key, "target": "value", "op": "==", "number": 0, "value": expected.encode()})
        if not await self.buckets.put(namespace, key, value, -1, caller, compare):
            raise RocketError(Code.CAS_FAILED, f"key {key!r} of namespace {namespace!r} does not hold "
                              + ("no value" if expected is None else f"{expected!r}"))
        return command.reply()

    async def get(self, command: Command, connection, caller: Caller) -> Command:
        namespace, key = command.ext["namespace"], command.ext["key"]
        value = await self.buckets.get(namespace, key, caller)
        if value is None:
            return command.reply(ResponseCode.QUERY_NOT_FOUND, f"No config item, Namespace: {namespace} Key: {key}")
        return command.reply(ext={"value": value.decode(errors="replace")})

    async def delete(self, command: Command, connection, caller: Caller) -> Command:
        """Deleting what is not there succeeds, as in RocketMQ."""
        await self.buckets.delete(command.ext["namespace"], command.ext["key"], caller)
        return command.reply()

    async def list(self, command: Command, connection, caller: Caller) -> Command:
        """The namespace's keys (those with the optional prefix) as RocketMQ's KVTable, at most
        limits.remoting_kv_list_keys_max of them: past that, an error that says how to read them all."""
        namespace = command.ext["namespace"]
        entries = await self.buckets.scan(namespace, command.ext.get("prefix", ""),
                                          limits.remoting_kv_list_keys_max + 1, caller)
        if len(entries) > limits.remoting_kv_list_keys_max:
            raise RocketError(Code.BAD_REQUEST, f"namespace {namespace!r} has more than "
                              f"{limits.remoting_kv_list_keys_max} keys: read them with rocket kv ls {namespace}")
        if not entries:
            return command.reply(ResponseCode.QUERY_NOT_FOUND, f"No config item, Namespace: {namespace}")
        table = {key: value.decode(errors="replace") for key, value in entries}
        return command.reply(body=orjson.dumps({"table": table}))
