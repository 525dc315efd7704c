"""Topic and cluster administration on the broker: create, list, describe and update topics, storage classes, tier and
cluster status, drains, node health; what the nameservers keep is asked of them. A mixin of Broker.
"""

from __future__ import annotations

from rocket import __version__, limits


class Admin:
    async def ping(self, request: dict) -> dict:
        return {"version": __version__, "roles": list(self.roles)}

    async def create_topic(self, request: dict) -> dict:
        return await self.peers.nameserver("MetaCreateTopic", request, timeout_s=limits.leader_wait_s_max + 5)

    async def create_storage_class(self, request: dict) -> dict:
        return await self.peers.nameserver("MetaCreateStorageClass", request, timeout_s=limits.leader_wait_s_max + 5)

    async def storage_classes(self, request: dict) -> dict:
        return await self.peers.nameserver("MetaStorageClasses", request, timeout_s=limits.leader_wait_s_max + 5)

    async def list_topics(self, request: dict) -> dict:
        """The topics, without the KV buckets kept as topics (KvListBuckets lists those)."""
        topics = (await self.peers.nameserver("MetaListTopics", request))["topics"]
        return {"topics": [topic for topic in topics if topic["message_type"] != "kv"]}

    async def update_topic(self, request: dict) -> dict:
        spec = await self.peers.nameserver("MetaUpdateTopic", request, timeout_s=limits.leader_wait_s_max + 5)
        self._routes.pop(request["topic"], None)
        return spec

    async def tier_status(self, request: dict) -> dict:
        """Per topic (one, or all), per queue: where data starts, locally and in the tier, and its bytes."""
        if request["topic"]:
            names = [request["topic"]]
        else:
            names = [topic["name"] for topic in (await self.list_topics({}))["topics"]]
        topics = []
        for name in names:
            route = await self._route(name)
            queues = []
            for group, numbers in self._by_group(route, range(route.spec.queues)).items():
                response = await self._storage(route, group, "StorageTier", {"group": group, "topic": name,
                                                                            "queues": numbers})
                queues.extend(response["queues"])
            topics.append({"topic": route.spec.to_wire(), "queues": sorted(queues, key=lambda info: info["queue"])})
        return {"topics": topics}

    async def cluster_status(self, request: dict) -> dict:
        return await self.peers.nameserver("ClusterStatus", request, timeout_s=limits.leader_wait_s_max + 5)

    async def placement_explain(self, request: dict) -> dict:
        return await self.peers.nameserver("PlacementExplain", request, timeout_s=limits.leader_wait_s_max + 5)

    async def node_health(self, request: dict) -> dict:
        return await self.peers.nameserver("NodeHealth", request, timeout_s=limits.leader_wait_s_max + 5)

    async def pin_node_health(self, request: dict) -> dict:
        return await self.peers.nameserver("PinNodeHealth", request, timeout_s=limits.leader_wait_s_max + 5)

    async def drain_node(self, request: dict) -> dict:
        return await self.peers.nameserver("DrainNode", request, timeout_s=limits.leader_wait_s_max + 5)

    async def describe_topic(self, request: dict) -> dict:
        route = await self._route(request["topic"])
        queues = [info for response in await self._queues(route) for info in response["queues"]]
        return {"topic": route.spec.to_wire(), "queues": sorted(queues, key=lambda info: info["queue"])}

    async def search_offset(self, request: dict) -> dict:
        route = await self._route(request["topic"])
        offsets = [entry for response in await self._queues(route, timestamp_ms=max(0, request["timestamp_ms"]))
                   for entry in response["time_offsets"]]
        return {"offsets": sorted(offsets, key=lambda entry: entry["queue"])}
