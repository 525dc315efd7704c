"""The storage role's consumer-group membership (roles/storage/groups.py) is bounded: a client inventing group or
topic names cannot grow it past limits.group_member_keys_max, and pairs whose members all left are forgotten."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from rocket import limits
from rocket.errors import Code, RocketError
from rocket.roles.storage.groups import GroupMembers


def Members() -> GroupMembers:
    return GroupMembers(lambda group: None)  # this node leads every group


def heartbeat(members: Members, group: str, topic: str = "t", member: str = "m") -> dict:
    return {"group": 1, "consumer_group": group, "topic": topic, "member": member, "leave": False}


async def test_member_pairs_are_bounded_and_expired_ones_make_room(monkeypatch, autojump_clock):
    monkeypatch.setattr(limits, "group_member_keys_max", 3)
    members = Members()
    for name in ("a", "b", "c"):
        await members.group_heartbeat(heartbeat(members, name))
    with pytest.raises(RocketError) as refused:
        await members.group_heartbeat(heartbeat(members, "d"))
    assert refused.value.code == Code.OVERLOADED and "runaway" in refused.value.message
    assert (await members.group_heartbeat(heartbeat(members, "a", member="m2")))["members"] == ["m", "m2"]
    await trio.sleep(limits.group_member_expiry_s + 1)  # every member lapses
    assert (await members.group_heartbeat(heartbeat(members, "d")))["members"] == ["m"]
    assert members.pairs() == {("d", "t")}
