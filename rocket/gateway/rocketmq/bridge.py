"""What the parts of the RocketMQ 5 proxy share: the dispatcher they call the broker's methods through, the protobuf
modules, the topic cache, and the translations of statuses and messages."""

from __future__ import annotations

import logging
import types
import zlib

from rocket.clock import Clock
from rocket.errors import RocketError
from rocket.gateway.properties import BORN_HOST_PROPERTY
from rocket.gateway.reads import TopicCache
from rocket.gateway.rocketmq.protocol import MESSAGE_TYPE_OF, OK, status_of
from rocket.model import ID_PROPERTY, KEYS_PROPERTY, Message
from rocket.transport.grpc_wire import GrpcError, GrpcStatus
from rocket.transport.rpc import Dispatcher

log = logging.getLogger("rocket.rocketmq")


class Bridge:
    def __init__(self, dispatcher: Dispatcher, definition: types.ModuleType, service: types.ModuleType,
                 clock: Clock, max_attempts: int):
        self.dispatcher = dispatcher
        self.definition = definition
        self.service = service
        self.clock = clock
        self.max_attempts = max_attempts  # the node's rocketmq_max_attempts, for groups that set none
        self.topics = TopicCache(dispatcher, clock)

    def parse(self, request_type, data: bytes):
        try:
            return request_type.FromString(data)
        except Exception:  # protobuf's DecodeError, whatever module it comes from
            raise GrpcError(GrpcStatus.INTERNAL, f"malformed {request_type.DESCRIPTOR.name}") from None

    def status(self, code: int = OK, message: str = "OK"):
        return self.definition.Status(code=code, message=message)

    def error_status(self, error: RocketError):
        return self.status(status_of(error), f"{error.code.name}: {error.message}")

    async def topic(self, name: str) -> dict:
        return await self.topics.get(name)

    async def group_settings(self, group: str) -> dict:
        """The consumer group's settings as the broker applies them (GroupSettings: cached there a few seconds);
        max_attempts 0 and an empty backoff when the group sets none, or when they cannot be read."""
        try:
            return await self.dispatcher.local("GroupSettings", {"group": group})
        except RocketError as error:
            log.info("consumer group %s: settings not read: %s", group, error)
            return {"group": group, "max_attempts": 0, "retry_backoff_s": [], "consume_mode": "clustering",
                    "fifo": False}

    async def max_attempts_of(self, group: str) -> int:
        """The group's max attempts, or the node's rocketmq_max_attempts when the group sets none."""
        return (await self.group_settings(group))["max_attempts"] or self.max_attempts

    def to_rocketmq(self, topic: dict, message: Message, handle: dict | None, invisible_ms: int):
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
