"""What the remoting gateway's parts share: the dispatcher they call the broker's methods through, the cluster's name,
the topic cache, the lookups of queues and messages, and the nursery of the gateway's own tasks."""

from __future__ import annotations

import trio

from rocket import limits
from rocket.clock import Clock
from rocket.errors import Code, RocketError
from rocket.gateway.reads import TopicCache, queue_info
from rocket.gateway.remoting import messages as layout
from rocket.model import Message
from rocket.serde import batch as batch_codec
from rocket.transport.guard import Caller
from rocket.transport.rpc import Dispatcher


class Bridge:
    def __init__(self, dispatcher: Dispatcher, clock: Clock, cluster: str):
        self.dispatcher = dispatcher
        self.clock = clock
        self.cluster = cluster  # the one broker name routes give: rocket's brokers are alike
        self.started_ms = clock.wall_ms()
        self.nursery: trio.Nursery | None = None  # the gateway's own tasks (RemotingGateway.run)
        self.topics = TopicCache(dispatcher, clock)
        # topic -> (read at, queue -> (min_offset, next_offset)), as many topics as the cache holds
        self._bounds: dict[str, tuple[float, dict[int, tuple[int, int]]]] = {}

    async def topic(self, name: str) -> dict:
        return await self.topics.get(name)

    def forget_topic(self, name: str) -> None:
        """Read the topic anew next time: it was created or changed here."""
        self.topics.forget(name)
        self._bounds.pop(name, None)

    async def queue_bounds(self, topic: str, queue: int) -> tuple[int, int] | None:
        """The queue's (min_offset, next_offset), read for all the topic's queues at once at most every
        limits.remoting_queue_bounds_s; None when they cannot be read now (a pull's answer does not wait for them)."""
        now = self.clock.now_s()
        found = self._bounds.get(topic)
        if found is None or now - found[0] >= limits.remoting_queue_bounds_s:
            try:
                described = await self.dispatcher.local("DescribeTopic", {"topic": topic})
            except RocketError:
                return found[1].get(queue) if found is not None else None
            self._bounds.pop(topic, None)
            while len(self._bounds) >= limits.gateway_topic_cache_entries_max:
                del self._bounds[next(iter(self._bounds))]
            found = self._bounds[topic] = (now, {info["queue"]: (info["min_offset"], info["next_offset"])
                                                 for info in described["queues"]})
        return found[1].get(queue)

    async def topic_by_hash(self, topic_hash: int, *named: str) -> str:
        """The topic a commitLogOffset names: one of the named ones if it hashes alike, else the first topic
        that does."""
        for name in named:
            if name and layout.topic_hash(name) == topic_hash:
                return name
        for topic in (await self.dispatcher.local("ListTopics", {}))["topics"]:
            if layout.topic_hash(topic["name"]) == topic_hash:
                return topic["name"]
        raise RocketError(Code.NOT_FOUND, "no topic holds the message this id names")

    async def queue_info(self, topic: str, queue: int) -> dict:
        return await queue_info(self.dispatcher, topic, queue)

    async def message_at(self, topic: str, queue: int, offset: int, caller: Caller | None,
                         group: str = "") -> Message | None:
        """The message at the offset, read as the caller (for the consumer group, if named)."""
        response = await self.dispatcher.local("Pull", {
            "topic": topic, "group": group, "queues": [{"queue": queue, "offset": offset}], "max_bytes": 1,
            "wait_ms": 0, "filter_type": "tag", "filter": "*"}, caller)
        for stored in response["batches"]:
            for message in batch_codec.decode(stored["batch"], stored["base_offset"], queue):
                if message.offset == offset:
                    return message
        return None


def as_stored(message: Message, topic: str, host: tuple[bytes, int]) -> bytes:
    """A message as a RocketMQ broker stores it (MessageDecoder's layout), as pulls, lookups and checks carry it."""
    properties = layout.remoting_properties(message)
    try:
        reconsume = int(properties.get(layout.RECONSUME_TIME, "0"))
    except ValueError:
        reconsume = 0
    return layout.encode_stored(message, topic, host, reconsume, properties)
