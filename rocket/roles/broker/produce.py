"""Produce on the broker: a batch is checked (header, CRC, its records as readers decode them, the topic's message
type) and appended by its queue's storage group as it came; timers and transactions are ended there too.
"""

from __future__ import annotations

import functools
import itertools
import logging
import random
from collections.abc import AsyncIterator

import trio

from rocket import limits
from rocket.errors import Code, RocketError
from rocket.model import TopicSpec
from rocket.parked import Slot
from rocket.roles.broker.routes import Route, Routes, Turns, complete_later
from rocket.serde.batch import FLAG_TIMED, FLAG_TRANSACTION, WRITTEN_HERE, check_header, check_produced

log = logging.getLogger("rocket.broker")


def _check_message_type(spec: TopicSpec, flags: int) -> None:
    """A topic takes only sends of its type (RocketMQ 5's topic message type check)."""
    timed = bool(flags & FLAG_TIMED)
    if spec.message_type == "system":
        raise RocketError(Code.WRONG_MESSAGE_TYPE, f"{spec.name!r} is a system queue: only the system writes there "
                          "(rocket dlq resend sends dead letters to their topic again)")
    if bool(flags & FLAG_TRANSACTION) != (spec.message_type == "transaction"):
        raise RocketError(Code.WRONG_MESSAGE_TYPE, f"topic {spec.name!r} is a {spec.message_type} topic: "
                          "transactional (half) messages go to transaction topics, and only they")
    if timed and spec.message_type != "delay":
        raise RocketError(Code.WRONG_MESSAGE_TYPE, f"topic {spec.name!r} is a {spec.message_type} topic: messages "
                          "with a delivery time go to a delay topic")
    if not timed and spec.message_type == "delay":
        raise RocketError(Code.WRONG_MESSAGE_TYPE, f"topic {spec.name!r} is a delay topic: give each message a "
                          "delivery time")


class Produce:
    """Produce, and the calls on what was produced: timers cancelled, transactions ended and checked back.
    Produces to any queue (-1) stick to one queue until one of them is answered (_produce_queue), so that one
    group's Raft round carries the batches sent meanwhile."""

    def __init__(self, routes: Routes, turns: Turns, randomness: random.Random):
        self.routes = routes
        self.turns = turns
        # The producer the broker is for clients that number no batches (its gateways'), so that its own storage
        # retries store a batch once: a random id, and one sequence for all its batches (store/producers.py).
        self._producer_id = randomness.getrandbits(63) or 1
        self._sequences = itertools.count()

    async def produce(self, request: dict) -> dict:
        """Check the batch's header, CRC and records (decoded in C, then dropped: the batch goes on as it came) and
        send it to its group, numbered by its producer (or else by this broker), so that retries store it once."""
        route = await self.routes.route(request["topic"])
        queue, group, ticket = self._produce_queue(route, request["queue"], batch=request["batch"])
        try:
            return await self._append(route, queue, group, self._append_call(route.spec, request, queue, group))
        finally:
            if ticket is not None:
                self._move_on(route.spec.name, ticket)

    def produce_parked(self, request: dict, slot: Slot) -> None:
        """produce on the data plane: when the route is cached, the append is parked with the storage role in this
        process if this node leads the group, or sent without a task to the leader on another node over its open
        channel; slot completes when the leader's round applies it. An append that meets a leader change, a lost
        connection or no answer is sent again as a task, with the same producer sequence (Routes.storage's retries).
        Raises Unparked, before checking the batch, when the call must be a task from the start (no cached route,
        no known leader, or no open channel to it). A produce to any queue takes its turn only once it is parked: one
        Unparked leaves it untaken, for the task (produce) to take."""
        route = self.routes.cached(request["topic"])
        queue, group, ticket = self._produce_queue(route, request["queue"], take=False)  # taken once it is parked
        to = self.routes.parking(route, group, "StorageAppend")
        call = self._append_call(route.spec, request, queue, group)
        retryable = self.routes.retryable(route, group)

        def finish(outcome: object) -> None:
            if ticket is not None:
                self._move_on(route.spec.name, ticket)
            if isinstance(outcome, RocketError) and outcome.code in retryable:
                self.routes.start_soon(complete_later, slot, functools.partial(self._append, route, queue, group, call))
            elif isinstance(outcome, RocketError) and outcome.code == Code.UNKNOWN_TOPIC:
                self.routes.start_soon(complete_later, slot,
                                       functools.partial(self._append_elsewhere, route, queue, group, call))
            else:
                slot.complete(outcome)
        self.routes.park(to, "StorageAppend", call, Slot(finish), retryable)
        if ticket is not None:
            self._take_ticket(route.spec.name, request["batch"])

    async def _append(self, route: Route, queue: int, group: int, call: dict) -> dict:
        """StorageAppend on the queue's group, retried there (Routes.storage); and on the queue's new group when the
        old one refused the topic because it moved to another storage class (Routes.rerouted). A refused append was
        not stored (a batch it stored before gets its first answer), so it is stored once."""
        try:
            return await self.routes.storage(route, group, "StorageAppend", call)
        except RocketError as error:
            if error.code != Code.UNKNOWN_TOPIC:
                raise
        return await self._append_elsewhere(route, queue, group, call)

    async def _append_elsewhere(self, route: Route, queue: int, group: int, call: dict) -> dict:
        """StorageAppend on the queue's group once it is not group, which refused the topic (Routes.rerouted)."""
        route, group = await self.routes.rerouted(route, queue, group)
        return await self.routes.storage(route, group, "StorageAppend", {**call, "group": group})

    def _produce_queue(self, route: Route, queue: int, take: bool = True,
                       batch: bytes | memoryview = b"") -> tuple[int, int, int | None]:
        """The queue a produce goes to, its storage group, and, for any queue (-1), the ticket it took (unless take is
        False: the caller takes it once the call is parked), whose queue is the topic's sticky one.

        Produces to any queue stick to one queue until one of them is answered (or fails), or
        limits.produce_sticky_batches went there: Kafka's sticky partitioner (KIP-480). The batches sent meanwhile reach
        one storage group, whose next Raft round carries them together, where round robin spread them over as many
        groups, each paying a round's costs for one of them. One at a time, each answered before the next is sent, is
        round robin. A batch of limits.produce_sticky_bytes or more moves the next ones on at once: it fills a round
        alone, and such batches spread over the groups' leaders."""
        ticket = None
        if queue == -1:
            name = route.spec.name
            ticket = self._take_ticket(name, batch) if take else self.turns.peek(name)
            queue = ticket // limits.produce_sticky_batches % route.spec.queues
        return queue, route.queue_groups[self.routes.queue(route.spec, queue)], ticket

    def _move_on(self, topic: str, ticket: int) -> None:
        """The produce to any queue that took ticket was answered: the topic's next ones go to the next queue, unless
        they already do."""
        self.turns.move_on(topic, ticket, limits.produce_sticky_batches)

    def _take_ticket(self, topic: str, batch: bytes | memoryview) -> int:
        ticket = self.turns.take(topic)
        if len(batch) >= limits.produce_sticky_bytes:
            self._move_on(topic, ticket)
        return ticket

    def _append_call(self, spec: TopicSpec, request: dict, queue: int, group: int) -> dict:
        """The StorageAppend of a produce, its batch checked (its header alone, when encode() in this process wrote
        it: WRITTEN_HERE)."""
        batch = request["batch"]
        header = check_header(batch, crc=False) if request.get("records") is WRITTEN_HERE else check_produced(batch)
        _check_message_type(spec, header.flags)
        producer, sequence = request.get("producer_id", 0), request.get("sequence", 0)
        if not producer:
            producer, sequence = self._producer_id, next(self._sequences)
        elif producer < 0 or sequence < 0:
            raise RocketError(Code.BAD_REQUEST, f"producer_id and sequence are not negative: {producer}, {sequence}")
        return {"group": group, "topic": spec.name, "queue": queue, "batch": request["batch"], "producer_id": producer,
                "sequence": sequence}

    async def _on_queue(self, method: str, request: dict) -> dict:
        """A storage call on the group of the request's queue."""
        route = await self.routes.route(request["topic"])
        group = route.queue_groups[self.routes.queue(route.spec, request["queue"])]
        return await self.routes.storage(route, group, method, {**request, "group": group})

    async def cancel_timer(self, request: dict) -> dict:
        """Drop a delayed message that has not been delivered yet."""
        return await self._on_queue("StorageCancelTimer", request)

    async def end_transaction(self, request: dict) -> dict:
        return await self._on_queue("StorageEndTransaction", request)

    async def transaction_checks(self, request: dict) -> AsyncIterator[dict]:
        """Stream the topic's transactions due for a check back to the producer that asked, every
        limits.transaction_check_poll_s; each goes to one asker per check interval."""
        route = await self.routes.route(request["topic"])
        if route.spec.message_type != "transaction":
            raise RocketError(Code.WRONG_MESSAGE_TYPE, f"topic {route.spec.name!r} is not a transaction topic")
        while True:
            for group, queues in self.routes.by_group(route, range(route.spec.queues)).items():
                try:
                    found = await self.routes.storage(route, group, "StorageTransactionChecks",
                                                      {"group": group, "topic": route.spec.name, "queues": queues})
                except RocketError as error:  # a group without a leader now: the next round asks again
                    log.info("transaction checks of %s on group %d: %s", route.spec.name, group, error)
                    continue
                if found["checks"]:
                    yield found
            await trio.sleep(limits.transaction_check_poll_s)
            route = await self.routes.route(route.spec.name)
