"""Transactions on a group's leader: half messages are committed (moved into their topic) or rolled back, and the
ones whose producers did not say are listed for check-back. A part of StorageRole.
"""

from __future__ import annotations

import logging

from rocket import limits
from rocket.clock import Clock
from rocket.config import NodeConfig
from rocket.errors import Code, RocketError
from rocket.model import check_topic_name, half_topic, unresolved_topic
from rocket.replication import Engine
from rocket.roles.storage.gate import Gate
from rocket.roles.storage.stamps import AppendStamps
from rocket.serde import batch as batch_codec
from rocket.store.commands import encode_cancel, encode_move, encode_rearm
from rocket.store.store import Store

log = logging.getLogger("rocket.storage")


class Transactions:
    def __init__(self, store: Store, host: Engine, gate: Gate, stamps: AppendStamps, clock: Clock,
                 config: NodeConfig):
        self.store = store
        self.host = host
        self.gate = gate
        self.stamps = stamps
        self.clock = clock
        self.config = config

    async def end_transaction(self, request: dict) -> dict:
        """Commit: the half messages are appended to their queue, once; roll back: they are dropped."""
        group = request["group"]
        self.gate.hosted(group)
        topic = check_topic_name(request["topic"])
        queue, offset = next(iter(self.gate.positions([request], "offset").items()))
        if not 1 <= request["count"] <= limits.batch_messages_max:
            raise RocketError(Code.BAD_REQUEST, f"a transaction holds 1..{limits.batch_messages_max} messages")
        offsets = list(range(offset, offset + request["count"]))
        if request["commit"]:
            try:
                messages = self.store.timers.pending_messages(half_topic(topic), queue, offsets)
            except RocketError:  # never there: answered below like a second commit
                messages = []
            done = bool(messages) and bool(await self.host.propose(group, encode_move(
                topic, queue, self.stamps.stamp(topic, queue), half_topic(topic), offsets,
                batch_codec.encode(messages, self.clock.wall_ms())), limits.storage_append_wait_s_max))
        else:
            done = await self.host.propose(group, encode_cancel(half_topic(topic), queue, offsets))
        if not done:
            raise RocketError(Code.NOT_FOUND, f"no open transaction {queue}.{offset}+{request['count']} on "
                              f"{topic!r}: it was committed, rolled back or set aside as unresolved")
        return {}

    async def transaction_checks(self, request: dict) -> dict:
        """Open transactions of the topic's queues due for a check back: each is rescheduled by one check
        interval and counted as it is handed out (a conditional command, so only one asker gets it), or,
        checked transaction_checks_max times already, set aside in the unresolved queue."""
        group = request["group"]
        self.gate.leads(group)
        topic = check_topic_name(request["topic"])
        queues = set(self.gate.positions([{"queue": queue, "offset": 0} for queue in request["queues"]], "offset"))
        now_ms = self.clock.wall_ms()
        waiting = half_topic(topic)
        transactions: dict[tuple[int, int], list] = {}  # (queue, first half offset) -> due ms, checks, offsets
        for timer in self.store.timers.due_timers(group, now_ms, limits.timer_fire_messages_max, halves=True):
            if timer.topic == waiting and timer.queue in queues:
                base_offset = self.store.timers.batch_entry(waiting, timer.queue, timer.offset).base_offset
                transactions.setdefault((timer.queue, base_offset), [timer.deliver_at_ms, timer.checks, []])[2].append(
                    timer.offset)
        checks = []
        for (queue, base_offset), (due_ms, checked, offsets) in transactions.items():
            batch = batch_codec.encode(self.store.timers.pending_messages(waiting, queue, offsets), now_ms)
            if checked >= self.config.transaction_checks_max:
                await self.host.propose(group, encode_move(unresolved_topic(topic), queue, now_ms, waiting, offsets,
                                                           batch))
                log.warning("transaction %d.%d on %s is unresolved after %d checks", queue, base_offset, topic, checked)
                continue
            next_ms = now_ms + int(self.config.transaction_check_s * 1000)
            if await self.host.propose(group, encode_rearm(waiting, queue, offsets, due_ms, next_ms, checked + 1)):
                checks.append({"topic": topic, "queue": queue, "offset": offsets[0], "count": len(offsets),
                               "batch": batch})
        return {"checks": checks}
