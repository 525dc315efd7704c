"""Key-value buckets on the storage groups (RIP-22): every change is a transaction command in a shard's Raft log,
decided here against the keys' current state. Pure: no I/O, no clock; the machine reads keys through a KvView (the
KV index) under an overlay of what the entries applied before, in the same apply, changed."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from rocket import limits
from rocket.errors import Code, RocketError

PUT, DELETE, EXPIRED = 1, 2, 3  # the kinds of change, as watchers see them (an expiry is a delete with a reason)
KIND_NAMES = {PUT: "put", DELETE: "delete", EXPIRED: "expired"}
TARGETS = ("revision", "create_revision", "version", "value")
# Any: a comparison's operands are two of a key's targets of one kind (ints, or bytes for "value").
COMPARISONS: dict[str, Callable[[Any, Any], bool]] = {
    "==": lambda a, b: a == b, "!=": lambda a, b: a != b, "<": lambda a, b: a < b, ">": lambda a, b: a > b}
OPS = ("put", "delete", "delete_prefix", "get")


@dataclasses.dataclass(slots=True, frozen=True)
class KeyState:
    """A key's current record. A missing key compares as revision, create_revision and version 0."""

    value: bytes
    revision: int  # the shard's revision of the key's last change
    create_revision: int
    version: int  # changes since it was created
    expires_ms: int = 0  # 0: never

    def expired(self, now_ms: int) -> bool:
        return 0 < self.expires_ms <= now_ms


@dataclasses.dataclass(slots=True)
class Compare:
    key: str
    target: str  # one of TARGETS
    op: str  # one of COMPARISONS
    number: int = 0
    value: bytes = b""


@dataclasses.dataclass(slots=True)
class Op:
    op: str  # one of OPS
    key: str = ""  # or the prefix, for delete_prefix
    value: bytes = b""
    ttl_ms: int = 0  # put: the key expires this long after now_ms (0: never)


@dataclasses.dataclass(slots=True)
class Txn:
    bucket: str
    shard: int
    now_ms: int
    history: int  # revisions kept per key, the bucket's setting
    compare: list[Compare]
    success: list[Op]
    failure: list[Op]


@dataclasses.dataclass(slots=True)
class KvBatch:
    """Transactions a leader proposed together (as many callers' puts arrived at once): one Raft entry, applied one
    after the other, each deciding alone."""

    txns: list[Txn]


@dataclasses.dataclass(slots=True)
class KvChange:
    """One revision of a shard: the key's new state (None when deleted or expired) and the one it replaced."""

    bucket: str
    shard: int
    key: str
    kind: int  # PUT, DELETE or EXPIRED
    revision: int
    state: KeyState | None
    previous: KeyState | None
    history: int


def check_key(key: str) -> str:
    if not isinstance(key, str) or not key or len(key.encode()) > limits.kv_key_bytes_max:
        raise RocketError(Code.BAD_REQUEST, f"a key must be 1-{limits.kv_key_bytes_max} bytes of UTF-8, got "
                          f"{len(key.encode()) if isinstance(key, str) else key!r} bytes")
    return key


def check_value(value: bytes | memoryview) -> bytes | memoryview:
    if len(value) > limits.kv_value_bytes_max:
        raise RocketError(Code.BAD_REQUEST, f"a value must be at most {limits.kv_value_bytes_max} bytes, got "
                          f"{len(value)}")
    return value


def txn_from_wire(wire: dict, now_ms: int) -> Txn:
    """A transaction as the storage RPC carries it (StorageKvTxn), stamped with the leader's clock."""
    return Txn(wire["bucket"], wire["shard"], now_ms, wire["history"],
               [Compare(c["key"], c["target"], c["op"], c["number"], c["value"]) for c in wire["compare"]],
               *([Op(o["op"], o["key"], o["value"], max(0, o["ttl_ms"])) for o in wire[branch]]
                 for branch in ("success", "failure")))


def txn_bytes(txn: Txn) -> int:
    """Its keys and values: what it adds to a Raft entry."""
    return sum(len(part.key) + len(part.value) for part in (*txn.compare, *txn.success, *txn.failure))


def check_txn(txn: Txn) -> Txn:
    """What the proposer checks before a transaction enters the log: sizes, names and the one-shard rule is the
    broker's (it knows the bucket); here, what every replica relies on."""
    operations = len(txn.compare) + len(txn.success) + len(txn.failure)
    if operations > limits.kv_txn_ops_max:
        raise RocketError(Code.BAD_REQUEST, f"a transaction holds at most {limits.kv_txn_ops_max} compares and "
                          f"operations, got {operations}")
    for compare in txn.compare:
        check_key(compare.key)
        check_value(compare.value)
        if compare.target not in TARGETS or compare.op not in COMPARISONS:
            raise RocketError(Code.BAD_REQUEST, f"a compare's target is one of {', '.join(TARGETS)} and its op one of "
                              f"{' '.join(COMPARISONS)}, got {compare.target!r} {compare.op!r}")
    for op in txn.success + txn.failure:
        if op.op not in OPS:
            raise RocketError(Code.BAD_REQUEST, f"a transaction's operation is one of {', '.join(OPS)}, got {op.op!r}")
        if op.op != "delete_prefix":
            check_key(op.key)
        elif len(op.key.encode()) > limits.kv_key_bytes_max:
            raise RocketError(Code.BAD_REQUEST, f"a prefix must be at most {limits.kv_key_bytes_max} bytes")
        if not 0 <= op.ttl_ms <= limits.kv_ttl_s_max * 1000:
            raise RocketError(Code.BAD_REQUEST, f"a TTL must be 0 (none) to {limits.kv_ttl_s_max} s, got "
                              f"{op.ttl_ms} ms")
        check_value(op.value)
    size = txn_bytes(txn)
    if size > limits.kv_txn_bytes_max:
        raise RocketError(Code.BAD_REQUEST, f"a transaction's keys and values must total at most "
                          f"{limits.kv_txn_bytes_max} bytes, got {size}")
    if not 1 <= txn.history <= limits.kv_history_max:
        raise RocketError(Code.BAD_REQUEST, f"history must be 1-{limits.kv_history_max}, got {txn.history}")
    return txn


Read = Callable[[str], "KeyState | None"]  # a key's state in the shard, expired or not
Keys = Callable[[str, int], list[str]]  # up to limit keys of the shard with a prefix, sorted, expired or not


class ShardTxn:
    """One transaction applied to one shard at revision: decide() returns its result and the changes it made.

    A bucket's keys hash onto its shards (rocket.model.shard_of); a shard lives in one storage group. Each change
    takes the next revision of its shard: a put or delete of a key, or the expiry of a key whose TTL passed. A
    transaction compares, then runs its success or its failure operations, like etcd's Txn. Time is the leader's
    now_ms, carried in the command, so that every replica expires the same keys."""

    def __init__(self, txn: Txn, revision: int, read: Read, keys: Keys, changed: dict[str, KeyState | None]):
        """changed: the shard's keys changed by the entries applied before in the same apply (updated here)."""
        self.txn, self.revision, self._read, self._keys = txn, revision, read, keys
        self.changes: list[KvChange] = []
        self._changed = changed

    def decide(self) -> dict:
        """{"succeeded", "revision" (the shard's after it), "results": one per operation run}"""
        txn = self.txn
        succeeded = all(self._holds(compare) for compare in txn.compare)
        results = [self._run(op) for op in (txn.success if succeeded else txn.failure)]
        return {"succeeded": succeeded, "revision": self.revision, "results": results}

    def live(self, key: str) -> KeyState | None:
        """The key's state, expiring it first (a change of its own) if its TTL passed."""
        state = self._changed[key] if key in self._changed else self._read(key)
        if state is not None and state.expired(self.txn.now_ms):
            self._change(key, EXPIRED, None, state)
            return None
        return state

    def _holds(self, compare: Compare) -> bool:
        state = self.live(compare.key)
        if compare.target == "value":
            if state is None:
                return compare.op == "!="
            return COMPARISONS[compare.op](state.value, compare.value)
        found = getattr(state, compare.target) if state is not None else 0
        return COMPARISONS[compare.op](found, compare.number)

    def _run(self, op: Op) -> dict:
        if op.op == "get":
            state = self.live(op.key)
            return {"entries": [entry(op.key, state)] if state is not None else []}
        if op.op == "put":
            previous = self.live(op.key)
            revision = self.revision + 1
            expires_ms = self.txn.now_ms + op.ttl_ms if op.ttl_ms else 0
            state = KeyState(bytes(op.value), revision, previous.create_revision if previous else revision,
                             previous.version + 1 if previous else 1, expires_ms)
            self._change(op.key, PUT, state, previous)
            return {"revision": revision}
        if op.op == "delete":
            previous = self.live(op.key)
            if previous is not None:
                self._change(op.key, DELETE, None, previous)
            return {"deleted": int(previous is not None)}
        deleted = 0  # delete_prefix: up to limits.kv_delete_prefix_keys_max keys; the caller repeats while it did
        for key in self._prefixed(op.key, limits.kv_delete_prefix_keys_max):
            previous = self.live(key)
            if previous is not None:
                self._change(key, DELETE, None, previous)
                deleted += 1
        return {"deleted": deleted}

    def _prefixed(self, prefix: str, limit: int) -> list[str]:
        """Keys with prefix as this transaction sees them: the shard's, with the earlier changes of the apply."""
        found = set(self._keys(prefix, limit + len(self._changed)))
        for key, state in self._changed.items():
            if key.startswith(prefix):
                (found.add if state is not None else found.discard)(key)
        return sorted(found)[:limit]

    def _change(self, key: str, kind: int, state: KeyState | None, previous: KeyState | None) -> None:
        self.revision += 1
        self._changed[key] = state
        self.changes.append(KvChange(self.txn.bucket, self.txn.shard, key, kind, self.revision, state, previous,
                                     self.txn.history))


def entry(key: str, state: KeyState) -> dict:
    """A key as the API answers it."""
    return {"key": key, "value": state.value, "revision": state.revision, "create_revision": state.create_revision,
            "version": state.version, "expires_ms": state.expires_ms}
