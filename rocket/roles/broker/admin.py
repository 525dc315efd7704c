"""Topic and cluster administration on the broker: create, list, describe and update topics, storage classes,
consumer groups' settings, tier and cluster status, drains, node health; what the nameservers keep is asked of them.
"""

from __future__ import annotations

import logging

import trio

from rocket import __version__, limits
from rocket.errors import Code, RocketError
from rocket.model import check_group_name
from rocket.roles.broker.routes import Routes
from rocket.roles.peers import Peers

log = logging.getLogger("rocket.broker")


class GroupSettings:
    """Consumer groups' settings as the nameservers keep them, cached: what receives apply (max attempts, backoff)."""

    def __init__(self, peers: Peers):
        self.peers = peers
        # consumer group -> (read at, its settings or None): the latest limits.group_settings_cache_entries_max
        self._cache: dict[str, tuple[float, dict | None]] = {}

    def forget(self, group: str) -> None:
        """The group's settings changed: the next of() reads them."""
        self._cache.pop(group, None)

    async def of(self, group: str) -> dict | None:
        """The group's settings (None: it has none), read from the nameservers at most every
        limits.group_settings_cache_s; while they do not answer, what was known (or none) is kept that long."""
        now = trio.current_time()
        cached = self._cache.get(group)
        if cached is not None and now - cached[0] < limits.group_settings_cache_s:
            return cached[1]
        try:
            settings = (await self.peers.nameserver("MetaConsumerGroups", {"group": group},
                                                    timeout_s=limits.storage_call_s_max))["groups"][0]
        except RocketError as error:
            settings = None if cached is None else cached[1]
            if error.code != Code.UNKNOWN_GROUP:
                log.info("consumer group %s: settings kept as they were (%s): %s", group,
                         "none" if settings is None else "known", error)
        self._cache.pop(group, None)
        if len(self._cache) >= limits.group_settings_cache_entries_max:
            del self._cache[next(iter(self._cache))]
        self._cache[group] = (now, settings)
        return settings


class Admin:
    def __init__(self, routes: Routes, peers: Peers, roles: tuple[str, ...], settings: GroupSettings):
        self.routes = routes
        self.peers = peers
        self.roles = roles
        self.settings = settings

    async def ping(self, request: dict) -> dict:
        return {"version": __version__, "roles": list(self.roles)}

    async def create_topic(self, request: dict) -> dict:
        return await self.peers.nameserver("MetaCreateTopic", request, timeout_s=limits.leader_wait_s_max + 5)

    async def create_storage_class(self, request: dict) -> dict:
        return await self.peers.nameserver("MetaCreateStorageClass", request, timeout_s=limits.leader_wait_s_max + 5)

    async def storage_classes(self, request: dict) -> dict:
        return await self.peers.nameserver("MetaStorageClasses", request, timeout_s=limits.leader_wait_s_max + 5)

    async def create_consumer_group(self, request: dict) -> dict:
        made = await self.peers.nameserver("MetaCreateConsumerGroup", request, timeout_s=limits.leader_wait_s_max + 5)
        self.settings.forget(request["group"])
        return made

    async def update_consumer_group(self, request: dict) -> dict:
        updated = await self.peers.nameserver("MetaUpdateConsumerGroup", request, timeout_s=limits.leader_wait_s_max + 5)
        self.settings.forget(request["group"])
        return updated

    async def consumer_groups(self, request: dict) -> dict:
        return await self.peers.nameserver("MetaConsumerGroups", request, timeout_s=limits.leader_wait_s_max + 5)

    async def group_settings(self, request: dict) -> dict:
        """A group's settings as this broker applies them to its receives (at most limits.group_settings_cache_s
        old): a group without settings answers max_attempts 0 (none set), the default backoff (empty), clustering,
        not FIFO. What a gateway reads to honour the group's max attempts and backoff."""
        name = check_group_name(request["group"])
        return await self.settings.of(name) or {"group": name, "max_attempts": 0, "retry_backoff_s": [],
                                                 "consume_mode": "clustering", "fifo": False}

    async def list_topics(self, request: dict) -> dict:
        """The topics, without the KV buckets kept as topics (KvListBuckets lists those)."""
        topics = (await self.peers.nameserver("MetaListTopics", request))["topics"]
        return {"topics": [topic for topic in topics if topic["message_type"] != "kv"]}

    async def update_topic(self, request: dict) -> dict:
        spec = await self.peers.nameserver("MetaUpdateTopic", request, timeout_s=limits.leader_wait_s_max + 5)
        self.routes.forget(request["topic"])
        return spec

    async def tier_status(self, request: dict) -> dict:
        """Per topic (one, or all), per queue: where data starts, locally and in the tier, and its bytes."""
        if request["topic"]:
            names = [request["topic"]]
        else:
            names = [topic["name"] for topic in (await self.list_topics({}))["topics"]]
        topics = []
        for name in names:
            route = await self.routes.route(name)
            queues = []
            for group, numbers in self.routes.by_group(route, range(route.spec.queues)).items():
                response = await self.routes.storage(route, group, "StorageTier",
                                                     {"group": group, "topic": name, "queues": numbers})
                queues.extend(response["queues"])
            topics.append({"topic": route.spec.to_wire(), "queues": sorted(queues, key=lambda info: info["queue"])})
        return {"topics": topics}

    async def forward(self, method: str, request: dict) -> dict:
        """A call the nameservers answer, made on a broker without a nameserver beside it."""
        return await self.peers.nameserver(method, request, timeout_s=limits.leader_wait_s_max + 5)

    async def describe_topic(self, request: dict) -> dict:
        route = await self.routes.route(request["topic"])
        queues = [info for response in await self.routes.queues(route) for info in response["queues"]]
        return {"topic": route.spec.to_wire(), "queues": sorted(queues, key=lambda info: info["queue"])}

    async def search_offset(self, request: dict) -> dict:
        route = await self.routes.route(request["topic"])
        offsets = [entry for response in await self.routes.queues(route, timestamp_ms=max(0, request["timestamp_ms"]))
                   for entry in response["time_offsets"]]
        return {"offsets": sorted(offsets, key=lambda entry: entry["queue"])}
