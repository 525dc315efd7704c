"""Topic administration over a channel."""

from __future__ import annotations

from rocket.errors import Code, RocketError
from rocket.model import Message, TopicSpec, queue_for_key
from rocket.serde import batch as batch_codec
from rocket.transport.channel import Channel


class Admin:
    def __init__(self, channel: Channel):
        self.channel = channel

    async def create_topic(self, name: str, queues: int, message_type: str = "normal") -> TopicSpec:
        """message_type: normal, fifo, delay or transaction; a topic accepts only sends of its type."""
        return TopicSpec.from_wire(await self.channel.call(
            "CreateTopic", {"topic": name, "queues": queues, "message_type": message_type}))

    async def update_topic(self, name: str, retention_s: float | None = None,
                           local_retention_s: float | None = None) -> TopicSpec:
        """Set a topic's total and local retention in whole seconds (0 keeps data for ever, -1 takes the
        node's default; None leaves a setting as it is)."""
        def wire(seconds: float | None) -> int:
            return -2 if seconds is None else -1 if seconds < 0 else max(1, round(seconds)) if seconds else 0

        return TopicSpec.from_wire(await self.channel.call(
            "UpdateTopic", {"topic": name, "retention_s": wire(retention_s), "local_retention_s": wire(local_retention_s)}))

    async def tier_status(self, topic: str = "") -> list[tuple[TopicSpec, list[dict]]]:
        """Per topic (one, or every one): per queue its first, local, tiered and next offsets, its local,
        tiered and pending bytes, and its pieces in the tier."""
        response = await self.channel.call("TierStatus", {"topic": topic})
        return [(TopicSpec.from_wire(entry["topic"]), entry["queues"]) for entry in response["topics"]]

    async def list_topics(self) -> list[TopicSpec]:
        response = await self.channel.call("ListTopics", {})
        return [TopicSpec.from_wire(entry) for entry in response["topics"]]

    async def describe_topic(self, name: str) -> tuple[TopicSpec, list[dict]]:
        response = await self.channel.call("DescribeTopic", {"topic": name})
        return TopicSpec.from_wire(response["topic"]), response["queues"]

    async def cluster_status(self) -> dict:
        """Nodes (roles, liveness, load), storage groups (voters, leader) and the nameserver leader."""
        return await self.channel.call("ClusterStatus", {})

    async def drain_node(self, node: int, draining: bool = True) -> None:
        """Move every replica off a storage node (or, with draining False, let it take replicas again)."""
        await self.channel.call("DrainNode", {"node": node, "draining": draining})

    async def describe_group(self, topic: str, group: str) -> list[dict]:
        """Per queue: the group's pull position, the live pull consumer reading it (member), pop consumption, lag
        and dead letters."""
        return (await self.channel.call("DescribeGroup", {"topic": topic, "group": group}))["queues"]

    async def reset_group(self, topic: str, group: str, to: str | int, queue: int = -1) -> list[dict]:
        """Move the group's positions (on every queue, or on queue) to 'earliest', 'latest', or a time (epoch ms)."""
        request = {"topic": topic, "group": group, "to": to if isinstance(to, str) else "time",
                   "timestamp_ms": to if isinstance(to, int) else 0, "queue": queue}
        return (await self.channel.call("ResetGroup", request))["queues"]

    async def seek_group(self, topic: str, group: str, queue: int, offset: int) -> list[dict]:
        """Move the group's positions on one queue to offset: past a batch its consumers cannot read, say."""
        request = {"topic": topic, "group": group, "to": "offset", "queue": queue, "offset": offset}
        return (await self.channel.call("ResetGroup", request))["queues"]

    async def get_message(self, topic: str, queue: int, offset: int) -> Message:
        """The message at queue and offset (NOT_FOUND if it was never stored)."""
        response = await self.channel.call("Pull", {"topic": topic, "queues": [{"queue": queue, "offset": offset}],
                                                    "max_bytes": 1, "wait_ms": 0})
        for stored in response["batches"]:
            for message in batch_codec.decode(stored["batch"], stored["base_offset"], queue):
                if message.offset == offset:
                    return message
        raise RocketError(Code.NOT_FOUND, f"{topic} has no message {queue}.{offset}")

    async def find_messages(self, topic: str, key: str, start_ms: int = 0, end_ms: int | None = None,
                            limit: int = 64) -> list[Message]:
        """Messages with this key stored from start_ms to end_ms: the key's queue is read over that time
        (batch by batch, no key index), so a narrow range is cheap and a wide one is a scan."""
        spec, queues = await self.describe_topic(topic)
        queue = queue_for_key(key, spec.queues)
        start = (await self.channel.call("SearchOffset", {"topic": topic, "timestamp_ms": start_ms}))["offsets"]
        offset = next(entry["offset"] for entry in start if entry["queue"] == queue)
        end = next(entry["next_offset"] for entry in queues if entry["queue"] == queue)
        if end_ms is not None:
            stop = (await self.channel.call("SearchOffset", {"topic": topic, "timestamp_ms": end_ms + 1}))["offsets"]
            end = next(entry["offset"] for entry in stop if entry["queue"] == queue)
        found: list[Message] = []
        while offset < end and len(found) < limit:
            response = await self.channel.call("Pull", {"topic": topic, "queues": [{"queue": queue, "offset": offset}],
                                                        "wait_ms": 0})
            if not response["batches"]:
                break
            for stored in response["batches"]:
                # A batch that cannot be read holds no key to match (get_message names it).
                messages = batch_codec.readable(stored["batch"], stored["base_offset"], queue) or []
                found.extend(message for message in messages if message.key == key and offset <= message.offset < end)
            offset = response["next_offsets"][0]["offset"]
        return found[:limit]

    async def cancel_timer(self, topic: str, timer_id: str) -> None:
        """Drop a delayed message before its time; timer_id is 'QUEUE.OFFSET' from its send."""
        queue, offset = parse_message_id(timer_id)
        await self.channel.call("CancelTimer", {"topic": topic, "queue": queue, "offset": offset})


def parse_message_id(message_id: str) -> tuple[int, int]:
    """A message's id on its topic is QUEUE.OFFSET; a delayed one's, until delivered, is its timer's."""
    queue, separator, offset = message_id.partition(".")
    if not separator or not queue.isdigit() or not offset.isdigit():
        raise RocketError(Code.BAD_REQUEST, f"message id {message_id!r}: expected QUEUE.OFFSET, as its send printed")
    return int(queue), int(offset)
