"""RocketMQ 5's PullMessage (a long poll of one queue from an offset, through the broker's Pull) and the offset
calls: UpdateOffset (CommitOffsets), GetOffset (FetchOffsets) and QueryOffset. A part of RocketMQProxy (Pulling)."""

from __future__ import annotations

import math
from collections.abc import AsyncIterator

import trio

from rocket import limits
from rocket.errors import Code, RocketError
from rocket.filter import compile_filter
from rocket.gateway.reads import matching, queue_info
from rocket.gateway.rocketmq.bridge import Bridge
from rocket.gateway.rocketmq.protocol import MESSAGE_NOT_FOUND, OFFSET_NOT_FOUND, ms_of
from rocket.transport.h2_server import GrpcCall

BEGINNING, END, TIMESTAMP = 0, 1, 2  # apache.rocketmq.v2.QueryOffsetPolicy


class Pulling:
    """The client keeps its own position; pulled messages carry no receipt handle. QueryOffset answers the queue's
    first or next offset, or SearchOffset by time."""

    def __init__(self, bridge: Bridge):
        self.bridge = bridge

    async def pull_message(self, request, call: GrpcCall) -> AsyncIterator:
        """A status, the messages from request.offset that match the filter (batch_size at most), then the offset
        to pull from next; "message not found" (and that offset) when none came before the long poll ended."""
        service = self.bridge.service
        topic_name, queue = request.message_queue.topic.name, request.message_queue.id
        wait_s = min(ms_of(request.long_polling_timeout, limits.rocketmq_receive_wait_s_default),
                     limits.pull_wait_ms_max) / 1000
        if math.isfinite(call.deadline):
            wait_s = min(wait_s, call.deadline - trio.current_time() - limits.rocketmq_receive_answer_margin_s)
        deadline = trio.current_time() + max(0.0, wait_s)
        count_max = max(1, min(request.batch_size or limits.rocketmq_receive_messages_default,
                               limits.rocketmq_pull_messages_max))
        expression = request.filter_expression
        filter_type = "sql" if expression.type == 2 else "tag"
        text = expression.expression or ("*" if filter_type == "tag" else "")
        offset = request.offset
        try:
            topic = await self.bridge.topic(topic_name)
            chosen = compile_filter(filter_type, text)
            while True:
                slice_s = min(limits.rocketmq_receive_slice_s, max(0.0, deadline - trio.current_time()))
                response = await self.bridge.dispatcher.local("Pull", {
                    "topic": topic_name, "group": request.group.name, "queues": [{"queue": queue, "offset": offset}],
                    "max_bytes": limits.rocketmq_pull_bytes_max, "wait_ms": int(slice_s * 1000),
                    "filter_type": filter_type, "filter": text}, call.acting)
                found, offset = matching(response, queue, offset, chosen, count_max)
                if found or trio.current_time() >= deadline:
                    break
        except RocketError as error:
            yield service.PullMessageResponse(status=self.bridge.error_status(error))
            if error.code == Code.OFFSET_OUT_OF_RANGE:  # where the queue's messages are, as RocketMQ answers
                try:
                    info = await queue_info(self.bridge.dispatcher, topic_name, queue)
                except RocketError:
                    return
                moved = info["next_offset"] if offset > info["next_offset"] else info["min_offset"]
                yield service.PullMessageResponse(next_offset=moved)
            return
        if not found:
            yield service.PullMessageResponse(status=self.bridge.status(MESSAGE_NOT_FOUND, "no new message"))
        else:
            yield service.PullMessageResponse(status=self.bridge.status())
            for message in found:
                yield service.PullMessageResponse(message=self.bridge.to_rocketmq(topic, message, None, 0))
        yield service.PullMessageResponse(next_offset=offset)

    async def update_offset(self, request, call: GrpcCall):
        try:
            await self.bridge.dispatcher.local("CommitOffsets", {
                "group": request.group.name, "topic": request.message_queue.topic.name,
                "offsets": [{"queue": request.message_queue.id, "offset": request.offset}]}, call.acting)
        except RocketError as error:
            return self.bridge.service.UpdateOffsetResponse(status=self.bridge.error_status(error))
        return self.bridge.service.UpdateOffsetResponse(status=self.bridge.status())

    async def get_offset(self, request, call: GrpcCall):
        service = self.bridge.service
        group, topic_name, queue = request.group.name, request.message_queue.topic.name, request.message_queue.id
        try:
            fetched = await self.bridge.dispatcher.local("FetchOffsets", {"group": group, "topic": topic_name},
                                                          call.acting)
        except RocketError as error:
            return service.GetOffsetResponse(status=self.bridge.error_status(error))
        offset = next((entry["offset"] for entry in fetched["offsets"] if entry["queue"] == queue), -1)
        if offset < 0:
            return service.GetOffsetResponse(status=self.bridge.status(
                OFFSET_NOT_FOUND, f"group {group!r} has no offset in queue {queue} of {topic_name!r}"))
        return service.GetOffsetResponse(status=self.bridge.status(), offset=offset)

    async def query_offset(self, request, call: GrpcCall):
        """BEGINNING: the queue's first offset; END: the offset its next message gets; TIMESTAMP: the first
        message stored at or after the time."""
        topic_name, queue = request.message_queue.topic.name, request.message_queue.id
        policy = request.query_offset_policy
        try:
            if policy == TIMESTAMP:
                searched = await self.bridge.dispatcher.local("SearchOffset", {
                    "topic": topic_name, "timestamp_ms": request.timestamp.ToMilliseconds()}, call.acting)
                offset = next((entry["offset"] for entry in searched["offsets"] if entry["queue"] == queue), None)
                if offset is None:
                    raise RocketError(Code.BAD_QUEUE, f"topic {topic_name!r} has no queue {queue}")
            elif policy in (BEGINNING, END):
                info = await queue_info(self.bridge.dispatcher, topic_name, queue)
                offset = info["min_offset"] if policy == BEGINNING else info["next_offset"]
            else:
                raise RocketError(Code.BAD_REQUEST, f"unknown query_offset_policy {policy}")
        except RocketError as error:
            return self.bridge.service.QueryOffsetResponse(status=self.bridge.error_status(error))
        return self.bridge.service.QueryOffsetResponse(status=self.bridge.status(), offset=offset)

