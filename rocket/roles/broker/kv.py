"""The KV API on the broker (RIP-22): buckets, whose keys hash onto shards (a hash tag {...} keeps keys together), and
put, get, delete, range, transactions and watch, each sent to the storage group of the key's shard. The bucket calls
take and return typed messages (rocket/serde/typed.py); the keys' calls, the data plane, plain ones.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import AsyncIterator, Sequence
from typing import Any
from contextlib import suppress

import trio

from rocket import limits
from rocket.errors import Code, RocketError
from rocket.model import KV_PREFIX, TopicSpec, bucket_topic, shard_of
from rocket.parked import Slot
from rocket.roles.broker.routes import Route, Routes, complete_later
from rocket.roles.peers import Peers
from rocket.serde.typed import (BucketInfo, BucketRequest, CreateBucketRequest, DescribeBucketResponse, Empty,
                                KvShardInfo, ListBucketsResponse, ListTopicsResponse, TopicInfo, convert, plain)
from rocket.store.kv import check_key, check_txn, check_value, txn_bytes, txn_from_wire
from rocket.transport.rpc import as_rocket_error


@dataclasses.dataclass(slots=True)
class KvCall:
    """The transactions of one StorageKvTxn call, and its outcome once done."""

    txns: list[dict] = dataclasses.field(default_factory=list)
    bytes: int = 0
    done: trio.Event = dataclasses.field(default_factory=trio.Event)
    results: list[dict] | None = None
    error: RocketError | None = None


def bucket_info(topic: TopicInfo | TopicSpec) -> BucketInfo:
    """The bucket kept as topic: as the nameservers answer it, or as routed."""
    return BucketInfo(topic.name[len(KV_PREFIX):], topic.queues, topic.history, topic.ttl_ms, topic.created_ms)


def prefix_end(prefix: str) -> str:
    """The smallest key after every key that starts with prefix ('' when there is none: no bound)."""
    while prefix and prefix[-1] == chr(0x10FFFF):
        prefix = prefix[:-1]
    return prefix[:-1] + chr(ord(prefix[-1]) + 1) if prefix else ""


class KeyValues:
    """The KV calls. A bucket is kept by the nameservers as a topic of type "kv" whose queues are its shards, so
    routes, placement and replica moves are the topics'.

    A KvPut or a KvGet is parked as produce parks an append (Routes.parking and park): with the storage role here
    when this node leads the key's shard, else on the open channel to the shard's leader, which merges the parked
    puts of a round into one Raft entry and serves a get at once while its lease holds (roles/storage/kv.py).
    Without a cached route or an open channel, a put is a task, and the task path sends a group's writes in batches,
    one StorageKvTxn call out at a time per group (_kv_batched)."""

    def __init__(self, routes: Routes, peers: Peers):
        self.routes = routes
        self.peers = peers
        # storage group -> the KV batch that takes transactions now, and the lock held while its call is out: a
        # route's groups, so bounded by limits.storage_groups_max
        self._kv_open: dict[int, KvCall] = {}
        self._kv_sending: dict[int, trio.Lock] = {}

    # ---- buckets -------------------------------------------------------------------------------------

    async def kv_create_bucket(self, request: CreateBucketRequest) -> BucketInfo:
        topic = await self.peers.nameserver("MetaCreateBucket", plain(request), timeout_s=limits.leader_wait_s_max + 5)
        return bucket_info(convert(topic, TopicInfo))

    async def kv_list_buckets(self, request: Empty) -> ListBucketsResponse:
        listed = convert(await self.peers.nameserver("MetaListTopics", plain(request)), ListTopicsResponse)
        return ListBucketsResponse([bucket_info(topic) for topic in listed.topics if topic.message_type == "kv"])

    async def _bucket(self, name: str) -> Route:
        return await self.routes.route(bucket_topic(name))

    async def kv_describe_bucket(self, request: BucketRequest) -> DescribeBucketResponse:
        """Each shard's revision, keys, bytes and digest, as its leader holds them."""
        route = await self._bucket(request.bucket)
        shards = []
        for shard, group in enumerate(route.queue_groups):
            found = await self._kv_read(route, shard, {"op": "digest"})  # plain: StorageKvRead is the data plane's
            shards.append(KvShardInfo(shard, group, self.routes.leader_of(group), found["revision"], found["keys"],
                                      found["bytes"], found["digest"]))
        return DescribeBucketResponse(bucket_info(route.spec), shards)

    async def kv_delete_bucket(self, request: BucketRequest) -> Empty:
        """Delete every key (watchers see them go), then forget the bucket."""
        route = await self._bucket(request.bucket)
        for shard in range(route.spec.queues):
            await self._delete_prefix(route, shard, "")
        await self.peers.nameserver("MetaDeleteBucket", plain(request), timeout_s=limits.leader_wait_s_max + 5)
        self.routes.forget(route.spec.name)
        return Empty()

    # ---- keys ----------------------------------------------------------------------------------------

    async def _kv_txn(self, route: Route, shard: int, compare: list[dict], success: list[dict],
                      failure: Sequence[dict] = ()) -> dict:
        """A transaction on one shard, checked here (it goes in a batch with others, which a bad one must not fail)
        and sent with the others that came for the shard's group meanwhile (_kv_batched)."""
        txn, size = self._kv_txn_checked(route, shard, compare, success, failure)
        return await self._kv_batched(route, route.queue_groups[shard], txn, size)

    @staticmethod
    def _kv_txn_checked(route: Route, shard: int, compare: list[dict], success: list[dict],
                        failure: Sequence[dict] = ()) -> tuple[dict, int]:
        """A transaction as StorageKvTxn carries it, its puts' TTLs the bucket's unless given, checked; and its size."""
        for op in (*success, *failure):
            if op.get("ttl_ms", -1) < 0:
                op["ttl_ms"] = route.spec.ttl_ms if op["op"] == "put" else 0
        txn = {"bucket": route.spec.bucket, "shard": shard, "history": route.spec.history, "compare": compare,
               "success": list(success), "failure": list(failure)}
        return txn, txn_bytes(check_txn(txn_from_wire(txn, 0)))

    async def _kv_batched(self, route: Route, group: int, txn: dict, size: int) -> dict:
        """Group commit of KV writes, like a batch of messages: one StorageKvTxn (one Raft entry) at a time per
        group carries every transaction that arrived while the one before was out. The first of a batch sends it,
        shielded, so that the others' writes do not depend on its caller staying; each gets its own result, or the
        batch's error (an outcome unknown is unknown for all of them)."""
        batch = self._kv_open.get(group)
        first = batch is None or len(batch.txns) >= limits.kv_batch_txns_max or \
            batch.bytes + size > limits.kv_txn_bytes_max
        if batch is None or first:
            batch = self._kv_open[group] = KvCall()
        slot = len(batch.txns)
        batch.txns.append(txn)
        batch.bytes += size
        if first:
            with trio.CancelScope(shield=True):
                try:
                    async with self._kv_sending.setdefault(group, trio.Lock()):
                        if self._kv_open.get(group) is batch:
                            del self._kv_open[group]  # those who come now start the next batch
                        response = await self.routes.storage(route, group, "StorageKvTxn",
                                                             {"group": group, "txns": batch.txns}, at_most_once=True)
                        batch.results = response["results"]
                except RocketError as error:
                    batch.error = error
                finally:
                    batch.done.set()
        else:
            await batch.done.wait()
        if batch.error is not None:
            raise batch.error
        assert batch.results is not None  # set before done, unless error was
        return batch.results[slot]

    async def _kv_read(self, route: Route, shard: int, request: dict) -> dict:
        group = route.queue_groups[shard]
        return await self.routes.storage(route, group, "StorageKvRead", _read_call(route, group, shard, request))

    async def kv_put(self, request: dict) -> dict:
        route = await self._bucket(request["bucket"])
        shard, txn, size = self._put_txn(route, request)
        return await self._put_batched(route, route.queue_groups[shard], txn, size)

    async def _put_batched(self, route: Route, group: int, txn: dict, size: int) -> dict:
        return _put_answer(txn, await self._kv_batched(route, group, txn, size))

    def kv_put_parked(self, request: dict, slot: Slot) -> None:
        """kv_put on the data plane, when the bucket's route is cached: the put is one StorageKvTxn parked with the
        storage role in this process when this node leads the key's shard (the Raft round proposes all that came
        meanwhile in one go, instead of _kv_batched's one call at a time), or sent without a task on the open channel
        to the shard's leader on another node, whose read loop parks it in turn (as produce forwards its appends).
        One that meets a leader change before it was proposed (UNAVAILABLE: surely not applied) is sent again as a
        task, as Routes.storage retries a put; any other failure is the put's (at most once)."""
        route = self.routes.cached(bucket_topic(request["bucket"]))
        shard, txn, size = self._put_txn(route, request)
        group = route.queue_groups[shard]
        to = self.routes.parking(route, group, "StorageKvTxn")
        retryable = self.routes.retryable(route, group, at_most_once=True)

        def finish(outcome: Any) -> None:  # the answer, or the RocketError met
            if isinstance(outcome, RocketError):
                if outcome.code in retryable:
                    self.routes.start_soon(complete_later, slot,
                                           functools.partial(self._put_batched, route, group, txn, size))
                else:
                    slot.complete(outcome)
                return
            try:
                slot.complete(_put_answer(txn, outcome["results"][0]))
            except RocketError as error:
                slot.complete(error)
        self.routes.park(to, "StorageKvTxn", {"group": group, "txns": [txn]}, Slot(finish), retryable)

    def _put_txn(self, route: Route, request: dict) -> tuple[int, dict, int]:
        """A KvPut as a transaction on its key's shard: (shard, the transaction, its size)."""
        key = check_key(request["key"])
        compare = []
        if request["if_absent"]:
            compare.append({"key": key, "target": "create_revision", "op": "==", "number": 0, "value": b""})
        if request["if_revision"] >= 0:
            compare.append({"key": key, "target": "revision", "op": "==", "number": request["if_revision"],
                            "value": b""})
        shard = shard_of(key, route.spec.queues)
        txn, size = self._kv_txn_checked(route, shard, compare, [
            {"op": "put", "key": key, "value": check_value(request["value"]), "ttl_ms": request["ttl_ms"]}],
            [{"op": "get", "key": key, "value": b"", "ttl_ms": 0}])
        return shard, txn, size

    async def kv_get(self, request: dict) -> dict:
        route = await self._bucket(request["bucket"])
        key = _get_key(request)
        return _get_answer(request, key, await self._kv_read(route, shard_of(key, route.spec.queues), _get_read(
            request, key)))

    def kv_get_parked(self, request: dict, slot: Slot) -> None:
        """kv_get on the data plane, when the bucket's route is cached: parked with the storage role in this process
        when this node leads the key's shard (served in this step when it need not wait: a lease, everything applied;
        else Unparked, a task), or sent without a task on the open channel to the shard's leader on another node.
        A forwarded one that meets a leader change is asked again as a task (a read may be)."""
        route = self.routes.cached(bucket_topic(request["bucket"]))
        key = _get_key(request)
        shard = shard_of(key, route.spec.queues)
        group = route.queue_groups[shard]
        to = self.routes.parking(route, group, "StorageKvRead")
        retryable = self.routes.retryable(route, group)

        def finish(outcome: Any) -> None:  # the answer, or the RocketError met
            if isinstance(outcome, RocketError) and outcome.code in retryable:
                self.routes.start_soon(complete_later, slot, functools.partial(self.kv_get, request))
                return
            try:
                slot.complete(outcome if isinstance(outcome, RocketError) else _get_answer(request, key, outcome))
            except RocketError as error:
                slot.complete(error)
        self.routes.park(to, "StorageKvRead", _read_call(route, group, shard, _get_read(request, key)), Slot(finish),
                         retryable)

    async def kv_delete(self, request: dict) -> dict:
        route = await self._bucket(request["bucket"])
        if request["prefix"]:
            if request["if_revision"] >= 0:
                raise RocketError(Code.BAD_REQUEST, "a prefix delete takes no if_revision")
            deleted = revision = 0
            for shard in range(route.spec.queues):
                count, revision = await self._delete_prefix(route, shard, request["key"])
                deleted += count
            return {"revision": revision, "deleted": deleted}
        key = check_key(request["key"])
        compare = [] if request["if_revision"] < 0 else [
            {"key": key, "target": "revision", "op": "==", "number": request["if_revision"], "value": b""}]
        result = await self._kv_txn(route, shard_of(key, route.spec.queues), compare,
                                    [{"op": "delete", "key": key, "value": b"", "ttl_ms": 0}],
                                    [{"op": "get", "key": key, "value": b"", "ttl_ms": 0}])
        if not result["succeeded"]:
            raise cas_failed(key, result)
        return {"revision": result["revision"], "deleted": result["results"][0]["deleted"]}

    async def _delete_prefix(self, route: Route, shard: int, prefix: str) -> tuple[int, int]:
        """Delete a shard's keys with a prefix, limits.kv_delete_prefix_keys_max per command: (deleted, revision)."""
        deleted = 0
        while True:
            result = await self._kv_txn(route, shard, [], [{"op": "delete_prefix", "key": prefix, "value": b"",
                                                            "ttl_ms": 0}])
            deleted += result["results"][0]["deleted"]
            if result["results"][0]["deleted"] < limits.kv_delete_prefix_keys_max:
                return deleted, result["revision"]

    async def kv_range(self, request: dict) -> dict:
        """Keys in order across the shards, a page at a time: each shard gives its first keys after `after`,
        and the page is the first `limit` of them all."""
        route = await self._bucket(request["bucket"])
        start, end = request["start"], request["end"]
        if request["prefix"]:
            if start or end:
                raise RocketError(Code.BAD_REQUEST, "a range is a prefix or [start, end), not both")
            start, end = request["prefix"], prefix_end(request["prefix"])
        if request["limit"] < 0:
            raise RocketError(Code.BAD_REQUEST, f"limit must be 0 (the default page) or more, got {request['limit']}")
        limit = min(request["limit"] or limits.kv_range_keys_default, limits.kv_range_keys_max)
        read = {"start": start, "end": end, "after": request["after"], "limit": limit,
                "keys_only": request["keys_only"], "serializable": request["serializable"],
                "op": "count" if request["count_only"] else "range"}
        answers = await self._each_shard(route, read)
        if request["count_only"]:
            return {"entries": [], "more": False, "count": sum(answer["count"] for answer in answers)}
        entries = sorted((entry for answer in answers for entry in answer["entries"]), key=lambda e: e["key"])
        more = len(entries) > limit or any(answer["more"] for answer in answers)
        if any(answer["more"] for answer in answers):  # keep keys before the first a shard left out
            bound = min(answer["entries"][-1]["key"] for answer in answers if answer["more"])
            entries = [entry for entry in entries if entry["key"] <= bound]
        return {"entries": entries[:limit], "more": more, "count": 0}

    async def _each_shard(self, route: Route, read: dict) -> list[dict]:
        """Every shard's answer to read, at once; the first shard that fails ends the others, and its error (not a
        group of them, which the caller would get as INTERNAL) is the call's."""
        answers: list[dict] = [{}] * route.spec.queues
        failures: list[RocketError] = []

        async def one(shard: int) -> None:
            try:
                answers[shard] = await self._kv_read(route, shard, read)
            except RocketError as error:
                failures.append(error)
                nursery.cancel_scope.cancel()

        async with trio.open_nursery() as nursery:
            for shard in range(route.spec.queues):
                nursery.start_soon(one, shard)
        if failures:
            raise failures[0]
        return answers

    async def kv_txn(self, request: dict) -> dict:
        """Atomic over the keys of one shard, like etcd's Txn; keys of different shards are refused."""
        route = await self._bucket(request["bucket"])
        keys = [c["key"] for c in request["compare"]] + [o["key"] for o in request["success"] + request["failure"]]
        shards = {shard_of(key, route.spec.queues) for key in keys}
        if len(shards) > 1:
            raise RocketError(Code.CROSS_SHARD, f"the transaction's keys lie in {len(shards)} shards of bucket "
                              f"{request['bucket']!r}; a transaction is atomic within one shard: give its keys one "
                              "hash tag, as in {user-1}/profile and {user-1}/cart")
        return await self._kv_txn(route, shards.pop() if shards else 0, request["compare"], request["success"],
                                  request["failure"])

    async def kv_export(self, request: dict) -> AsyncIterator[dict]:
        """Every key of the bucket, shard by shard, each shard as of one revision (a LevelDB snapshot its leader
        pins for the export), a page at a time."""
        route = await self._bucket(request["bucket"])
        for shard in range(route.spec.queues):
            cursor = ""
            while True:
                page = await self._kv_read(route, shard, {"op": "export", "cursor": cursor})
                cursor = page["cursor"]
                yield {"shard": shard, "revision": page["revision"], "entries": page["entries"], "last": not cursor}
                if not cursor:
                    break

    async def kv_watch(self, request: dict) -> AsyncIterator[dict]:
        """Each shard's changes in revision order, from where the watcher asks (resuming after the last revision it
        saw), read a bounded batch at a time: a slow watcher holds back only its own reads. A task per shard, in the
        broker's nursery (Routes.start_soon), follows the shard until the stream ends."""
        route = await self._bucket(request["bucket"])
        starts = {shard: request["from_revision"] if request["from_revision"] > 0 else -1
                  for shard in range(route.spec.queues)}
        for position in request["from_revisions"]:
            if not 0 <= position["shard"] < route.spec.queues:
                raise RocketError(Code.BAD_REQUEST, f"bucket {request['bucket']!r} has shards 0.."
                                  f"{route.spec.queues - 1}, not {position['shard']}")
            starts[position["shard"]] = position["revision"]
        sender, receiver = trio.open_memory_channel(0)
        followers = {shard: trio.CancelScope() for shard in starts}  # cancelled as the stream ends, started or not

        async def follow(shard: int, revision: int, sender) -> None:
            group = route.queue_groups[shard]
            with followers[shard]:
                async with sender:
                    try:
                        while True:
                            found = await self.routes.storage(route, group, "StorageKvWatch", {
                                "group": group, "bucket": route.spec.bucket, "shard": shard,
                                "prefix": request["prefix"], "from_revision": revision,
                                "wait_ms": limits.kv_watch_wait_ms_max},
                                timeout_s=limits.kv_watch_wait_ms_max / 1000 + limits.storage_call_s_max)
                            revision = found["next_revision"]
                            if found["events"]:
                                await sender.send({"events": found["events"]})
                    except trio.BrokenResourceError:
                        return  # the watcher is gone
                    except Exception as error:  # the stream ends with it
                        with suppress(trio.BrokenResourceError):
                            await sender.send(as_rocket_error(error, "KvWatch"))

        async with sender:
            for shard, revision in starts.items():
                self.routes.start_soon(follow, shard, revision, sender.clone())
        try:
            async with receiver:
                async for batch in receiver:
                    if isinstance(batch, RocketError):
                        raise batch
                    yield batch
        finally:
            for scope in followers.values():
                scope.cancel()


def _read_call(route: Route, group: int, shard: int, request: dict) -> dict:
    """A StorageKvRead of a shard: request's fields over the defaults."""
    return {"group": group, "bucket": route.spec.bucket, "shard": shard, "key": "", "revision": 0, "start": "",
            "end": "", "after": "", "limit": 0, "keys_only": False, "serializable": False, **request}


def _get_key(request: dict) -> str:
    """A KvGet's key, checked with its revision."""
    key = check_key(request["key"])
    if request["revision"] < 0:
        raise RocketError(Code.BAD_REQUEST, f"revision must be 0 (the latest) or more, got {request['revision']}")
    return key


def _get_read(request: dict, key: str) -> dict:
    return {"op": "get", "key": key, "revision": request["revision"], "serializable": request["serializable"]}


def _get_answer(request: dict, key: str, found: dict) -> dict:
    """A KvGet's answer from its StorageKvRead's; NOT_FOUND without an entry."""
    if not found["entries"]:
        at = f" at revision {request['revision']}" if request["revision"] else ""
        raise RocketError(Code.NOT_FOUND, f"key {key!r} is not in bucket {request['bucket']!r}{at}")
    return {"entries": found["entries"], "more": False, "count": 1}


def _put_answer(txn: dict, result: dict) -> dict:
    """A KvPut's answer from its transaction's result; CAS_FAILED if its compare did not hold."""
    if not result["succeeded"]:
        raise cas_failed(txn["success"][0]["key"], result)
    return {"revision": result["results"][0]["revision"], "deleted": 0}


def cas_failed(key: str, result: dict) -> RocketError:
    found = result["results"][0]["entries"] if result["results"] else []
    current = found[0]["revision"] if found else 0
    return RocketError(Code.CAS_FAILED, f"key {key!r} is at revision {current}"
                       f"{'' if found else ' (absent)'}: the compare did not hold")
