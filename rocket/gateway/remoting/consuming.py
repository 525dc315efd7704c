"""Remoting consumption: PULL_MESSAGE (long polls, TAG and SQL92 subscriptions, the commit-offset flag), the
offset requests, CONSUMER_SEND_MSG_BACK onto %RETRY%group and rocket's dead letters, and the orderly consumers'
queue locks. A part of RemotingGateway.
"""

from __future__ import annotations

import orjson

from rocket import limits
from rocket.errors import Code, RocketError
from rocket.filter import compile_filter
from rocket.gateway.reads import matching
from rocket.gateway.remoting import messages as layout
from rocket.gateway.remoting.bridge import Bridge, as_stored
from rocket.gateway.remoting.clients import Clients
from rocket.gateway.remoting.codec import Command, ResponseCode, json_body, objects
from rocket.model import RETRY_PREFIX, Message
from rocket.serde import batch as batch_codec
from rocket.transport.guard import Caller

PULL_COMMIT_OFFSET, PULL_SUSPEND, PULL_SUBSCRIPTION = 1, 2, 4  # PullSysFlag's bits


def _int(header: dict[str, str], name: str, default: int | None = None) -> int:
    value = header.get(name)
    if value in (None, "", "null"):
        if default is None:
            raise ValueError(f"header field {name} is missing")
        return default
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"header field {name}={value[:40]!r} is not an integer") from None


class Consuming:
    def __init__(self, bridge: Bridge, clients: Clients):
        self.bridge, self.clients = bridge, clients
        self.dispatcher, self.clock = bridge.dispatcher, bridge.clock

    async def pull_message(self, command: Command, connection, caller: Caller) -> Command:
        header = command.ext
        group, topic_name = header["consumerGroup"], header["topic"]
        queue, offset = _int(header, "queueId"), _int(header, "queueOffset")
        sys_flag = _int(header, "sysFlag", 0)
        if sys_flag & PULL_COMMIT_OFFSET and _int(header, "commitOffset", -1) >= 0:  # written later, as the node
            self.dispatcher.guard.authorize(caller, "CommitOffsets", {"topic": topic_name, "group": group})
            self.clients.commit_later(group, topic_name, queue, _int(header, "commitOffset"))
        if sys_flag & PULL_SUBSCRIPTION and header.get("subscription"):
            kind, expression = header.get("expressionType") or "TAG", header["subscription"]
        else:
            kind, expression = self.clients.subscription_of(group, topic_name)
        chosen = compile_filter("sql" if kind.upper() == "SQL92" else "tag", expression)
        wait_ms = min(_int(header, "suspendTimeoutMillis", 0), limits.pull_wait_ms_max) if sys_flag & PULL_SUSPEND else 0
        count_max = max(1, min(_int(header, "maxMsgNums", 32), limits.remoting_pull_messages_max))
        try:
            response = await self.dispatcher.local("Pull", {
                "topic": topic_name, "group": group, "queues": [{"queue": queue, "offset": offset}],
                "max_bytes": limits.remoting_pull_bytes_max, "wait_ms": wait_ms,
                "filter_type": "sql" if kind.upper() == "SQL92" else "tag", "filter": expression}, caller)
        except RocketError as error:
            if error.code != Code.OFFSET_OUT_OF_RANGE:
                raise
            info = await self.bridge.queue_info(topic_name, queue)
            moved = info["next_offset"] if offset > info["next_offset"] else info["min_offset"]
            return command.reply(ResponseCode.PULL_OFFSET_MOVED, f"offset {offset} is outside the queue",
                                 {"nextBeginOffset": moved, "minOffset": info["min_offset"],
                                  "maxOffset": info["next_offset"], "suggestWhichBrokerId": 0})
        found, next_offset = matching(response, queue, offset, chosen, count_max)
        low, high = await self.bridge.queue_bounds(topic_name, queue) or (0, next_offset)
        fields = {"nextBeginOffset": next_offset, "minOffset": low, "maxOffset": max(high, next_offset),
                  "suggestWhichBrokerId": 0}
        if not found:
            return command.reply(ResponseCode.PULL_NOT_FOUND, "no new message", fields)
        host = layout.host_bytes(connection.local)
        body = b"".join(as_stored(message, topic_name, host) for message in found)
        return command.reply(ext=fields, body=body)

    # ---- offsets -------------------------------------------------------------------------------------------

    async def query_consumer_offset(self, command: Command, connection, caller: Caller) -> Command:
        header = command.ext
        group, topic, queue = header["consumerGroup"], header["topic"], _int(header, "queueId")
        self.dispatcher.guard.authorize(caller, "FetchOffsets", {"group": group, "topic": topic})  # answered here too
        offset = self.clients.uncommitted(group, topic, queue)
        if offset is None:
            fetched = await self.dispatcher.local("FetchOffsets", {"group": group, "topic": topic})
            offset = next((entry["offset"] for entry in fetched["offsets"] if entry["queue"] == queue), None)
        if offset is None or offset < 0:
            # RocketMQ answers 0 for a queue whose first message is still at offset 0 (and in memory), so a new
            # group reads a young queue from its start whatever its consumeFromWhere: clients count on it.
            if (await self.bridge.queue_info(topic, queue))["min_offset"] > 0:
                return command.reply(ResponseCode.QUERY_NOT_FOUND, "Not found, V3_0_6_SNAPSHOT maybe this group "
                                     "consumer boot first")
            offset = 0
        return command.reply(ext={"offset": offset})

    async def update_consumer_offset(self, command: Command, connection, caller: Caller) -> Command:
        header = command.ext
        self.dispatcher.guard.authorize(caller, "CommitOffsets", {"group": header["consumerGroup"],
                                                                  "topic": header["topic"]})
        self.clients.commit_later(header["consumerGroup"], header["topic"], _int(header, "queueId"),
                                  _int(header, "commitOffset"))  # written later, as the node
        return command.reply()

    async def max_offset(self, command: Command, connection, caller: Caller) -> Command:
        info = await self.bridge.queue_info(command.ext["topic"], _int(command.ext, "queueId"))
        return command.reply(ext={"offset": info["next_offset"]})

    async def min_offset(self, command: Command, connection, caller: Caller) -> Command:
        info = await self.bridge.queue_info(command.ext["topic"], _int(command.ext, "queueId"))
        return command.reply(ext={"offset": info["min_offset"]})

    async def search_offset(self, command: Command, connection, caller: Caller) -> Command:
        queue = _int(command.ext, "queueId")
        found = await self.dispatcher.local("SearchOffset", {"topic": command.ext["topic"],
                                                             "timestamp_ms": _int(command.ext, "timestamp")}, caller)
        offset = next((entry["offset"] for entry in found["offsets"] if entry["queue"] == queue), None)
        if offset is None:
            raise RocketError(Code.BAD_QUEUE, f"topic {command.ext['topic']!r} has no queue {queue}")
        return command.reply(ext={"offset": offset})

    async def earliest_store_time(self, command: Command, connection, caller: Caller) -> Command:
        topic, queue = command.ext["topic"], _int(command.ext, "queueId")
        info = await self.bridge.queue_info(topic, queue)
        message = await self.bridge.message_at(topic, queue, info["min_offset"], caller) \
            if info["next_offset"] > info["min_offset"] else None
        return command.reply(ext={"timestamp": message.timestamp_ms if message else 0})

    # ---- retries ---------------------------------------------------------------------------------------------

    async def send_back(self, command: Command, connection, caller: Caller) -> Command:
        """A message the consumer failed: to %RETRY%group after its delay level (0: the server's choice: the group's
        retry backoff if it has one (rocket group create --retry-backoff), else level 3 plus its reconsume times, as
        RocketMQ), or to rocket's dead letters of its topic once it was consumed maxReconsumeTimes times (the group's
        max attempts less one where set, else the client's), or at once for a negative level."""
        header = command.ext
        group = header["group"]
        topic_hash, queue, low = layout.split_commit_log_offset(_int(header, "offset"))
        retry_topic = RETRY_PREFIX + group
        topic = await self.bridge.topic_by_hash(topic_hash, retry_topic, header.get("originTopic", ""))
        info = await self.bridge.queue_info(topic, queue)
        message = await self.bridge.message_at(topic, queue, layout.unwrap_offset(low, info["next_offset"]), caller,
                                               group)
        if message is None:
            return command.reply(ResponseCode.SYSTEM_ERROR, f"NOT_FOUND: no message at that offset of {topic}")
        properties = dict(message.properties)
        origin_topic = properties.get(layout.RETRY_TOPIC, header.get("originTopic") or topic)
        properties.setdefault(layout.RETRY_TOPIC, origin_topic)
        properties.setdefault(layout.ORIGIN_MESSAGE_ID, header.get("originMsgId", ""))
        properties.setdefault(ORIGIN_QUEUE, str(queue))
        times = int(properties.get(layout.RECONSUME_TIME, "0") or 0) + 1
        properties[layout.RECONSUME_TIME] = str(times)
        level = _int(header, "delayLevel", 0)
        settings = await self.dispatcher.local("GroupSettings", {"group": group})
        if settings["max_attempts"]:  # the group's setting (rocket group create/update) wins over the client's
            max_times = settings["max_attempts"] - 1
        else:
            max_times = _int(header, "maxReconsumeTimes", limits.remoting_reconsume_times_default)
        now_ms = self.clock.wall_ms()
        again = Message(message.body, key=message.key, tag=message.tag, properties=properties,
                        timestamp_ms=message.timestamp_ms)
        if level < 0 or times > max_times:
            origin_queue = int(properties.get(ORIGIN_QUEUE, "0") or 0)
            await self.dispatcher.local("Bury", {"topic": origin_topic, "group": group, "queue": origin_queue,
                                                 "batch": batch_codec.encode([again], now_ms)}, caller)
            return command.reply()
        backoff = settings["retry_backoff_s"]
        if level == 0 and backoff:  # the server's choice, and the group names its backoff
            delay_s = backoff[min(times, len(backoff)) - 1]
        else:
            delay_s = layout.DELAY_LEVELS_S[min(level or 3 + times - 1, len(layout.DELAY_LEVELS_S)) - 1]
        again.deliver_at_ms = now_ms + max(1, int(delay_s * 1000))
        await self.clients.ensure_retry_topic(group)
        await self.dispatcher.local("Produce", {"topic": retry_topic, "queue": -1,
                                                "batch": batch_codec.encode([again], now_ms)})
        return command.reply()

    # ---- orderly consumers' locks ------------------------------------------------------------------------------

    async def lock_batch(self, command: Command, connection, caller: Caller) -> Command:
        """Lock queues for an orderly consumer: those free, or already its, or whose holder stopped renewing for
        limits.remoting_lock_expiry_s (RocketMQ's 60 s rebalance lock). Each queue's storage group keeps its lock
        (LockQueues), so every broker answers alike."""
        return command.reply(body=orjson.dumps({"lockOKMQSet": await self._locks(command, caller, "lock")}))

    async def unlock_batch(self, command: Command, connection, caller: Caller) -> Command:
        await self._locks(command, caller, "unlock")
        return command.reply()

    async def _locks(self, command: Command, caller: Caller, op: str) -> list[dict]:
        """LockQueues for the mqSet's queues, topic by topic; the queues held (lock) or given back (unlock)."""
        request = json_body(command)
        group, client = str(request.get("consumerGroup", "")), str(request.get("clientId", ""))
        by_topic: dict[str, dict[int, dict]] = {}
        for queue in objects(request.get("mqSet"), "mqSet"):
            queue_id = queue.get("queueId")
            if isinstance(queue_id, bool) or not isinstance(queue_id, int):
                raise ValueError(f"mqSet: queueId {queue_id!r} is not an integer")
            by_topic.setdefault(str(queue.get("topic", "")), {})[queue_id] = queue
        done = []
        for topic, queues in by_topic.items():
            answer = await self.dispatcher.local("LockQueues", {"topic": topic, "group": group, "client": client,
                                                                "queues": sorted(queues), "op": op}, caller)
            done += [queues[queue_id] for queue_id in answer["queues"]]
        return done


ORIGIN_QUEUE = "ORIGIN_QUEUE_ID"  # the queue a retried message came from: its dead letter lies beside it
