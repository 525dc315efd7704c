"""Remoting clients and their groups: HEART_BEAT, UNREGISTER_CLIENT, GET_CONSUMER_LIST_BY_GROUP, and
NOTIFY_CONSUMER_IDS_CHANGED pushed when a group's members change. A part of RemotingGateway (Clients).
"""

from __future__ import annotations

import dataclasses
import logging
from typing import TYPE_CHECKING

import orjson
import trio

from rocket import limits
from rocket.clock import sleep_periodic
from rocket.errors import Code, RocketError
from rocket.gateway.remoting.bridge import Bridge
from rocket.gateway.remoting.codec import Command, RequestCode, ResponseCode, json_body, objects
from rocket.model import RETRY_PREFIX
from rocket.transport.guard import Caller

if TYPE_CHECKING:
    from rocket.gateway.remoting.server import Connection

log = logging.getLogger("rocket.remoting")


@dataclasses.dataclass
class Member:
    client: str
    connection: Connection
    subscriptions: dict[str, tuple[str, str]]  # topic -> (expression type, expression)


class Clients:
    """A consumer is a member of its group for as long as its connection lives, as in RocketMQ: the gateway keeps it
    in rocket's cluster-wide group membership (GroupHeartbeat, per subscribed topic) every
    limits.remoting_member_refresh_s, well inside rocket's member expiry, so every broker answers the same member
    list. A closed connection or UNREGISTER_CLIENT leaves at once. Committed offsets are kept here and written every
    limits.remoting_member_refresh_s (and when a client leaves), not once per pull: a pull carries its consumer's
    commit. At most limits.remoting_client_groups_max groups of each kind are kept, a group forgotten with its last
    client, and at most limits.remoting_unwritten_offsets_keys_max (group, topic) pairs of unwritten offsets."""

    def __init__(self, bridge: Bridge) -> None:
        self.bridge, self.dispatcher = bridge, bridge.dispatcher
        # Groups with clients connected here, at most limits.remoting_client_groups_max of each kind, each of at most
        # limits.group_members_max clients; a group goes when its last client leaves.
        self._groups: dict[str, dict[str, Member]] = {}  # consumer group -> client id -> member
        self._producers: dict[str, dict[str, object]] = {}  # producer group -> client id -> connection
        # (group, topic) -> members, as last read: kept only while a local member subscribes to the topic
        self._members_seen: dict[tuple[str, str], list[str]] = {}
        # (group, topic) -> queue -> offset, unwritten: at most limits.remoting_unwritten_offsets_keys_max pairs
        self._offsets: dict[tuple[str, str], dict[int, int]] = {}
        self._retry_topics_made: set[str] = set()  # cleared at limits.gateway_topic_cache_entries_max

    async def heart_beat(self, command: Command, connection, caller: Caller) -> Command:
        data = json_body(command)
        client = str(data.get("clientID", ""))
        if not client:
            raise ValueError("the heartbeat names no clientID")
        for producer in objects(data.get("producerDataSet"), "producerDataSet"):
            group = _group_of(self._producers, str(producer.get("groupName", "")))
            if group is not None and (client in group or len(group) < limits.group_members_max):
                group[client] = connection
        for consumer in objects(data.get("consumerDataSet"), "consumerDataSet"):
            group_name = str(consumer.get("groupName", ""))
            subscriptions = {str(entry.get("topic", "")): (str(entry.get("expressionType") or "TAG"),
                                                           str(entry.get("subString") or "*"))
                             for entry in objects(consumer.get("subscriptionDataSet"), "subscriptionDataSet")}
            members = _group_of(self._groups, group_name)
            if members is None or client not in members and len(members) >= limits.group_members_max:
                continue
            fresh = client not in members or members[client].subscriptions.keys() != subscriptions.keys()
            members[client] = Member(client, connection, subscriptions)
            if consumer.get("messageModel") != "BROADCASTING":
                await self.ensure_retry_topic(group_name)
            if fresh:
                await self._refresh_group(group_name)
        return command.reply()

    async def ensure_retry_topic(self, group: str) -> None:
        """A clustering consumer group's retry topic, %RETRY%group (RocketMQ's broker makes it at the group's first
        heartbeat): a delay topic with one queue, where CONSUMER_SEND_MSG_BACK puts messages to consume again."""
        name = RETRY_PREFIX + group
        if name in self._retry_topics_made:
            return
        try:
            await self.bridge.topic(name)
        except RocketError:
            try:
                await self.dispatcher.local("CreateTopic", {"topic": name, "queues": 1, "message_type": "delay",
                                                            "storage_class": "raft"})
            except RocketError as error:
                if error.code != Code.TOPIC_EXISTS:
                    log.warning("cannot create the retry topic %s: %s", name, error)
                    return
            self.bridge.forget_topic(name)
        if len(self._retry_topics_made) >= limits.gateway_topic_cache_entries_max:
            self._retry_topics_made.clear()
        self._retry_topics_made.add(name)

    async def unregister_client(self, command: Command, connection, caller: Caller) -> Command:
        client, group_name = command.ext.get("clientID", ""), command.ext.get("consumerGroup")
        if group_name and self._groups.get(group_name, {}).pop(client, None) is not None:
            if not self._groups[group_name]:
                del self._groups[group_name]
            await self._flush_offsets()
            await self._refresh_group(group_name, leaving=client)
        producers = self._producers.get(command.ext.get("producerGroup", ""))
        if producers is not None and producers.pop(client, None) is not None and not producers:
            del self._producers[command.ext["producerGroup"]]
        return command.reply()

    async def connection_closed(self, connection) -> None:
        with trio.CancelScope(shield=True), trio.move_on_after(limits.shutdown_grace_s):
            for group_name, members in list(self._groups.items()):
                gone = [client for client, member in members.items() if member.connection is connection]
                for client in gone:
                    del members[client]
                    await self._flush_offsets()
                    await self._refresh_group(group_name, leaving=client)
                if not members:
                    self._groups.pop(group_name, None)
            for group_name, clients in list(self._producers.items()):
                for client in [client for client, held in clients.items() if held is connection]:
                    del clients[client]
                if not clients:
                    del self._producers[group_name]

    async def consumer_list(self, command: Command, connection, caller: Caller) -> Command:
        group_name = command.ext["consumerGroup"]
        topics = self._group_topics(group_name)
        if not topics:
            return command.reply(ResponseCode.CONSUMER_NOT_ONLINE, f"the consumer group {group_name} has no "
                                 "consumer online here: send a heartbeat first")
        members: set[str] = set()
        for topic in topics:  # read now: members that joined through another broker count at once
            members.update(await self._refresh(group_name, topic))
        return command.reply(body=orjson.dumps({"consumerIdList": sorted(members)}))

    def _group_topics(self, group_name: str) -> list[str]:
        return sorted({topic for member in self._groups.get(group_name, {}).values() for topic in member.subscriptions})

    async def _refresh_group(self, group_name: str, leaving: str = "") -> None:
        for topic in self._group_topics(group_name):
            await self._refresh(group_name, topic)
        if leaving:
            for (group, topic) in [key for key in self._members_seen if key[0] == group_name]:
                await self._refresh(group, topic, leaving)

    async def _refresh(self, group_name: str, topic: str, leaving: str = "") -> list[str]:
        """Keep this gateway's members of the group alive on the topic (and a leaving one out); the members, and
        a NOTIFY_CONSUMER_IDS_CHANGED to the local ones when they changed."""
        local = [client for client, member in self._groups.get(group_name, {}).items() if topic in member.subscriptions]
        members: list[str] = []
        try:
            if leaving:
                members = (await self.dispatcher.local("GroupHeartbeat", {"group": group_name, "topic": topic,
                                                                         "member": leaving, "leave": True}))["members"]
            for client in local:
                members = (await self.dispatcher.local("GroupHeartbeat", {"group": group_name, "topic": topic,
                                                                         "member": client, "leave": False}))["members"]
            if not local and not leaving:
                members = (await self.dispatcher.local("GroupHeartbeat", {"group": group_name, "topic": topic,
                                                                         "member": "", "leave": True}))["members"]
        except RocketError as error:
            log.info("membership of %s on %s: %s", group_name, topic, error)
            return self._members_seen.get((group_name, topic), local)
        before = self._members_seen.get((group_name, topic))
        if local:  # who to tell of a change: without local members there is no one
            self._members_seen[(group_name, topic)] = members
        else:
            self._members_seen.pop((group_name, topic), None)
        if before is not None and before != members:
            notice = Command(RequestCode.NOTIFY_CONSUMER_IDS_CHANGED, ext={"consumerGroup": group_name})
            for client in local:
                connection = self._groups[group_name][client].connection
                await connection.notify(Command(notice.code, ext=dict(notice.ext)))
        return members

    async def keep_members(self) -> None:
        """Every limits.remoting_member_refresh_s: the local members kept alive, and the unwritten offsets written."""
        while True:
            await sleep_periodic(limits.remoting_member_refresh_s)
            await self._flush_offsets()
            for group_name in list(self._groups):
                for topic in self._group_topics(group_name):
                    await self._refresh(group_name, topic)

    def subscription_of(self, group_name: str, topic: str) -> tuple[str, str]:
        for member in self._groups.get(group_name, {}).values():
            if topic in member.subscriptions:
                return member.subscriptions[topic]
        return ("TAG", "*")

    def members_of(self, group_name: str) -> dict[str, Member]:
        """The group's clients connected here, by client id."""
        return self._groups.get(group_name, {})

    def member_count(self) -> int:
        return sum(len(members) for members in self._groups.values())

    def producer_connections(self, group_name: str) -> list:
        return list(self._producers.get(group_name, {}).values())

    def commit_later(self, group_name: str, topic: str, queue: int, offset: int) -> None:
        """Keep a commit for the next write; a negative one means nothing was consumed (ali-ons commits -1 for a
        queue it held at offset 0) and is not kept."""
        key = (group_name, topic)
        if offset < 0:
            return
        if key not in self._offsets and len(self._offsets) >= limits.remoting_unwritten_offsets_keys_max:
            # Not kept (storage unreachable this long, or a runaway client): the consumer's next pull carries its
            # commit again, and until one is written a restarted consumer reads from the last written (at least once).
            log.info("unwritten offsets of %d groups and topics are held already: not keeping %s on %s",
                     len(self._offsets), group_name, topic)
            return
        self._offsets.setdefault(key, {})[queue] = offset

    def uncommitted(self, group_name: str, topic: str, queue: int) -> int | None:
        return self._offsets.get((group_name, topic), {}).get(queue)

    async def _flush_offsets(self) -> None:
        pending, self._offsets = self._offsets, {}
        for (group_name, topic), offsets in pending.items():
            try:
                await self.dispatcher.local("CommitOffsets", {"group": group_name, "topic": topic, "offsets": [
                    {"queue": queue, "offset": offset} for queue, offset in offsets.items()]})
            except RocketError as error:  # kept for the next round, unless newer ones came meanwhile
                log.info("committing offsets of %s on %s: %s", group_name, topic, error)
                if (group_name, topic) not in self._offsets and \
                        len(self._offsets) >= limits.remoting_unwritten_offsets_keys_max:
                    continue  # newer pairs took the room: these consumers commit again with their next pull
                newer = self._offsets.setdefault((group_name, topic), {})
                for queue, offset in offsets.items():
                    newer.setdefault(queue, offset)


def _group_of(groups: dict[str, dict], name: str) -> dict | None:
    """The group's clients, a new group's if fewer than limits.remoting_client_groups_max have clients here."""
    found = groups.get(name)
    if found is None and len(groups) < limits.remoting_client_groups_max:
        found = groups[name] = {}
    return found
