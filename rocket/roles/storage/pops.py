"""Pop (simple) consumption on a group's leader: messages handed out with a receipt and an invisible time, acked,
made visible again, or sent to the dead letters once they used up their attempts. A part of StorageRole.
"""

from __future__ import annotations

import trio

from rocket import limits
from rocket.clock import Clock
from rocket.errors import Code, RocketError
from rocket.filter import SqlFilter, compile_filter
from rocket.model import ALL_TAGS, Message, check_group_name, check_topic_name
from rocket.replication import Engine
from rocket.roles.storage.gate import Gate
from rocket.roles.storage.reads import Reads
from rocket.serde import batch as batch_codec
from rocket.serde.batch import peek_count
from rocket.store.commands import encode_pop
from rocket.store.store import Store


class Pops:
    def __init__(self, store: Store, host: Engine, gate: Gate, reads: Reads, clock: Clock):
        self.store = store
        self.host = host
        self.gate = gate
        self.reads = reads
        self.clock = clock
        # One pop at a time per group and queue. Bounded by the pops under way: a lock goes once no task holds or
        # waits for it (_drop_pop_lock), and each pop is a call, which the connection limits bound.
        self._pop_locks: dict[tuple[str, str, int], trio.Lock] = {}

    async def pop(self, request: dict) -> dict:
        """Hand out up to max_messages from the group's queues: first those whose invisible time ran out
        (or, past max_attempts, to the dead-letter queue), then new ones the filter matches. With wait_ms,
        wait for new messages or the next reappearance when there is nothing yet."""
        group = request["group"]
        self.gate.leads(group)
        consumer_group = check_group_name(request["consumer_group"])
        topic = check_topic_name(request["topic"])
        queues = list(self.gate.positions([{"queue": queue, "offset": 0} for queue in request["queues"]], "offset"))
        chosen = compile_filter(request["filter_type"], request["filter"])
        invisible_ms = min(max(request["invisible_ms"], int(limits.pop_invisible_s_min * 1000)), limits.pop_invisible_s_max * 1000)
        wanted = min(max(request["max_messages"], 1), limits.pop_messages_max)
        attempts_max = max(1, request["max_attempts"])
        deadline = trio.current_time() + min(max(request["wait_ms"], 0), limits.pull_wait_ms_max) / 1000
        while True:
            response = {"batches": [], "handles": [], "cursors": [], "next_visible_ms": 0}
            for queue in queues:
                if len(response["handles"]) < wanted:
                    await self._pop_queue(group, consumer_group, topic, queue, chosen, invisible_ms,
                                          wanted - len(response["handles"]), attempts_max, request["fifo"], response)
            wake_s = deadline - trio.current_time()
            if response["handles"] or wake_s <= 0:
                return response
            if response["next_visible_ms"]:
                wake_s = min(wake_s, max(limits.pop_wake_s_min, response["next_visible_ms"] / 1000 - self.clock.wall_s()))
            await self.store.reads.wait_for_data(
                {(topic, entry["queue"]): entry["offset"] for entry in response["cursors"]}, wake_s)

    async def _pop_queue(self, group: int, consumer_group: str, topic: str, queue: int, chosen, invisible_ms: int,
                         wanted: int, attempts_max: int, fifo: bool, response: dict) -> None:
        """Expired messages again (or to the dead letters), then new ones. FIFO: nothing while a message
        is in flight, and nothing new until those that expired were handed out again, in order."""
        key = (consumer_group, topic, queue)
        lock = self._pop_locks.setdefault(key, trio.Lock())
        try:
            async with lock:
                now_ms = self.clock.wall_ms()
                state = self.store.reads.pop_state(*key)
                again = []
                for offset, (visible_ms, attempt) in sorted(state.in_flight.items()):
                    if visible_ms > now_ms:
                        response["next_visible_ms"] = min(response["next_visible_ms"] or visible_ms, visible_ms)
                    elif attempt >= attempts_max:
                        await self._dead_letter(group, key, offset, attempt, visible_ms, now_ms)
                    elif len(again) < wanted:
                        again.append([offset, attempt, visible_ms])
                if fifo and any(visible_ms > now_ms for visible_ms, _ in state.in_flight.values()):
                    again = []  # the queue waits for its messages in flight, which come back in order
                new, next_cursor, batches = [], state.cursor, {}
                blocked = fifo and state.in_flight
                if not blocked:
                    new, next_cursor, batches = await self._new_for_pop(topic, queue, state.cursor,
                                                                        wanted - len(again), chosen)
                # A receive with nothing waits for new messages past the cursor, or, on a queue held by what is
                # in flight, for a change to it (an ack wakes waiting readers) or new messages past the end.
                wait_from = self.store.reads.queue_stats(topic, queue)["next_offset"] if blocked else next_cursor
                response["cursors"].append({"queue": queue, "offset": wait_from})
                if not again and next_cursor == state.cursor:
                    return
                handed = await self.host.propose(group, encode_pop({
                    "op": "pop", "consumer_group": consumer_group, "topic": topic, "queue": queue,
                    "cursor": state.cursor, "next": next_cursor, "new": new, "again": again,
                    "visible_at_ms": now_ms + invisible_ms}), limits.storage_append_wait_s_max)
            if handed is False:  # the state moved on under a leader change: the next receive tries again
                return
            for offset, _, _ in again:
                found, _ = await self.reads.read_queue(topic, queue, offset, 1, True, ALL_TAGS)
                batches.update(found)
            served = sorted(batches.items())
            self.store.count_read(topic, queue, served, messages=len(handed))
            response["batches"].extend({"queue": queue, "base_offset": base_offset, "batch": batch}
                                       for base_offset, batch in served)
            response["handles"].extend({"queue": queue, "offset": offset, "attempt": attempt,
                                        "visible_at_ms": now_ms + invisible_ms} for offset, attempt in handed)
        finally:
            self._drop_pop_lock(key, lock)

    def _drop_pop_lock(self, key: tuple[str, str, int], lock: trio.Lock) -> None:
        if not lock.locked() and not lock.statistics().tasks_waiting:
            self._pop_locks.pop(key, None)  # locks are kept for queues being received from only

    async def _new_for_pop(self, topic: str, queue: int, cursor: int, wanted: int, chosen
                           ) -> tuple[list[int], int, dict]:
        """Up to wanted offsets from cursor whose messages the filter matches, where the cursor moves to
        (past what the filter skipped), and the batches holding them."""
        if wanted <= 0:
            return [], cursor, {}
        tag_mask = ALL_TAGS if chosen.tag_mask is None else chosen.tag_mask
        found, scanned_to = await self.reads.read_queue(topic, queue, cursor, limits.read_bytes_max, True, tag_mask)
        new: list[int] = []
        batches = {}
        every_message = chosen.tag_mask is None and not isinstance(chosen, SqlFilter)  # no need to decode
        for base_offset, batch in found:
            messages = None if every_message else batch_codec.readable(batch, base_offset)
            if messages is None:  # every message, or a batch no filter can read: its receiver dead-letters it
                start = max(cursor, base_offset)
                end = min(base_offset + peek_count(batch), start + wanted - len(new))
                new.extend(range(start, end))
                batches[base_offset] = batch
                if len(new) >= wanted:
                    return new, end, batches
                continue
            for message in messages:
                if message.offset < cursor:
                    continue
                if len(new) >= wanted:
                    return new, message.offset, batches
                if chosen.matches(message):
                    new.append(message.offset)
                    batches[base_offset] = batch
        return new, scanned_to, batches

    async def _dead_letter(self, group: int, key: tuple[str, str, int], offset: int, attempt: int, visible_ms: int,
                           now_ms: int) -> bool:
        """A message that used up its attempts (or that its consumer gave up on) goes to the group's dead-letter
        queue, with its attempts; False if its state moved on meanwhile."""
        consumer_group, topic, queue = key
        [(base_offset, batch)], _ = await self.reads.read_queue(topic, queue, offset, 1, True, ALL_TAGS)
        try:
            message = batch_codec.decode(batch, base_offset, queue)[offset - base_offset]
        except RocketError as error:  # it goes as an empty message that says why; its bytes stay where they are
            if error.code != Code.BAD_BATCH:
                raise
            message = Message(b"", properties={"DLQ_MALFORMED": error.message[:limits.error_excerpt_chars_max]}, timestamp_ms=now_ms)
        message.properties = {**message.properties, "DLQ_ORIGIN_QUEUE": str(queue), "DLQ_ORIGIN_OFFSET": str(offset),
                              "DLQ_ATTEMPTS": str(attempt)}
        return bool(await self.host.propose(group, encode_pop({
            "op": "dead", "consumer_group": consumer_group, "topic": topic, "queue": queue, "offset": offset,
            "attempt": attempt, "visible_ms": visible_ms, "now_ms": now_ms}, batch_codec.encode([message], now_ms)),
            limits.storage_append_wait_s_max))

    async def bury(self, request: dict) -> dict:
        """A batch a consumer gave up on, appended to the group's dead letters beside the queue as it is."""
        group = request["group"]
        self.gate.hosted(group)
        self.gate.positions([{"queue": request["queue"], "offset": 0}], "offset")
        await self.host.propose(group, encode_pop({
            "op": "bury", "consumer_group": check_group_name(request["consumer_group"]),
            "topic": check_topic_name(request["topic"]), "queue": request["queue"], "now_ms": self.clock.wall_ms()},
            bytes(request["batch"])), limits.storage_append_wait_s_max)
        return {}

    async def receipt(self, request: dict) -> dict:
        """Ack received messages (invisible_ms -1), or make them visible again after invisible_ms: one
        conditional command per queue, proposed together; or (dead) move them to the dead-letter queue.
        Answers the receipts that were stale."""
        group = request["group"]
        self.gate.hosted(group)
        consumer_group = check_group_name(request["consumer_group"])
        topic = check_topic_name(request["topic"])
        by_queue: dict[int, list[list[int]]] = {}
        for receipt in request["receipts"]:
            self.gate.positions([receipt], "offset")
            by_queue.setdefault(receipt["queue"], []).append([receipt["offset"], receipt["attempt"]])
        if request["dead"]:
            self.gate.leads(group)  # the in-flight state read here must be the group's latest
            return {"stale": await self._dead_letters(group, consumer_group, topic, by_queue)}
        stale: list[dict] = []

        async def one_queue(queue: int, receipts: list[list[int]]) -> None:
            command = {"op": "ack", "consumer_group": consumer_group, "topic": topic, "queue": queue, "receipts": receipts}
            if request["invisible_ms"] >= 0:
                invisible_ms = min(request["invisible_ms"], limits.pop_invisible_s_max * 1000)
                command.update(op="change", visible_at_ms=self.clock.wall_ms() + invisible_ms)
            current = await self.host.propose(group, encode_pop(command))
            stale.extend({"queue": queue, "offset": offset, "attempt": attempt}
                         for (offset, attempt), ok in zip(receipts, current) if not ok)

        async with trio.open_nursery() as nursery:
            for queue, receipts in by_queue.items():
                nursery.start_soon(one_queue, queue, receipts)
        return {"stale": stale}

    async def _dead_letters(self, group: int, consumer_group: str, topic: str, by_queue: dict[int, list[list[int]]]
                            ) -> list[dict]:
        """Move each received message (offset, attempt) to the dead-letter queue, under its queue's pop lock;
        returns those whose receipt was stale."""
        stale = []
        for queue, receipts in by_queue.items():
            key = (consumer_group, topic, queue)
            lock = self._pop_locks.setdefault(key, trio.Lock())
            try:
                async with lock:
                    for offset, attempt in receipts:
                        found = self.store.reads.pop_state(*key).in_flight.get(offset)
                        if found is None or found[1] != attempt or not await self._dead_letter(
                                group, key, offset, attempt, found[0], self.clock.wall_ms()):
                            stale.append({"queue": queue, "offset": offset, "attempt": attempt})
            finally:
                self._drop_pop_lock(key, lock)
        return stale
