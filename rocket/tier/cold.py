"""Cold reads: batches of offloaded pieces, fetched from the object store by ranged GETs and kept in a bounded LRU
cache (ColdReader). Every batch is checked against its own CRC and the index: damage is CORRUPT_DATA, never bad
data."""

from __future__ import annotations

import bisect
import collections
import logging

import trio

from rocket import limits
from rocket.errors import Code, RocketError
from rocket.model import ALL_TAGS, ReadBudget
from rocket.serde import batch as batch_codec
from rocket.tier.objectstore import ObjectStore
from rocket.serde.piece import Piece, PieceBatch, decode_index

log = logging.getLogger("rocket.tier")


class ColdReader:
    """Batches of offloaded pieces, fetched with ranged GETs of at least limits.cold_read_ahead_bytes (so the next
    reads of a consumer hit the cache), kept in a bounded LRU cache with the pieces' sidecar indexes."""

    def __init__(self, objects: ObjectStore, cache_bytes_max: int = limits.cold_cache_bytes_max,
                 read_ahead_bytes: int = limits.cold_read_ahead_bytes):
        self.objects = objects
        self.cache_bytes_max = cache_bytes_max
        self.read_ahead_bytes = read_ahead_bytes
        self._indexes: collections.OrderedDict[str, list[PieceBatch]] = collections.OrderedDict()
        self._chunks: collections.OrderedDict[tuple[str, int], bytes] = collections.OrderedDict()  # (key, start)
        self._chunk_starts: dict[str, list[int]] = {}  # key -> sorted starts of its cached chunks
        self._cached_bytes = 0
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
        found = []
        for entry in chosen:
            batch = await self._batch(piece, entry)
            found.append((entry.base_offset, batch))
        self.batches_read += len(found)
        return found, max(offset, next_offset)

    async def prefetch(self, piece: Piece) -> None:
        """Fetch a piece's index and first chunk ahead of the reads that will want them."""
        try:
            entries = await self.index(piece)
            if entries:
                await self._batch(piece, entries[0])
        except RocketError as error:
            log.info("read-ahead of %s: %s", piece.key, error)

    async def _batch(self, piece: Piece, entry: PieceBatch) -> bytes:
        chunk_start, chunk = await self._chunk(piece, entry)
        at = entry.position - chunk_start
        batch = chunk[at:at + entry.length]
        try:
            if len(batch) != entry.length:
                raise RocketError(Code.CORRUPT_DATA, f"object is truncated ({len(batch)} of {entry.length} bytes)")
            count = batch_codec.check_header(batch).count
        except RocketError as error:
            self._forget(piece.key)
            raise RocketError(Code.CORRUPT_DATA, f"tier object {piece.key}, batch at offset {entry.base_offset}: "
                              f"{error.message}") from None
        if count != entry.count:
            self._forget(piece.key)
            raise RocketError(Code.CORRUPT_DATA, f"tier object {piece.key}: the batch at offset {entry.base_offset} "
                              f"holds {count} messages, its index says {entry.count}")
        return batch

    async def _chunk(self, piece: Piece, entry: PieceBatch) -> tuple[int, bytes]:
        """A cached range of the piece's object holding the whole batch, fetched if need be."""
        starts = self._chunk_starts.get(piece.key, [])
        at = bisect.bisect_right(starts, entry.position) - 1
        if at >= 0:
            start = starts[at]
            chunk = self._chunks.get((piece.key, start))
            if chunk is not None and start + len(chunk) >= entry.position + entry.length:
                self._chunks.move_to_end((piece.key, start))
                self.cache_hits += 1
                return start, chunk
        start = entry.position
        end = min(piece.size, max(entry.position + entry.length, start + self.read_ahead_bytes))
        chunk = await self._get(piece.key, start, end)
        if len(chunk) != end - start:  # a short object: the batch check reports it
            return start, chunk
        self._remember(piece.key, start, chunk)
        return start, chunk

    def _remember(self, key: str, start: int, chunk: bytes) -> None:
        if (key, start) in self._chunks:
            return
        self._chunks[(key, start)] = chunk
        bisect.insort(self._chunk_starts.setdefault(key, []), start)
        self._cached_bytes += len(chunk)
        while self._cached_bytes > self.cache_bytes_max and len(self._chunks) > 1:
            (old_key, old_start), old = self._chunks.popitem(last=False)
            self._cached_bytes -= len(old)
            self._chunk_starts[old_key].remove(old_start)
            if not self._chunk_starts[old_key]:
                del self._chunk_starts[old_key]

    def _forget(self, key: str) -> None:
        """Drop a damaged piece's cached chunks and index, so that a repaired object is read afresh."""
        for start in self._chunk_starts.pop(key, []):
            self._cached_bytes -= len(self._chunks.pop((key, start)))
        self._indexes.pop(key, None)

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
