"""ChunkCache: the ranges of tiered objects a node fetched for cold reads, kept as files on its disk (bounded in bytes
and in idle time, least recently read out first), so that reads of the same range again cost a local read."""

from __future__ import annotations

import bisect
import collections
import dataclasses
import hashlib
import logging
import shutil
from collections.abc import Callable
from pathlib import Path

import trio

from rocket import limits
from rocket.errors import Code, RocketError
from rocket.tier.local import LocalDirectoryStore

log = logging.getLogger("rocket.tier")


@dataclasses.dataclass(slots=True)
class _Chunk:
    size: int
    read_at: float  # when last read or stored (the clock's seconds)


class ChunkCache:
    """Chunks (an object's key, the offset of their first byte) as files of a LocalDirectoryStore without fsync: a
    torn or lost file is one fetch again, as a damaged one is (the reader checks each batch's CRC and forgets it).
    Holds at most bytes_max; a chunk unread for idle_s_max goes at the next sweep. The directory starts empty: what
    a previous run left is deleted (run()), never trusted."""

    def __init__(self, directory: Path, bytes_max: int, idle_s_max: float = limits.cold_cache_idle_s_max,
                 clock: Callable[[], float] = trio.current_time):
        self.directory = directory
        self.bytes_max = bytes_max
        self.idle_s_max = idle_s_max
        self.clock = clock
        self.files = LocalDirectoryStore(directory, durable=False)
        self._chunks: collections.OrderedDict[tuple[str, int], _Chunk] = collections.OrderedDict()  # LRU first
        self._starts: dict[str, list[int]] = {}  # object key -> sorted starts of its chunks
        self.bytes = 0
        self.evicted = 0  # chunks dropped for room or idleness, for metrics

    async def run(self) -> None:
        """Empty the directory, then sweep idle chunks out every limits.cold_cache_sweep_s."""
        await trio.to_thread.run_sync(shutil.rmtree, self.directory, True)
        while True:
            await trio.sleep(limits.cold_cache_sweep_s)
            await self._evict(0)

    def find(self, key: str, start: int, end: int) -> tuple[int, int] | None:
        """The (start, end) of a cached chunk of key holding bytes start..end, if one does."""
        starts = self._starts.get(key)
        if not starts:
            return None
        at = bisect.bisect_right(starts, start) - 1
        if at < 0:
            return None
        chunk = self._chunks[(key, starts[at])]
        if starts[at] + chunk.size < end:
            return None
        return starts[at], starts[at] + chunk.size

    async def read(self, key: str, chunk_start: int, start: int, end: int) -> bytes:
        """Bytes start..end of key from its chunk at chunk_start (find() named it). A chunk gone meanwhile (evicted,
        or its file lost) is NOT_FOUND: the caller fetches from the store."""
        chunk = self._chunks.get((key, chunk_start))
        if chunk is None:
            raise RocketError(Code.NOT_FOUND, f"no cached chunk of {key} at {chunk_start}")
        chunk.read_at = self.clock()
        self._chunks.move_to_end((key, chunk_start))
        try:
            data = await self.files.get(_name(key, chunk_start), start - chunk_start, end - chunk_start)
        except RocketError as error:
            data, problem = b"", error.message
        else:
            problem = "it is short"
        if len(data) != end - start:  # evicted while read, lost or torn: fetched again
            await self._drop(key, chunk_start)
            raise RocketError(Code.NOT_FOUND, f"the cached chunk of {key} at {chunk_start}: {problem}")
        return data

    async def put(self, key: str, start: int, data: bytes) -> None:
        """Keep data, bytes of key from start, making room first. A failed write (a full disk) only logs: the read
        it came from is served all the same."""
        if (key, start) in self._chunks or not data or len(data) > self.bytes_max:
            return
        await self._evict(len(data))
        try:
            await self.files.put(_name(key, start), data)
        except RocketError as error:
            log.warning("tier cache: cannot keep %d bytes of %s: %s", len(data), key, error.message)
            return
        if (key, start) in self._chunks:  # another read fetched and kept the same chunk meanwhile
            return
        self._chunks[(key, start)] = _Chunk(len(data), self.clock())
        bisect.insort(self._starts.setdefault(key, []), start)
        self.bytes += len(data)

    async def forget(self, key: str) -> None:
        """Every chunk of key: damaged, or the object changed."""
        for start in list(self._starts.get(key, [])):
            await self._drop(key, start)

    async def _evict(self, room: int) -> None:
        """Drop the least recently read chunks until room more bytes fit, and every chunk idle too long."""
        idle_before = self.clock() - self.idle_s_max
        while self._chunks:
            (key, start), chunk = next(iter(self._chunks.items()))
            if self.bytes + room <= self.bytes_max and chunk.read_at >= idle_before:
                return
            self.evicted += 1
            await self._drop(key, start)

    async def _drop(self, key: str, start: int) -> None:
        chunk = self._chunks.pop((key, start), None)
        if chunk is None:
            return
        self.bytes -= chunk.size
        starts = self._starts[key]
        starts.remove(start)
        if not starts:
            del self._starts[key]
        await self.files.delete(_name(key, start))


def _name(key: str, start: int) -> str:
    """A chunk's file: a digest of the key (any length, any characters) spread over 256 directories, and its start."""
    digest = hashlib.sha256(key.encode()).hexdigest()
    return f"{digest[:2]}/{digest[2:34]}-{start:020d}"
