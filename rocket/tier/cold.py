"""Cold reads: batches of offloaded pieces, fetched from the object store by ranged GETs and kept in the node's cache
of them on disk (ColdReader, ChunkCache). Every batch is checked against its own CRC and the index: damage is
CORRUPT_DATA, never bad data."""

from __future__ import annotations

import bisect
import collections
import logging

import trio

from rocket import limits
from rocket.errors import Code, RocketError
from rocket.model import ALL_TAGS, ReadBudget
from rocket.serde import batch as batch_codec
from rocket.tier.cache import ChunkCache
from rocket.tier.objectstore import ObjectStore
from rocket.serde.piece import Piece, PieceBatch, decode_index

log = logging.getLogger("rocket.tier")


class ColdReader:
    """Batches of offloaded pieces. With a cache (ChunkCache), a read fetches at least limits.cold_read_ahead_bytes of
    the piece with one ranged GET and keeps it, so that a consumer's next reads, and reads of the same range again,
    are local; without one (a local directory tier: its files are local already) it gets exactly the batches asked
    for. The pieces' sidecar indexes are kept decoded (LRU)."""

    def __init__(self, objects: ObjectStore, cache: ChunkCache | None = None,
                 read_ahead_bytes: int = limits.cold_read_ahead_bytes):
        self.objects = objects
        self.cache = cache
        self.read_ahead_bytes = read_ahead_bytes
        self._indexes: collections.OrderedDict[str, list[PieceBatch]] = collections.OrderedDict()
        self._fetching: dict[tuple[str, int], trio.Event] = {}  # chunks on their way from the store, by key and start
        self.fetched_bytes = 0  # bytes fetched from the object store, for status and benchmarks
        self.gets = 0
        self.batches_read = 0  # batches read from offloaded pieces, for the node's metrics
        self.cache_hits = 0  # of them, those whose bytes were in the cache

    async def index(self, piece: Piece) -> list[PieceBatch]:
        entries = self._indexes.get(piece.key)
        if entries is not None:
            self._indexes.move_to_end(piece.key)
            return entries
        data = await self._get(piece.index_key, 0, None)
        entries = decode_index(data, piece)
        self._indexes[piece.key] = entries
        while len(self._indexes) > limits.cold_index_cache_entries_max:
            self._indexes.popitem(last=False)
        return entries

    async def read(self, piece: Piece, offset: int, max_bytes: int, at_least_one: bool = True,
                   tag_mask: int = ALL_TAGS) -> tuple[list[tuple[int, bytes]], int]:
        """Batches of piece from the one holding offset (or its first), up to max_bytes (at least one if
        asked), skipping those whose tag summary shares no bit with tag_mask; with the offset the next
        read starts at."""
        entries = await self.index(piece)
        at = max(0, bisect.bisect_right([entry.base_offset for entry in entries], offset) - 1)
        chosen: list[PieceBatch] = []
        budget = ReadBudget(max_bytes, at_least_one)
        next_offset = max(offset, piece.from_offset)
        for entry in entries[at:]:
            if tag_mask != ALL_TAGS and not entry.tag_summary & tag_mask:
                next_offset = entry.base_offset + entry.count
                continue
            if not budget.take(entry.length):
                break
            chosen.append(entry)
            next_offset = entry.base_offset + entry.count
        found = await self._batches(piece, chosen)
        self.batches_read += len(found)
        return found, max(offset, next_offset)

    async def prefetch(self, piece: Piece, offset: int | None = None) -> None:
        """Fetch ahead of a sequential reader: the piece's index and, into the cache, the chunk holding offset (the
        piece's first without one) and the chunk after it; nothing that is there already."""
        try:
            entries = await self.index(piece)
            at = 0 if offset is None else max(0, bisect.bisect_right([entry.base_offset for entry in entries],
                                                                     offset) - 1)
            for _ in range(2):  # the reader's chunk, then the next: fetched while the reader reads the first
                if at >= len(entries) or self.cache is None:
                    return
                entry = entries[at]
                if self.cache.find(piece.key, entry.position, entry.position + entry.length) is None:
                    await self._batches(piece, [entry])
                hit = self.cache.find(piece.key, entry.position, entry.position + entry.length)
                if hit is None:  # not kept (a full disk)
                    return
                at = bisect.bisect_left([entry.position for entry in entries], hit[1])
        except RocketError as error:
            log.info("read-ahead of %s: %s", piece.key, error)

    async def _batches(self, piece: Piece, chosen: list[PieceBatch]) -> list[tuple[int, bytes]]:
        """The chosen batches (in the piece's order), each checked: a run of them at a time, from one cached chunk,
        one fetched chunk, or (without a cache) one ranged GET. A cached chunk that fails a check is forgotten and
        the batches fetched again; one fetched from the store is CORRUPT_DATA."""
        cache = self.cache
        found: list[tuple[int, bytes]] = []
        at = 0
        while at < len(chosen):
            first = chosen[at]
            hit = cache.find(piece.key, first.position, first.position + first.length) if cache else None
            if hit is not None:
                end = hit[1]
            elif cache is not None:
                on_its_way = self._fetching.get((piece.key, first.position))
                if on_its_way is not None:  # a read-ahead of this very chunk: wait for it, then look again
                    await on_its_way.wait()
                    continue
                end = min(piece.size, max(first.position + first.length, first.position + self.read_ahead_bytes))
            else:
                end = chosen[-1].position + chosen[-1].length
            run = [entry for entry in chosen[at:] if entry.position + entry.length <= end] or [first]
            if hit is not None and cache is not None:
                try:
                    data = await cache.read(piece.key, hit[0], first.position, run[-1].position + run[-1].length)
                    found.extend(self._check(piece, run, first.position, data))
                    self.cache_hits += len(run)
                    at += len(run)
                    continue
                except RocketError:  # gone from the cache, or damaged there: from the store then
                    await cache.forget(piece.key)
            fetching = None
            if cache is not None and (piece.key, first.position) not in self._fetching:
                fetching = self._fetching[(piece.key, first.position)] = trio.Event()
            try:
                data = await self._get(piece.key, first.position, end)
                try:
                    batches = self._check(piece, run, first.position, data)
                except RocketError:
                    self._indexes.pop(piece.key, None)
                    raise
                if cache is not None and len(data) == end - first.position:
                    await cache.put(piece.key, first.position, data)
            finally:
                if fetching is not None:
                    del self._fetching[(piece.key, first.position)]
                    fetching.set()
            found.extend(batches)
            at += len(run)
        return found

    @staticmethod
    def _check(piece: Piece, run: list[PieceBatch], start: int, data: bytes) -> list[tuple[int, bytes]]:
        """Each batch of run, cut from data (bytes of the piece's object from start) and checked against its CRC and
        the index; CORRUPT_DATA naming the first that fails."""
        found = []
        for entry in run:
            at = entry.position - start
            batch = data[at:at + entry.length]
            try:
                if len(batch) != entry.length:
                    raise RocketError(Code.CORRUPT_DATA, f"object is truncated ({len(batch)} of {entry.length} "
                                                         "bytes)")
                count = batch_codec.check_header(batch).count
            except RocketError as error:
                raise RocketError(Code.CORRUPT_DATA, f"tier object {piece.key}, batch at offset {entry.base_offset}: "
                                  f"{error.message}") from None
            if count != entry.count:
                raise RocketError(Code.CORRUPT_DATA, f"tier object {piece.key}: the batch at offset "
                                  f"{entry.base_offset} holds {count} messages, its index says {entry.count}")
            found.append((entry.base_offset, batch))
        return found

    async def _get(self, key: str, start: int, end: int | None) -> bytes:
        """A range of a piece's object; UNAVAILABLE if the store has not returned it, retries included, within
        limits.cold_get_s_max (a reader waits: the offloader's longer retries would outlast its call)."""
        self.gets += 1
        try:
            with trio.move_on_after(limits.cold_get_s_max) as waited:
                data = await self.objects.get(key, start, end)
            if waited.cancelled_caught:
                raise RocketError(Code.UNAVAILABLE, f"the object store did not return tier object {key} within "
                                  f"{limits.cold_get_s_max:g} s (retries included): it is down or slow; try again")
        except RocketError as error:
            if error.code == Code.NOT_FOUND:
                raise RocketError(Code.CORRUPT_DATA, f"tier object {key} is missing although the manifest "
                                  "lists it") from None
            raise
        self.fetched_bytes += len(data)
        return data
