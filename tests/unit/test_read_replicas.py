"""The nameservers' read-replica planner (roles/nameserver/readers.py) over a real Metadata, with the group leaders'
membership changes recorded: what it adds, where, what it removes, and in which order it records and changes."""

from __future__ import annotations

import orjson
import pytest
import trio

from rocket.errors import Code, RocketError
from rocket.ml.placement import LeastLoaded, NodeLoad
from rocket.raft.core import Entry
from rocket.roles.nameserver.metadata import Metadata
from rocket.roles.nameserver.readers import ReadReplicas, check_read_replicas


class Meta:
    """The metadata group, applying each proposal at once."""

    def __init__(self, metadata: Metadata):
        self.metadata = metadata
        self.index = 0

    async def propose(self, command: dict):
        self.index += 1
        [result] = self.metadata.apply([Entry(1, self.index, orjson.dumps(command))], [-1])
        if isinstance(result, RocketError):
            raise result
        return result


class Cluster:
    def __init__(self, nodes: int = 6):
        self.metadata = Metadata()
        self.meta = Meta(self.metadata)
        self.down: set[int] = set()
        self.changes: list[tuple[int, str, int]] = []  # (group, action, node), as the leaders ran them
        self.failing = False
        self.nodes = range(1, nodes + 1)
        self.readers = ReadReplicas(self.meta, self.metadata, LeastLoaded(), self.loads, self.down.__contains__,
                                    self.change_members)

    def loads(self) -> list[NodeLoad]:
        return [NodeLoad(node, self.metadata.replicas(node), available=node not in self.down) for node in self.nodes]

    async def change_members(self, group: int, action: str, node: int) -> None:
        if self.failing:
            raise RocketError(Code.UNAVAILABLE, f"group {group} has no reachable leader")
        self.changes.append((group, action, node))

    async def setup(self, read_replicas: int) -> None:
        for node in self.nodes:
            await self.meta.propose({"op": "register", "node": node, "address": f"127.0.0.1:{9000 + node}",
                                     "roles": ["storage"]})
        await self.meta.propose({"op": "create_topic", "name": "hot", "queues": 2, "created_ms": 1,
                                 "new_groups": [{"id": 2, "voters": [1, 2, 3]}], "groups": [2],
                                 "read_replicas": read_replicas})

    async def round(self, moving: set[int] | None = None) -> None:
        async with trio.open_nursery() as nursery:
            self.readers.start(nursery, set() if moving is None else moving)


async def test_readers_go_to_the_least_loaded_nodes_one_per_round_and_leave_with_their_nodes():
    cluster = Cluster()
    await cluster.setup(2)
    await cluster.meta.propose({"op": "create_topic", "name": "other", "queues": 1, "created_ms": 1,
                                "new_groups": [{"id": 3, "voters": [4, 5, 1]}], "groups": [3]})
    await cluster.round()
    assert cluster.metadata.groups[2].readers == (6,)  # nodes 4 and 5 hold group 3 already
    await cluster.round()
    assert cluster.metadata.groups[2].readers == (6, 4) and cluster.metadata.groups[3].readers == ()
    assert cluster.changes == [(2, "add_learner", 6), (2, "add_learner", 4)]
    await cluster.round()
    assert len(cluster.changes) == 2  # settled: nothing asked again in this term
    cluster.down.add(6)  # its reader goes, and another takes its place on the next round
    await cluster.round()
    assert cluster.metadata.groups[2].readers == (4,) and cluster.changes[-1] == (2, "remove", 6)
    await cluster.round()
    assert cluster.metadata.groups[2].readers == (4, 5) and cluster.changes[-1] == (2, "add_learner", 5)
    await cluster.meta.propose({"op": "update_topic", "name": "hot", "retention_s": -1.0, "local_retention_s": -1.0,
                                "read_replicas": 0})
    await cluster.round()
    await cluster.round()
    assert cluster.metadata.groups[2].readers == () and cluster.changes[-2:] == [(2, "remove", 5), (2, "remove", 4)]


async def test_a_failed_change_is_retried_and_a_new_leader_confirms_the_recorded_readers():
    cluster = Cluster()
    await cluster.setup(1)
    cluster.failing = True  # recorded, then the group's leader could not be reached
    await cluster.round()
    assert cluster.metadata.groups[2].readers == (4,) and cluster.changes == []
    cluster.failing = False
    await cluster.round()
    assert cluster.changes == [(2, "add_learner", 4)]
    cluster.readers.forget()  # another term: the recorded reader is confirmed again (the change is idempotent)
    await cluster.round()
    assert cluster.changes == [(2, "add_learner", 4), (2, "add_learner", 4)]
    await cluster.round({2})  # a replica move runs on the group: it is left alone
    assert len(cluster.changes) == 2


async def test_read_replicas_are_refused_out_of_range_and_on_a_controller_class():
    cluster = Cluster()
    await cluster.setup(0)
    with pytest.raises(RocketError) as too_many:
        check_read_replicas(cluster.metadata, "raft", 5)
    assert too_many.value.code == Code.BAD_REQUEST and "0..4" in too_many.value.message
    await cluster.meta.propose({"op": "create_class", "name": "pair", "mode": "controller", "replicas": 2,
                                "min_in_sync_replicas": 1, "unclean_election": False, "ha_max_lag_s": 5.0,
                                "new_groups": []})
    with pytest.raises(RocketError) as controlled:
        check_read_replicas(cluster.metadata, "pair", 1)
    assert "raft storage class" in controlled.value.message
    check_read_replicas(cluster.metadata, "pair", 0)
