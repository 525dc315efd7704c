"""Parked calls: how the data plane waits without a task (../shared/DESIGN.md, "the data plane"): a call waits as a
`Slot`, not a coroutine. The invariant, owned here: **every slot completes exactly once** (answered, failed, or timed
out); a `Deadlines` sweep makes sure no slot waits past its deadline.
"""

from __future__ import annotations

import collections
import logging
import math
from collections.abc import Callable
from typing import Any

import trio

from rocket.errors import Code, RocketError

log = logging.getLogger("rocket.parked")

# A slot's outcome: the value it waited for, or the RocketError it met.
Finish = Callable[[object], None]


class Unparked(Exception):
    """Raised by a data-plane handler, before it did anything, when the call cannot be served without waiting (its
    route or its group's leader is elsewhere or unknown): the call is served as a task instead, with the request
    already decoded (request, set by Dispatcher.park)."""

    request: dict[str, Any] | None = None


class Slot:
    """A call on the data plane (a produce, a storage append) is served in its connection's read loop. What it waits
    for (its entry applied by a Raft round) is a parked slot: the round that applies the entry completes the slot, and
    the slot's finish writes the answer into its connection's buffer, sent with the round's other answers.

    A slot's first `complete` runs its finish; a later one (an entry applied after its deadline was swept, a leader
    change reported after the result) is dropped and counted in `late`. A slot with a deadline is kept in a
    `Deadlines` sweep, which its owner runs once per tick. A finish that raises is logged, never passed to the round
    loop that completed it: one bad answer must not stop a node's rounds."""
    __slots__ = ("_finish", "deadline", "done")
    late = 0  # completions dropped because the slot had completed already (the tests read it)

    def __init__(self, finish: Finish, deadline: float = math.inf):
        self._finish = finish
        self.deadline = deadline
        self.done = False

    def complete(self, outcome: object) -> bool:
        """Complete the slot with outcome (a RocketError: it failed); False, doing nothing, if it completed before."""
        if self.done:
            Slot.late += 1
            return False
        self.done = True
        try:
            self._finish(outcome)
        except Exception:  # a bug in an answer: logged, and the round that completed it goes on
            log.exception("a parked call's completion failed")
        return True

    def then(self, transform: Callable[[Any], object]) -> Slot:
        """A slot that completes this one: a value goes through transform first (which may raise RocketError, or
        fail with anything else: an INTERNAL error then), a RocketError goes as it is. Same deadline."""
        def finish(outcome: object) -> None:
            if not isinstance(outcome, RocketError):
                try:
                    outcome = transform(outcome)
                except RocketError as error:
                    outcome = error
                except Exception as error:
                    log.exception("a parked call's answer failed")
                    outcome = RocketError(Code.INTERNAL, f"the answer failed: {type(error).__name__}: {error}")
            self.complete(outcome)
        return Slot(finish, self.deadline)


class Awaited(Slot):
    """A slot a task waits for: the control plane's way onto a data-plane path (RaftHost.propose, Dispatcher.local).
    Once event is set, value() is the outcome, or raises the RocketError it was."""

    __slots__ = ("_outcome", "event")

    def __init__(self) -> None:
        super().__init__(self._arrived)
        self.event = trio.Event()
        self._outcome: object = None

    def _arrived(self, outcome: object) -> None:
        self._outcome = outcome
        self.event.set()

    def value(self) -> object:
        if isinstance(self._outcome, RocketError):
            raise self._outcome
        return self._outcome


class Deadlines:
    """Slots swept in the order they were added: give every slot of one sweep the same timeout, so that arrival
    order is deadline order and a sweep looks only at the oldest slots."""

    def __init__(self) -> None:
        self._slots: collections.deque[Slot] = collections.deque()

    def __len__(self) -> int:
        return len(self._slots)

    def add(self, slot: Slot) -> None:
        self._slots.append(slot)

    def sweep(self, now: float, expired: Callable[[], RocketError]) -> int:
        """Fail every slot whose deadline passed with expired(), and forget completed ones at the front; returns
        how many timed out."""
        slots, timed_out = self._slots, 0
        while slots and (slots[0].done or slots[0].deadline <= now):
            slot = slots.popleft()
            if not slot.done:
                slot.complete(expired())
                timed_out += 1
        return timed_out
