"""A Receive (pop) response and its receipts, decoded the same way by the client SDK and the RocketMQ gateway."""

from __future__ import annotations

import logging

from rocket.errors import Code, RocketError
from rocket.model import Message
from rocket.serde import batch as batch_codec

log = logging.getLogger("rocket.receive")


def parse_receipt(receipt: str) -> tuple[int, int, int]:
    """(queue, offset, attempt) of a receipt handed out with a received message."""
    parts = receipt.split(".")
    if len(parts) != 3 or not all(part.isdigit() for part in parts):
        raise RocketError(Code.BAD_REQUEST, f"receipt {receipt[:64]!r}: not rocket's (expected QUEUE.OFFSET.ATTEMPT)")
    queue, offset, attempt = map(int, parts)
    return queue, offset, attempt


def received(response: dict, topic: str) -> tuple[list[Message], list[dict]]:
    """The messages of a Receive response, in the order handed out, with their attempt and receipt; and the
    receipts of those in batches that cannot be read (a right CRC, malformed records). No attempt can read
    those, so the caller sends them to the dead letters at once instead of delivering them again."""
    decoded: dict[tuple[int, int], Message] = {}
    unreadable: list[tuple[int, int, int]] = []  # (queue, first offset, end) of batches that cannot be read
    for stored in response["batches"]:
        queue, base = stored["queue"], stored["base_offset"]
        try:
            for message in batch_codec.decode(stored["batch"], base, queue):
                decoded[(message.queue, message.offset)] = message
        except RocketError as error:
            if error.code != Code.BAD_BATCH:
                raise
            log.warning("%r queue %d: the batch at offset %d cannot be read, its messages go to the dead letters: %s",
                        topic, queue, base, error.message)
            unreadable.append((queue, base, base + batch_codec.peek_count(stored["batch"])))
    messages, dead = [], []
    for handle in response["handles"]:
        key = (handle["queue"], handle["offset"])
        if key not in decoded and any(queue == key[0] and first <= key[1] < end for queue, first, end in unreadable):
            dead.append({"queue": handle["queue"], "offset": handle["offset"], "attempt": handle["attempt"]})
            continue
        message = decoded.get(key)
        if message is None:  # its batch is gone (retention): nothing to hand out
            continue
        message.attempt = handle["attempt"]
        message.receipt = f"{handle['queue']}.{handle['offset']}.{handle['attempt']}"
        messages.append(message)
    return messages, dead
