"""Reads of a group's queues, on its leader or on a follower in sync: batches within a byte budget, from the WAL or
from the tier for what is no longer local; a long poll waits for data and returns it. Lookups by key, and the key
indexer behind them. A part of StorageRole."""

from __future__ import annotations

import trio
import trio.testing

from rocket import limits
from rocket.model import ALL_TAGS, ReadBudget
from rocket.replication import Engine
from rocket.roles.storage.gate import Gate
from rocket.serde.batch import key_term
from rocket.serde.piece import Piece
from rocket.store.store import Store
from rocket.tier.cold import ColdReader
from rocket.transport.background import Background


class Reads(Background):
    """StorageRead, StorageFindKey and StorageQueues, and the key indexer; run() holds the nursery where the next tier
    piece of a cold read is read ahead."""

    def __init__(self, store: Store, host: Engine, gate: Gate, cold: ColdReader | None, force_tier: bool):
        self.store = store
        self.host = host
        self.gate = gate
        self.cold = cold
        self.force_tier = force_tier  # tier_read_mode force: read from the tier all that is offloaded
        self._prefetching: set[str] = set()  # pieces being read ahead: one per read under way, removed as it ends
        self.replica_reads = 0  # reads served as a follower in sync

    async def read_queue(self, topic: str, queue: int, offset: int, budget: int, first: bool,
                          tag_mask: int) -> tuple[list[tuple[int, bytes]], int]:
        """A queue's batches from offset: from the tier for what is no longer local (or, in force mode,
        for all that is offloaded), else from the WAL."""
        cold = self.cold
        piece = self.store.reads.tier_piece(topic, queue, offset, self.force_tier) if cold is not None else None
        if cold is None or piece is None:
            return await self.store.reads.fetch(topic, queue, offset, budget, first, tag_mask)
        found, next_offset = await cold.read(piece, offset, budget, first, tag_mask)
        ahead: list[tuple[Piece, int | None]] = [(piece, next_offset)] if next_offset < piece.to_offset else []
        following = self.store.reads.tier_piece(topic, queue, piece.to_offset, self.force_tier)
        if following is not None:
            ahead.append((following, None))  # beside the rest of this piece's chunks, the next piece's first
        for ahead_piece, ahead_offset in ahead:
            if ahead_piece.key not in self._prefetching and self._nursery is not None:
                self._prefetching.add(ahead_piece.key)
                self._nursery.start_soon(self._prefetch, cold, ahead_piece, ahead_offset)
        return found, next_offset

    async def _prefetch(self, cold: ColdReader, piece, offset: int | None) -> None:
        try:
            await cold.prefetch(piece, offset)
        finally:
            self._prefetching.discard(piece.key)

    async def _read(self, topic: str, positions: dict[int, int], max_bytes: int, at_least_one: bool,
                    tag_mask: int = ALL_TAGS) -> dict:
        batches: list[dict] = []
        next_offsets: list[dict] = []
        budget = ReadBudget(max_bytes, at_least_one)
        for queue, offset in positions.items():
            if not budget.spent:
                found, offset = await self.read_queue(topic, queue, offset, budget.bytes_left, budget.first, tag_mask)
                self.store.count_read(topic, queue, found)
                for base_offset, data in found:
                    batches.append({"queue": queue, "base_offset": base_offset, "batch": data})
                    budget.take(len(data))  # the queue's read kept to what was left of the budget
            next_offsets.append({"queue": queue, "offset": offset})
        return {"batches": batches, "next_offsets": next_offsets}

    async def read(self, request: dict) -> dict:
        group = request["group"]
        self.gate.hosted(group)
        in_sync = request["follower_ok"] and self.host.in_sync(group, limits.follower_read_lag_entries_max)
        if not (request["any_replica"] or in_sync):
            self.gate.leads(group)
        if in_sync:
            self.replica_reads += 1
        topic = request["topic"]
        positions = self.gate.positions(request["queues"], "offset")
        max_bytes = max(0, min(request["max_bytes"], limits.read_bytes_max))
        tag_mask = request["tag_mask"] & ALL_TAGS  # a signed long on the wire; -1 reads every batch
        response = await self._read(topic, positions, max_bytes, request["at_least_one"], tag_mask)
        wait_ms = min(max(request["wait_ms"], 0), limits.pull_wait_ms_max)
        if (group, topic) in self.store.machine.dropped:  # sealed (moving to another class): no more will come here
            wait_ms = min(wait_ms, int(limits.leader_poll_s * 1000))
        if not response["batches"] and wait_ms:  # wait past what the filter skipped
            positions = {entry["queue"]: entry["offset"] for entry in response["next_offsets"]}
            await self.store.reads.wait_for_data({(topic, queue): offset for queue, offset in positions.items()},
                                                 wait_ms / 1000)
            response = await self._read(topic, positions, max_bytes, request["at_least_one"], tag_mask)
        return response

    async def find_key(self, request: dict) -> dict:
        """StorageFindKey, on the group's leader: the batches of a queue that may hold messages with a key (or a
        client's message id), as the key index names them; the broker matches their messages."""
        group = request["group"]
        self.gate.hosted(group)
        self.gate.leads(group)
        self.gate.positions([{"queue": request["queue"], "offset": 0}], "offset")  # a queue in range
        found, next_offset, done = await self.store.reads.find_keyed(
            request["topic"], request["queue"], key_term(request["key"], request["message_id"]), request["start_ms"],
            request["end_ms"], request["after"], max(0, min(request["max_bytes"], limits.read_bytes_max)))
        return {"batches": [{"queue": request["queue"], "base_offset": base_offset, "batch": batch}
                            for base_offset, batch in found], "next_offset": next_offset, "done": done}

    async def index_keys_forever(self) -> None:
        """The key indexer (Store.index_keys), a step at a time, each when every other task of the node waits: the
        appends never wait for it, and under a load that leaves the node no idle moment, lookups read whole the
        batches it has not reached yet. (No cushion of idle time: while a task waits for one, trio's autojumping
        test clock stands still, and the roles simulator with it.) Once a whole round of steps found little (each less
        than half a step's bytes: it caught up with queues still appended to), it rests limits.key_index_rest_s, so
        that its next steps take up that much of the appends at once rather than a step per idle moment."""
        small_steps = 0
        while True:
            indexed = await self.store.index_keys()
            candidates = self.store.machine.key_candidates
            if not candidates:
                self.store.keys_changed = changed = trio.Event()
                small_steps = 0
                await changed.wait()
            elif indexed < limits.key_index_step_bytes // 2:
                small_steps += 1
                if small_steps >= len(candidates):
                    small_steps = 0
                    await trio.sleep(limits.key_index_rest_s)
            else:
                small_steps = 0
            await trio.testing.wait_all_tasks_blocked()

    async def queues(self, request: dict) -> dict:
        self.gate.leads(request["group"])
        topic, reads = request["topic"], self.store.reads
        self.gate.positions([{"queue": queue, "offset": 0} for queue in request["queues"]], "offset")
        offsets, pops = [], []
        if request["consumer_group"]:
            committed = reads.fetch_offsets(request["consumer_group"], topic)
            offsets = [{"queue": queue, "offset": committed[queue]} for queue in request["queues"] if queue in committed]
            for queue in request["queues"]:
                state = reads.pop_state(request["consumer_group"], topic, queue)
                pops.append({"queue": queue, "cursor": state.cursor, "done_before": state.done_before(),
                             "in_flight": len(state.in_flight)})
        time_offsets = []
        if request["timestamp_ms"] >= 0:
            time_offsets = [{"queue": queue, "offset": reads.offset_for_time(topic, queue, request["timestamp_ms"])}
                            for queue in request["queues"]]
        committed, dead_letters, producers, locks = (reads.consumed(topic, request["queues"])
                                                     if request.get("consumed") else ([], [], [], []))
        return {"queues": [{"queue": queue, **reads.queue_stats(topic, queue)} for queue in request["queues"]],
                "offsets": offsets, "time_offsets": time_offsets, "pops": pops,
                "lagging": reads.lagging(topic, request["queues"]) if request.get("lagging") else [],
                "committed": committed, "dead_letters": dead_letters, "producers": producers, "locks": locks}
