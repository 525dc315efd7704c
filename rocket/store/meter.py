"""The store's numbers for the node's Prometheus endpoint: per topic and storage group, the messages and bytes
produced and read, the backlog, and each consumer group's lag, kept up to date from the queues that changed since
the last look (Store.changed), so that a scrape costs what changed, not every queue the node holds."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(slots=True)
class QueueSeen:
    """What one queue added to its topic's sums at the last look."""

    group: int
    produced_messages: int
    produced_bytes: int
    read_messages: int
    read_bytes: int
    backlog: int
    lags: tuple[tuple[str, int], ...]  # (consumer group, lag)


class QueueMeter:
    """Sums per (topic, storage group), and lags per (consumer group, topic, storage group), over a store's
    queues. update() folds in what changed; the node's collector then keeps the groups it leads. Only the first look
    reads every queue, and the committed offsets once from the index.

    A queue's produced totals are since it began (its next offset and bytes), so they agree on every replica; its
    read totals are what this node served since it started. Its backlog is its end offset less the offset its
    slowest consumer group committed, and a consumer group's lag on it its end offset less that group's offset: both
    only on queues the group committed on (a queue nobody consumes has no backlog here)."""

    def __init__(self, store):
        self.store = store
        self.queues: dict[tuple[str, int], QueueSeen] = {}
        # (topic, group) -> [produced messages, produced bytes, read messages, read bytes, backlog, queues]
        self.topics: dict[tuple[str, int], list[int]] = {}
        self.lags: dict[tuple[str, str, int], list[int]] = {}  # (consumer group, topic, group) -> [lag, queues]
        self._committed: dict[tuple[str, int], dict[str, int]] = {}  # queue -> consumer group -> offset
        self._started = False

    def update(self) -> None:
        store = self.store
        if not self._started:
            self._started = True
            store.changed = set()
            for consumer_group, topic, queue, offset in store.index.all_offsets():
                self._committed.setdefault((topic, queue), {})[consumer_group] = offset
            changed = set(store.machine.queues) | set(self._committed)
        else:
            changed, store.changed = store.changed, set()
        queues = store.machine.queues
        for key in changed:
            seen = self.queues.pop(key, None)
            if seen is not None:
                self._add(key[0], seen, -1)
            stats = queues.get(key)
            if stats is None:
                continue
            committed = self._committed.get(key)
            if stats.committed:  # what was committed since this node started: newer than the index's at the start
                committed = self._committed[key] = {**(committed or {}), **stats.committed}
            end = stats.next_offset
            lags = tuple((consumer_group, max(0, end - offset)) for consumer_group, offset in committed.items()
                         ) if committed else ()
            backlog = max((lag for _, lag in lags), default=0)
            seen = self.queues[key] = QueueSeen(stats.group, end, stats.bytes, stats.out_messages, stats.out_bytes,
                                                backlog, lags)
            self._add(key[0], seen, 1)

    def _add(self, topic: str, seen: QueueSeen, sign: int) -> None:
        """Add a queue's numbers to its sums (sign 1) or take them away (-1); sums of no queue are dropped."""
        key = (topic, seen.group)
        sums = self.topics.setdefault(key, [0, 0, 0, 0, 0, 0])
        sums[0] += sign * seen.produced_messages
        sums[1] += sign * seen.produced_bytes
        sums[2] += sign * seen.read_messages
        sums[3] += sign * seen.read_bytes
        sums[4] += sign * seen.backlog
        sums[5] += sign
        if not sums[5]:
            del self.topics[key]
        for consumer_group, lag in seen.lags:
            key = (consumer_group, topic, seen.group)
            found = self.lags.setdefault(key, [0, 0])
            found[0] += sign * lag
            found[1] += sign
            if not found[1]:
                del self.lags[key]
