"""A topic's storage groups are made when the topic is created, and each storage node learns of its new groups
from the nameservers. A call that names such a group before then is not refused: the node asks for its
assignment at once and serves the call when the answer brings the group, so the first produce to a new topic
takes no retry by the broker."""

from __future__ import annotations

import time

import pytest

from rocket.client import Admin, connect
from rocket.errors import Code, RocketError
from rocket.model import Message
from rocket.serde import batch as batch_codec


async def test_a_storage_call_for_a_group_just_created_is_served(node):
    async with connect(f"127.0.0.1:{node.tcp_port}") as channel:
        await Admin(channel).create_topic("fresh", 4)
        route = await channel.call("GetRoute", {"topic": "fresh"})
        group = route["queue_groups"][0]
        batch = batch_codec.encode([Message(b"first")], int(time.time() * 1000))
        answer = await channel.call("StorageAppend", {"group": group, "topic": "fresh", "queue": 0, "batch": batch})
        assert answer["base_offset"] == 0 and answer["count"] == 1


async def test_a_group_this_node_is_not_given_is_still_refused(node):
    """The node asks, and the answer does not bring the group: UNAVAILABLE, for the broker to try elsewhere."""
    async with connect(f"127.0.0.1:{node.tcp_port}") as channel:
        batch = batch_codec.encode([Message(b"lost")], int(time.time() * 1000))
        with pytest.raises(RocketError) as refused:
            await channel.call("StorageAppend", {"group": 999_999, "topic": "nowhere", "queue": 0, "batch": batch})
        assert refused.value.code == Code.UNAVAILABLE and "not hosted" in refused.value.message
