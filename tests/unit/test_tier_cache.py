"""The cold reads' cache on disk (rocket.tier.cache.ChunkCache under ColdReader): a range read again is read from the
cache, not the store; the cache keeps to its bytes and idle time; a damaged or vanished cached file is fetched again,
never returned; what a previous run left is deleted."""

from __future__ import annotations

import collections
import os

import trio

from rocket import limits
from rocket.tier import LocalDirectoryStore
from rocket.tier.cache import ChunkCache
from rocket.tier.cold import ColdReader
from tests.unit.test_store import GROUP, Node, workload
from tests.unit.test_tier_offload import TOPIC, cold_bodies, expected_bodies, make_offloader, scan_until_done


class CountingStore:
    """The tier's store, counting the bytes fetched from it and the gets of each range; each get takes delay_s."""

    def __init__(self, inner: LocalDirectoryStore, delay_s: float = 0.0):
        self.inner = inner
        self.fetched = 0
        self.delay_s = delay_s
        self.gets: collections.Counter = collections.Counter()

    async def get(self, key: str, start: int = 0, end: int | None = None) -> bytes:
        self.gets[(key, start)] += 1
        await trio.sleep(self.delay_s)
        data = await self.inner.get(key, start, end)
        self.fetched += len(data)
        return data

    def __getattr__(self, name: str):
        return getattr(self.inner, name)


class Clock:
    now = 0.0

    def __call__(self) -> float:
        return self.now


def cached_files(cache: ChunkCache) -> dict[str, int]:
    return {os.path.join(root, name): os.path.getsize(os.path.join(root, name))
            for root, _, names in os.walk(cache.directory) for name in names}


async def offloaded(tmp_path, piece_bytes: int = 12_000):
    node = Node(tmp_path / "node")
    node.apply(GROUP, workload())
    objects = LocalDirectoryStore(tmp_path / "tier")
    await scan_until_done(make_offloader(node, objects, piece_bytes=piece_bytes))
    return node, objects


async def test_a_range_read_again_comes_from_the_cache_and_the_cache_keeps_to_its_bytes(tmp_path):
    node, objects = await offloaded(tmp_path)
    store = CountingStore(objects)
    cache = ChunkCache(tmp_path / "cache", bytes_max=200_000, clock=Clock())
    reader = ColdReader(store, cache, read_ahead_bytes=30_000)  # type: ignore[arg-type]
    assert await cold_bodies(node, reader, 0) == expected_bodies(0)
    fetched = store.fetched
    assert fetched and cache.bytes <= 200_000 and sum(cached_files(cache).values()) <= 200_000 + 64 * len(
        cached_files(cache))  # each file: the chunk and its footer
    assert await cold_bodies(node, reader, 0) == expected_bodies(0)
    assert store.fetched == fetched and reader.cache_hits > 0  # the queue's pieces fit: nothing fetched again
    assert await cold_bodies(node, reader, 1) == expected_bodies(1)  # more than fits: the oldest chunks go
    assert cache.bytes <= 200_000 and cache.evicted > 0
    node.close()


async def test_a_damaged_or_vanished_cached_chunk_is_fetched_again_never_returned(tmp_path):
    node, objects = await offloaded(tmp_path)
    store = CountingStore(objects)
    cache = ChunkCache(tmp_path / "cache", bytes_max=limits.cold_cache_bytes_min, clock=Clock())
    reader = ColdReader(store, cache, read_ahead_bytes=30_000)  # type: ignore[arg-type]
    assert await cold_bodies(node, reader, 0) == expected_bodies(0)
    files = sorted(cached_files(cache))
    with open(files[0], "r+b") as file:  # a flipped byte inside the first batch
        file.seek(40)
        byte = file.read(1)
        file.seek(40)
        file.write(bytes([byte[0] ^ 1]))
    os.unlink(files[1])
    fetched = store.fetched
    assert await cold_bodies(node, reader, 0) == expected_bodies(0)
    assert store.fetched > fetched  # the two chunks came from the store again
    node.close()


async def test_idle_chunks_go_and_a_previous_runs_files_are_deleted(tmp_path):
    node, objects = await offloaded(tmp_path)
    clock = Clock()
    leftover = tmp_path / "cache" / "ab" / "leftover"
    leftover.parent.mkdir(parents=True)
    leftover.write_bytes(b"from a previous run")
    cache = ChunkCache(tmp_path / "cache", bytes_max=limits.cold_cache_bytes_min, idle_s_max=100, clock=clock)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(cache.run)
        await trio.sleep(0.1)  # the worker thread deleted the directory
        assert not leftover.exists()
        reader = ColdReader(objects, cache, read_ahead_bytes=30_000)
        assert await cold_bodies(node, reader, 0) == expected_bodies(0)
        assert cache.bytes > 0 and cached_files(cache)
        clock.now = 50.0
        assert await cold_bodies(node, reader, 1) == expected_bodies(1)  # queue 1's chunks were read at 50
        clock.now = 120.0
        await cache._evict(0)
        assert cache.bytes == sum(size for size in cache_sizes(cache)) > 0
        assert all(key.startswith(f"tier/{TOPIC}/1/") for key in cache._starts)  # queue 0's were idle for 120 s
        nursery.cancel_scope.cancel()
    node.close()


def cache_sizes(cache: ChunkCache) -> list[int]:
    return [chunk.size for chunk in cache._chunks.values()]


async def test_read_ahead_fetches_the_readers_chunk_and_the_next_into_the_cache(tmp_path):
    node, objects = await offloaded(tmp_path, piece_bytes=40_000)  # pieces of 7 or 8 batches
    store = CountingStore(objects)
    cache = ChunkCache(tmp_path / "cache", bytes_max=limits.cold_cache_bytes_min, clock=Clock())
    reader = ColdReader(store, cache, read_ahead_bytes=4_000)  # type: ignore[arg-type]
    piece = max(node.tier_state(TOPIC, 0).pieces, key=lambda piece: piece.size)
    entries = await reader.index(piece)
    assert len(entries) >= 3
    await reader.prefetch(piece, entries[0].base_offset)
    assert len(cache._chunks) == 2  # the chunk holding the offset, and the one after it
    fetched = store.fetched
    batches, _ = await reader.read(piece, entries[0].base_offset, 3 * entries[0].length)  # read_charge: more than 2
    assert len(batches) >= 2 and store.fetched == fetched  # both from the cache
    await reader.prefetch(piece, entries[0].base_offset)
    assert store.fetched == fetched  # nothing fetched twice
    node.close()


async def test_a_read_waits_for_the_read_ahead_of_its_chunk_instead_of_fetching_it_again(tmp_path):
    node, objects = await offloaded(tmp_path, piece_bytes=40_000)
    store = CountingStore(objects, delay_s=0.05)
    cache = ChunkCache(tmp_path / "cache", limits.cold_cache_bytes_min, clock=Clock())
    reader = ColdReader(store, cache, read_ahead_bytes=4_000)  # type: ignore[arg-type]
    piece = max(node.tier_state(TOPIC, 0).pieces, key=lambda piece: piece.size)
    entries = await reader.index(piece)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(reader.prefetch, piece, entries[0].base_offset)
        await trio.sleep(0.01)  # its get of the first chunk is out
        batches, _ = await reader.read(piece, entries[0].base_offset, entries[0].length)
    assert [offset for offset, _ in batches] == [entries[0].base_offset]
    assert store.gets[(piece.key, entries[0].position)] == 1
    node.close()
