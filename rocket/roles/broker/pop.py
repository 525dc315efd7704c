"""Pop (simple) consumption on the broker: receive hands out messages from every queue's storage group, and
receipts are acked, made visible again or dead-lettered where their queue is.
"""

from __future__ import annotations

import logging

import trio

from rocket import limits
from rocket.clock import Clock
from rocket.errors import Code, RocketError
from rocket.model import check_group_name
from rocket.serde.batch import check_produced
from rocket.roles.broker.admin import GroupSettings
from rocket.roles.broker.pull import Filters
from rocket.roles.broker.routes import Route, Routes, Turns

log = logging.getLogger("rocket.broker")


class PopConsumption:
    def __init__(self, routes: Routes, clock: Clock, turns: Turns, filters: Filters, settings: GroupSettings):
        self.routes = routes
        self.clock = clock
        self.turns = turns
        self.filters = filters
        self.settings = settings

    async def receive(self, request: dict) -> dict:
        """Pop consumption over all queues of the topic, storage group after storage group (starting at a
        different one each time, so receivers spread); waits up to wait_ms for messages. A topic whose queues lie in
        one storage group waits in that group's pop call, which returns the messages: one storage call. The group's
        settings in the metadata, when they set max attempts, override the request's (so every client and gateway
        gives up where the group says), and the response names them."""
        route = await self.routes.route(request["topic"])
        check_group_name(request["group"])
        settings = await self.settings.of(request["group"]) or {"max_attempts": 0, "retry_backoff_s": []}
        max_attempts = settings["max_attempts"] or request["max_attempts"]
        self.filters.of(request)  # a malformed filter is refused here, with its position
        groups = list(self.routes.by_group(route, range(route.spec.queues)).items())
        start = self.turns.take("%receive%" + route.spec.name) % len(groups)
        groups = groups[start:] + groups[:start]
        wanted = min(max(request["max_messages"], 1), limits.pop_messages_max)
        deadline = trio.current_time() + min(max(request["wait_ms"], 0), limits.pull_wait_ms_max) / 1000
        while True:
            fifo = route.spec.message_type == "fifo"
            response = {"batches": [], "handles": [], "cursors": [], "next_visible_ms": 0, "fifo": fifo,
                        "max_attempts": settings["max_attempts"], "retry_backoff_s": settings["retry_backoff_s"]}
            rerouted = False
            for group, queues in groups:
                if len(response["handles"]) >= wanted:
                    break
                wait_s = max(0.0, deadline - trio.current_time()) if len(groups) == 1 else 0.0
                try:
                    found = await self.routes.storage(route, group, "StoragePop", {
                        "group": group, "consumer_group": request["group"], "topic": route.spec.name,
                        "queues": queues, "max_messages": wanted - len(response["handles"]),
                        "invisible_ms": request["invisible_ms"], "wait_ms": int(wait_s * 1000),
                        "max_attempts": max_attempts, "filter_type": request["filter_type"],
                        "filter": request["filter"], "fifo": fifo}, timeout_s=wait_s + limits.storage_call_s_max)
                except RocketError as error:
                    if error.code != Code.UNKNOWN_TOPIC:
                        raise
                    route, _ = await self.routes.rerouted(route, queues[0], group)  # it moved to another class
                    groups, rerouted = list(self.routes.by_group(route, range(route.spec.queues)).items()), True
                    break
                for field in ("batches", "handles", "cursors"):
                    response[field].extend(found[field])
                if found["next_visible_ms"]:
                    response["next_visible_ms"] = min(response["next_visible_ms"] or found["next_visible_ms"],
                                                      found["next_visible_ms"])
            left_s = deadline - trio.current_time()
            if response["handles"] or left_s <= 0:
                return response
            if rerouted:
                continue
            if response["next_visible_ms"]:
                left_s = min(left_s, max(limits.pop_wake_s_min, response["next_visible_ms"] / 1000 - self.clock.wall_s()))
            await self._wait_for_data(route, {entry["queue"]: entry["offset"] for entry in response["cursors"]}, left_s)

    async def _wait_for_data(self, route: Route, positions: dict[int, int], wait_s: float) -> None:
        """Long-poll every group at once, reading nothing, on a replica in sync or read replica (Routes.replica_read);
        return when one of them has data, or after wait_s. A group that fails the poll ends the wait too: the caller
        pops again, and that reports the failure. (A pop that waits itself would hand out messages even when its
        answer is dropped, as a cancelled one's is.)"""
        async def wait_on(group: int, queues: list[int], done: trio.CancelScope) -> None:
            try:
                await self.routes.replica_read(route, group, {
                    "group": group, "topic": route.spec.name, "wait_ms": int(wait_s * 1000), "max_bytes": 0,
                    "at_least_one": False, "any_replica": False, "follower_ok": False, "tag_mask": -1,
                    "queues": [{"queue": queue, "offset": positions[queue]} for queue in queues]},
                    timeout_s=wait_s + limits.storage_call_s_max)
            except RocketError as error:
                log.info("long poll of %s on group %d: %s", route.spec.name, group, error)
            done.cancel()

        with trio.move_on_after(wait_s + 1):
            async with trio.open_nursery() as nursery:
                for group, queues in self.routes.by_group(route, positions).items():
                    nursery.start_soon(wait_on, group, queues, nursery.cancel_scope)

    async def ack(self, request: dict) -> dict:
        return await self._receipt({**request, "invisible_ms": -1})

    async def change_invisible(self, request: dict) -> dict:
        """Make a received message visible again after invisible_ms (0: at once, for a retry now)."""
        if request["invisible_ms"] < 0:
            raise RocketError(Code.BAD_REQUEST, f"invisible_ms {request['invisible_ms']} is negative")
        return await self._receipt(request)

    async def dead_letter(self, request: dict) -> dict:
        """Move received messages to the group's dead-letter queue now, whatever their attempts (RocketMQ's
        ForwardMessageToDeadLetterQueue); answers the receipts that were stale."""
        return await self._receipt({**request, "invisible_ms": -1}, dead=True)

    async def bury(self, request: dict) -> dict:
        """Put a batch of messages a consumer gave up on in the group's dead letters beside the topic's queue, as
        they are (the remoting gateway's retries past maxReconsumeTimes: those messages were never popped)."""
        route = await self.routes.route(request["topic"])
        consumer_group = check_group_name(request["group"])
        check_produced(request["batch"])
        group = route.queue_groups[self.routes.queue(route.spec, request["queue"])]
        await self.routes.storage(route, group, "StorageBury", {"group": group, "consumer_group": consumer_group,
                                                          "topic": route.spec.name, "queue": request["queue"],
                                                          "batch": request["batch"]})
        return {}

    async def _receipt(self, request: dict, dead: bool = False) -> dict:
        """On each storage group of the receipts' queues."""
        route = await self.routes.route(request["topic"])
        consumer_group = check_group_name(request["group"])
        by_group: dict[int, list[dict]] = {}
        for receipt in request["receipts"]:
            by_group.setdefault(route.queue_groups[self.routes.queue(route.spec, receipt["queue"])], []).append(receipt)
        stale = []
        for group, receipts in by_group.items():
            response = await self.routes.storage(route, group, "StorageReceipt", {
                **request, "group": group, "consumer_group": consumer_group, "receipts": receipts, "dead": dead})
            stale.extend(response["stale"])
        return {"stale": stale}
