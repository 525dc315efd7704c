"""Delay messages on a group's leader: due timers are proposed as moves into their topic, and timers are cancelled.
A part of StorageRole.
"""

from __future__ import annotations

import logging
import math

import trio

from rocket import limits
from rocket.clock import Clock
from rocket.errors import Code, RocketError
from rocket.model import check_topic_name, timer_topic
from rocket.replication import Engine
from rocket.roles.storage.gate import Gate
from rocket.roles.storage.stamps import AppendStamps
from rocket.store.commands import encode_cancel, encode_move
from rocket.store.store import Store

log = logging.getLogger("rocket.storage")


class Timers:
    def __init__(self, store: Store, host: Engine, gate: Gate, stamps: AppendStamps, clock: Clock):
        self.store = store
        self.host = host
        self.gate = gate
        self.stamps = stamps
        self.clock = clock

    async def fire_forever(self) -> None:
        """On the groups this node leads, deliver due timers, at most every limits.timer_tick_s (their precision).
        Between passes the loop sleeps until the earliest timer of a group it leads falls due, or an apply sets one,
        or, while other groups hold timers, limits.idle_recheck_s passed (their leadership may come here)."""
        while True:
            await trio.sleep(limits.timer_tick_s)
            now_ms = self.clock.wall_ms()
            due_ms, any_timer = self.store.timers.next_timer_ms(self.host.leads)
            if due_ms > now_ms:
                self.store.timers_changed = changed = trio.Event()
                with trio.move_on_after(min((due_ms - now_ms) / 1000,
                                            limits.idle_recheck_s if any_timer else math.inf)):
                    await changed.wait()
                now_ms = self.clock.wall_ms()
            for group in self.store.timers.timer_groups(now_ms):
                if not self.host.leads(group):
                    continue
                try:
                    await self.fire_due(group, now_ms)
                except RocketError as error:  # lost leadership, or the proposal timed out: next round retries
                    log.info("group %d: delivering timers: %s", group, error)

    async def fire_due(self, group: int, now_ms: int) -> int:
        """Deliver the group's timers due by now_ms to their queues. A fire applies only if all its timers
        are still pending, so a repeat after a lost answer or a change of leader delivers nothing twice.
        Returns how many were delivered."""
        delivered = 0
        for topic, queue, offsets, batch in self.store.timers.due_deliveries(group, now_ms):
            fire = encode_move(topic, queue, self.stamps.stamp(topic, queue), timer_topic(topic), offsets, batch)
            if await self.host.propose(group, fire, limits.storage_append_wait_s_max):
                delivered += len(offsets)
        return delivered

    async def cancel_timer(self, request: dict) -> dict:
        self.gate.hosted(request["group"])
        check_topic_name(request["topic"])
        queue, offset = next(iter(self.gate.positions([request], "offset").items()))
        if not await self.host.propose(request["group"], encode_cancel(timer_topic(request["topic"]), queue, [offset])):
            raise RocketError(Code.NOT_FOUND, f"no pending timer {queue}.{offset} on topic {request['topic']!r}: "
                              "it was delivered or cancelled, or never existed")
        return {}
