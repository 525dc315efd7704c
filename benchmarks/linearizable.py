"""Linearizability of key-value histories from a chaos test, checked as Porcupine does (Wing & Gong's search with
Lowe's cache): each key on its own as one register, since linearizability is local. `check(history)` -> Result; an
op whose outcome is unknown (completed None) takes effect at some time after its invocation, or never."""

from __future__ import annotations

import bisect
import itertools
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

KINDS = ("get", "put", "cas")
_GET, _PUT, _CAS, _CAS_FAILED = range(4)  # how an op moves the register (see _Register)
_CHECK_EVERY = 4096  # search steps between looks at the clock
_SHOWN = 8  # ops of the longest linearizable prefix that an explanation names


@dataclass(frozen=True, kw_only=True)
class Op:
    """One client operation on one key: times on one monotonic clock, completed None when the outcome is unknown.

    put: value written, ok True (False: refused for sure, so it never took effect). cas: expected (None: the key must
    be absent), value (the new value), ok whether it succeeded. get: result (None: the key was absent). ok None with
    completed set: the op ended by then, but whether it took effect is unknown."""

    client: int
    key: str
    kind: str
    value: bytes | None = None
    expected: bytes | None = None
    invoked: float
    completed: float | None
    ok: bool | None = None
    result: bytes | None = None

    def describe(self) -> str:
        """A short line for explanations: client, what was done and seen, and the interval."""
        if self.kind == "get":
            what = f"get -> {_show(self.result)}"
        elif self.kind == "put":
            what = f"put {_show(self.value)}"
        else:
            what = f"cas {_show(self.expected)} -> {_show(self.value)}"
        if self.kind != "get":
            what += {True: " ok", False: " failed", None: " (outcome unknown)"}[self.ok]
        end = "?" if self.completed is None else f"{self.completed:.6f}"
        return f"c{self.client} {what} [{self.invoked:.6f}, {end}]"


@dataclass
class Result:
    """ok: True linearizable, False not (bad_keys), None unknown (some key's search ran out of time, none bad)."""

    ok: bool | None
    bad_keys: list[str] = field(default_factory=list)
    timed_out_keys: list[str] = field(default_factory=list)
    details: dict[str, str] = field(default_factory=dict)


def _show(value: bytes | None) -> str:
    """A register value as text: absent, or the bytes' repr."""
    return "absent" if value is None else repr(value)


def _validate(op: Op) -> None:
    """Raises ValueError for an op the checker cannot read: unknown kind, or completed before invoked."""
    if op.kind not in KINDS:
        raise ValueError(f"op kind {op.kind!r} is none of {KINDS}: {op}")
    if op.completed is not None and op.completed < op.invoked:
        raise ValueError(f"op completed before it was invoked: {op}")
    if math.isnan(op.invoked) or (op.completed is not None and math.isnan(op.completed)):
        raise ValueError(f"op time is NaN: {op}")


def check(history: Sequence[Op], time_limit_s: float = 10.0) -> Result:
    """Whether the history is linearizable, key by key, within time_limit_s for all keys together."""
    deadline = time.monotonic() + time_limit_s
    by_key: dict[str, list[Op]] = {}
    for op in history:
        _validate(op)
        by_key.setdefault(op.key, []).append(op)
    result = Result(ok=True)
    for key in sorted(by_key):
        verdict, detail = _Register(by_key[key]).search(deadline)
        if verdict is None:
            result.timed_out_keys.append(key)
        elif not verdict:
            result.bad_keys.append(key)
            result.details[key] = detail
    result.ok = False if result.bad_keys else None if result.timed_out_keys else True
    return result


class _Register:
    """The ops on one key. Those that must be linearized (all but puts and cas of unknown outcome and no known end)
    form Porcupine's doubly linked list of call and return entries sorted by time; the others are free: each may
    take effect at any point after its invocation, or never, and the search tries them only when it is stuck."""

    def __init__(self, history: Sequence[Op]) -> None:
        """Drops what cannot matter (a get of unknown outcome, a put refused for sure) and builds the entry list."""
        self.ops = [op for op in history if not (op.kind == "get" and op.completed is None)
                    and not (op.kind == "put" and op.ok is False and op.completed is not None)]
        # Values as small ints: 0 absent, then each value an op compares the state with; the state is never compared
        # with any other value, so all of those are one, the last.
        compared: dict[bytes, int] = {}
        for op in self.ops:
            value = op.result if op.kind == "get" else op.expected if op.kind == "cas" else None
            if value is not None:
                compared.setdefault(value, len(compared) + 1)
        other = len(compared) + 1
        self.names = ["absent", *map(repr, compared), "a value no op reads"]
        self.codes: list[int] = []
        self.reads: list[int] = []  # the value a get returned, or a cas compared with; -1 for a put
        self.writes: list[int] = []  # the value a put or cas that takes effect writes; -1 for the others
        self.must_read: list[bool] = []  # a get, or a cas that succeeded: it needs the value it reads
        self.may_skip: list[bool] = []  # unknown outcome with a known end: may have had no effect by then
        self.initial_readers = [0] * (other + 1)  # by value: the ops that need it (self.readers: those not yet
        self.initial_sources = [0] * (other + 1)  # linearized, in a search), and those that may write it
        free: list[tuple[float, int]] = []  # (invoked, op) of the free ops
        events: list[tuple[float, int, int]] = []  # (time, 0 call / 1 return, op): calls first on a tie
        for i, op in enumerate(self.ops):
            known = op.completed is not None and (op.kind == "get" or op.ok is not None)
            code = {"get": _GET, "put": _PUT}.get(op.kind, _CAS_FAILED if known and not op.ok else _CAS)
            self.codes.append(code)
            read = op.result if code == _GET else op.expected
            self.reads.append(-1 if code == _PUT else 0 if read is None else compared[read])
            self.writes.append(-1 if code in (_GET, _CAS_FAILED) else 0 if op.value is None
                               else compared.get(op.value, other))
            self.must_read.append(code == _GET or (code == _CAS and known))
            self.may_skip.append(not known and op.completed is not None)
            if self.must_read[i]:
                self.initial_readers[self.reads[i]] += 1
            if self.writes[i] >= 0:
                self.initial_sources[self.writes[i]] += 1
            if op.completed is None:
                free.append((op.invoked, i))
            else:
                events += [(op.invoked, 0, i), (op.completed, 1, i)]
        self.readers, self.sources = list(self.initial_readers), list(self.initial_sources)
        events.sort()
        free.sort()
        self.free_invoked = [t for t, _ in free]
        self.free_op = [i for _, i in free]
        # Free ops alike (same kind, value and compared value) are interchangeable once invoked: the search applies
        # them in the order of their invocation only, each after the one before it.
        self.free_after: list[int] = []  # the free op alike invoked last before this one, or -1
        last: dict[tuple[int, int, int], int] = {}
        for u, i in enumerate(self.free_op):
            alike = (self.codes[i], self.writes[i], self.reads[i])
            self.free_after.append(last.get(alike, -1))
            last[alike] = u
        count = len(events)
        self.head, self.tail = count, count + 1
        self.entry_op = [i for _, _, i in events]
        self.entry_time = [t for t, _, _ in events]
        self.is_call = [kind == 0 for _, kind, _ in events]
        self.match = [-1] * count  # a call's return entry
        self.bit = [0] * count  # a call's bit in the mask of linearized ops that must be
        call_of: dict[int, int] = {}
        for entry, (_, kind, i) in enumerate(events):
            if kind == 0:
                call_of[i] = entry
                self.bit[entry] = 1 << len(call_of) - 1
            else:
                self.match[call_of[i]] = entry
        self.nxt, self.prv = [-1] * (count + 2), [-1] * (count + 2)
        order = [self.head, *range(count), self.tail]
        for before, after in itertools.pairwise(order):
            self.nxt[before], self.prv[after] = after, before

    def _lift(self, entry: int) -> None:
        """Unlinks a call entry and its return entry (their own links are kept, for _unlift)."""
        nxt, prv = self.nxt, self.prv
        for e in (entry, self.match[entry]):
            before, after = prv[e], nxt[e]
            nxt[before], prv[after] = after, before

    def _unlift(self, entry: int) -> None:
        """Links back a call entry and its return entry, in the reverse order of _lift."""
        nxt, prv = self.nxt, self.prv
        for e in (self.match[entry], entry):
            nxt[prv[e]] = e
            prv[nxt[e]] = e

    def _next_states(self, i: int, state: int) -> tuple[int, ...]:
        """The register's possible states after op i is linearized in state; none if it cannot be."""
        code = self.codes[i]
        if code == _GET:
            return (state,) if state == self.reads[i] else ()
        if code == _CAS_FAILED:
            return (state,) if state != self.reads[i] else ()
        applied = (self.writes[i],) if code == _PUT or state == self.reads[i] else ()
        return (*applied, state) if self.may_skip[i] else applied

    def _needs(self, i: int, k: int, state: int, before: int) -> bool:
        """Whether op i, linearized with outcome k in state (a free op's value, the state before it `before`), could
        not have come before that free op with the same outcome: a free op is only ever linearized just ahead of one
        that needs it. Any linearization can be made so: a free op the next op overwrites, or the last, is left out;
        one the next op does not need moves after it."""
        code = self.codes[i]
        if code == _GET:
            return True  # it reads the free op's value, not `before`
        if code == _CAS_FAILED:
            return self.reads[i] == before
        return code == _CAS and k == 0 and state == self.reads[i]  # a cas that took effect from that value

    def _take(self, i: int, sign: int) -> None:
        """Counts op i as linearized (sign -1), or no longer (+1), in readers and sources."""
        if self.must_read[i]:
            self.readers[self.reads[i]] += sign
        if self.writes[i] >= 0:
            self.sources[self.writes[i]] += sign

    def _stranded(self, i: int, old: int, new: int) -> bool:
        """Whether op i, just taken from state old to new, left a value some op must still read that no op can
        write any more: old, or the value i did not write."""
        readers, sources = self.readers, self.sources
        for value in (old, self.writes[i]):
            if value >= 0 and value != new and readers[value] and not sources[value]:
                return True
        return False

    def search(self, deadline: float) -> tuple[bool | None, str]:
        """Depth-first search for a linearization: (True, ""), (False, why), or (None, "") past the deadline.

        A configuration is (ops of the list linearized, free ops applied, state, and after a free op the state before
        it). Lowe's cache keeps those seen, and one is pruned when one seen had all the same but a subset of its free
        ops applied: any way on from it is a way on from that one, leaving the extra free ops out."""
        nxt, is_call, entry_op, bit = self.nxt, self.is_call, self.entry_op, self.bit
        free_op, free_invoked, free_after = self.free_op, self.free_invoked, self.free_after
        self.readers, self.sources = list(self.initial_readers), list(self.initial_sources)  # _take counts in these
        state = 0  # absent
        linearized = applied = 0  # bit masks: calls in the list (by self.bit), free ops (1 << index in free_op)
        needing, before = False, 0  # just after a free op: the state before it (see _needs)
        seen: dict[tuple[int, int, bool, int], list[int]] = {(0, 0, False, 0): [0]}
        # for a configuration but its free ops, the masks of free ops applied seen with it
        stack: list[tuple[int, int, int, bool, int]] = []  # (call entry, state before, outcome taken, needing and
        # before as they were); for a free op, (-1 - its index, ..., the return entry it went ahead of, ...)
        best: list[int] = []  # ops of the longest linearizable prefix seen; low: the lowest depth popped since
        best_states: list[int] = []  # the state after each
        low = 0
        entry, start, steps = nxt[self.head], 0, 0
        free, eligible = -1, 0  # in the free ops' turn: the next to try, and how many were invoked by then

        def seen_before(key: tuple[int, int, bool, int], mask: int) -> bool:
            """Whether the configuration, or one it is pruned for, was seen; if not, it is now."""
            masks = seen.setdefault(key, [])
            if any(m | mask == mask for m in masks):
                return True
            masks.append(mask)
            return False

        while True:
            steps += 1
            if steps % _CHECK_EVERY == 0 and time.monotonic() > deadline:
                return None, ""
            pushed = False
            if free < 0:  # the list's turn
                if entry == self.tail:  # no return entry left: every op that must be linearized is
                    return True, ""
                if is_call[entry]:
                    i = entry_op[entry]
                    outcomes = self._next_states(i, state)
                    after = linearized | bit[entry]
                    self._take(i, -1)
                    for k in range(start, len(outcomes)):
                        if (needing and not self._needs(i, k, state, before)) or self._stranded(i, state, outcomes[k]):
                            continue
                        if not seen_before((after, outcomes[k], False, 0), applied):
                            stack.append((entry, state, k, needing, before))
                            state, linearized, needing, before = outcomes[k], after, False, 0
                            self._lift(entry)
                            pushed = True
                            break
                    else:
                        self._take(i, 1)
                        entry, start = nxt[entry], 0
                        continue
                else:  # an op that must be linearized by now is not: the free ops invoked by now may help
                    free, eligible = 0, bisect.bisect_right(free_invoked, self.entry_time[entry])
            if not pushed:  # the free ops' turn, ahead of return entry `entry`
                while free < eligible:
                    if not applied >> free & 1 and (free_after[free] < 0 or applied >> free_after[free] & 1):
                        i = free_op[free]
                        outcomes = self._next_states(i, state)
                        if outcomes and outcomes[0] != state and (not needing or self._needs(i, 0, state, before)):
                            self._take(i, -1)
                            if (not self._stranded(i, state, outcomes[0])
                                    and not seen_before((linearized, outcomes[0], True, state), applied | 1 << free)):
                                stack.append((-1 - free, state, entry, needing, before))
                                state, applied, needing, before = outcomes[0], applied | 1 << free, True, state
                                pushed = True
                                break
                            self._take(i, 1)
                    free += 1
            if pushed:
                if len(stack) > len(best):
                    best[low:] = [entry_op[e] if e >= 0 else free_op[-1 - e] for e, *_ in stack[low:]]
                    best_states[low:] = [*(s for _, s, *_ in stack[low + 1:]), state]
                    low = len(stack)
                entry, start, free = nxt[self.head], 0, -1
                continue
            if not stack:
                return False, self._explain(best, best_states)
            # Nothing more to try from here: undo the last step, and try what comes after it.
            item, state, k, needing, before = stack.pop()
            low = min(low, len(stack))
            if item >= 0:
                self._take(entry_op[item], 1)
                linearized ^= bit[item]
                self._unlift(item)
                entry, start, free = item, k + 1, -1
            else:
                self._take(free_op[-1 - item], 1)
                applied ^= 1 << -1 - item
                entry, free = k, -item  # the free op after it
                eligible = bisect.bisect_right(free_invoked, self.entry_time[entry])

    def _explain(self, best: list[int], states: list[int]) -> str:
        """Why no linearization exists: the end of the longest linearizable prefix (and the states after its ops), and
        why the first op that must have taken effect by its completion cannot come next."""
        ops, names = self.ops, list(self.names)
        state = states[-1] if states else 0
        if state == len(names) - 1:  # a value no op reads: the one the prefix wrote last
            j = len(states) - 1
            while j > 0 and states[j - 1] == state:
                j -= 1
            names[state] = repr(ops[best[j]].value)
        prefix = [ops[i].describe() for i in best[-_SHOWN:]]
        if len(best) > _SHOWN:
            prefix.insert(0, f"... {len(best) - _SHOWN} earlier ops")
        why = f"longest linearizable prefix, {len(best)} of {len(ops)} ops: [{'; '.join(prefix)}], leaving " + \
            names[state]
        left = set(range(len(ops))) - set(best)
        due = [i for i in left if ops[i].completed is not None]
        if not due:
            return why
        stuck = min(due, key=lambda i: (ops[i].completed, i))
        left.discard(stuck)
        why += f"; then {ops[stuck].describe()} cannot come next"
        outcomes = self._next_states(stuck, state)
        if not outcomes:
            return why + f" from {names[state]}"
        for value in (state, self.writes[stuck]):
            if value < 0 or value in outcomes:
                continue
            readers = [i for i in left if self.must_read[i] and self.reads[i] == value]
            if readers and not any(self.writes[i] == value for i in left):
                return why + f": it would leave no op to write {names[value]} for {ops[min(readers)].describe()}"
        return why + ", nor can any op invoked by its end"
