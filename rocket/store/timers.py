"""The store's timers: which are due, the deliveries to propose for them, and the messages they hold (decoded
batches kept in a bounded cache). A part of Store (StoreTimers), over the machine's next due times and the index.
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from typing import TYPE_CHECKING

import msgspec

from rocket import limits
from rocket.errors import Code, RocketError
from rocket.model import Message, timer_topic
from rocket.serde import batch as batch_codec
from rocket.store.machine import NEVER_MS, StorageMachine
from rocket.store.values import IndexEntry, Timer

if TYPE_CHECKING:
    from rocket.store.queue_index import QueueIndex


def _batches_of(messages: list[Message]):
    """Messages cut into lists that each encode as one batch of about a producer's batch size."""
    chunk: list[Message] = []
    size = 0
    for message in messages:
        message_bytes = 64 + len(message.body) + len(message.key) + len(message.tag) + sum(
            len(name) + len(value) + 2 for name, value in message.properties.items())
        if chunk and (size + message_bytes > limits.producer_batch_bytes_default
                      or len(chunk) >= limits.batch_messages_max):
            yield chunk
            chunk, size = [], 0
        chunk.append(message)
        size += message_bytes
    if chunk:
        yield chunk


class StoreTimers:
    """Timers and half messages over the machine's next due times and the index; read(topic, queue, offset,
    max_bytes) is the store's, for the batches that hold their messages."""

    def __init__(self, machine: StorageMachine, index: QueueIndex,
                 read: Callable[[str, int, int, int], list[tuple[int, bytes]]]):
        self.machine = machine
        self.index = index
        self.read = read
        # (topic, queue, base offset) -> (batch bytes, its messages): the most recent, up to
        # limits.timer_batches_cached_bytes_max (_timer_batch)
        self._timer_batches: collections.OrderedDict[tuple[str, int, int], tuple[int, list[Message]]] = \
            collections.OrderedDict()
        self._timer_batches_bytes = 0

    def due_timers(self, group: int, now_ms: int, limit: int, halves: bool = False) -> list[Timer]:
        """The group's pending timers (or half messages to check back) due by now_ms, earliest first (at
        most limit)."""
        start_ms = self.machine.next_due.get((group, halves), NEVER_MS)
        if start_ms > now_ms:
            return []
        due = self.index.timers(group, start_ms, now_ms, limit, halves)
        upcoming = due or self.index.timers(group, start_ms, limit=1, halves=halves)
        self.machine.next_due[(group, halves)] = upcoming[0].deliver_at_ms if upcoming else NEVER_MS
        return due

    def due_deliveries(self, group: int, now_ms: int) -> list[tuple[str, int, list[int], bytes]]:
        """The group's timers due by now_ms (at most limits.timer_fire_messages_max) as deliveries to
        propose as fires: (topic, queue, timer offsets, batch). Each message is stamped with its
        delivery time, in batches of about a producer's batch size."""
        by_queue: dict[tuple[str, int], dict[int, int]] = {}
        for timer in self.due_timers(group, now_ms, limits.timer_fire_messages_max):
            by_queue.setdefault((timer.topic, timer.queue), {})[timer.offset] = timer.deliver_at_ms
        deliveries = []
        for (waiting, queue), wanted in by_queue.items():
            due: list[Message] = []
            for offset, deliver_at_ms in wanted.items():
                base_offset, messages = self._timer_batch(waiting, queue, offset)
                due.append(msgspec.structs.replace(messages[offset - base_offset], timestamp_ms=deliver_at_ms,
                                                  deliver_at_ms=0))
            due.sort(key=lambda message: (message.timestamp_ms, message.offset))
            topic = waiting[len(timer_topic("")):]
            deliveries.extend((topic, queue, [message.offset for message in chunk], batch_codec.encode(chunk, now_ms))
                              for chunk in _batches_of(due))
        return deliveries

    def pending_messages(self, source: str, queue: int, offsets: list[int]) -> list[Message]:
        """Messages of a system queue (half messages of a transaction), by offset."""
        found = []
        for offset in offsets:
            base_offset, messages = self._timer_batch(source, queue, offset)
            found.append(messages[offset - base_offset])
        return found

    def batch_entry(self, topic: str, queue: int, offset: int) -> IndexEntry:
        """Where the batch holding offset lies, its size, count and append time."""
        entries, _ = self.index.locate(topic, queue, offset, 1)
        if not entries or not entries[0].base_offset <= offset < entries[0].base_offset + entries[0].count:
            raise RocketError(Code.NOT_FOUND, f"{topic}/{queue} holds no message at offset {offset}")
        return entries[0]

    def _timer_batch(self, topic: str, queue: int, offset: int) -> tuple[int, list[Message]]:
        """The decoded batch holding a timer's message. Timers of one batch often fall due at different
        times, so decoded batches are kept (the most recent, up to limits.timer_batches_cached_bytes_max)."""
        cache = self._timer_batches
        key = (topic, queue, self.batch_entry(topic, queue, offset).base_offset)
        if key in cache:
            cache.move_to_end(key)
            return key[2], cache[key][1]
        [(base_offset, batch)] = self.read(topic, queue, offset, 1)
        messages = batch_codec.decode(batch, base_offset)
        cache[key] = (len(batch), messages)
        self._timer_batches_bytes += len(batch)
        while self._timer_batches_bytes > limits.timer_batches_cached_bytes_max and len(cache) > 1:
            self._timer_batches_bytes -= cache.popitem(last=False)[1][0]
        return base_offset, messages

    def next_timer_ms(self, leads) -> tuple[int, bool]:
        """The earliest time a timer of a group for which leads(group) holds may fall due (NEVER_MS: none), and
        whether any group has a timer at all."""
        pending = [(group, next_ms) for (group, halves), next_ms in self.machine.next_due.items()
                   if not halves and next_ms < NEVER_MS]
        return min((next_ms for group, next_ms in pending if leads(group)), default=NEVER_MS), bool(pending)

    def timer_groups(self, now_ms: int) -> list[int]:
        """Groups that may have timers due by now_ms."""
        return [group for (group, halves), next_ms in self.machine.next_due.items() if not halves and next_ms <= now_ms]

    def pending_timers(self, group: int, halves: bool = False) -> int:
        return len(self.index.timers(group, halves=halves))
