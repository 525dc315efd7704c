"""A Wing–Gong style linearizability checker for a history of register operations (put, get,
compare-and-set, delete, swap), checked key by key. An operation without a response may have taken effect
at any point after its invocation, or never."""

from __future__ import annotations

import dataclasses
import math

INFINITY = math.inf
ABSENT = None  # the state of a key nobody wrote, or that was deleted


@dataclasses.dataclass(frozen=True)
class Operation:
    id: int
    key: str
    kind: str  # "put", "get", "cas", "delete" or "swap"
    argument: tuple  # put, swap: (value,), cas: (expected, new), get, delete: ()
    invoked: float
    responded: float = INFINITY  # INFINITY: no response seen
    result: object = None  # get: the value read; cas: whether it swapped; delete: whether the key was there;
    # swap: the value it replaced; put: None


def _apply(kind: str, argument: tuple, state):
    """(new state, result) of one operation on a register."""
    if kind == "put":
        return argument[0], None
    if kind == "get":
        return state, state
    if kind == "delete":
        return ABSENT, state is not ABSENT
    if kind == "swap":  # a read and a write in one step, as a transaction does them
        return argument[0], state
    expected, new = argument
    return (new, True) if state == expected else (state, False)


def linearizable(history: list[Operation]) -> tuple[bool, str]:
    """Whether the whole history is linearizable; on failure, the key whose history is not."""
    by_key: dict[str, list[Operation]] = {}
    for operation in history:
        by_key.setdefault(operation.key, []).append(operation)
    for key, operations in sorted(by_key.items()):
        if not _key_linearizable(operations):
            return False, f"key {key!r}: no legal order for {len(operations)} operations"
    return True, ""


def _key_linearizable(operations: list[Operation]) -> bool:
    """A depth-first search for an order that respects real time and the register's rules; a set of operations
    done, with the state they leave, is explored once. Iterative: a key's history may be thousands long."""
    operations = sorted(operations, key=lambda o: o.invoked)
    bits = {operation.id: 1 << index for index, operation in enumerate(operations)}
    completed = sum(bits[o.id] for o in operations if o.responded != INFINITY)
    seen: set[tuple[int, object]] = set()
    stack: list[tuple[int, object]] = [(0, ABSENT)]
    while stack:
        done, state = stack.pop()
        if completed & done == completed:
            return True  # operations left are pending: they may never have happened
        if (done, state) in seen:
            continue
        seen.add((done, state))
        remaining = [o for o in operations if not done & bits[o.id]]
        horizon = min(o.responded for o in remaining)
        candidates = []
        for operation in remaining:
            if operation.invoked > horizon:
                break  # it started after another had finished: that one must come first
            new_state, result = _apply(operation.kind, operation.argument, state)
            if operation.responded != INFINITY and result != operation.result:
                continue
            candidates.append((done | bits[operation.id], new_state))
        stack.extend(reversed(candidates))  # the earliest candidate is tried first, as the recursive search did
    return False


def describe(history: list[Operation], key: str) -> str:
    """One key's operations in invocation order, a line each, for a failure's message."""
    lines = []
    for o in sorted((o for o in history if o.key == key), key=lambda o: o.invoked):
        responded = "pending" if o.responded == INFINITY else f"{o.responded:9.4f}"
        lines.append(f"{o.invoked:9.4f} {responded:>9} {o.kind:6} {o.argument!r} -> {o.result!r}")
    return "\n".join(lines)
