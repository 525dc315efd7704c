"""Reclaiming the WAL from its oldest segment: what Raft and the store still need decides what may go, and live
batches of an almost empty old segment are copied forward first. A part of StorageRole.
"""

from __future__ import annotations

import logging

import trio

from rocket import limits
from rocket.clock import sleep_periodic
from rocket.replication import Engine
from rocket.store.store import Store
from rocket.store.values import IndexEntry

log = logging.getLogger("rocket.storage")


class WalReclaim:
    def __init__(self, store: Store, host: Engine):
        self.store = store
        self.host = host
        self.moved_bytes = 0  # batches copied forward so that old WAL segments could go
        self._drops_seen, self._rescan_at = -1, 0.0  # the store's drops at the last scan of the WAL's oldest

    async def reclaim_forever(self) -> None:
        while True:
            await sleep_periodic(limits.wal_reclaim_s)
            await self.reclaim()

    async def reclaim(self) -> int:
        """Delete the WAL segments that nothing needs any more: the Raft groups' state lies after the last
        checkpoint, the entries not yet applied and the batches the store indexes lie wherever they do
        (batches go once retention dropped them locally or their timers settled). When the oldest few
        segments hold at most limits.wal_live_fraction_max of live batches, those of the oldest are copied
        forward first, so that data kept for long (a long timer, a topic without a tier) does not hold
        on to everything written after it. Returns how many segments went."""
        wal = self.host.wal
        raft_floor = min(position for position in (wal.replay_start(), self.host.unapplied_position_min())
                         if position is not None)
        starts = wal.log.segment_starts()
        ends = [end for end in starts[1:] if end <= raft_floor]  # of the sealed segments Raft no longer needs
        if not ends:
            return 0
        floor = self._wal_floor(raft_floor)
        drops = self.store.index.drops
        if floor < ends[0] and (drops != self._drops_seen or trio.current_time() >= self._rescan_at):
            # The oldest segment is pinned: look at what lives in the oldest few (a scan of their batches,
            # so not again for a while unless some local data went meanwhile).
            window = [starts[0]] + ends[:limits.wal_reclaim_window_segments]
            live, settled = await self.store.world.run_sync(self.store.reclaim.wal_live, window[0], window[-1])
            self.store.reclaim.forget(settled)
            oldest = [found for found in live if found[2].position < window[1]]
            if oldest and sum(entry.batch_bytes for _, _, entry in live) <= \
                    limits.wal_live_fraction_max * (window[-1] - window[0]):
                await self._move_forward(oldest)
            floor = self._wal_floor(raft_floor)
            self._drops_seen, self._rescan_at = drops, trio.current_time() + limits.wal_rescan_s
        if floor < ends[0]:
            return 0
        await self.store.world.run_sync(self.store.sync)  # the drops and moves counted on are durable first
        # A read of the WAL in a worker thread that finds its segment gone reads again (Store.fetch). Unlinking
        # hundreds of big files takes seconds: a worker thread does it, not the node's event loop.
        removed = await self.store.world.run_sync(wal.log.delete_before, floor)
        if removed:
            log.info("WAL: deleted %d segments below position %d", removed, floor)
        return removed

    def _wal_floor(self, raft_floor: int) -> int:
        store_floor = self.store.reclaim.wal_floor()
        return raft_floor if store_floor is None else min(raft_floor, store_floor)

    async def _move_forward(self, batches: list[tuple[str, int, IndexEntry]]) -> None:
        """Copy batches to the end of the WAL (durably), a bounded chunk at a time, and point the index at
        the copies."""
        while batches:
            size = 0
            for count, (_, _, entry) in enumerate(batches):
                size += entry.batch_bytes
                if size > limits.batch_bytes_max and count:
                    break
            else:
                count = len(batches)
            chunk, batches = batches[:count], batches[count:]
            positions = await self.host.write_data([self.store.reads.read_entry(topic, queue, entry)
                                                    for topic, queue, entry in chunk])
            moved = self.store.reclaim.move_batches(
                [(topic, queue, entry, position) for (topic, queue, entry), position in zip(chunk, positions)])
            self.moved_bytes += moved
            log.info("WAL: copied %d bytes of %d batches forward from its oldest segment", moved, len(chunk))
