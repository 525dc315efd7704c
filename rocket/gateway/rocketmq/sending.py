"""RocketMQ 5's SendMessage, EndTransaction and RecallMessage: messages converted to rocket's and sent as one
batch per queue through the broker's methods. A part of RocketMQProxy, over its Bridge.
"""

from __future__ import annotations

import gzip

from rocket.errors import Code, RocketError
from rocket.gateway.properties import BORN_HOST_PROPERTY
from rocket.gateway.rocketmq.bridge import Bridge
from rocket.gateway.rocketmq.protocol import INVALID_TRANSACTION_ID
from rocket.model import ID_PROPERTY, KEYS_PROPERTY, Message, queue_for_key
from rocket.serde import batch as batch_codec
from rocket.transport.h2_server import GrpcCall

# rocketmq-python-client 5.1.2 writes milliseconds into Timestamp.seconds; as seconds this is 5000-01-01.
MILLISECONDS_IN_SECONDS_FIELD_AFTER = 95_617_584_000


class Sending:
    def __init__(self, bridge: Bridge):
        self.bridge = bridge

    def _to_rocket(self, message, fifo: bool) -> Message:
        system = message.system_properties
        body = message.body
        if system.body_encoding == 2:  # GZIP: rocket stores plain bodies, which every client can read
            body = gzip.decompress(body)
        properties = dict(message.user_properties)
        if any(name.startswith("__rmq.") for name in properties):
            raise RocketError(Code.BAD_REQUEST, "user properties starting with '__rmq.' are reserved")
        keys = [key for key in system.keys if key]
        key = system.message_group if system.HasField("message_group") else (keys[0] if keys else "")
        if keys and keys != [key]:
            properties[KEYS_PROPERTY] = " ".join(keys)
        if system.message_id:
            properties[ID_PROPERTY] = system.message_id
        if system.born_host:
            properties[BORN_HOST_PROPERTY] = system.born_host
        born_ms = system.born_timestamp.seconds * 1000 + system.born_timestamp.nanos // 1_000_000
        deliver_at_ms = 0
        if system.HasField("delivery_timestamp"):
            seconds, nanos = system.delivery_timestamp.seconds, system.delivery_timestamp.nanos
            if seconds > MILLISECONDS_IN_SECONDS_FIELD_AFTER:
                deliver_at_ms = seconds
            else:
                deliver_at_ms = max(1, seconds * 1000 + nanos // 1_000_000)
        return Message(body, key=key, tag=system.tag if system.HasField("tag") else "", properties=properties,
                       timestamp_ms=born_ms, deliver_at_ms=deliver_at_ms)

    async def send_message(self, request, call: GrpcCall):
        """The request's messages as one batch (they share a topic; the first picks the queue)."""
        service = self.bridge.service
        messages = list(request.messages)
        if not messages:
            return service.SendMessageResponse(status=self.bridge.status(40000, "no messages"))
        try:
            name = messages[0].topic.name
            if any(message.topic.name != name for message in messages):
                raise RocketError(Code.BAD_REQUEST, "the messages of one SendMessage go to one topic")
            topic = await self.bridge.topic(name)
            fifo = topic["message_type"] == "fifo"
            converted = [self._to_rocket(message, fifo) for message in messages]
            first = messages[0].system_properties
            if fifo and converted[0].key:
                queue = queue_for_key(converted[0].key, topic["queues"])  # the message group picks the queue
            elif fifo:
                queue = first.queue_id if 0 <= first.queue_id < topic["queues"] else -1
            else:  # the broker picks, as Apache RocketMQ's proxy does (SendMessageQueueSelector): its sticky queue
                queue = -1
            transaction = first.message_type == 4
            batch = batch_codec.encode(converted, self.bridge.clock.wall_ms(), transaction=transaction)
            reply = await self.bridge.dispatcher.local("Produce", {"topic": name, "queue": queue, "batch": batch,
                                                                   "records": batch_codec.WRITTEN_HERE}, call.acting)
        except (RocketError, OSError, EOFError) as error:
            error = error if isinstance(error, RocketError) else RocketError(Code.BAD_REQUEST, f"body: {error}")
            status = self.bridge.error_status(error)
            return service.SendMessageResponse(status=status, entries=[service.SendResultEntry(status=status)])
        entries = []
        for index, message in enumerate(messages):
            offset = reply["base_offset"] + index
            message_id = message.system_properties.message_id or f"{reply['queue']}.{offset}"
            entry = service.SendResultEntry(status=self.bridge.status(), offset=offset, message_id=message_id)
            if transaction:
                entry.transaction_id = f"{reply['queue']}.{reply['base_offset']}.{reply['count']}"
            if reply.get("scheduled"):
                entry.recall_handle = f"{reply['queue']}.{offset}"
            entries.append(entry)
        return service.SendMessageResponse(status=self.bridge.status(), entries=entries)

    async def end_transaction(self, request, call: GrpcCall):
        parts = request.transaction_id.split(".")
        if len(parts) != 3 or not all(part.isdigit() for part in parts):
            return self.bridge.service.EndTransactionResponse(status=self.bridge.status(
                INVALID_TRANSACTION_ID, f"transaction id {request.transaction_id!r}: not rocket's"))
        if request.resolution == 0 and request.source == 2:  # a check's UNKNOWN: the broker checks again later
            return self.bridge.service.EndTransactionResponse(status=self.bridge.status())
        if request.resolution not in (1, 2):
            return self.bridge.service.EndTransactionResponse(
                status=self.bridge.status(40000, "resolution is COMMIT or ROLLBACK"))
        queue, offset, count = map(int, parts)
        try:
            await self.bridge.dispatcher.local("EndTransaction", {
                "topic": request.topic.name, "queue": queue, "offset": offset, "count": count,
                "commit": request.resolution == 1}, call.acting)
        except RocketError as error:
            return self.bridge.service.EndTransactionResponse(status=self.bridge.error_status(error))
        return self.bridge.service.EndTransactionResponse(status=self.bridge.status())

    async def recall_message(self, request, call: GrpcCall):
        """Cancel a delayed message before its time: the recall handle is its timer id."""
        parts = request.recall_handle.split(".")
        if len(parts) != 2 or not all(part.isdigit() for part in parts):
            return self.bridge.service.RecallMessageResponse(
                status=self.bridge.status(40000, "malformed recall handle"))
        try:
            await self.bridge.dispatcher.local("CancelTimer", {"topic": request.topic.name, "queue": int(parts[0]),
                                                        "offset": int(parts[1])}, call.acting)
        except RocketError as error:
            return self.bridge.service.RecallMessageResponse(status=self.bridge.error_status(error))
        return self.bridge.service.RecallMessageResponse(status=self.bridge.status(), message_id=request.recall_handle)
