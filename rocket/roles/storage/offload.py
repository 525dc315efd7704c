"""The offloader: on the storage groups this node leads, uploads each queue's data to the tier in pieces (piece.py),
each proposed to the group's manifest only once verified, and applies the queues' local and total retention.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Awaitable, Callable
from typing import cast

import trio

from rocket import limits
from rocket.clock import Clock, sleep_periodic
from rocket.errors import Code, RocketError, leaf_exceptions
from rocket.serde.piece import Piece, build, queue_prefix, range_of_key
from rocket.store.commands import encode_drop_local, encode_expire, encode_offloaded, encode_truncate
from rocket.store.store import Store
from rocket.tier.objectstore import ObjectInfo, ObjectStore

log = logging.getLogger("rocket.tier")


@dataclasses.dataclass(frozen=True, slots=True)
class TierSettings:
    prefix: str = ""
    piece_bytes: int = limits.tier_piece_bytes_default
    piece_age_s: float = limits.tier_piece_age_s_default
    retention_s: float = 0.0  # default total retention; 0 keeps data for ever
    local_retention_s: float = limits.tier_local_retention_s_default  # 0 keeps local data for ever
    force_reads: bool = False  # read offloaded data from the tier even while it is still local


@dataclasses.dataclass(frozen=True, slots=True)
class _Built:
    """A piece built and not yet stored: its two objects' bytes."""
    piece: Piece
    segment: bytes
    index: bytes


@dataclasses.dataclass(slots=True)
class _Backoff:
    until: float = 0.0
    wait_s: float = 0.0


class Offloader:
    """propose(group, payload) replicates a command in a group; leads() gives the groups this node leads, each with its
    term; retention(topic) gives (retention_s, local_retention_s) with the defaults applied.

    On the groups led here it uploads each queue's next piece once it is full or old, verifies it (the store's answer
    to the put: size and MD5) and only then proposes it to the group's manifest (offload); it drops local data past
    its local retention (only pieces the manifest holds) and expires pieces past the total retention, manifest first,
    then the objects (retain). Failures back off per queue and retry. Without an object store (tier_backend off) it
    only applies total retention, to local data."""

    def __init__(self, store: Store, objects: ObjectStore | None, settings: TierSettings,
                 propose: Callable[[int, bytes], Awaitable], leads: Callable[[], dict[int, int]],
                 retention: Callable[[str], tuple[float, float]], clock: Clock):
        self.store = store
        self.clock = clock
        self.objects = objects
        self.settings = settings
        self.propose = propose
        self.leads = leads
        self.retention = retention
        # These five are keyed by queues the store holds (Store.queues_of picks every key they get), each of which
        # the store already keeps a QueueStats of in memory: they cost a small multiple of that, never more queues.
        self._backoff: dict[tuple[str, int], _Backoff] = {}  # queue -> its wait after a failure; gone once it passed
        self._pending_seen: dict[tuple[str, int], tuple[int, float]] = {}  # queue -> (tiered to, its data's wall s)
        self._retention_due: dict[tuple[str, int], float] = {}  # queue -> when to look at its retentions again
        self._swept: set[tuple[str, int]] = set()  # queues whose unlisted objects this offloader looked for
        # queue -> (term, offset): its last piece went into the manifest in that term, and it ended there, so no other
        # upload from that offset can have happened unless the term changed (no orphans to look for)
        self._clean: dict[tuple[str, int], tuple[int, int]] = {}
        self._led: dict[int, int] = {}  # group -> term, of the groups led at the last scan
        self._built_bytes = 0  # of pieces built (or being built) and not yet stored: limits.tier_built_bytes_max
        self._builds = trio.CapacityLimiter(limits.tier_builds_parallel)
        self.uploaded_pieces = 0
        self.uploaded_bytes = 0
        self.swept_objects = 0
        self.failures = 0

    @property
    def _objects(self) -> ObjectStore:
        """The object store: pieces are offloaded, verified and swept only with one (_due looks first)."""
        assert self.objects is not None, "the tier is off"
        return self.objects

    async def run(self) -> None:
        """A scan every tier_scan_s; until this node first leads a group (it just started), a look every
        tier_first_scan_poll_s, so that a restarted node's backlog starts going as soon as it leads."""
        while not self.leads():
            await trio.sleep(limits.tier_first_scan_poll_s)
        while True:
            await self.scan()
            await sleep_periodic(limits.tier_scan_s)

    async def scan(self) -> int:
        """One round over the queues of the groups led here that may have something to upload (appended
        to since they last had nothing pending) or to drop or expire (those with pieces, when their
        retention may have come); returns the pieces uploaded. Idle queues cost nothing."""
        uploads = 0
        now = self.clock.now_s()
        led = self._led = self.leads()
        limiter = trio.CapacityLimiter(limits.tier_uploads_parallel)

        def counted() -> bool:
            nonlocal uploads
            uploads += 1
            return uploads < limits.tier_uploads_per_scan_max

        async def upload(group: int, topic: str, queue: int) -> None:
            """The queue's due pieces, in order; other queues' at the same time, up to the limiter."""
            async with limiter:
                try:
                    if uploads < limits.tier_uploads_per_scan_max:
                        await self.offload(group, topic, queue, counted)
                except* RocketError as errors:  # the piece's two puts at once may both fail: the first says why
                    self._back_off((topic, queue), cast(RocketError, next(leaf_exceptions(errors))))

        async with trio.open_nursery() as nursery:
            for number, (group, topic, queue) in enumerate(
                    self.store.reads.queues_of(led, self.store.offload_candidates)):
                if number % 1000 == 999:
                    await trio.sleep(0)  # a long round lets the node's other work in
                if not self._backed_off((topic, queue), now) and self._due(topic, queue):
                    nursery.start_soon(upload, group, topic, queue)
        due = [key for key, at in self._retention_due.items() if at <= now]
        for group, topic, queue in self.store.reads.queues_of(led, due):
            if self._backed_off((topic, queue), now):
                continue
            try:
                await self.retain(group, topic, queue)
            except RocketError as error:
                self._back_off((topic, queue), error)
        return uploads

    def _backed_off(self, key: tuple[str, int], now: float) -> bool:
        backoff = self._backoff.get(key)
        if backoff is not None and now < backoff.until:
            return True
        self._backoff.pop(key, None)
        return False

    def _back_off(self, key: tuple[str, int], error: RocketError) -> None:
        self.failures += 1
        backoff = self._backoff.setdefault(key, _Backoff())
        backoff.wait_s = min(max(backoff.wait_s * 2, limits.tier_scan_s), limits.tier_backoff_s_max)
        backoff.until = self.clock.now_s() + backoff.wait_s
        log.warning("tier: %s/%d: %s (retrying in %.0f s)", key[0], key[1], error, backoff.wait_s)

    def _due(self, topic: str, queue: int) -> bool:
        """A cheap look before reading the index: is a full piece waiting, or has data waited long enough?"""
        state = self.store.reads.tier_state(topic, queue)
        pending_bytes = self.store.reads.queue_bytes(topic, queue) - (
            state.offloaded_bytes + state.truncated_bytes if state is not None else 0)
        tiered_to = state.tiered_to if state is not None else 0
        self._retention_due.setdefault((topic, queue), self.clock.now_s())  # it has pieces, or soon will
        if pending_bytes <= 0 or self.objects is None:
            self._pending_seen.pop((topic, queue), None)
            self.store.offload_candidates.discard((topic, queue))  # until it is appended to again
            return False
        if pending_bytes >= self.settings.piece_bytes:
            return True
        seen = self._pending_seen.get((topic, queue))
        if seen is None or seen[0] != tiered_to:
            # The age of the data, not of this offloader's first look at it: a backlog a restarted node finds is
            # as old as it is (one seek of the queue's index, once per piece).
            entries, _ = self.store.index.locate(topic, queue, tiered_to, 1)
            seen = (tiered_to, entries[0].append_ms / 1000 if entries else self.clock.wall_s())
            self._pending_seen[(topic, queue)] = seen
        return self.clock.wall_s() - seen[1] >= self.settings.piece_age_s

    async def offload(self, group: int, topic: str, queue: int, stored: Callable[[], bool]) -> None:
        """Upload the queue's due pieces in order, calling stored() once the manifest holds each: it answers whether
        to go on. While one piece uploads the next is built (read from the WAL, checked, hashed), as long as the pieces
        built and not yet stored stay within limits.tier_built_bytes_max, so the store and the node's CPU work at
        once."""
        pending: list[_Built] = []  # built and not yet stored, in order

        async def build_next(start: int) -> None:
            try:
                built = await self._build(topic, queue, start)
            except RocketError:
                return  # the piece uploading now still goes; this one is built again after it, and fails there
            if built is not None:
                pending.append(built)

        try:
            while True:
                if not pending:
                    built = await self._build(topic, queue, None) if self._due(topic, queue) else None
                    if built is None:
                        return
                    pending.append(built)
                built = pending[0]
                async with trio.open_nursery() as nursery:
                    if self._built_bytes + self.settings.piece_bytes <= limits.tier_built_bytes_max:
                        nursery.start_soon(build_next, built.piece.to_offset)
                    held = await self._store(group, topic, queue, built)
                self._built_bytes -= pending.pop(0).piece.size
                if not held or not stored():
                    return
        finally:
            self._built_bytes -= sum(built.piece.size for built in pending)

    async def _build(self, topic: str, queue: int, start: int | None) -> _Built | None:
        """The queue's next piece from start (where the manifest ends by default), if one is due."""
        entries = self.store.reads.offload_run(topic, queue, self.settings.piece_bytes,
                                               int(self.settings.piece_age_s * 1000), self.clock.wall_ms(), start)
        if not entries:
            return None

        def read_and_build() -> _Built:
            return _Built(*build(self.settings.prefix, topic, queue, self.store.reads.read_run(topic, queue, entries)))
        # Reading up to a piece of bytes from the WAL, their CRCs, the copy into one object and its MD5: a worker
        # thread does them (pread, zlib and hashlib let go of the GIL), not the node's trio thread.
        self._built_bytes += self.settings.piece_bytes  # held from here: a build under way counts too
        try:
            async with self._builds:
                built = await self.store.world.run_sync(read_and_build)
        finally:
            self._built_bytes -= self.settings.piece_bytes
        self._built_bytes += built.piece.size
        return built

    async def _store(self, group: int, topic: str, queue: int, built: _Built) -> bool:
        """Upload a piece, verify it and propose it to the manifest; True once the manifest holds it. Other objects
        from its offset go only then, when no manifest can ever list them (its end only moves on): deleted earlier,
        one could be the piece an earlier leader got committed that this node has not applied yet."""
        piece = built.piece
        term = self._led.get(group, 0)
        look = self._clean.pop((topic, queue), None) != (term, piece.from_offset)
        stored: dict[str, ObjectInfo] = {}

        async def put(key: str, data: bytes, md5: str | None = None) -> None:
            stored[key] = await self._objects.put(key, data, md5=md5)

        async with trio.open_nursery() as nursery:  # the two objects at once: neither counts until both are checked
            nursery.start_soon(put, piece.index_key, built.index)
            nursery.start_soon(put, piece.key, built.segment, piece.md5)
        self._verify(piece, stored[piece.key], stored[piece.index_key])
        if not await self.propose(group, encode_offloaded(topic, queue, piece)):
            if (topic, queue) not in self.store.machine.queues:  # the topic was deleted meanwhile
                await self.delete_objects(topic, queue)
            elif not self._lists(topic, queue, piece):  # another piece from its offset got there first
                await self._objects.delete(piece.key)
                await self._objects.delete(piece.index_key)
            return False
        self._clean[(topic, queue)] = (term, piece.to_offset)
        self.uploaded_pieces += 1
        self.uploaded_bytes += piece.size
        log.debug("tier: offloaded %s (%d bytes)", piece.key, piece.size)
        if look:
            try:
                await self._delete_orphans(topic, queue, piece)
            except RocketError as error:
                log.warning("tier: orphans beside %s are left: %s", piece.key, error)
        return True

    @staticmethod
    def _verify(piece: Piece, segment: ObjectInfo, index: ObjectInfo) -> None:
        """The data counts as offloaded only once the store holds exactly what was built: each store's put checks
        what it stored before it answers (S3's ETag against Content-MD5, GCS's md5Hash, Azure's Content-MD5, HDFS's
        file status and MD5 after the rename, the local store's fsynced file), and its answer must be the piece's."""
        if segment.size != piece.size or segment.etag != piece.md5 or index.size != piece.index_size:
            raise RocketError(Code.CORRUPT_DATA, f"tier object {piece.key} holds {segment.size} bytes with MD5 "
                              f"{segment.etag}; uploaded {piece.size} with {piece.md5}")

    def _lists(self, topic: str, queue: int, piece: Piece) -> bool:
        state = self.store.reads.tier_state(topic, queue)
        return state is not None and any(listed.key == piece.key for listed in state.pieces)

    async def _delete_orphans(self, topic: str, queue: int, piece: Piece) -> None:
        """Objects of a run from the listed piece's offset cut differently (an upload a crash or a lost leadership
        left unlisted) go, so the tier holds an offset twice only until its piece is listed."""
        prefix = queue_prefix(self.settings.prefix, topic, queue) + f"{piece.from_offset:020d}-"
        for info in await self._objects.list(prefix):
            if range_of_key(info.key) != (piece.from_offset, piece.to_offset):
                await self._objects.delete(info.key)

    async def delete_objects(self, topic: str, queue: int) -> int:
        """Every object of a deleted topic's queue, listed, not read from a manifest: also those an upload a crash
        cut short left behind. Returns how many went."""
        if self.objects is None:
            return 0
        found = await self.objects.list(queue_prefix(self.settings.prefix, topic, queue))
        for info in found:
            await self.objects.delete(info.key)
        return len(found)

    async def _sweep(self, topic: str, queue: int, listed: set[str], end: int) -> None:
        """Objects from an offset before the manifest's end that it does not list (it never can: its end only moves
        on) go: pieces an expire whose deletes a crash or a lost leadership cut short left behind, and uploads that
        lost the race for the manifest, whose uploader crashed or was cut off. Looked for once per queue by each
        offloader (each time a node starts)."""
        for info in await self._objects.list(queue_prefix(self.settings.prefix, topic, queue)):
            found = range_of_key(info.key)
            if found is not None and found[0] < end and info.key not in listed:
                await self._objects.delete(info.key)
                self.swept_objects += 1

    async def _truncate(self, group: int, topic: str, queue: int, state, retention_s: float) -> None:
        """Local data older than the total retention that no piece holds goes (where the tier is off, or
        was down for longer than the retention)."""
        start = state.local_from if state is not None else 0
        end = self.store.index.offset_for_time(topic, queue, int((self.clock.wall_s() - retention_s) * 1000))
        if end is None:
            end = self.store.reads.queue_stats(topic, queue)["next_offset"]
        if end > start:
            await self.propose(group, encode_truncate(topic, queue, start, end,
                                                      self.store.reads.local_bytes(topic, queue, start, end)))

    async def retain(self, group: int, topic: str, queue: int) -> None:
        """Drop local data past local retention (offloaded only), expire pieces past total retention; look
        again after the shorter of the two (at most limits.tier_retention_check_s)."""
        state = self.store.reads.tier_state(topic, queue)
        retention_s, local_retention_s = self.retention(topic)
        self._retention_due[(topic, queue)] = self.clock.now_s() + min(
            [limits.tier_retention_check_s] + [seconds for seconds in (retention_s, local_retention_s) if seconds > 0])
        if retention_s > 0 and (state is None or not state.pieces):
            await self._truncate(group, topic, queue, state, retention_s)
        if state is None or self.objects is None:
            return
        if (topic, queue) not in self._swept:
            listed = {key for piece in state.pieces for key in (piece.key, piece.index_key)}
            await self._sweep(topic, queue, listed, state.tiered_to)  # both taken before the list: it may move on
            self._swept.add((topic, queue))
        if not state.pieces:
            return
        now_ms = self.clock.wall_ms()
        if local_retention_s > 0:
            drop_to = None
            for piece in state.pieces:
                if piece.to_offset <= state.local_from:
                    continue
                if now_ms - piece.last_append_ms < local_retention_s * 1000:
                    break
                drop_to = piece.to_offset
            if drop_to is not None:
                await self.propose(group, encode_drop_local(topic, queue, drop_to))
        if retention_s > 0:
            expired = []
            for piece in state.pieces:
                if now_ms - piece.last_append_ms < retention_s * 1000:
                    break
                expired.append(piece)
            if expired and await self.propose(group, encode_expire(topic, queue, expired[-1].to_offset)):
                for piece in expired:
                    await self.objects.delete(piece.key)
                    await self.objects.delete(piece.index_key)
