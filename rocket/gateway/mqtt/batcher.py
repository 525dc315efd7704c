"""Publishes of every MQTT connection to one queue, produced together (Batcher): while a queue's batch is stored, what
comes for it waits and goes in the next. Devices publish a message or a few at a time; produce costs per batch."""

from __future__ import annotations

import trio

from rocket import limits
from rocket.clock import Clock
from rocket.errors import Code, RocketError
from rocket.model import Message
from rocket.serde import batch as batch_codec
from rocket.transport.rpc import Dispatcher


class _Waiting:
    """One connection's messages for a queue, and how their produce ended."""
    __slots__ = ("messages", "bytes", "done", "error")

    def __init__(self, messages: list[Message]):
        self.messages = messages
        self.bytes = sum([len(message.body) for message in messages]) + \
            limits.mqtt_message_overhead_bytes * len(messages)
        self.done = trio.Event()
        self.error: RocketError | None = None


class Batcher:
    """The first caller for a queue produces, and goes on producing what the others left for it meanwhile, each
    batch up to half the batch limit; the others wait for theirs. Callers were authorized already (the connection
    checks each topic against its user), so the batches go as the node."""

    def __init__(self, dispatcher: Dispatcher, clock: Clock):
        self.dispatcher = dispatcher
        self.clock = clock
        self._lines: dict[tuple[str, int], list[_Waiting]] = {}  # (topic, queue) -> what waits for the next batch

    async def produce(self, topic: str, queue: int, messages: list[Message]) -> None:
        """Store the messages in the queue, in order, with those of others; RocketError if that failed."""
        waiting = _Waiting(messages)
        line = self._lines.get((topic, queue))
        if line is not None:
            line.append(waiting)
            await waiting.done.wait()
        else:
            await self._lead(topic, queue, waiting)
        if waiting.error is not None:
            raise waiting.error

    async def _lead(self, topic: str, queue: int, first: _Waiting) -> None:
        line = self._lines[(topic, queue)] = [first]
        taken: list[_Waiting] = []
        try:
            while line:
                size, count = 0, 0
                while count < len(line) and (count == 0 or size + line[count].bytes <= limits.batch_bytes_max // 2):
                    size += line[count].bytes
                    count += 1
                taken, line[:] = line[:count], line[count:]
                try:
                    with trio.CancelScope(shield=True):  # the others wait for its answer: it comes, in time
                        batch = batch_codec.encode([message for each in taken for message in each.messages],
                                                   self.clock.wall_ms())
                        await self.dispatcher.local("Produce", {"topic": topic, "queue": queue, "batch": batch,
                                                                "records": batch_codec.WRITTEN_HERE})
                except RocketError as error:
                    for each in taken:
                        each.error = error
                for each in taken:
                    each.done.set()
                taken = []
        finally:
            del self._lines[(topic, queue)]
            for each in [*taken, *line]:  # cancelled before their batch went: never stored
                if not each.done.is_set():
                    each.error = RocketError(Code.UNAVAILABLE, "the publish was not stored: the broker is stopping")
                    each.done.set()
