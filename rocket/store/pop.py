"""Pop (simple) consumption state of a consumer group on one queue, the state machine's part of it (PopQueue), and
the conditional commands that change it (decide), so a pop or ack computed on stale state (a race, a repeat, a new
leader) changes nothing. Pure: no I/O, no clock."""

from __future__ import annotations

import dataclasses

from rocket import limits

PopKey = tuple[str, str, int]  # consumer group, topic, queue


@dataclasses.dataclass(slots=True)
class PopQueue:
    """A cursor (messages before it were handed out or skipped) and the messages in flight, each with the time it
    becomes visible again and its delivery attempt."""

    cursor: int = 0
    in_flight: dict[int, tuple[int, int]] = dataclasses.field(default_factory=dict)  # offset -> (visible at ms, attempt)

    def done_before(self) -> int:
        """Every message before this offset was acknowledged (or skipped by the filter)."""
        return min(self.in_flight, default=self.cursor)


@dataclasses.dataclass(slots=True)
class PopChange:
    """What one command changed, as the index stores it."""

    key: PopKey
    cursor: int | None = None
    set: dict[int, tuple[int, int]] = dataclasses.field(default_factory=dict)
    dropped: list[int] = dataclasses.field(default_factory=list)
    reset: bool = False  # in flight is only what set says (a snapshot installed)

    def to_wire(self) -> list[object]:
        return [*self.key, self.cursor, [[offset, *state] for offset, state in self.set.items()], self.dropped,
                self.reset]

    @classmethod
    def from_wire(cls, wire: list) -> "PopChange":
        consumer_group, topic, queue, cursor, changed, dropped, reset = wire
        return cls((consumer_group, topic, queue), cursor,
                   {offset: (visible_ms, attempt) for offset, visible_ms, attempt in changed}, dropped, reset)


def apply_change(pops: dict[PopKey, PopQueue], change: PopChange) -> None:
    state = pops.setdefault(change.key, PopQueue())
    if change.reset:
        state.in_flight.clear()
    if change.cursor is not None:
        state.cursor = change.cursor
    state.in_flight.update(change.set)
    for offset in change.dropped:
        state.in_flight.pop(offset, None)


def _matches(state: PopQueue, offset: int, attempt: int, visible_ms: int | None = None) -> bool:
    found = state.in_flight.get(offset)
    return found is not None and found[1] == attempt and (visible_ms is None or found[0] == visible_ms)


def decide(pops: dict[PopKey, PopQueue], command: dict) -> tuple[object, PopChange | None]:
    """A command's result and its change (None: it changes nothing). Commands name the state they were
    computed from; if it moved on meanwhile they apply nothing:
    - pop: {cursor, next, new: offsets, again: [[offset, attempt, visible ms]], visible_at_ms}: hands out
      new messages from cursor (those between cursor and next not in new were skipped by the filter)
      and again the expired ones; result [[offset, attempt], ...] or False (never None: the Raft host
      answers None with the entry's index);
    - ack {receipts: [[offset, attempt]]}, change {receipts, visible_at_ms}: result per receipt, whether
      it was current (a stale one changes nothing);
    - dead {offset, attempt, visible_ms}: drops a message that used up its attempts (the store appends
      it to the dead-letter queue); result True or False;
    - reset {cursor}: starts over at cursor with nothing in flight."""
    key = (command["consumer_group"], command["topic"], command["queue"])
    state = pops.get(key, PopQueue())
    operation = command["op"]
    if operation == "pop":
        if state.cursor != command["cursor"] or not all(_matches(state, *again) for again in command["again"]):
            return False, None
        if len(state.in_flight) + len(command["new"]) > limits.pop_in_flight_per_queue_max:
            return False, None
        change = PopChange(key, command["next"])
        visible_at_ms = command["visible_at_ms"]
        change.set.update((offset, (visible_at_ms, 1)) for offset in command["new"])
        change.set.update((offset, (visible_at_ms, attempt + 1)) for offset, attempt, _ in command["again"])
        return [[offset, attempt] for offset, (_, attempt) in change.set.items()], change
    if operation in ("ack", "change"):
        current = [_matches(state, offset, attempt) for offset, attempt in command["receipts"]]
        if operation == "ack":
            change = PopChange(key, dropped=[offset for (offset, _), ok in zip(command["receipts"], current) if ok])
        else:
            change = PopChange(key, set={offset: (command["visible_at_ms"], attempt)
                                         for (offset, attempt), ok in zip(command["receipts"], current) if ok})
        return current, change if any(current) else None
    if operation == "reset":
        return True, PopChange(key, command["cursor"], reset=True)
    if operation == "dead":
        if not _matches(state, command["offset"], command["attempt"], command["visible_ms"]):
            return False, None
        return True, PopChange(key, dropped=[command["offset"]])
    raise ValueError(f"unknown pop operation {operation!r}")
