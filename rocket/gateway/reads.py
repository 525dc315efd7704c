"""What both RocketMQ gateways (gRPC and remoting) read alike through the broker's methods: one queue's pulled
messages past an offset that match a filter, and one queue's offsets."""

from __future__ import annotations

import struct

from rocket.errors import Code, RocketError
from rocket.filter import Filter
from rocket.model import Message
from rocket.serde import batch as batch_codec
from rocket.transport.rpc import Dispatcher


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
