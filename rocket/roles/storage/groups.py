"""Consumer group membership on the leader of the group's queue 0: soft state, rebuilt by heartbeats. A part of
StorageRole."""

from __future__ import annotations

import trio

from collections.abc import Callable

from rocket import limits
from rocket.errors import Code, RocketError
from rocket.model import check_group_name, check_topic_name


class GroupMembers:
    """The live pull members per (consumer group, topic), on the leader of the topic's queue 0 (leads(group) raises
    NotLeader elsewhere): at most limits.group_member_keys_max pairs, each of limits.group_members_max members."""

    def __init__(self, leads: Callable[[int], None]):
        self.leads = leads
        self._members: dict[tuple[str, str], dict[str, float]] = {}  # (group, topic) -> member -> expires at
        self._members_swept_at = 0.0

    def pairs(self) -> set[tuple[str, str]]:
        """The (consumer group, topic) pairs with live members, as far as the last sweep knows."""
        return set(self._members)

    async def group_heartbeat(self, request: dict) -> dict:
        """The live members of a consumer group on a topic, on the leader of the storage group of its
        queue 0. Soft state: after a change of leader the members are back within a heartbeat, and until
        then a member may read a queue another one reads too (duplicates, never a gap: positions are
        committed). No member leaving (member "") only reads who is live."""
        self.leads(request["group"])
        key = (check_group_name(request["consumer_group"]), check_topic_name(request["topic"]))
        member = request["member"]
        if len(member) > limits.group_name_bytes_max or not (member or request["leave"]):
            raise RocketError(Code.BAD_REQUEST, f"member id must be 1-{limits.group_name_bytes_max} characters")
        now = trio.current_time()
        full = key not in self._members and len(self._members) >= limits.group_member_keys_max
        if full or now - self._members_swept_at > limits.group_member_expiry_s:  # groups all of whose members left
            self._members_swept_at = now
            for gone in [name for name, members in self._members.items() if max(members.values()) < now]:
                del self._members[gone]
        if key not in self._members and len(self._members) >= limits.group_member_keys_max:
            raise RocketError(Code.OVERLOADED, f"this storage group holds members of {len(self._members)} consumer "
                              "groups and topics already: a runaway client?")
        members = self._members.setdefault(key, {})
        for gone in [name for name, expires in members.items() if expires < now]:
            del members[gone]
        if request["leave"]:
            members.pop(member, None)
        elif member in members or len(members) < limits.group_members_max:
            members[member] = now + limits.group_member_expiry_s
        else:
            raise RocketError(Code.OVERLOADED, f"group {key[0]!r} on {key[1]!r} has {len(members)} members already")
        if not members:
            del self._members[key]
        return {"members": sorted(members), "queues": []}
