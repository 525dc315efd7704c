"""What the gateways read alike through the broker's methods: topics (TopicCache), one queue's pulled messages past
an offset that match a filter, one queue's offsets, and waits for topics to grow (Tails)."""

from __future__ import annotations

import contextlib
import logging
import struct
from collections.abc import Callable, Iterator

import trio

from rocket import limits
from rocket.clock import Clock
from rocket.errors import Code, RocketError
from rocket.filter import Filter
from rocket.model import KV_PREFIX, Message
from rocket.serde import batch as batch_codec
from rocket.transport.background import Background
from rocket.transport.rpc import Dispatcher

log = logging.getLogger("rocket.gateway")


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


class Tail:
    """A topic watched for growth: its generation goes up each time the watch finds new data past the ends it knew,
    or learns the ends anew (it started, or a call failed). Readers with a task wait on it (wait); readers without
    one (parked MQTT connections) are sleepers, each called once at the next bump."""
    __slots__ = ("generation", "_changed", "holders", "scope", "sleepers")

    def __init__(self) -> None:
        self.generation = 0
        self._changed = trio.Event()
        self.holders = 0
        self.scope = trio.CancelScope()
        self.sleepers: dict[object, Callable[[], None]] = {}  # owner -> what wakes it

    def bump(self) -> None:
        self.generation += 1
        self._changed.set()
        self._changed = trio.Event()
        sleepers, self.sleepers = self.sleepers, {}
        for wake in sleepers.values():
            wake()

    async def wait(self, since: int, timeout_s: float) -> None:
        """Until the generation is past since (read before the caller looked for data), or timeout_s passed."""
        with trio.move_on_after(timeout_s):
            while self.generation == since:
                await self._changed.wait()


class Tails(Background):
    """Waits for topics to grow, one long-polled Pull per topic however many wait on it: a gateway's idle readers
    (MQTT subscriptions) read the generation of the topic's Tail, look for data in their own way, and wait on the
    Tail only if they found none. A topic is watched while someone holds it (watching)."""

    def __init__(self, dispatcher: Dispatcher):
        self.dispatcher = dispatcher
        self._tails: dict[str, Tail] = {}  # topic -> its watch, while held: bounded by the holders' topics

    def hold(self, topic: str) -> Tail:
        """The topic's Tail, watched until as many release() as hold() were called."""
        tail = self._tails.get(topic)
        if tail is None:
            assert self._nursery is not None, "Tails.run() has not started"
            tail = self._tails[topic] = Tail()
            self._nursery.start_soon(self._watch, topic, tail)
        tail.holders += 1
        return tail

    def release(self, topic: str) -> None:
        tail = self._tails[topic]
        tail.holders -= 1
        if not tail.holders:
            tail.scope.cancel()
            del self._tails[topic]

    @contextlib.contextmanager
    def watching(self, topic: str) -> Iterator[Tail]:
        tail = self.hold(topic)
        try:
            yield tail
        finally:
            self.release(topic)

    async def _watch(self, topic: str, tail: Tail) -> None:
        """The topic's ends (DescribeTopic), a bump, then Pulls from them, each waiting up to limits.pull_wait_ms_max,
        until one finds data; again. A bump follows each learning of the ends, so a reader that looked for data before
        they were learnt looks again (what came meanwhile lies before the new ends, where no Pull sees it). A failed
        call bumps too (the readers meet the failure themselves) and is tried again after
        limits.gateway_tail_retry_s."""
        with tail.scope:
            while True:
                try:
                    described = await self.dispatcher.local("DescribeTopic", {"topic": topic})
                    ends = [{"queue": queue["queue"], "offset": queue["next_offset"]} for queue in described["queues"]]
                    tail.bump()
                    while not (await self.dispatcher.local("Pull", {
                            "topic": topic, "queues": ends, "max_bytes": 1, "wait_ms": limits.pull_wait_ms_max,
                            "filter_type": "tag", "filter": "*", "group": ""}))["batches"]:
                        pass
                except RocketError as error:
                    log.info("watching topic %s for new data: %s", topic, error)
                    tail.bump()
                    await trio.sleep(limits.gateway_tail_retry_s)
