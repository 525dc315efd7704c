"""KV shards on their group's replicas: transactions proposed by the leader, reads (linearizable on the leader,
serializable on a replica in sync) and exports, watches that wait for a shard's next revision, and the leader's expiry
of keys past their TTL. A part of StorageRole.
"""

from __future__ import annotations

import logging
import math
from typing import Any

import trio

from rocket import limits
from rocket.clock import Clock
from rocket.errors import Code, RocketError
from rocket.parked import Slot, Unparked
from rocket.replication import Engine
from rocket.roles.storage.gate import Gate, NotHosted
from rocket.store.commands import encode_kv
from rocket.store.kv import KIND_NAMES, Op, Txn, check_key, check_txn, entry, txn_bytes, txn_from_wire
from rocket.store.store import Store

log = logging.getLogger("rocket.storage")

KV_READ_KINDS = frozenset({"get", "range", "count", "digest", "export"})  # StorageKvRead's ops


class KeyValues:
    def __init__(self, store: Store, host: Engine, gate: Gate, clock: Clock):
        self.store = store
        self.host = host
        self.gate = gate
        self.clock = clock
        # export id -> (LevelDB snapshot, revision, idle at): ids are ours, at most limits.kv_exports_max
        self._kv_exports: dict[str, tuple] = {}
        self._kv_export_ids = 0
        self.kv_counts: dict[str, int] = {"txns": 0}  # transactions applied on this leader, their operations by kind
        # Parked StorageKvTxn calls by group, proposed together at the start of the next Raft round (_propose_kv)
        self._kv_waiting: dict[int, list] = {}
        host.on_round(self._propose_kv)
        self.kv_reads: dict[str, int] = {}  # KV reads served, by kind: KV_READ_KINDS only

    async def kv_txn(self, request: dict) -> dict:
        """Transactions that came to a broker together for this group: one Raft entry, one result each."""
        txns = self._kv_checked(request)
        results = await self.host.propose(request["group"], self._kv_payload(txns), limits.storage_append_wait_s_max)
        return self._kv_answer(txns, results)

    def kv_txn_parked(self, request: dict, slot: Slot) -> None:
        """kv_txn on the data plane: the transactions wait, parked, for the next Raft round, which proposes every
        group's waiting transactions as one entry (_propose_kv), and its apply answers each."""
        try:
            txns = self._kv_checked(request)
        except NotHosted:
            raise Unparked from None
        self._kv_waiting.setdefault(request["group"], []).append((txns, slot))
        self.host.wake_round()

    def _propose_kv(self) -> None:
        """At the start of each Raft round (RaftHost.on_round): each group's waiting transactions, as few entries as
        limits.kv_batch_txns_max and kv_txn_bytes_max allow; each entry's apply answers its callers."""
        waiting, self._kv_waiting = self._kv_waiting, {}
        for group, calls in waiting.items():
            chunk: list[tuple[list[Txn], Slot]] = []
            count = size = 0
            for txns, slot in calls:
                more = sum(map(txn_bytes, txns))
                if chunk and (count + len(txns) > limits.kv_batch_txns_max or size + more > limits.kv_txn_bytes_max):
                    self._propose_kv_chunk(group, chunk)
                    chunk, count, size = [], 0, 0
                chunk.append((txns, slot))
                count, size = count + len(txns), size + more
            self._propose_kv_chunk(group, chunk)

    def _propose_kv_chunk(self, group: int, chunk: list[tuple[list[Txn], Slot]]) -> None:
        def answer_each(outcome: Any) -> None:  # the results, or the RocketError met
            at = 0
            for txns, slot in chunk:
                slot.complete(outcome if isinstance(outcome, RocketError)
                              else self._kv_answer(txns, outcome[at:at + len(txns)]))
                at += len(txns)
        entry = Slot(answer_each)
        try:
            self.host.propose_parked(group, self._kv_payload([txn for txns, _ in chunk for txn in txns]), entry,
                                     limits.storage_append_wait_s_max)
        except RocketError as error:
            entry.complete(error)

    def _kv_checked(self, request: dict) -> list[Txn]:
        """A StorageKvTxn's transactions, checked, stamped with this leader's clock. That stamp decides TTL expiry for
        every replica."""
        group = request["group"]
        self.gate.leads(group)
        if not 1 <= len(request["txns"]) <= limits.kv_batch_txns_max:
            raise RocketError(Code.BAD_REQUEST, f"1-{limits.kv_batch_txns_max} transactions at once, not "
                              f"{len(request['txns'])}")
        now_ms = self.clock.wall_ms()
        txns = [check_txn(txn_from_wire(txn, now_ms)) for txn in request["txns"]]
        if any(op.op == "put" for txn in txns for op in txn.success + txn.failure):
            self.gate.room_for_data()
        return txns

    @staticmethod
    def _kv_payload(txns: list[Txn]) -> bytes:
        payload = encode_kv(txns)
        if len(payload) > limits.raft_entry_bytes_max:
            raise RocketError(Code.BAD_REQUEST, f"transactions of {len(payload)} bytes in all; at most "
                              f"{limits.raft_entry_bytes_max} go at once")
        return payload

    def _kv_answer(self, txns: list[Txn], results: list) -> dict:
        counts = self.kv_counts  # the node's metrics: counted once the entry is applied
        counts["txns"] += len(txns)
        for txn, result in zip(txns, results):  # the operations of the branch each ran (StorageMachine's results)
            ran = txn.success if not isinstance(result, dict) or result.get("succeeded", True) else txn.failure
            for op in ran:
                counts[op.op] = counts.get(op.op, 0) + 1
        return {"results": results}

    async def _kv_readable(self, request: dict) -> None:
        """Linearizable reads on the leader once it knows it still leads and applied all it committed (its lease,
        or a round of heartbeats); serializable ones on any replica in sync. The leader's check is its read barrier."""
        group = request["group"]
        self.gate.hosted(group)
        if request.get("serializable") and self.host.in_sync(group, limits.follower_read_lag_entries_max):
            return
        self.gate.leads(group)
        await self.host.read_barrier(group, lease=True)

    def kv_read_parked(self, request: dict, slot: Slot) -> None:
        """kv_read on the data plane, for a get that need not wait: a serializable one on a replica in sync, or a
        linearizable one on a leader whose lease holds and that applied all it committed (RaftHost.read_now). It is
        served at once, in the caller's step; any other read, or one of a group not hosted here, is Unparked, to wait as
        a task (kv_read)."""
        group = request["group"]
        if request["op"] != "get":
            raise Unparked
        try:
            self.gate.hosted(group)
        except NotHosted:  # not yet, perhaps: the task waits for this node's assignment (once_assigned)
            raise Unparked from None
        if not (request.get("serializable") and self.host.in_sync(group, limits.follower_read_lag_entries_max)
                or self.host.read_now(group)):
            raise Unparked
        slot.complete(self._kv_get(request))

    async def kv_read(self, request: dict) -> dict:
        await self._kv_readable(request)
        operation = request["op"]
        if operation not in KV_READ_KINDS:  # before it is counted: the kinds are the metric's labels, a fixed set
            raise RocketError(Code.BAD_REQUEST, f"a KV read is get, range, count, digest or export, not {operation!r}")
        if operation == "get":
            return self._kv_get(request)
        self.kv_reads[operation] = self.kv_reads.get(operation, 0) + 1  # the node's metrics, by kind
        bucket, shard, kv = request["bucket"], request["shard"], self.store.kv
        revision = self._kv_revision(bucket, shard)
        now_ms = self.clock.wall_ms()
        start, end = request["start"], request["end"] or None
        if operation == "count":
            count = await self.store.world.run_sync(kv.count, bucket, shard, start, end, now_ms)
            return {"entries": [], "count": count, "revision": revision}
        if operation == "export":
            return self._kv_export_page(bucket, shard, request["cursor"], revision, now_ms)
        if operation == "digest":
            keys, size, digest = await self.store.world.run_sync(kv.digest, bucket, shard)
            return {"entries": [], "revision": revision, "keys": keys, "bytes": size, "digest": digest}
        limit = min(max(request["limit"], 1), limits.kv_range_keys_max)
        found, more = kv.range(bucket, shard, start, end, request["after"] or None, limit, limits.kv_range_bytes_max,
                               now_ms, request["keys_only"])
        return {"entries": [entry(key, state) for key, state in found], "more": more, "revision": revision}

    def _kv_get(self, request: dict) -> dict:
        """A get, once it may be served: the key's entry (at the revision asked, or the latest) unless expired."""
        self.kv_reads["get"] = self.kv_reads.get("get", 0) + 1
        bucket, shard, kv = request["bucket"], request["shard"], self.store.kv
        key = check_key(request["key"])
        state = (kv.get_at(bucket, shard, key, request["revision"]) if request["revision"] > 0
                 else kv.get(bucket, shard, key))
        found = [entry(key, state)] if state is not None and not state.expired(self.clock.wall_ms()) else []
        return {"entries": found, "revision": self._kv_revision(bucket, shard)}

    def _kv_export_page(self, bucket: str, shard: int, cursor: str, revision: int, now_ms: int) -> dict:
        """A page of a shard's keys as of one revision: the first page pins a LevelDB snapshot (cursor ''), the
        next ones read it after the last key given (cursor 'id/last key'), until a page says no more."""
        exports = self._kv_exports
        now = trio.current_time()
        for stale in [name for name, (pin, _, idle_at) in exports.items() if idle_at < now]:
            exports.pop(stale)[0].close()
        if not cursor:
            if len(exports) >= limits.kv_exports_max:
                raise RocketError(Code.OVERLOADED, f"{len(exports)} exports are open on node {self.gate.node_id}; "
                                  "retry when one ends")
            self._kv_export_ids += 1
            name, after = str(self._kv_export_ids), None
            exports[name] = (self.store.kv.pin(), revision, now)
        else:
            name, _, after = cursor.partition("/")
            if name not in exports:
                raise RocketError(Code.NOT_FOUND, f"export {name} is over or was idle more than "
                                  f"{limits.kv_export_idle_s:g} s; start it again")
        pin, revision, _ = exports[name]
        found, more = self.store.kv.range(bucket, shard, "", None, after, limits.kv_range_keys_max,
                                          limits.kv_range_bytes_max, now_ms, source=pin)
        if more:
            exports[name] = (pin, revision, now + limits.kv_export_idle_s)
        else:
            exports.pop(name)[0].close()
        return {"entries": [entry(key, state) for key, state in found], "more": more, "revision": revision,
                "cursor": f"{name}/{found[-1][0]}" if more else ""}

    async def kv_watch(self, request: dict) -> dict:
        """The shard's changes from a revision on, waiting up to wait_ms for the first; COMPACTED when the
        revision is older than the events kept."""
        group, bucket, shard = request["group"], request["bucket"], request["shard"]
        self.gate.leads(group)
        revision = self._kv_revision(bucket, shard)
        start = revision + 1 if request["from_revision"] < 0 else max(request["from_revision"], 1)
        oldest = self.store.kv.oldest_event(bucket, shard, revision)
        if start < oldest:
            raise RocketError(Code.COMPACTED, f"revision {start} of {bucket!r} shard {shard} is compacted; the "
                              f"oldest kept is {oldest}")
        if start > revision:
            await self.store.kv_wait(bucket, shard, start - 1, min(max(request["wait_ms"], 0),
                                                                   limits.kv_watch_wait_ms_max) / 1000)
            revision = self._kv_revision(bucket, shard)
        events, next_revision = self.store.kv.events(bucket, shard, start, request["prefix"],
                                                     limits.kv_watch_events_max, limits.kv_range_bytes_max)
        for event in events:
            event["shard"], event["kind"] = shard, KIND_NAMES[event["kind"]]
        return {"events": events, "next_revision": max(next_revision, start), "revision": revision}

    def _kv_revision(self, bucket: str, shard: int) -> int:
        found = self.store.machine.kv_shards.get((bucket, shard))
        return found[1] if found is not None else 0

    async def expire_forever(self) -> None:
        """On each group this node leads, delete the keys whose TTL passed: a transaction that looks at them
        with the leader's clock, which expires them (a change every replica applies alike). At most every
        limits.kv_expire_scan_s; between passes the loop sleeps until the first key with a TTL in a group it leads
        expires, or KV changes, or, while groups hold KV shards, limits.idle_recheck_s passed (leadership moves)."""
        while True:
            await trio.sleep(limits.kv_expire_scan_s)
            now_ms = self.clock.wall_ms()
            holders = {holder for holder, *_ in self.store.machine.kv_shards.values()}
            led = [group for group in holders if self.host.leads(group)]
            due_ms = min((expiry for group in led if (expiry := self.store.kv.next_expiry_ms(group)) is not None),
                         default=None)
            if due_ms is None or due_ms > now_ms:
                self.store.kv_changed = changed = trio.Event()
                wait_s = (due_ms - now_ms) / 1000 if due_ms is not None else math.inf
                with trio.move_on_after(min(wait_s, limits.idle_recheck_s if holders else math.inf)):
                    await changed.wait()
                continue
            for group in led:
                shards: dict[tuple[str, int], list[str]] = {}
                for bucket, shard, key, _ in self.store.kv.expiring(group, now_ms, limits.kv_expire_keys_max):
                    shards.setdefault((bucket, shard), []).append(key)
                for (bucket, shard), keys in shards.items():
                    for at in range(0, len(keys), limits.kv_txn_ops_max):
                        history = self.store.machine.kv_shards[(bucket, shard)][2]
                        txn = Txn(bucket, shard, now_ms, history, [],
                                  [Op("get", key) for key in keys[at:at + limits.kv_txn_ops_max]], [])
                        try:
                            await self.host.propose(group, encode_kv([txn]), limits.storage_append_wait_s_max)
                        except RocketError as error:  # no longer leading, or slow: the next pass tries again
                            log.info("group %d: expiring KV keys: %s", group, error)
