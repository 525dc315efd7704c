"""Idempotent produce: what a storage group remembers of each producer's latest batches, so that a batch sent again
(a retry after a lost answer, by a client's failover or a broker's storage retry) gets its first answer, offsets
included, and is not stored twice. Pure."""

from __future__ import annotations

import dataclasses

from rocket import limits
from rocket.errors import Code, RocketError

Key = tuple[int, str, int]  # producer id, topic, queue
Row = tuple[int, int, str, int, int, int, int, int, int]  # group, producer, topic, queue, sequence, base, count,
# the entry index and append time of the state's last use: an answer remembered
Dropped = tuple[int, int, str, int, int]  # group, producer, topic, queue, sequence: an answer forgotten
Change = Row | Dropped  # told apart by their length; kept in the order they were made

_IDLE_MS = limits.producer_state_idle_s_max * 1000


@dataclasses.dataclass(slots=True)
class ProducerState:
    answers: dict[int, tuple[int, int]]  # sequence -> (base offset, count), in sequence order
    last_index: int  # the entry that used it last: the order in which states are forgotten
    last_ms: int


class Producers:
    """A producer (rocket's client; a broker, for the clients of its gateways) has a random 63-bit id and numbers its
    batches with one increasing sequence. A produced batch's entry starts with its producer's id and sequence
    (commands.SEQUENCED_COMMAND), written only once every other replica's Raft link said a schema version that
    applies it (Engine.replicas_speak; in a rolling upgrade the older replicas could not). Per (producer, topic,
    queue) the group keeps the answers of the limits.producer_sequences_kept_max largest sequences applied. As in
    Kafka (KIP-98), but sequences may have gaps (a batch refused before storage used its number) and batches in
    flight may apply out of order, so a sequence is judged by the window alone (check):
    - in the window: a repeat; the first answer is given again;
    - not in it, and the window is not full or the sequence is above its smallest: new (every sequence applied above
      the smallest is in the window, because only the smallest ever leaves it);
    - below a full window's smallest: UNKNOWN_SEQUENCE, as its outcome cannot be told.

    Every replica applies the same entries, so each keeps the same state; what it forgets is decided by the entries
    alone (the least recently used past limits.producer_states_per_group_max, the ones idle past
    limits.producer_state_idle_s_max by the entries' append times). The state is in each group's snapshot and, on the
    node, in the index (rows per remembered sequence, from each apply's Effects.producer_changes), from which it is
    reloaded at start."""

    def __init__(self) -> None:
        # Raft group -> (producer, topic, queue) -> state, least recently used first.
        self.groups: dict[int, dict[Key, ProducerState]] = {}

    def check(self, group: int, key: Key, sequence: int) -> tuple[int, int] | RocketError | None:
        """A repeat's first answer, UNKNOWN_SEQUENCE for a sequence older than the window, or None: a new batch."""
        state = self.groups.get(group, {}).get(key)
        if state is None:
            return None
        answer = state.answers.get(sequence)
        if answer is not None:
            return answer
        if len(state.answers) >= limits.producer_sequences_kept_max and sequence < next(iter(state.answers)):
            return RocketError(Code.UNKNOWN_SEQUENCE, f"batch {sequence} of producer {key[0]:x} on {key[1]}/{key[2]} "
                               f"is older than the {len(state.answers)} this queue remembers: whether it was stored "
                               "is not known")
        return None

    def record(self, group: int, key: Key, sequence: int, answer: tuple[int, int], index: int, now_ms: int,
               changes: list[Change]) -> None:
        """A new batch applied at entry index: remember its answer, forgetting what falls out (both to changes)."""
        states = self.groups.get(group)
        if states is None:
            states = self.groups[group] = {}
        state = states.pop(key, None)  # put back last: the most recently used
        if state is None:
            state = ProducerState({}, index, now_ms)
        states[key] = state
        answers = state.answers
        in_order = not answers or sequence > next(reversed(answers))
        answers[sequence] = answer
        if not in_order:  # batches in flight applied out of order: rare, and the answers stay sorted
            answers = state.answers = dict(sorted(answers.items()))
        state.last_index = index
        if now_ms > state.last_ms:
            state.last_ms = now_ms
        changes.append((group, key[0], key[1], key[2], sequence, answer[0], answer[1], index, state.last_ms))
        if len(answers) > limits.producer_sequences_kept_max:
            oldest = next(iter(answers))
            del answers[oldest]
            changes.append((group, key[0], key[1], key[2], oldest))
        while states:
            first = next(iter(states))
            if len(states) <= limits.producer_states_per_group_max and states[first].last_ms >= now_ms - _IDLE_MS:
                break
            changes.extend((group, *first, gone) for gone in states.pop(first).answers)

    def forget(self, group: int, topic: str, queues: set[int], changes: list[Change]) -> None:
        """A deleted topic's queues: their producers' states go (to changes), so a topic made again starts afresh."""
        states = self.groups.get(group, {})
        for key in [key for key in states if key[1] == topic and key[2] in queues]:
            changes.extend((group, *key, gone) for gone in states.pop(key).answers)

    # ---- snapshots and the index -----------------------------------------------------------------------

    def snapshot(self, group: int) -> list:
        """The group's states, least recently used first."""
        return [[*key, state.last_index, state.last_ms, [[sequence, *answer] for sequence, answer in
                                                         state.answers.items()]]
                for key, state in self.groups.get(group, {}).items()]

    def restore(self, group: int, wire: list) -> list[Row]:
        """Make the group's states a snapshot's; the rows that hold them."""
        states = self.groups[group] = {}
        rows = []
        for producer, topic, queue, last_index, last_ms, answers in wire:
            states[(producer, topic, queue)] = ProducerState({sequence: (base, count) for sequence, base, count
                                                               in sorted(answers)}, last_index, last_ms)
            rows.extend((group, producer, topic, queue, sequence, base, count, last_index, last_ms)
                        for sequence, base, count in answers)
        return rows

    @classmethod
    def load(cls, rows) -> "Producers":
        """The states the index's rows hold (a state's last use is its latest row's)."""
        producers = cls()
        for group, producer, topic, queue, sequence, base, count, index, at_ms in sorted(rows, key=lambda row: row[7]):
            states = producers.groups.setdefault(group, {})
            key = (producer, topic, queue)
            state = states.pop(key, None) or ProducerState({}, index, at_ms)
            states[key] = state
            state.answers[sequence] = (base, count)
            state.last_index, state.last_ms = index, max(state.last_ms, at_ms)
        for states in producers.groups.values():
            for state in states.values():
                state.answers = dict(sorted(state.answers.items()))
        return producers
