"""A Wing–Gong style linearizability checker for a history of register operations (put, get,
compare-and-set), checked key by key. An operation without a response may have taken effect at any
point after its invocation, or never."""

from __future__ import annotations

import dataclasses
import math

INFINITY = math.inf


@dataclasses.dataclass(frozen=True)
class Operation:
    id: int
    key: str
    kind: str  # "put", "get" or "cas"
    argument: tuple  # put: (value,), cas: (expected, new), get: ()
    invoked: float
    responded: float = INFINITY  # INFINITY: no response seen
    result: object = None  # get: the value read; cas: whether it swapped; put: None


def _apply(kind: str, argument: tuple, state):
    """(new state, result) of one operation on a register."""
    if kind == "put":
        return argument[0], None
    if kind == "get":
        return state, state
    expected, new = argument
    return (new, True) if state == expected else (state, False)


def linearizable(history: list[Operation]) -> tuple[bool, str]:
    """Whether the whole history is linearizable; on failure, the key whose history is not."""
    by_key: dict[str, list[Operation]] = {}
    for operation in history:
        by_key.setdefault(operation.key, []).append(operation)
    for key, operations in by_key.items():
        if not _key_linearizable(operations):
            return False, f"key {key!r}: no legal order for {len(operations)} operations"
    return True, ""


def _key_linearizable(operations: list[Operation]) -> bool:
    operations = sorted(operations, key=lambda o: o.invoked)
    completed = frozenset(o.id for o in operations if o.responded != INFINITY)
    seen: set[tuple[frozenset, object]] = set()

    def search(done: frozenset, state) -> bool:
        if completed <= done:
            return True  # operations left are pending: they may never have happened
        if (done, state) in seen:
            return False
        seen.add((done, state))
        remaining = [o for o in operations if o.id not in done]
        horizon = min(o.responded for o in remaining)
        for operation in remaining:
            if operation.invoked > horizon:
                break  # it started after another had finished: that one must come first
            new_state, result = _apply(operation.kind, operation.argument, state)
            if operation.responded != INFINITY and result != operation.result:
                continue
            if search(done | {operation.id}, new_state):
                return True
        return False

    return search(frozenset(), None)
