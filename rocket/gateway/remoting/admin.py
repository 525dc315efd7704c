"""Remoting lookups and mqadmin basics: VIEW_MESSAGE_BY_ID, QUERY_MESSAGE by key, topic creation, deletion and
listing, topic stats, consumer connections, broker runtime info. A part of RemotingGateway.
"""

from __future__ import annotations

import orjson

from rocket import __version__, limits
from rocket.errors import Code, RocketError
from rocket.gateway.remoting import messages as layout
from rocket.gateway.remoting.bridge import Bridge, as_stored
from rocket.gateway.remoting.clients import Clients
from rocket.gateway.remoting.codec import Command, ResponseCode
from rocket.model import KV_PREFIX
from rocket.serde import batch as batch_codec
from rocket.transport.guard import Caller

MESSAGE_TYPE_OF_ATTRIBUTE = {"NORMAL": "normal", "FIFO": "fifo", "DELAY": "delay", "TRANSACTION": "transaction"}


class Administration:
    def __init__(self, bridge: Bridge, clients: Clients):
        self.bridge, self.clients = bridge, clients
        self.dispatcher, self.clock, self.cluster = bridge.dispatcher, bridge.clock, bridge.cluster

    async def view_message(self, command: Command, connection, caller: Caller) -> Command:
        """The message an offsetMsgId's commit log offset names (the topic named too, by 5.x clients)."""
        topic_hash, queue, low = layout.split_commit_log_offset(int(command.ext["offset"]))
        topic = await self.bridge.topic_by_hash(topic_hash, command.ext.get("topic", ""))
        info = await self.bridge.queue_info(topic, queue)
        message = await self.bridge.message_at(topic, queue, layout.unwrap_offset(low, info["next_offset"]), caller)
        if message is None:
            return command.reply(ResponseCode.SYSTEM_ERROR, f"NOT_FOUND: {topic} has no message {queue} at that offset")
        return command.reply(body=as_stored(message, topic, layout.host_bytes(connection.local)))

    async def query_message(self, command: Command, connection, caller: Caller) -> Command:
        """Messages of a topic with a key (or, with _UNIQUE_KEY_QUERY, a client message id) stored in a time range,
        from every queue, through the storage groups' key index (FindMessages)."""
        header = command.ext
        topic, key, unique = header["topic"], header["key"], header.get("_UNIQUE_KEY_QUERY") == "true"
        wanted = max(1, min(int(header.get("maxNum", "32") or 32), limits.remoting_pull_messages_max))
        response = await self.dispatcher.local("FindMessages", {
            "topic": topic, "key": key, "message_id": unique, "queues": [],
            "start_ms": min(max(0, int(header.get("beginTimestamp", "0") or 0)), 2**62),
            "end_ms": min(max(0, int(header.get("endTimestamp", "0") or 0)), 2**62), "limit": wanted}, caller)
        at = {(entry["queue"], entry["offset"]) for entry in response["offsets"]}
        host = layout.host_bytes(connection.local)
        found = [as_stored(message, topic, host) for stored in response["batches"]
                 for message in batch_codec.readable(stored["batch"], stored["base_offset"], stored["queue"]) or ()
                 if (message.queue, message.offset) in at]
        if not found:
            return command.reply(ResponseCode.QUERY_NOT_FOUND, f"no message with key {key!r} in {topic} in that time")
        return command.reply(ext={"indexLastUpdateTimestamp": self.clock.wall_ms(), "indexLastUpdatePhyoffset": 0},
                             body=b"".join(found))

    async def create_topic(self, command: Command, connection, caller: Caller) -> Command:
        """mqadmin updateTopic: a new topic with writeQueueNums queues, its message type from the 5.x attribute
        +message.type (NORMAL by default); an existing one is left as it is (rocket changes queues with
        `rocket topic update`)."""
        header = command.ext
        name = header["topic"]
        queues = int(header.get("writeQueueNums") or header.get("readQueueNums") or 8)
        attributes = header.get("attributes") or ""
        message_type = "normal"
        for attribute in attributes.split(","):
            name_part, _, value = attribute.lstrip("+").partition("=")
            if name_part == "message.type":
                message_type = MESSAGE_TYPE_OF_ATTRIBUTE.get(value.upper(), "")
                if not message_type:
                    raise RocketError(Code.BAD_REQUEST, f"message.type {value!r} is not NORMAL, FIFO, DELAY or TRANSACTION")
        try:
            await self.dispatcher.local("CreateTopic", {"topic": name, "queues": queues, "message_type": message_type,
                                                        "storage_class": "raft"}, caller)
        except RocketError as error:
            if error.code != Code.TOPIC_EXISTS:
                raise
        self.bridge.forget_topic(name)
        return command.reply()

    async def all_topic_config(self, command: Command, connection, caller: Caller) -> Command:
        topics = (await self.dispatcher.local("ListTopics", {}))["topics"]
        table = {topic["name"]: {"topicName": topic["name"], "readQueueNums": topic["queues"],
                                 "writeQueueNums": topic["queues"], "perm": 6, "topicFilterType": "SINGLE_TAG",
                                 "topicSysFlag": 0, "order": topic["message_type"] == "fifo",
                                 "attributes": {"message.type": topic["message_type"].upper()}}
                 for topic in topics if not topic["name"].startswith(KV_PREFIX)}
        return command.reply(body=orjson.dumps({"topicConfigTable": table,
                                                "dataVersion": {"timestamp": self.clock.wall_ms(), "counter": 0}}))

    async def topic_stats(self, command: Command, connection, caller: Caller) -> Command:
        name = command.ext["topic"]
        described = await self.dispatcher.local("DescribeTopic", {"topic": name})
        table = {}
        for info in described["queues"]:
            queue = {"topic": name, "brokerName": self.cluster, "queueId": info["queue"]}
            key = orjson.dumps(queue).decode()
            table[key] = {"minOffset": info["min_offset"], "maxOffset": info["next_offset"], "lastUpdateTimestamp": 0}
        return command.reply(body=orjson.dumps({"offsetTable": table}))

    async def consumer_connections(self, command: Command, connection, caller: Caller) -> Command:
        group_name = command.ext["consumerGroup"]
        members = self.clients.members_of(group_name)
        if not members:
            return command.reply(ResponseCode.CONSUMER_NOT_ONLINE, f"the consumer group {group_name} is not online here")
        connections = [{"clientId": client, "clientAddr": member.connection.peer, "language": "JAVA", "version": 0}
                       for client, member in members.items()]
        subscriptions = {topic: {"topic": topic, "subString": expression, "expressionType": kind, "tagsSet": [],
                                 "codeSet": [], "subVersion": 0}
                         for member in members.values() for topic, (kind, expression) in member.subscriptions.items()}
        return command.reply(body=orjson.dumps({"connectionSet": connections, "subscriptionTable": subscriptions,
                                                "consumeType": "CONSUME_PASSIVELY", "messageModel": "CLUSTERING",
                                                "consumeFromWhere": "CONSUME_FROM_LAST_OFFSET"}))

    async def runtime_info(self, command: Command, connection, caller: Caller) -> Command:
        table = {"brokerVersionDesc": f"rocket {__version__}", "brokerVersion": "0",
                 "remotingClients": str(self.clients.member_count()),
                 "bootTimestamp": str(self.bridge.started_ms)}
        return command.reply(body=orjson.dumps({"table": table}))

    async def delete_topic(self, command: Command, connection, caller: Caller) -> Command:
        """mqadmin deleteTopic sends DELETE_TOPIC_IN_BROKER to each master, then DELETE_TOPIC_IN_NAMESRV to each
        nameserver: the first deletes the topic with all it holds (as a RocketMQ broker does, whatever its consumers
        have left), the others find it gone and succeed."""
        name = command.ext["topic"]
        try:
            await self.dispatcher.local("DeleteTopic", {"topic": name, "force": True}, caller)
        except RocketError as error:
            if error.code != Code.UNKNOWN_TOPIC:
                raise
        self.bridge.forget_topic(name)
        return command.reply()
