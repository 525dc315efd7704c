"""Consumer groups' settings (RIP-18's subscription data in the metadata): the calls that create, update, read and
delete them, in typed messages (rocket/serde/typed.py). A part of Nameserver, over the metadata group.
"""

from __future__ import annotations

import logging

from rocket.errors import Code, RocketError
from rocket.model import check_group_name
from rocket.roles.nameserver.group import MetadataGroup
from rocket.roles.nameserver.metadata import CONSUMER_GROUP_FIELDS, check_consumer_group, group_exists
from rocket.serde.typed import (ConsumerGroupInfo, ConsumerGroupsRequest, ConsumerGroupsResponse,
                                CreateConsumerGroupRequest, Empty, UpdateConsumerGroupRequest, convert, plain)

log = logging.getLogger("rocket.nameserver")


def settings_of(request: dict, fields) -> dict:
    """The settings a create or update request gives, checked (BAD_REQUEST in one line)."""
    check_group_name(request["group"])
    unknown = sorted(set(fields) - set(CONSUMER_GROUP_FIELDS))
    if unknown:
        raise RocketError(Code.BAD_REQUEST, f"a consumer group has no setting {unknown[0]!r}: only "
                          f"{', '.join(CONSUMER_GROUP_FIELDS)}")
    return check_consumer_group({field: request[field] for field in CONSUMER_GROUP_FIELDS if field in fields})


class ConsumerGroupSettings:
    """The consumer group calls. A group's settings are its max attempts before the dead letters, its retry backoff,
    its consume mode and whether it consumes in order. Brokers read them (roles/broker/admin.py's GroupSettings, a
    few seconds cached) and apply them to every receive of the group, whichever client or gateway made it."""

    def __init__(self, meta: MetadataGroup):
        self.meta = meta

    async def create_consumer_group(self, request: CreateConsumerGroupRequest) -> ConsumerGroupInfo:
        settings_of(plain(request), CONSUMER_GROUP_FIELDS)
        return await self.meta.on_leader("MetaCreateConsumerGroup", request, self._create_consumer_group_here)

    async def _create_consumer_group_here(self, request: CreateConsumerGroupRequest) -> ConsumerGroupInfo:
        name = request.group
        if name in self.meta.metadata.consumer_groups:
            raise group_exists(name)
        made = await self.meta.propose({"op": "create_consumer_group", "group": name,
                                        "settings": settings_of(plain(request), CONSUMER_GROUP_FIELDS)})
        log.info("consumer group %s: %s", name, made.to_wire())
        return convert(made.to_wire(), ConsumerGroupInfo)

    async def update_consumer_group(self, request: UpdateConsumerGroupRequest) -> ConsumerGroupInfo:
        """Only the settings named in `fields` change."""
        settings_of(plain(request), request.fields)
        return await self.meta.on_leader("MetaUpdateConsumerGroup", request, self._update_consumer_group_here)

    async def _update_consumer_group_here(self, request: UpdateConsumerGroupRequest) -> ConsumerGroupInfo:
        self.meta.metadata.consumer_group(request.group)  # UNKNOWN_GROUP before anything is proposed
        updated = await self.meta.propose({"op": "update_consumer_group", "group": request.group,
                                           "settings": settings_of(plain(request), request.fields)})
        log.info("consumer group %s updated: %s", request.group, updated.to_wire())
        return convert(updated.to_wire(), ConsumerGroupInfo)

    async def delete_consumer_group(self, request: ConsumerGroupsRequest) -> Empty:
        """A deleted consumer group's settings go (a group without settings: nothing to do)."""
        check_group_name(request.group)
        return await self.meta.on_leader("MetaDeleteConsumerGroup", request, self._delete_consumer_group_here)

    async def _delete_consumer_group_here(self, request: ConsumerGroupsRequest) -> Empty:
        if request.group in self.meta.metadata.consumer_groups:
            await self.meta.propose({"op": "delete_consumer_group", "group": request.group})
            log.info("consumer group %s: settings deleted", request.group)
        return Empty()

    async def consumer_groups(self, request: ConsumerGroupsRequest) -> ConsumerGroupsResponse:
        return await self.meta.read("MetaConsumerGroups", request, self._consumer_groups_here)

    async def _consumer_groups_here(self, request: ConsumerGroupsRequest) -> ConsumerGroupsResponse:
        """Every group with settings, by name, or the one named (UNKNOWN_GROUP if it has none)."""
        if request.group:
            return ConsumerGroupsResponse([convert(self.meta.metadata.consumer_group(request.group).to_wire(),
                                                   ConsumerGroupInfo)])
        groups = self.meta.metadata.consumer_groups
        return ConsumerGroupsResponse([convert(groups[name].to_wire(), ConsumerGroupInfo) for name in sorted(groups)])
