"""The KV API under the roles simulator's faults: a write whose answer is lost is applied once; a range whose shards
cannot answer fails with their error."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from rocket.errors import Code, RocketError
from rocket.model import bucket_topic
from rocket.roles.peers import RETRYABLE
from rocket.store.kv import shard_of
from tests.sim.kv_sim import BUCKET, SHARDS, leader_of
from tests.sim.roles_sim import NetworkFaults, cluster, start_nodes


async def range_with_two_nodes_down(base) -> RocketError:
    """The error a range over every shard gets from the one node left of three (its route cached by a put)."""
    network, nodes = cluster(0, base, NetworkFaults(), groups=6)
    async with trio.open_nursery() as nursery:
        await start_nodes(nursery, nodes)
        listen = nodes[3].config.listen
        address = (listen.host, listen.port)
        await network.call(0, address, "KvCreateBucket", {"bucket": BUCKET, "shards": SHARDS}, 30.0, True)
        await network.call(0, address, "KvPut", {"bucket": BUCKET, "key": "k0", "value": b"v"}, 30.0, True)
        for node in (1, 2):
            nodes[node].crash()
            await nodes[node].stopped.wait()
        with pytest.raises(RocketError) as raised:
            await network.call(0, address, "KvRange", {"bucket": BUCKET, "prefix": ""}, 60.0, True)
        nodes[3].crash()
    return raised.value


def test_a_range_whose_shards_cannot_answer_fails_with_their_error_not_internal(fast_disk, inline_threads):
    """A range reads every shard at once; when they fail, the caller gets a shard's error (here UNAVAILABLE: no
    quorum), which it may retry, not INTERNAL made of the group of the shards' errors."""
    error = trio.run(range_with_two_nodes_down, fast_disk, clock=trio.testing.MockClock(autojump_threshold=0))
    assert error.code in RETRYABLE, error


async def put_whose_first_answer_is_lost(base) -> tuple[RocketError | None, dict]:
    """A put through a broker that is not its shard's leader, the answer of whose first storage call is lost;
    returns the put's error (None if it succeeded) and the key as read afterwards."""
    network, nodes = cluster(0, base, NetworkFaults(), groups=6)
    async with trio.open_nursery() as nursery:
        await start_nodes(nursery, nodes)
        first = nodes[1].config.listen
        await network.call(0, (first.host, first.port), "KvCreateBucket", {"bucket": BUCKET, "shards": SHARDS}, 30.0,
                           True)
        route = await network.call(0, (first.host, first.port), "GetRoute", {"topic": bucket_topic(BUCKET)}, 30.0, True)
        group = route["queue_groups"][shard_of("k0", SHARDS)]
        while leader_of(nodes, group) is None:
            await trio.sleep(0.05)
        broker = nodes[next(node for node in nodes if node != leader_of(nodes, group))].config.listen
        call, lost = network.call, []

        async def lose_first_answer(sender, address, method, request, timeout_s, reliable=False):
            response = await call(sender, address, method, request, timeout_s, reliable)
            if method == "StorageKvTxn" and not lost:
                lost.append(method)
                raise RocketError(Code.CONNECTION_LOST, "connection lost (planted)")
            return response

        network.call = lose_first_answer
        error = None
        try:
            await call(0, (broker.host, broker.port), "KvPut", {"bucket": BUCKET, "key": "k0", "value": b"once"}, 30.0)
        except RocketError as raised:
            error = raised
        found = await call(0, (broker.host, broker.port), "KvGet", {"bucket": BUCKET, "key": "k0"}, 30.0)
        for node in nodes.values():
            node.crash()
    assert lost, "no storage call's answer was lost"
    return error, found["entries"][0]


def test_a_put_whose_answer_is_lost_is_applied_once(fast_disk, inline_threads):
    """A broker that gets no answer from storage for a KV write does not send it again (a second put could undo a
    later one, a CAS would answer CAS_FAILED to its own success): the caller learns the outcome is unknown, and the
    key changed once."""
    error, entry = trio.run(put_whose_first_answer_is_lost, fast_disk,
                            clock=trio.testing.MockClock(autojump_threshold=0))
    assert (bytes(entry["value"]), entry["version"]) == (b"once", 1), entry
    assert error is not None and error.code == Code.CONNECTION_LOST, error
