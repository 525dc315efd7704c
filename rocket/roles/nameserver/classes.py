"""Storage classes (issue 32): the calls that create and describe them, in typed messages (rocket/serde/typed.py).
A part of Nameserver.
"""

from __future__ import annotations

import logging
from typing import Protocol

import trio

from rocket import limits
from rocket.config import NodeConfig
from rocket.errors import Code, RocketError
from rocket.model import check_name, check_request_id
from rocket.ml.placement import NodeLoad
from rocket.roles.nameserver.group import MetadataGroup
from rocket.roles.nameserver.metadata import DEFAULT_CLASS, STORAGE_MODES, class_exists, unknown_class
from rocket.serde.typed import (CreateStorageClassRequest, StorageClassesRequest, StorageClassesResponse,
                                StorageClassInfo, convert, plain)

log = logging.getLogger("rocket.nameserver")


def check_class_request(request: dict) -> None:
    """A class's settings, each refused with one line saying what is allowed."""
    check_name("storage class", request["name"], limits.storage_class_name_bytes_max)
    mode, replicas = request["mode"], request["replicas"]
    if mode not in STORAGE_MODES:
        raise RocketError(Code.BAD_REQUEST, f"mode must be one of {', '.join(STORAGE_MODES)}, got {mode!r}")
    if mode == "controller" and not 2 <= replicas <= limits.replication_max:
        raise RocketError(Code.BAD_REQUEST, f"a controller-mode class needs 2..{limits.replication_max} replicas (a "
                          f"master and at least one slave), got {replicas}")
    if not 1 <= replicas <= limits.replication_max:
        raise RocketError(Code.BAD_REQUEST, f"replicas must be 1..{limits.replication_max}, got {replicas}")
    if not 1 <= request["min_in_sync_replicas"] <= replicas:
        raise RocketError(Code.BAD_REQUEST, f"min_in_sync_replicas must be 1..{replicas} (the replicas), got "
                          f"{request['min_in_sync_replicas']}")
    if not limits.ha_lag_s_min <= request["ha_max_lag_s"] <= limits.ha_lag_s_max:
        raise RocketError(Code.BAD_REQUEST, f"ha_max_lag_s must be {limits.ha_lag_s_min:g}..{limits.ha_lag_s_max:g} "
                          f"seconds, got {request['ha_max_lag_s']}")
    if not 0 <= request["groups"] <= limits.storage_groups_max:
        raise RocketError(Code.BAD_REQUEST, f"groups must be 1..{limits.storage_groups_max} (0: the nameservers' "
                          f"storage_groups), got {request['groups']}")


class GroupMaker(Protocol):
    """What makes new storage groups (the nameserver): the lock new group ids are taken under, the storage nodes as
    placement sees them, the placement of new groups on them, and each group's leader as last reported."""

    creating: trio.Lock
    leaders: dict[int, int]

    def loads(self) -> list[NodeLoad]: ...

    def new_groups(self, count: int, replicas: int, loads: list[NodeLoad]) -> list[dict]: ...


class StorageClasses:
    """The storage class calls. A class is a named pool of storage groups, all made with it: in Raft mode, or in
    controller mode (RIP-44), where the controller in the metadata names each group's master and its replicas in
    sync. The default class, "raft", is the pool the nameservers grow as storage nodes join; it is not stored.
    Topics are placed on one class's groups, and a topic's queues go only to them. Controller-mode groups are
    neither moved nor leader-balanced by the nameservers: the controller keeps their members and names their
    master."""

    def __init__(self, meta: MetadataGroup, config: NodeConfig, maker: GroupMaker):
        self.meta = meta
        self.metadata = meta.metadata
        self.config = config
        self.maker = maker

    async def create_storage_class(self, request: CreateStorageClassRequest) -> StorageClassInfo:
        check_class_request(plain(request))
        check_request_id(request.request_id)
        return await self.meta.on_leader("MetaCreateStorageClass", request, self._create_class_here)

    async def _create_class_here(self, request: CreateStorageClassRequest) -> StorageClassInfo:
        """Place the class's groups on the least loaded storage nodes, one replica per node, and record them."""
        name, replicas = request.name, request.replicas
        count = request.groups or self.config.storage_groups
        async with self.maker.creating:  # group ids are taken one creation at a time
            retry = self.metadata.created_by(request.request_id, "class") == name and name in self.metadata.classes
            if not retry and (name == DEFAULT_CLASS or name in self.metadata.classes):
                raise class_exists(name)
            if retry:  # a create that was applied, whose answer was lost: the first answer
                return convert(self.metadata.describe_class(self.metadata.classes[name], self.maker.leaders,
                                                            elections=False), StorageClassInfo)
            loads = self.maker.loads()
            available = sum(load.available for load in loads)
            if available < replicas:
                raise RocketError(Code.UNAVAILABLE, f"storage class {name!r} needs {replicas} storage nodes up for "
                                  f"its {replicas} replicas; {available} {'is' if available == 1 else 'are'} up")
            if len(self.metadata.groups) + count > limits.storage_groups_max:
                raise RocketError(Code.OVERLOADED, f"{count} more groups would pass the cluster's maximum of "
                                  f"{limits.storage_groups_max}")
            new_groups = self.maker.new_groups(count, replicas, loads)
            await self.meta.propose({"op": "create_class", "name": name, "mode": request.mode, "replicas": replicas,
                                     "min_in_sync_replicas": request.min_in_sync_replicas,
                                     "unclean_election": request.unclean_election,
                                     "ha_max_lag_s": request.ha_max_lag_s, "new_groups": new_groups,
                                     "request_id": request.request_id})
        log.info("storage class %s (%s mode, %d replicas): groups %s", name, request.mode, replicas,
                 ", ".join(str(group["id"]) for group in new_groups))
        return convert(self.metadata.describe_class(self.metadata.classes[name], self.maker.leaders, elections=False),
                       StorageClassInfo)

    async def storage_classes(self, request: StorageClassesRequest) -> StorageClassesResponse:
        return await self.meta.read("MetaStorageClasses", request, self._classes_here, locally=False)

    async def _classes_here(self, request: StorageClassesRequest) -> StorageClassesResponse:
        """Every class with its groups, or one (name) with its groups and their recent elections too."""
        name = request.name
        classes = self.metadata.storage_classes(self.config.replication)
        if name:
            classes = [storage_class for storage_class in classes if storage_class.name == name]
            if not classes:
                raise unknown_class(name)
        return StorageClassesResponse([convert(self.metadata.describe_class(storage_class, self.maker.leaders,
                                                                            elections=bool(name)), StorageClassInfo)
                                       for storage_class in classes])
