"""Reclaiming the WAL: the store knows which batches still lie in a WAL segment, forgets settled timer and half
batches, and points batches at copies written further on, so that old segments can go. A part of Store of its own,
over the queue index (Store.reclaim).
"""

from __future__ import annotations

from collections.abc import Callable

from rocket import limits
from rocket.model import timer_topic
from rocket.store.queue_index import QueueIndex
from rocket.store.values import HALF_PREFIX, IndexEntry

TIMER_PREFIX = timer_topic("")


def _chunks(items: list, size: int) -> list[list]:
    return [items[start:start + size] for start in range(0, len(items), size)]


class Reclaim:
    def __init__(self, index: QueueIndex, wrote: Callable[[], None]):
        self.index = index
        self._wrote = wrote  # says the index was written: the store's background sync has work

    def wal_floor(self) -> int | None:
        """The lowest WAL position an indexed batch lies at: the WAL segments wholly below it hold nothing
        this store reads (once the index is synced)."""
        return self.index.first_referenced()

    def wal_live(self, start: int, stop: int) -> tuple[list[tuple[str, int, IndexEntry]], list[tuple[str, int, int]]]:
        """The batches in WAL [start, stop), in WAL order: those still read, and timer and half batches whose
        messages are all settled (delivered, cancelled, committed or rolled back), which nothing reads again
        (see forget). Only reads the index: it may run in a worker thread."""
        live, settled = [], []
        for topic, queue, entry in self.index.referenced(start, stop):
            if topic.startswith((TIMER_PREFIX, HALF_PREFIX)) and not self.index.pending_timer_in(
                    topic, queue, entry.base_offset, entry.count):
                settled.append((topic, queue, entry.base_offset))
            else:
                live.append((topic, queue, entry))
        return live, settled

    def forget(self, settled: list[tuple[str, int, int]]) -> None:
        """Drop the index entries of settled timer and half batches (topic, queue, base offset): a settled
        batch never has a pending timer again."""
        for chunk in _chunks(settled, limits.index_replay_records_per_write_max):
            self.index.forget(chunk)
            self._wrote()

    def move_batches(self, moves: list[tuple[str, int, IndexEntry, int]]) -> int:
        """Point batches (topic, queue, entry, new position) at copies of them written further on in the
        WAL (durably), so the segment they lay in can go; a batch dropped or moved meanwhile is left
        alone. Returns the bytes of the batches moved."""
        moved = 0
        for chunk in _chunks(moves, limits.index_replay_records_per_write_max):
            wire = [(topic, queue, entry.base_offset, entry.position, new) for topic, queue, entry, new in chunk]
            moved += sum(entry.batch_bytes for (_, _, entry, _), done in zip(chunk, self.index.move(wire)) if done)
            self._wrote()
        return moved
