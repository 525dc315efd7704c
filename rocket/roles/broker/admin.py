"""Topic and cluster administration on the broker: create, list, describe, update and delete topics, storage classes,
consumer groups' settings, tier and cluster status, drains, node health; what the nameservers keep is asked of them.
The topic, storage class, consumer group and tier calls take and return typed messages (rocket/serde/typed.py).
"""

from __future__ import annotations

import logging
from typing import TypeVar

import msgspec
import trio

from rocket import __version__, limits
from rocket.errors import Code, RocketError
from rocket.model import check_group_name
from rocket.roles.broker.routes import Routes
from rocket.roles.peers import Peers
from rocket.serde.typed import (ConsumerGroupInfo, ConsumerGroupsRequest, ConsumerGroupsResponse,
                                CreateConsumerGroupRequest, CreateStorageClassRequest, CreateTopicRequest,
                                DeleteTopicRequest, DescribeTopicResponse, Empty, ListTopicsResponse,
                                StorageClassesRequest, StorageClassesResponse, StorageClassInfo, StorageQueuesResponse,
                                StorageTierResponse, TierQueue, TierStatusRequest, TierStatusResponse, TierTopic,
                                TopicInfo, TopicRequest, UpdateConsumerGroupRequest, UpdateTopicRequest, convert, plain,
                                topic_info)

log = logging.getLogger("rocket.broker")
T = TypeVar("T", bound=msgspec.Struct)


class GroupSettings:
    """Consumer groups' settings as the nameservers keep them, cached: what receives apply (max attempts, backoff)."""

    def __init__(self, peers: Peers):
        self.peers = peers
        # consumer group -> (read at, its settings or None): the latest limits.group_settings_cache_entries_max
        self._cache: dict[str, tuple[float, dict | None]] = {}

    def forget(self, group: str) -> None:
        """The group's settings changed: the next of() reads them."""
        self._cache.pop(group, None)

    async def delete(self, group: str) -> None:
        """The group's settings go from the nameservers (if it had any)."""
        await self.peers.nameserver("MetaDeleteConsumerGroup", {"group": group}, timeout_s=limits.leader_wait_s_max + 5)
        self.forget(group)

    async def of(self, group: str) -> dict | None:
        """The group's settings (None: it has none), read from the nameservers at most every
        limits.group_settings_cache_s; while they do not answer, what was known (or none) is kept that long. Plain,
        as the nameservers answer: receives read them so (pop.py)."""
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

    async def _metadata(self, method: str, request: msgspec.Struct, answer: type[T]) -> T:
        """A nameservers' metadata change or listing, waiting out a leader change; the answer typed once."""
        return convert(await self.peers.nameserver(method, plain(request), timeout_s=limits.leader_wait_s_max + 5),
                       answer)

    async def create_topic(self, request: CreateTopicRequest) -> TopicInfo:
        return await self._metadata("MetaCreateTopic", request, TopicInfo)

    async def create_storage_class(self, request: CreateStorageClassRequest) -> StorageClassInfo:
        return await self._metadata("MetaCreateStorageClass", request, StorageClassInfo)

    async def storage_classes(self, request: StorageClassesRequest) -> StorageClassesResponse:
        return await self._metadata("MetaStorageClasses", request, StorageClassesResponse)

    async def create_consumer_group(self, request: CreateConsumerGroupRequest) -> ConsumerGroupInfo:
        made = await self._metadata("MetaCreateConsumerGroup", request, ConsumerGroupInfo)
        self.settings.forget(request.group)
        return made

    async def update_consumer_group(self, request: UpdateConsumerGroupRequest) -> ConsumerGroupInfo:
        updated = await self._metadata("MetaUpdateConsumerGroup", request, ConsumerGroupInfo)
        self.settings.forget(request.group)
        return updated

    async def consumer_groups(self, request: ConsumerGroupsRequest) -> ConsumerGroupsResponse:
        return await self._metadata("MetaConsumerGroups", request, ConsumerGroupsResponse)

    async def group_settings(self, request: ConsumerGroupsRequest) -> ConsumerGroupInfo:
        """A group's settings as this broker applies them to its receives (at most limits.group_settings_cache_s
        old): a group without settings answers max_attempts 0 (none set), the default backoff (empty), clustering,
        not FIFO. What a gateway reads to honour the group's max attempts and backoff."""
        name = check_group_name(request.group)
        settings = await self.settings.of(name)
        return ConsumerGroupInfo(name) if settings is None else convert(settings, ConsumerGroupInfo)

    async def list_topics(self, request: Empty) -> ListTopicsResponse:
        """The topics, without the KV buckets kept as topics (KvListBuckets lists those)."""
        listed = convert(await self.peers.nameserver("MetaListTopics", plain(request)), ListTopicsResponse)
        return ListTopicsResponse([topic for topic in listed.topics if topic.message_type != "kv"])

    async def update_topic(self, request: UpdateTopicRequest) -> TopicInfo:
        spec = await self._metadata("MetaUpdateTopic", request, TopicInfo)
        self.routes.forget(request.topic)
        return spec

    async def delete_topic(self, request: DeleteTopicRequest) -> Empty:
        """Delete a topic and everything of it: its messages (locally and in the tier), timers, transactions, dead
        letters, and its consumer groups' offsets and pop states on it (roles/nameserver/deletes.py). Unless forced,
        refused (NOT_CONSUMED) while a consumer group has messages of it left to consume. Returns once every
        group dropped it; a KV bucket is deleted with KvDeleteBucket."""
        route = await self.routes.route(request.topic)
        if route.spec.message_type == "kv":
            raise RocketError(Code.BAD_REQUEST, f"{request.topic!r} is a KV bucket: delete it with KvDeleteBucket")
        if not request.force:
            lagging = sorted({name for response in await self.routes.queues(route, lagging=True)
                              for name in response["lagging"]})
            if lagging:
                raise RocketError(Code.NOT_CONSUMED, f"topic {request.topic!r} has messages consumer group(s) "
                                  f"{', '.join(lagging[:5])}{', ...' if len(lagging) > 5 else ''} have not consumed; "
                                  "force the delete to lose them")
        try:
            return await self._metadata("MetaDeleteTopic", request, Empty)
        finally:
            self.routes.forget(request.topic)

    async def tier_status(self, request: TierStatusRequest) -> TierStatusResponse:
        """Per topic (one, or all), per queue: where data starts, locally and in the tier, and its bytes."""
        if request.topic:
            names = [request.topic]
        else:
            names = [topic.name for topic in (await self.list_topics(Empty())).topics]
        topics = []
        for name in names:
            route = await self.routes.route(name)
            queues: list[TierQueue] = []
            for group, numbers in self.routes.by_group(route, range(route.spec.queues)).items():
                response = await self.routes.storage(route, group, "StorageTier",
                                                     {"group": group, "topic": name, "queues": numbers})
                queues.extend(convert(response, StorageTierResponse).queues)
            topics.append(TierTopic(topic_info(route.spec), sorted(queues, key=lambda info: info.queue)))
        return TierStatusResponse(topics)

    async def forward(self, method: str, request: dict) -> dict:
        """A call the nameservers answer, made on a broker without a nameserver beside it."""
        return await self.peers.nameserver(method, request, timeout_s=limits.leader_wait_s_max + 5)

    async def describe_topic(self, request: TopicRequest) -> DescribeTopicResponse:
        route = await self.routes.route(request.topic)
        queues = [info for response in await self.routes.queues(route)
                  for info in convert(response, StorageQueuesResponse).queues]
        return DescribeTopicResponse(topic_info(route.spec), sorted(queues, key=lambda info: info.queue))

    async def search_offset(self, request: dict) -> dict:
        route = await self.routes.route(request["topic"])
        offsets = [entry for response in await self.routes.queues(route, timestamp_ms=max(0, request["timestamp_ms"]))
                   for entry in response["time_offsets"]]
        return {"offsets": sorted(offsets, key=lambda entry: entry["queue"])}
