"""Pull consumption on the broker: batches past the client's positions within a byte budget, from any replica in
sync, filtered by tag summary on storage and by SQL here; a long poll waits on storage for data.
"""

from __future__ import annotations

import logging
import math
from collections.abc import AsyncIterator

import trio

from rocket import limits
from rocket.errors import Code, RocketError
from rocket.filter import Filter, SqlFilter, compile_filter
from rocket.model import ID_PROPERTY, KEYS_PROPERTY, Message, ReadBudget
from rocket.roles.broker.routes import Route, Routes
from rocket.serde import batch as batch_codec

log = logging.getLogger("rocket.broker")


def _may_match(chosen: SqlFilter, batch: bytes) -> bool:
    """Whether a message of the batch matches; a batch that cannot be read goes to the client, whose poll names
    it (BAD_BATCH with its offsets) and can step past it, where failing the pull would stop every queue."""
    messages = batch_codec.readable(batch)
    return messages is None or any(chosen.matches(message) for message in messages)


def _has_key(message: Message, key: str, message_id: bool) -> bool:
    """Whether the message was sent with the key (rocket's key, or one of its RocketMQ keys) or, with message_id,
    with the key as the client's message id."""
    properties = message.properties
    if message_id:
        return properties.get(ID_PROPERTY) == key
    return message.key == key or key in properties.get(KEYS_PROPERTY, "").split(" ")


class Filters:
    """Consumers' filters, compiled once per expression: the most recent limits.filters_cached_max."""

    def __init__(self) -> None:
        self._compiled: dict[tuple[str, str], Filter] = {}

    def of(self, request: dict) -> Filter:
        """The request's filter (filter_type, filter); BAD_FILTER names where it does not parse."""
        key = (request["filter_type"], request["filter"])
        found = self._compiled.get(key)
        if found is None:
            found = compile_filter(*key)
            if len(self._compiled) >= limits.filters_cached_max:
                del self._compiled[next(iter(self._compiled))]
            self._compiled[key] = found
        return found


class Pull:
    def __init__(self, routes: Routes, filters: Filters):
        self.routes = routes
        self.filters = filters

    async def _pull_positions(self, request: dict) -> tuple[Route, dict[int, int]]:
        route = await self.routes.route(request["topic"])
        positions = self.routes.offsets(route, request["queues"])
        if not positions:
            raise RocketError(Code.BAD_REQUEST, "pull needs at least one queue")
        return route, positions

    async def _read(self, route: Route, positions: dict[int, int], max_bytes: int, replicas: bool = True,
                    tag_mask: int = -1) -> dict:
        """Read group after group with what is left of the byte budget, so a response fits a frame;
        from any replica in sync or read replica (Routes.replica_read), or from the leaders alone."""
        batches: list[dict] = []
        next_offsets: list[dict] = []
        budget = ReadBudget(max_bytes)
        for group, queues in self.routes.by_group(route, positions).items():
            wanted = [{"queue": queue, "offset": positions[queue]} for queue in queues]
            if budget.spent:
                next_offsets.extend(wanted)
                continue
            request = {"group": group, "topic": route.spec.name, "queues": wanted, "max_bytes": budget.bytes_left,
                       "wait_ms": 0, "at_least_one": budget.first, "any_replica": False, "follower_ok": False,
                       "tag_mask": tag_mask}
            if replicas:
                response = await self.routes.replica_read(route, group, request)
            else:
                response = await self.routes.storage(route, group, "StorageRead", request)
            batches.extend(response["batches"])
            for found in response["batches"]:
                budget.take(len(found["batch"]))  # storage kept to what was left of the budget
            next_offsets.extend(response["next_offsets"])
        return {"batches": batches, "next_offsets": next_offsets}

    async def _long_poll(self, route: Route, positions: dict[int, int], max_bytes: int, tag_mask: int,
                         wait_s: float) -> dict:
        """One storage call per group, all at once, each to a replica in sync or read replica as Routes.replica_read
        chooses (else the leader): each reads, waits up to wait_s if it found nothing, and reads again. The first
        group that answers ends the others' waits; the answer is its batches (within max_bytes), with every other
        queue where it was or where its group's read skipped to. One that answers without batches ends them too: its
        wait woke for a change other than data (a pop or ack there), and it no longer waits, so the caller reads and
        waits again; so does one that fails: the caller's next read reports the failure."""
        answers: list[dict] = []
        found: list[dict] = []
        # (Rounded up: the last fraction of a millisecond, rounded down to 0, made the pull loop read without waiting
        # until its deadline passed, a dozen times under load.)

        async def poll(group: int, queues: list[int], done: trio.CancelScope) -> None:
            try:
                answer = await self.routes.replica_read(route, group, {
                    "group": group, "topic": route.spec.name, "wait_ms": math.ceil(wait_s * 1000), "max_bytes": max_bytes,
                    "at_least_one": True, "any_replica": False, "follower_ok": False, "tag_mask": tag_mask,
                    "queues": [{"queue": queue, "offset": positions[queue]} for queue in queues]},
                    timeout_s=wait_s + limits.storage_call_s_max)
            except RocketError as error:
                log.info("long poll of %s on group %d: %s", route.spec.name, group, error)
                done.cancel()
                return
            answers.append(answer)
            if answer["batches"]:
                found.append(answer)
            done.cancel()  # with batches, or none: its wait woke for another change (a pop moved a cursor there)

        with trio.move_on_after(wait_s + limits.storage_call_s_max):
            async with trio.open_nursery() as nursery:
                for group, queues in self.routes.by_group(route, positions).items():
                    nursery.start_soon(poll, group, queues, nursery.cancel_scope)
        winner = found[0] if found else None
        moved = dict(positions)
        for answer in answers:
            if answer is winner or not answer["batches"]:
                moved.update((entry["queue"], entry["offset"]) for entry in answer["next_offsets"])
        return {"batches": winner["batches"] if winner else [],
                "next_offsets": [{"queue": queue, "offset": offset} for queue, offset in moved.items()]}

    async def _read_filtered(self, route: Route, positions: dict[int, int], max_bytes: int, chosen: Filter,
                             wait_s: float = 0.0, leaders_if_empty: bool = True) -> dict:
        """The batches that may hold a match: storage skips batches by their tag summary unread; an SQL filter
        decodes the rest here and keeps the batches with a match. Clients filter the messages of the batches they
        get. Read from any replica in sync (and, if that finds nothing and leaders_if_empty, from the leaders: a
        replica may lag), or with wait_s, long-polled on the leaders."""
        tag_mask = -1 if chosen.tag_mask is None else chosen.tag_mask - 2**64 * (chosen.tag_mask >= 2**63)
        if wait_s > 0:
            response = await self._long_poll(route, positions, max_bytes, tag_mask, wait_s)
        else:
            response = await self._read(route, positions, max_bytes, tag_mask=tag_mask)
            if not response["batches"] and leaders_if_empty:
                response = await self._read(route, positions, max_bytes, replicas=False, tag_mask=tag_mask)
        if isinstance(chosen, SqlFilter):
            response["batches"] = [stored for stored in response["batches"] if _may_match(chosen, stored["batch"])]
        return response

    async def pull(self, request: dict) -> dict:
        """Batches past the positions that may hold messages the filter matches. With wait_ms, a read that finds
        none is followed by long polls (one storage call per group, which waits and returns data) until some
        match or the time is up, reading on past batches the filter skipped."""
        route, positions = await self._pull_positions(request)
        chosen = self.filters.of(request)
        max_bytes = max(1, min(request["max_bytes"], limits.read_bytes_max))
        deadline = trio.current_time() + min(max(request["wait_ms"], 0), limits.pull_wait_ms_max) / 1000
        response = await self._read_filtered(route, positions, max_bytes, chosen,
                                             leaders_if_empty=trio.current_time() >= deadline)
        while not response["batches"] and trio.current_time() < deadline:
            positions = {entry["queue"]: entry["offset"] for entry in response["next_offsets"]}
            response = await self._read_filtered(route, positions, max_bytes, chosen, deadline - trio.current_time())
        return response

    async def subscribe(self, request: dict) -> AsyncIterator[dict]:
        """Stream pull responses as data arrives, each continuing where the previous ended."""
        route, positions = await self._pull_positions(request)
        chosen = self.filters.of(request)
        max_bytes = max(1, min(request["max_bytes"], limits.read_bytes_max))
        wait_s = 0.0
        while True:
            response = await self._read_filtered(route, positions, max_bytes, chosen, wait_s, leaders_if_empty=False)
            positions = {entry["queue"]: entry["offset"] for entry in response["next_offsets"]}
            if response["batches"]:
                yield response
            wait_s = 0.0 if response["batches"] else limits.pull_wait_ms_max / 1000

    async def find_messages(self, request: dict) -> dict:
        """FindMessages: the messages of the queues asked (all, if none) sent with a key, or a client's message id,
        and stored in a time range, at most limit of them in queue order. Each queue's leader names the batches its
        key index says may hold one (and those not indexed yet), a call per limits.find_batches_max of them;
        their messages are matched here."""
        route = await self.routes.route(request["topic"])
        queues = request["queues"] or list(range(route.spec.queues))
        positions = self.routes.offsets(route, [{"queue": queue, "offset": 0} for queue in queues])
        limit = max(0, min(request["limit"], limits.find_messages_max))
        key, message_id = request["key"], request["message_id"]
        if not key:
            raise RocketError(Code.BAD_REQUEST, "give the key (or the message id) to find")
        batches: list[dict] = []
        offsets: list[dict] = []
        budget = ReadBudget(limits.read_bytes_max)
        read = 0
        group_of = {queue: group for group, held in self.routes.by_group(route, positions).items() for queue in held}
        for queue in sorted(group_of):
            group = group_of[queue]
            after, done = -1, False
            while not done and len(offsets) < limit and not budget.spent:
                answer = await self.routes.storage(route, group, "StorageFindKey", {
                    "group": group, "topic": route.spec.name, "queue": queue, "key": key,
                    "message_id": message_id, "start_ms": request["start_ms"], "end_ms": request["end_ms"],
                    "after": after, "max_bytes": budget.bytes_left})
                after, done = answer["next_offset"], answer["done"]
                for stored in answer["batches"]:
                    read += 1
                    found = [message.offset for message in batch_codec.readable(
                        stored["batch"], stored["base_offset"], queue) or () if _has_key(message, key, message_id)]
                    found = found[:limit - len(offsets)]
                    if found and budget.take(len(stored["batch"])):
                        batches.append(stored)
                        offsets.extend({"queue": queue, "offset": offset} for offset in found)
        return {"batches": batches, "offsets": offsets, "batches_read": read}

