"""RocketMQ 5's ReceiveMessage (pop through the broker's Receive, in slices), Ack, ChangeInvisibleDuration and
ForwardMessageToDeadLetterQueue; receipt handles are rocket's receipts. A mixin of RocketMQProxy.
"""

from __future__ import annotations

import logging
import math
import zlib
from collections.abc import AsyncIterator

import trio

from rocket import limits
from rocket.errors import RocketError
from rocket.gateway.properties import BORN_HOST_PROPERTY, ID_PROPERTY, KEYS_PROPERTY
from rocket.gateway.rocketmq.protocol import INVALID_RECEIPT_HANDLE, MESSAGE_NOT_FOUND, MESSAGE_TYPE_OF, ms_of
from rocket.model import Message
from rocket.serde.receive import parse_receipt, received
from rocket.transport.h2_server import GrpcCall

log = logging.getLogger("rocket.rocketmq")


class Receiving:
    async def receive_message(self, request, call: GrpcCall) -> AsyncIterator:
        """A long poll: a status, then the messages; "message not found" shortly before the client's deadline."""
        service = self.service
        topic_name = request.message_queue.topic.name
        wait_s = ms_of(request.long_polling_timeout, limits.rocketmq_receive_wait_s_default) / 1000
        if math.isfinite(call.deadline):
            wait_s = min(wait_s, call.deadline - trio.current_time() - limits.rocketmq_receive_answer_margin_s)
        expression = request.filter_expression
        filter_type = "sql" if expression.type == 2 else "tag"
        deadline = trio.current_time() + max(0.0, wait_s)
        try:
            topic = await self._topic(topic_name)
            while True:
                slice_s = min(limits.rocketmq_receive_slice_s, max(0.0, deadline - trio.current_time()))
                response = await self.dispatcher.local("Receive", {
                    "topic": topic_name, "group": request.group.name, "max_messages": max(1, request.batch_size),
                    "invisible_ms": ms_of(request.invisible_duration, limits.rocketmq_invisible_s_default),
                    "wait_ms": int(slice_s * 1000), "max_attempts": self.max_attempts,
                    "filter_type": filter_type, "filter": expression.expression or ("*" if filter_type == "tag" else "")})
                if response["handles"] or trio.current_time() >= deadline:
                    break
        except RocketError as error:
            yield service.ReceiveMessageResponse(status=self._error_status(error))
            return
        if not response["handles"]:
            yield service.ReceiveMessageResponse(status=self._status(MESSAGE_NOT_FOUND, "no new message"))
            return
        yield service.ReceiveMessageResponse(status=self._status())
        messages, unreadable = received(response, topic_name)
        if unreadable:
            try:
                await self.dispatcher.local("DeadLetter", {"topic": topic_name, "group": request.group.name,
                                                           "receipts": unreadable, "invisible_ms": -1})
            except RocketError as error:  # they come back after their invisible time, and go then
                log.warning("dead-lettering unreadable messages of %s: %s", topic_name, error)
        invisible_ms = ms_of(request.invisible_duration, limits.rocketmq_invisible_s_default)
        for message in messages:
            handle = {"queue": message.queue, "offset": message.offset, "attempt": message.attempt}
            yield service.ReceiveMessageResponse(message=self._to_rocketmq(topic, message, handle, invisible_ms))
        answered = service.ReceiveMessageResponse()  # when the messages left: push consumers measure latency from it
        answered.delivery_timestamp.FromMilliseconds(self.clock.wall_ms())
        yield answered

    def _to_rocketmq(self, topic: dict, message: Message, handle: dict | None, invisible_ms: int):
        """handle None: a pulled message, which has no receipt handle, attempt or invisible time."""
        definition = self.definition
        properties = dict(message.properties)
        fifo = topic["message_type"] == "fifo"
        keys_text = properties.pop(KEYS_PROPERTY, None)
        keys = keys_text.split(" ") if keys_text else ([message.key] if message.key and not fifo else [])
        message_id = properties.pop(ID_PROPERTY, "") or f"{message.queue}.{message.offset}"
        born_host = properties.pop(BORN_HOST_PROPERTY, "")
        system = definition.SystemProperties(
            keys=keys, message_id=message_id, born_host=born_host, store_host="rocket",
            body_digest=definition.Digest(type=1, checksum=format(zlib.crc32(message.body) & 0xFFFFFFFF, "08X")),
            body_encoding=1, message_type=MESSAGE_TYPE_OF.get(topic["message_type"], 1), queue_id=message.queue,
            queue_offset=message.offset)
        if handle is not None:
            system.delivery_attempt = handle["attempt"]
            system.receipt_handle = f"{handle['queue']}.{handle['offset']}.{handle['attempt']}"
            system.invisible_duration.FromMilliseconds(invisible_ms)
        if message.tag:
            system.tag = message.tag
        if fifo and message.key:
            system.message_group = message.key
        system.born_timestamp.FromMilliseconds(message.timestamp_ms)
        system.store_timestamp.FromMilliseconds(message.timestamp_ms)
        if message.deliver_at_ms or topic["message_type"] == "delay":  # a delivered one's timestamp is its time
            system.delivery_timestamp.FromMilliseconds(message.deliver_at_ms or message.timestamp_ms)
        return definition.Message(topic=definition.Resource(name=topic["name"]), user_properties=properties,
                                  system_properties=system, body=message.body)

    async def ack_message(self, request, call: GrpcCall):
        service = self.service
        entries = list(request.entries)
        results = []
        try:
            receipts = [_receipt(entry.receipt_handle) for entry in entries]
            response = await self.dispatcher.local("Ack", {"topic": request.topic.name, "group": request.group.name,
                                                           "receipts": receipts, "invisible_ms": -1})
        except RocketError as error:
            return service.AckMessageResponse(status=self._error_status(error))
        stale = {(entry["queue"], entry["offset"], entry["attempt"]) for entry in response["stale"]}
        for entry, receipt in zip(entries, receipts):
            expired = (receipt["queue"], receipt["offset"], receipt["attempt"]) in stale
            status = self._status(INVALID_RECEIPT_HANDLE, "the receipt is stale") if expired else self._status()
            results.append(service.AckMessageResultEntry(message_id=entry.message_id,
                                                         receipt_handle=entry.receipt_handle, status=status))
        overall = self._status() if not stale else (results[0].status if len(results) == 1 else self._status(30000, "some failed"))
        return service.AckMessageResponse(status=overall, entries=results)

    async def change_invisible_duration(self, request, call: GrpcCall):
        service = self.service
        try:
            receipt = _receipt(request.receipt_handle)
            invisible_ms = ms_of(request.invisible_duration, 0)
            if receipt["attempt"] >= await self._max_attempts(request.group.name):
                invisible_ms = 0  # a failure of the last attempt: the next receive moves it to the dead-letter queue
            response = await self.dispatcher.local("ChangeInvisible", {
                "topic": request.topic.name, "group": request.group.name, "receipts": [receipt],
                "invisible_ms": invisible_ms})
        except RocketError as error:
            return service.ChangeInvisibleDurationResponse(status=self._error_status(error))
        if response["stale"]:
            return service.ChangeInvisibleDurationResponse(status=self._status(INVALID_RECEIPT_HANDLE, "the receipt is stale"))
        return service.ChangeInvisibleDurationResponse(status=self._status(), receipt_handle=request.receipt_handle)

    async def forward_message_to_dead_letter_queue(self, request, call: GrpcCall):
        """The received message goes to the group's dead-letter queue now and is not delivered again (the
        client calls this for a message it cannot consume, such as a FIFO one past its attempts)."""
        service = self.service
        try:
            receipt = _receipt(request.receipt_handle)
            response = await self.dispatcher.local("DeadLetter", {
                "topic": request.topic.name, "group": request.group.name, "receipts": [receipt], "invisible_ms": -1})
        except RocketError as error:
            return service.ForwardMessageToDeadLetterQueueResponse(status=self._error_status(error))
        if response["stale"]:
            return service.ForwardMessageToDeadLetterQueueResponse(
                status=self._status(INVALID_RECEIPT_HANDLE, "the receipt is stale"))
        return service.ForwardMessageToDeadLetterQueueResponse(status=self._status())


def _receipt(text: str) -> dict:
    queue, offset, attempt = parse_receipt(text)
    return {"queue": queue, "offset": offset, "attempt": attempt}
