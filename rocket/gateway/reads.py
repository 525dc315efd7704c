"""What the gateways read alike through the broker's methods: topics (TopicCache), one queue's pulled messages past
an offset that match a filter, and one queue's offsets."""

from __future__ import annotations

import struct

from rocket import limits
from rocket.clock import Clock
from rocket.errors import Code, RocketError
from rocket.filter import Filter
from rocket.model import KV_PREFIX, Message
from rocket.serde import batch as batch_codec
from rocket.transport.rpc import Dispatcher


class TopicCache:
    """Topics' TopicInfo, each read at most every limits.gateway_topic_cache_s; a KV bucket is no topic here."""

    def __init__(self, dispatcher: Dispatcher, clock: Clock):
        self.dispatcher = dispatcher
        self.clock = clock
        self._topics: dict[str, tuple[float, dict]] = {}  # name -> (read at, topic), oldest first

    async def get(self, name: str) -> dict:
        now = self.clock.now_s()
        found = self._topics.get(name)
        if found is not None and now - found[0] < limits.gateway_topic_cache_s:
            return found[1]
        if not name or name.startswith(KV_PREFIX):
            raise RocketError(Code.UNKNOWN_TOPIC, f"no topic {name!r}")
        if self.dispatcher.serves("GetRoute"):  # a nameserver here: no storage call needed
            topic = (await self.dispatcher.local("GetRoute", {"topic": name}))["topic"]
        else:
            topic = (await self.dispatcher.local("DescribeTopic", {"topic": name}))["topic"]
        if topic["message_type"] == "kv":
            raise RocketError(Code.UNKNOWN_TOPIC, f"{name!r} is a KV bucket, not a topic")
        self._topics.pop(name, None)
        while len(self._topics) >= limits.gateway_topic_cache_entries_max:
            del self._topics[next(iter(self._topics))]
        self._topics[name] = (now, topic)
        return topic

    def forget(self, name: str) -> None:
        """Read the topic anew next time: it was created or changed."""
        self._topics.pop(name, None)


def matching(response: dict, queue: int, offset: int, chosen: Filter, count_max: int) -> tuple[list[Message], int]:
    """The pulled messages from offset on that match (a pull returns whole batches that may), count_max at most,
    and the offset after them: the first message not sent when the count cut it short."""
    next_offset = next((entry["offset"] for entry in response["next_offsets"] if entry["queue"] == queue), offset)
    found: list[Message] = []
    for stored in response["batches"]:
        for message in _decoded(stored, queue):
            if message.offset < offset:
                continue
            if len(found) >= count_max:
                return found, message.offset
            if chosen.matches(message):
                found.append(message)
    return found, next_offset


def _decoded(stored: dict, queue: int) -> list[Message]:
    """A pulled batch's messages, or BAD_BATCH naming the queue and the offsets of a batch that cannot be read."""
    try:
        return batch_codec.decode(stored["batch"], stored["base_offset"], queue)
    except RocketError as error:
        if error.code != Code.BAD_BATCH:
            raise
        base = stored["base_offset"]
        try:
            offsets = f"offsets {base}-{base + batch_codec.peek_count(stored['batch']) - 1}"
        except struct.error:  # not even a header: where it starts
            offsets = f"offset {base}"
        raise RocketError(Code.BAD_BATCH, f"queue {queue}, {offsets}: {error.message}") from None


async def queue_info(dispatcher: Dispatcher, topic: str, queue: int) -> dict:
    """The queue's QueueInfo: min_offset, next_offset, bytes."""
    described = await dispatcher.local("DescribeTopic", {"topic": topic})
    for info in described["queues"]:
        if info["queue"] == queue:
            return info
    raise RocketError(Code.BAD_QUEUE, f"topic {topic!r} has no queue {queue}")
