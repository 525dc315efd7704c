"""The broker's storage calls (roles/broker/routes.py, `Routes.storage`) when a group's leader stops answering, as
behind a partition: the next try goes to the other replicas, not to the silent one again, and so do the broker's
other calls for a while (limits.storage_silent_s), each giving the silent node only a short probe. A leader's own
error is the one reported, not a follower's "not the leader"."""

from __future__ import annotations

import pytest
import trio

from rocket import limits
from rocket.clock import Clock
from rocket.errors import Code, RocketError
from rocket.model import Address, TopicSpec
from rocket.replication import NotLeader
from rocket.roles.broker.routes import Routes

SILENT, NEW_LEADER, FOLLOWER = 1, 2, 3


class Peers:
    """Node 1 holds every call until its timeout (a partition); node 2 leads now; node 3 follows."""

    metadata_version = 0

    def __init__(self):
        self.calls: list[int] = []
        self.routes_given = 0

    async def call(self, address: Address, method: str, request: dict, timeout_s: float) -> dict:
        node = address.port
        self.calls.append(node)
        if node == SILENT:
            await trio.sleep(timeout_s)
            raise RocketError(Code.TIMEOUT, "no answer")
        if node == FOLLOWER:
            raise RocketError(Code.UNAVAILABLE, "not the leader")
        return {"ok": True}

    async def nameserver(self, method: str, request: dict) -> dict:
        """Topic orders: queue 0 on group 7 (nodes 1, 2, 3), queue 1 on group 8 (nodes 1, 3), both led by node 1;
        then no nameserver answers (the partition cut them off too)."""
        if self.routes_given:
            raise RocketError(Code.UNAVAILABLE, "no nameserver answers")
        self.routes_given += 1
        return {"version": 1, "topic": TopicSpec("orders", queues=2).to_wire(), "queue_groups": [7, 8],
                "nodes": [{"id": node, "address": f"127.0.0.1:{node}"} for node in (SILENT, NEW_LEADER, FOLLOWER)],
                "groups": [{"id": 7, "voters": [SILENT, NEW_LEADER, FOLLOWER], "leader": SILENT},
                           {"id": 8, "voters": [SILENT, FOLLOWER], "leader": SILENT}]}


async def known_routes() -> Routes:
    routes = Routes(Peers(), Clock())  # type: ignore[arg-type]
    await routes.route("orders")
    return routes


async def test_a_leader_that_does_not_answer_is_tried_last(autojump_clock):
    """Once the known leader's call timed out, the other replicas are tried before it again: the call is served
    after one storage call's timeout, not two."""
    routes = await known_routes()
    route = await routes.route("orders")
    started = trio.current_time()
    assert await routes.storage(route, 7, "StorageAppend", {"group": 7}) == {"ok": True}
    assert trio.current_time() - started < limits.storage_call_s_max + 1
    assert routes.peers.calls == [SILENT, NEW_LEADER]
    assert routes.leader_of(7) == NEW_LEADER


async def test_every_call_asks_a_silent_node_last_and_briefly(autojump_clock):
    """Once one call found a leader silent, the broker's next calls, for its other groups too, go to the other
    replicas first and give the silent node only limits.storage_silent_probe_s: served without a storage call's
    timeout each. Once it answers again, it is asked first again."""
    routes = await known_routes()
    route = await routes.route("orders")
    await routes.storage(route, 7, "StorageAppend", {"group": 7})  # waits out one timeout: node 1 is silent
    routes.peers.calls.clear()
    started = trio.current_time()
    with trio.move_on_after(limits.storage_silent_probe_s * 3):  # group 8 has no other leader: probes only
        await routes.storage(route, 8, "StorageAppend", {"group": 8})
    assert trio.current_time() - started < limits.storage_silent_probe_s * 3 + 0.01
    assert routes.peers.calls[:2] == [FOLLOWER, SILENT]  # the follower first, then a probe of the silent node
    assert routes.peers.calls.count(SILENT) >= 2  # each probe ended after storage_silent_probe_s, not a call's timeout
    assert limits.storage_silent_probe_s < limits.storage_call_s_max


async def test_the_leaders_error_is_reported_not_a_followers(autojump_clock):
    """A leader that answers UNAVAILABLE for a reason of its own (its object store down) until the retries run out:
    the caller hears that reason, not the last follower's "not the leader"."""
    routes = await known_routes()
    route = await routes.route("orders")

    async def call(address: Address, method: str, request: dict, timeout_s: float) -> dict:
        if address.port == FOLLOWER:
            raise RocketError(Code.UNAVAILABLE, "not the leader")
        raise RocketError(Code.UNAVAILABLE, "the object store did not return tier object k: it is down")

    routes.peers.call = call
    try:
        await routes.storage(route, 8, "StorageRead", {"group": 8})
    except RocketError as error:
        assert error.code == Code.UNAVAILABLE and "object store" in error.message, error
    else:
        raise AssertionError("the read succeeded")


async def test_a_leader_named_by_a_former_one_is_asked_and_its_error_reported(autojump_clock):
    """The broker still takes node 1 for group 7's leader; node 1 answers that node 2 leads now, node 2 that its
    object store is down, node 3 that node 2 leads. The caller hears node 2's reason (not a "not the leader", which
    the example cluster's test once got after a kill moved leaders), and the next call goes to node 2 first."""
    routes = await known_routes()
    route = await routes.route("orders")
    calls: list[int] = []

    async def call(address: Address, method: str, request: dict, timeout_s: float) -> dict:
        calls.append(address.port)
        if address.port != NEW_LEADER:
            raise NotLeader(NEW_LEADER)
        raise RocketError(Code.UNAVAILABLE, "the object store did not return tier object k: it is down")

    routes.peers.call = call
    with pytest.raises(RocketError) as failed:
        await routes.storage(route, 7, "StorageRead", {"group": 7})
    assert failed.value.code == Code.UNAVAILABLE and "object store" in failed.value.message, failed.value
    assert calls[:2] == [SILENT, NEW_LEADER] and routes.leader_of(7) == NEW_LEADER
    calls.clear()
    with pytest.raises(RocketError):
        await routes.storage(route, 7, "StorageRead", {"group": 7})
    assert calls[0] == NEW_LEADER


def test_not_leader_names_its_leader_over_the_wire():
    assert NotLeader.named(RocketError.from_wire(NotLeader(13).to_wire())) == 13
    assert NotLeader.named(RocketError.from_wire(NotLeader(0).to_wire())) == 0
    assert NotLeader.named(RocketError(Code.UNAVAILABLE, "the object store is down")) is None
    assert NotLeader.named(RocketError(Code.TIMEOUT, NotLeader.PREFIX + "3")) is None
