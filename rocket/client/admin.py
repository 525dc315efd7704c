"""Topic administration over a channel."""

from __future__ import annotations

from rocket.model import TopicSpec


class Admin:
    def __init__(self, channel):
        self.channel = channel

    async def create_topic(self, name: str, queues: int) -> TopicSpec:
        return TopicSpec.from_wire(await self.channel.call("CreateTopic", {"topic": name, "queues": queues}))

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
