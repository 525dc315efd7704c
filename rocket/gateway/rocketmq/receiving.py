"""RocketMQ 5's ReceiveMessage (pop through the broker's Receive, in slices), Ack, ChangeInvisibleDuration and
ForwardMessageToDeadLetterQueue; receipt handles are rocket's receipts. A part of RocketMQProxy, over its Bridge.
"""

from __future__ import annotations

import logging
import math
from collections.abc import AsyncIterator

import trio

from rocket import limits
from rocket.errors import RocketError
from rocket.gateway.rocketmq.bridge import Bridge
from rocket.gateway.rocketmq.protocol import INVALID_RECEIPT_HANDLE, MESSAGE_NOT_FOUND, ms_of
from rocket.serde.receive import parse_receipt, received
from rocket.transport.h2_server import GrpcCall

log = logging.getLogger("rocket.rocketmq")


class Receiving:
    def __init__(self, bridge: Bridge):
        self.bridge = bridge

    async def receive_message(self, request, call: GrpcCall) -> AsyncIterator:
        """A long poll: a status, then the messages; "message not found" shortly before the client's deadline."""
        service = self.bridge.service
        topic_name = request.message_queue.topic.name
        wait_s = ms_of(request.long_polling_timeout, limits.rocketmq_receive_wait_s_default) / 1000
        if math.isfinite(call.deadline):
            wait_s = min(wait_s, call.deadline - trio.current_time() - limits.rocketmq_receive_answer_margin_s)
        expression = request.filter_expression
        filter_type = "sql" if expression.type == 2 else "tag"
        deadline = trio.current_time() + max(0.0, wait_s)
        try:
            topic = await self.bridge.topic(topic_name)
            while True:
                slice_s = min(limits.rocketmq_receive_slice_s, max(0.0, deadline - trio.current_time()))
                response = await self.bridge.dispatcher.local("Receive", {
                    "topic": topic_name, "group": request.group.name, "max_messages": max(1, request.batch_size),
                    "invisible_ms": ms_of(request.invisible_duration, limits.rocketmq_invisible_s_default),
                    "wait_ms": int(slice_s * 1000), "max_attempts": self.bridge.max_attempts,
                    "filter_type": filter_type,
                    "filter": expression.expression or ("*" if filter_type == "tag" else "")}, call.acting)
                if response["handles"] or trio.current_time() >= deadline:
                    break
        except RocketError as error:
            yield service.ReceiveMessageResponse(status=self.bridge.error_status(error))
            return
        if not response["handles"]:
            yield service.ReceiveMessageResponse(status=self.bridge.status(MESSAGE_NOT_FOUND, "no new message"))
            return
        yield service.ReceiveMessageResponse(status=self.bridge.status())
        messages, unreadable = received(response, topic_name)
        if unreadable:
            try:
                await self.bridge.dispatcher.local("DeadLetter", {"topic": topic_name, "group": request.group.name,
                                                           "receipts": unreadable, "invisible_ms": -1}, call.acting)
            except RocketError as error:  # they come back after their invisible time, and go then
                log.warning("dead-lettering unreadable messages of %s: %s", topic_name, error)
        invisible_ms = ms_of(request.invisible_duration, limits.rocketmq_invisible_s_default)
        for message in messages:
            handle = {"queue": message.queue, "offset": message.offset, "attempt": message.attempt}
            yield service.ReceiveMessageResponse(message=self.bridge.to_rocketmq(topic, message, handle, invisible_ms))
        answered = service.ReceiveMessageResponse()  # when the messages left: push consumers measure latency from it
        answered.delivery_timestamp.FromMilliseconds(self.bridge.clock.wall_ms())
        yield answered

    async def ack_message(self, request, call: GrpcCall):
        service = self.bridge.service
        entries = list(request.entries)
        results = []
        try:
            receipts = [_receipt(entry.receipt_handle) for entry in entries]
            response = await self.bridge.dispatcher.local("Ack", {
                "topic": request.topic.name, "group": request.group.name, "receipts": receipts, "invisible_ms": -1},
                call.acting)
        except RocketError as error:
            return service.AckMessageResponse(status=self.bridge.error_status(error))
        stale = {(entry["queue"], entry["offset"], entry["attempt"]) for entry in response["stale"]}
        for entry, receipt in zip(entries, receipts):
            expired = (receipt["queue"], receipt["offset"], receipt["attempt"]) in stale
            status = self.bridge.status(INVALID_RECEIPT_HANDLE, "the receipt is stale") if expired \
                else self.bridge.status()
            results.append(service.AckMessageResultEntry(message_id=entry.message_id,
                                                         receipt_handle=entry.receipt_handle, status=status))
        overall = self.bridge.status() if not stale else (
            results[0].status if len(results) == 1 else self.bridge.status(30000, "some failed"))
        return service.AckMessageResponse(status=overall, entries=results)

    async def change_invisible_duration(self, request, call: GrpcCall):
        service = self.bridge.service
        try:
            receipt = _receipt(request.receipt_handle)
            invisible_ms = ms_of(request.invisible_duration, 0)
            if receipt["attempt"] >= await self.bridge.max_attempts_of(request.group.name):
                invisible_ms = 0  # a failure of the last attempt: the next receive moves it to the dead-letter queue
            response = await self.bridge.dispatcher.local("ChangeInvisible", {
                "topic": request.topic.name, "group": request.group.name, "receipts": [receipt],
                "invisible_ms": invisible_ms}, call.acting)
        except RocketError as error:
            return service.ChangeInvisibleDurationResponse(status=self.bridge.error_status(error))
        if response["stale"]:
            return service.ChangeInvisibleDurationResponse(
                status=self.bridge.status(INVALID_RECEIPT_HANDLE, "the receipt is stale"))
        return service.ChangeInvisibleDurationResponse(status=self.bridge.status(),
                                                       receipt_handle=request.receipt_handle)

    async def forward_message_to_dead_letter_queue(self, request, call: GrpcCall):
        """The received message goes to the group's dead-letter queue now and is not delivered again (the
        client calls this for a message it cannot consume, such as a FIFO one past its attempts)."""
        service = self.bridge.service
        try:
            receipt = _receipt(request.receipt_handle)
            response = await self.bridge.dispatcher.local("DeadLetter", {
                "topic": request.topic.name, "group": request.group.name, "receipts": [receipt], "invisible_ms": -1},
                call.acting)
        except RocketError as error:
            return service.ForwardMessageToDeadLetterQueueResponse(status=self.bridge.error_status(error))
        if response["stale"]:
            return service.ForwardMessageToDeadLetterQueueResponse(
                status=self.bridge.status(INVALID_RECEIPT_HANDLE, "the receipt is stale"))
        return service.ForwardMessageToDeadLetterQueueResponse(status=self.bridge.status())


def _receipt(text: str) -> dict:
    queue, offset, attempt = parse_receipt(text)
    return {"queue": queue, "offset": offset, "attempt": attempt}
