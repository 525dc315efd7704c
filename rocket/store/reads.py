"""The store's reads (Store.reads): batches of a queue within a byte budget (from the page cache at once, else in a
worker thread), long-poll waits, queue positions and stats, pop states, and the tier manifest's answers.
"""

from __future__ import annotations

from collections.abc import Container
from typing import TYPE_CHECKING, cast

import trio

from rocket import limits
from rocket.errors import Code, RocketError
from rocket.model import ALL_TAGS, ReadBudget, dead_letter_parts
from rocket.serde import batch as batch_codec
from rocket.serde.piece import Piece
from rocket.store import pop
from rocket.store.manifest import TierQueue
from rocket.store.pop import PopQueue
from rocket.store.values import IndexEntry, QueueStats
from rocket.world import World

if TYPE_CHECKING:
    from rocket.disk.commitlog import CommitLog
    from rocket.store.machine import StorageMachine
    from rocket.store.queue_index import QueueIndex


class Reads:
    """Reads over the state machine's state, the queue index and the WAL, which the store writes; the store wakes
    the long polls waiting on a queue it applied to (wake)."""

    def __init__(self, machine: StorageMachine, index: QueueIndex, data: CommitLog, world: World):
        self.machine = machine
        self.world = world
        self.index = index
        self.data = data  # the WAL: where batches lie
        self._watchers: dict[tuple[str, int], set[trio.Event]] = {}  # queue -> the long polls waiting on it

    def wake(self, keys: set[tuple[str, int]]) -> None:
        """Wake the long polls waiting on these queues (appended to, or their positions moved)."""
        for key in keys:
            for event in self._watchers.get(key, ()):
                event.set()

    def applied(self, group: int) -> int:
        return self.machine.applied.get(group, 0)

    def fetch_offsets(self, group: str, topic: str) -> dict[int, int]:
        return self.index.offsets(group, topic)

    def read(self, topic: str, queue: int, offset: int, max_bytes: int, at_least_one: bool = True) -> list[tuple[int, bytes]]:
        """Stored batches from the one holding offset, up to max_bytes (and at least one if asked)."""
        return self.read_from(topic, queue, offset, max_bytes, at_least_one)[0]

    def read_from(self, topic: str, queue: int, offset: int, max_bytes: int, at_least_one: bool = True,
                  tag_mask: int = ALL_TAGS) -> tuple[list[tuple[int, bytes]], int]:
        """As read, skipping batches whose tag summary shares no bit with tag_mask unread; with the offset
        the next read starts at."""
        entries, next_offset = self.locate(topic, queue, offset, max_bytes, at_least_one, tag_mask)
        return self.read_entries(topic, queue, entries), next_offset

    async def fetch(self, topic: str, queue: int, offset: int, max_bytes: int, at_least_one: bool = True,
                    tag_mask: int = ALL_TAGS) -> tuple[list[tuple[int, bytes]], int]:
        """read_from, reading batches that are not in the page cache in a worker thread, so that the event loop
        does not wait for the disk."""
        entries, next_offset = self.locate(topic, queue, offset, max_bytes, at_least_one, tag_mask)
        if self._cached(entries):
            return self.read_entries(topic, queue, entries), next_offset
        ahead, _ = self.locate(topic, queue, next_offset, max_bytes, False, tag_mask)  # the next read's
        try:
            found = await self.world.run_sync(self._read_entries_ahead, topic, queue, entries, ahead)
        except RocketError:
            if min(entry.position for entry in entries) >= self.data.start_position:
                raise
            # WAL reclamation deleted the segment meanwhile (its batches live on further on): read again.
            return self.read_from(topic, queue, offset, max_bytes, at_least_one, tag_mask)
        return found, next_offset

    def locate(self, topic: str, queue: int, offset: int, max_bytes: int, at_least_one: bool = True,
               tag_mask: int = ALL_TAGS) -> tuple[list[IndexEntry], int]:
        """The index entries of the batches read_from returns, and the offset the next read starts at: all but
        the reading of the batches, which may then run in a worker thread (read_entries)."""
        stats = self.machine.queues.get((topic, queue))
        next_offset = stats.next_offset if stats else 0
        if offset > next_offset:
            raise RocketError(Code.OFFSET_OUT_OF_RANGE, f"offset {offset} is past the end ({next_offset}) of {topic}/{queue}")
        if offset == next_offset:
            return [], offset
        # Offsets are at least 0 (Gate.positions, roles/storage/gate.py), so a queue without stats has returned above.
        available_from = cast(QueueStats, stats).available_from
        if offset < available_from:
            raise RocketError(Code.UNAVAILABLE, f"this replica lacks {topic}/{queue} before offset "
                              f"{available_from} (it installed a snapshot); another replica has them")
        entries, scanned_to = self.index.locate(topic, queue, offset, max_bytes, at_least_one, tag_mask)
        return entries, max(offset, scanned_to) if scanned_to is not None else offset

    def read_entries(self, topic: str, queue: int, entries: list[IndexEntry],
                     detached: bool = False) -> list[tuple[int, bytes]]:
        """(base offset, batch) of each entry; detached, in any thread (see CommitLog.read_slice)."""
        return [(entry.base_offset, self.read_entry(topic, queue, entry, detached)) for entry in entries]

    async def fetch_entries(self, topic: str, queue: int, entries: list[IndexEntry]) -> list[tuple[int, bytes]]:
        """read_entries, in a worker thread unless the page cache holds the batches."""
        if self._cached(entries):
            return self.read_entries(topic, queue, entries)
        return await self.world.run_sync(self.read_entries, topic, queue, entries, True)

    def _read_entries_ahead(self, topic: str, queue: int, entries: list[IndexEntry],
                            ahead: list[IndexEntry]) -> list[tuple[int, bytes]]:
        """read_entries, detached; then have the kernel start reading the entries ahead, so that the next read
        of a reader catching up finds them in the page cache (benchmarks/RESULTS.md, "Fresh pages")."""
        found = self.read_entries(topic, queue, entries, detached=True)
        self.data.read_ahead([(entry.position, entry.batch_bytes) for entry in ahead if not self._cached([entry])])
        return found

    def _cached(self, entries: list[IndexEntry]) -> bool:
        """Whether reading these batches finds them in the page cache (see CommitLog.cached_from)."""
        cached_from = self.data.cached_from
        return all(entry.position >= cached_from for entry in entries)

    def read_entry(self, topic: str, queue: int, entry: IndexEntry, detached: bool = False) -> bytes:
        """An indexed batch from the WAL, checked against its own CRC and the index."""
        try:
            batch = self.data.read_slice(entry.position, entry.batch_bytes, detached)
            count = batch_codec.check_header(batch).count  # the batch's own CRC covers it where it lies
        except RocketError as error:  # damaged, or cut from the WAL although it was durable: data lost
            raise RocketError(Code.CORRUPT_DATA, f"{topic}/{queue}@{entry.base_offset} at WAL position "
                              f"{entry.position}: {error.message}") from None
        if count != entry.count:
            raise RocketError(Code.CORRUPT_DATA, f"{topic}/{queue}@{entry.base_offset}: WAL position "
                              f"{entry.position} holds a batch of {count} messages, the index says {entry.count}")
        return batch

    async def find_keyed(self, topic: str, queue: int, term: int, start_ms: int, end_ms: int, after: int,
                         max_bytes: int) -> tuple[list[tuple[int, bytes]], int, bool]:
        """The batches stored from start_ms (or from offset after, where an earlier answer stopped) to end_ms (0:
        until now) that may hold a message with the term (QueueIndex.find_keyed): at most limits.find_batches_max
        and max_bytes of them (at least one), read from the WAL, in a worker thread unless the page cache holds
        them. With the offset to go on from, and whether the range was searched to its end."""
        stats = self.machine.queues.get((topic, queue))
        if stats is None:
            return [], 0, True
        # What this replica lacks (it installed a snapshot, and has not backfilled yet) is not searched, as what only
        # the tier holds is not: the index keeps what is local.
        start = max(after if after >= 0 else self.offset_for_time(topic, queue, start_ms), stats.available_from)
        stop = self.offset_for_time(topic, queue, end_ms + 1) if end_ms > 0 else stats.next_offset
        entries, next_offset, _ = self.index.find_keyed(topic, queue, term, start, stop, limits.find_batches_max)
        budget = ReadBudget(max_bytes)
        for kept, entry in enumerate(entries):
            if not budget.take(entry.batch_bytes):
                entries, next_offset = entries[:kept], entry.base_offset
                break
        return await self.fetch_entries(topic, queue, entries), next_offset, next_offset >= stop

    async def wait_for_data(self, wants: dict[tuple[str, int], int], timeout_s: float) -> None:
        """Return when any queue has data at or past the wanted offset, or after the timeout."""
        for key, offset in wants.items():
            stats = self.machine.queues.get(key)
            if stats is not None and stats.next_offset > offset:
                return
        event = trio.Event()
        for key in wants:
            self._watchers.setdefault(key, set()).add(event)
        try:
            with trio.move_on_after(timeout_s):
                await event.wait()
        finally:
            for key in wants:
                watchers = self._watchers.get(key)
                if watchers is not None:
                    watchers.discard(event)
                    if not watchers:
                        del self._watchers[key]

    def lagging(self, topic: str, queues: list[int]) -> list[str]:
        """The consumer groups that committed (or pop) behind the end of one of the topic's queues: a scan of every
        offset committed, for an admin's question (is a topic still consumed?), not for the data plane."""
        ends = {queue: stats.next_offset for queue in queues if (stats := self.machine.queues.get((topic, queue)))}
        behind = {group for group, name, queue, offset in self.index.all_offsets()
                  if name == topic and queue in ends and offset < ends[queue]}
        behind.update(group for (group, name, queue), state in self.machine.pops.items()
                      if name == topic and queue in ends and (state.cursor < ends[queue] or state.in_flight))
        return sorted(behind)

    def consumed(self, topic: str, queues: list[int]) -> tuple[list[dict], list[str], list[dict], list[dict]]:
        """What clients left on the topic's queues here: every consumer group's committed offset (and, for pop
        consumption, where its done messages end), the dead-letter topics beside them, the answers remembered of
        their producers, and the orderly consumers' locks. A scan of every offset committed, for a topic moving to
        another storage class, not for the data plane."""
        wanted = set(queues)
        committed = [{"consumer_group": group, "queue": queue, "offset": offset, "pop": False}
                     for group, name, queue, offset in self.index.all_offsets() if name == topic and queue in wanted]
        committed += [{"consumer_group": group, "queue": queue, "offset": state.done_before(), "pop": True}
                      for (group, name, queue), state in self.machine.pops.items() if name == topic and queue in wanted]
        dead_letters = sorted({name for name, queue in self.machine.queues
                               if queue in wanted and (dead_letter_parts(name) or ("", ""))[1] == topic})
        producers = [{"queue": queue, "producer": producer, "sequence": sequence, "base_offset": base, "count": count}
                     for states in self.machine.producers.groups.values()
                     for (producer, name, queue), state in states.items() if name == topic and queue in wanted
                     for sequence, (base, count) in state.answers.items()]
        locks = [{"consumer_group": group, "queue": queue, "client": client}
                 for (_, group, name, queue), (client, _) in self.machine.locks.items()
                 if name == topic and queue in wanted]
        return committed, dead_letters, producers, locks

    def queue_stats(self, topic: str, queue: int) -> dict:
        stats = self.machine.queues.get((topic, queue))
        if stats is None:
            return {"min_offset": 0, "next_offset": 0, "bytes": 0}
        first = self.index.first_offset(topic, queue)
        state = self.machine.tier.get((topic, queue))
        if state is not None and state.pieces:
            first = state.pieces[0].from_offset
        elif state is not None:
            first = max(first if first is not None else state.local_from, state.local_from)
        return {"min_offset": stats.available_from if first is None else first, "next_offset": stats.next_offset,
                "bytes": stats.bytes}

    def pop_state(self, consumer_group: str, topic: str, queue: int) -> PopQueue:
        return self.machine.pops.get((consumer_group, topic, queue), PopQueue())

    def pop_states(self, topic: str) -> dict[pop.PopKey, PopQueue]:
        return {key: state for key, state in self.machine.pops.items() if key[1] == topic}

    def offset_for_time(self, topic: str, queue: int, timestamp_ms: int) -> int:
        state = self.machine.tier.get((topic, queue))
        if state is not None and state.pieces and timestamp_ms <= state.pieces[-1].last_append_ms:
            for piece in state.pieces:  # tiered data is found to the piece; local data to the batch
                if piece.last_append_ms >= timestamp_ms:
                    if piece.from_offset < state.local_from:
                        return piece.from_offset
                    break
        found = self.index.offset_for_time(topic, queue, timestamp_ms)
        if found is not None:
            return found
        stats = self.machine.queues.get((topic, queue))
        return stats.next_offset if stats else 0

    # ---- the tier ------------------------------------------------------------------------------------

    def tier_state(self, topic: str, queue: int) -> TierQueue | None:
        return self.machine.tier.get((topic, queue))

    def local_start(self, topic: str, queue: int) -> int:
        """Offsets before this are no longer in the local index: they are read from the tier."""
        state = self.machine.tier.get((topic, queue))
        return state.local_from if state is not None else 0

    def tier_piece(self, topic: str, queue: int, offset: int, force: bool = False) -> Piece | None:
        """The piece a read at offset goes to: below local data always, within the tier too if forced."""
        state = self.machine.tier.get((topic, queue))
        if state is None or not (offset < state.local_from or force):
            return None
        return state.piece_at(offset)

    def queues_of(self, groups: Container[int], keys) -> list[tuple[int, str, int]]:
        """(group, topic, queue) of those of keys (topic, queue) that belong to these groups."""
        found = []
        for key in keys:
            stats = self.machine.queues.get(key)
            if stats is not None and stats.group in groups:
                found.append((stats.group, *key))
        return found

    def local_bytes(self, topic: str, queue: int, start: int, stop: int) -> int:
        """Bytes of the locally indexed batches that start in [start, stop)."""
        return self.index.bytes_between(topic, queue, start, stop)

    def queue_bytes(self, topic: str, queue: int) -> int:
        """Bytes ever stored in the queue (offloaded ones included), from memory."""
        stats = self.machine.queues.get((topic, queue))
        return stats.bytes if stats is not None else 0

    def offload_run(self, topic: str, queue: int, piece_bytes: int, piece_age_ms: int, now_ms: int,
                    start: int | None = None) -> list[IndexEntry]:
        """The index entries of the next run of batches to offload (read_run reads them): from start (by default
        where the manifest ends), up to piece_bytes (at least one batch); only once the run is full (more data
        follows it) or its first batch is older than piece_age_ms. Empty if nothing is due."""
        stats = self.machine.queues.get((topic, queue))
        state = self.machine.tier.get((topic, queue))
        if stats is None:
            return []
        if start is None:
            start = state.tiered_to if state is not None else self.index.first_offset(topic, queue)
        if start is None or start >= stats.next_offset or start < stats.available_from:
            return []
        entries, scanned_to = self.index.locate(topic, queue, start, piece_bytes, True)
        if not entries or entries[0].base_offset != start:
            return []
        full = scanned_to is not None and scanned_to < stats.next_offset
        if not full and now_ms - entries[0].append_ms < piece_age_ms:
            return []
        return entries

    def read_run(self, topic: str, queue: int, entries: list[IndexEntry]) -> list[tuple[int, bytes, int, int]]:
        """The batches of offload_run's entries as (base offset, batch, append ms, tag summary), each checked against
        its CRC and the index; detached, for a worker thread."""
        return [(entry.base_offset, self.read_entry(topic, queue, entry, True), entry.append_ms, entry.tag_summary)
                for entry in entries]
