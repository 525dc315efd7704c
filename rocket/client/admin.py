"""Topic administration over a channel."""

from __future__ import annotations

from rocket.errors import Code, RocketError
from rocket.model import TopicSpec


class Admin:
    def __init__(self, channel):
        self.channel = channel

    async def create_topic(self, name: str, queues: int, message_type: str = "normal") -> TopicSpec:
        """message_type: normal, fifo, delay or transaction; a topic accepts only sends of its type."""
        return TopicSpec.from_wire(await self.channel.call(
            "CreateTopic", {"topic": name, "queues": queues, "message_type": message_type}))

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
        """Per queue: the group's pull position, pop consumption, lag and dead letters."""
        return (await self.channel.call("DescribeGroup", {"topic": topic, "group": group}))["queues"]

    async def reset_group(self, topic: str, group: str, to: str | int) -> list[dict]:
        """Move the group's positions to 'earliest', 'latest', or a time (epoch ms)."""
        request = {"topic": topic, "group": group, "to": to if isinstance(to, str) else "time",
                   "timestamp_ms": to if isinstance(to, int) else 0}
        return (await self.channel.call("ResetGroup", request))["queues"]

    async def cancel_timer(self, topic: str, timer_id: str) -> None:
        """Drop a delayed message before its time; timer_id is 'QUEUE.OFFSET' from its send."""
        queue, offset = parse_timer_id(timer_id)
        await self.channel.call("CancelTimer", {"topic": topic, "queue": queue, "offset": offset})


def parse_timer_id(timer_id: str) -> tuple[int, int]:
    queue, separator, offset = timer_id.partition(".")
    if not separator or not queue.isdigit() or not offset.isdigit():
        raise RocketError(Code.BAD_REQUEST, f"timer id {timer_id!r}: expected QUEUE.OFFSET, as its send printed")
    return int(queue), int(offset)
