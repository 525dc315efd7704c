"""The KV API is linearizable under the roles simulator's faults: put, get, compare-and-set by value and by
revision, delete, one-key transactions and ranges of one key, by concurrent clients while shard leaders crash, are
cut off or are split from the other nodes, form a history the Wing–Gong checker accepts, key by key, whatever the
seed. Planted bugs are caught; two bugs the workload found stay fixed."""

from __future__ import annotations

import functools

import pytest
import trio
import trio.testing

from rocket import limits
from rocket.errors import Code, RocketError
from rocket.model import bucket_topic, shard_of
from rocket.parked import Unparked
from rocket.roles.peers import RETRYABLE
from rocket.roles.storage.kv import KeyValues
from rocket.store.kv import ShardTxn
from tests.sim.kv_sim import BUCKET, OPERATIONS, SHARDS, KvScenario, create_bucket, leader_of, run_kv
from tests.sim.linearizability import INFINITY
from tests.sim.roles_sim import NetworkFaults, cluster, start_nodes

KV_SEEDS = 10  # by default: each run simulates about 20 s of three nodes and takes about 1.5 s
SCENARIO = KvScenario(NetworkFaults(drop=0.02, call_loss=0.01))  # 2% of Raft payloads and 1% of answers lost


def simulate(seed: int, directory, scenario: KvScenario) -> dict:
    clock = trio.testing.MockClock(autojump_threshold=0)
    try:
        return trio.run(functools.partial(run_kv, seed, directory, scenario), clock=clock)
    except BaseException:
        print(f"KV simulation failed with seed {seed}: replay with pytest tests/sim/test_kv_sim.py --seed {seed}")
        raise


@pytest.mark.sim_seeds(KV_SEEDS)
def test_kv_is_linearizable_under_crashes_partitions_and_losses(seed, fast_disk):
    """Eight clients' history over six keys of three shards, under three crashes or partitions of shard (or
    nameserver) leaders and lost messages, is linearizable key by key, and no shard revision names two writes."""
    report = simulate(seed, fast_disk, SCENARIO)
    print({key: value for key, value in report.items() if key != "failing history"})
    assert report["linearizable"], f"{report['problem']}\n{report['failing history']}"
    assert not report["conflicts"], report["conflicts"]
    assert report["operations"] > 100 and len(report["faults"]) == 3
    assert all(report.get(kind, 0) > 0 for kind in OPERATIONS), report  # each kind of operation got answers


async def _readable_anywhere(self, request: dict) -> None:
    """The planted bug: a linearizable read without the read barrier, served by whichever replica is asked."""
    self.gate.hosted(request["group"])


PLANTED = {"read without the barrier": (KeyValues, "_kv_readable", _readable_anywhere),
           "CAS without comparing": (ShardTxn, "_holds", lambda self, compare: True)}
PLANTED_SEEDS = (0, 1, 2, 4, 5, 6)  # each bug was caught with each of them (the read bug in 14 of seeds 0-19)


@pytest.mark.parametrize("bug", list(PLANTED))
def test_the_checker_catches_a_planted_bug(bug, fast_disk, monkeypatch):
    """The KV workload and its checker have teeth: with a linearizable read served without the read barrier
    by any replica, or with a compare that always holds, some seed's history has no legal order."""
    monkeypatch.setattr(*PLANTED[bug])
    reports = []
    for seed in PLANTED_SEEDS:
        reports.append(simulate(seed, fast_disk / str(seed), SCENARIO))
        if not reports[-1]["linearizable"]:
            print(f"{bug}, seed {seed}: {reports[-1]['problem']}\n{reports[-1]['failing history']}")
            return
    pytest.fail(f"{bug} went unnoticed with seeds {PLANTED_SEEDS}: "
                f"{[(report['seed'], report['operations']) for report in reports]}")


async def range_with_two_nodes_down(base) -> RocketError:
    """The error a range over every shard gets from the one node left of three (its route cached by a put)."""
    network, nodes = cluster(0, base, NetworkFaults(), groups=6)
    async with trio.open_nursery() as nursery:
        await start_nodes(nursery, nodes)
        listen = nodes[3].config.listen
        address = (listen.host, listen.port)
        await create_bucket(network, address)
        await network.call(0, address, "KvPut", {"bucket": BUCKET, "key": "k0", "value": b"v"}, 30.0, True)
        for node in (1, 2):
            nodes[node].crash()
            await nodes[node].stopped.wait()
        with pytest.raises(RocketError) as raised:
            await network.call(0, address, "KvRange", {"bucket": BUCKET, "prefix": ""}, 60.0, True)
        nodes[3].crash()
    return raised.value


def test_a_range_whose_shards_cannot_answer_fails_with_their_error_not_internal(fast_disk):
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
        await create_bucket(network, (first.host, first.port))
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


def test_a_put_whose_answer_is_lost_is_applied_once(fast_disk):
    """A broker that gets no answer from storage for a KV write does not send it again (a second put could undo a
    later one, a CAS would answer CAS_FAILED to its own success): the caller learns the outcome is unknown, and the
    key changed once."""
    error, entry = trio.run(put_whose_first_answer_is_lost, fast_disk,
                            clock=trio.testing.MockClock(autojump_threshold=0))
    assert (bytes(entry["value"]), entry["version"]) == (b"once", 1), entry
    assert error is not None and error.code == Code.CONNECTION_LOST, error


async def put_cut_short_by_the_retry_deadline(base, plan: dict) -> tuple[RocketError | None, dict]:
    """A put whose storage calls are refused until plan["refuse_until"], set 3 s before the broker's retries end; the
    next call is applied but answered too late. Returns the put's error and the key as read afterwards."""
    network, nodes = cluster(0, base, NetworkFaults(), groups=6)
    async with trio.open_nursery() as nursery:
        await start_nodes(nursery, nodes)
        address = (nodes[1].config.listen.host, nodes[1].config.listen.port)
        await create_bucket(network, address)
        plan["refuse_until"] = trio.current_time() + limits.storage_retry_s_max - 3
        error = None
        try:
            await network.call(0, address, "KvPut", {"bucket": BUCKET, "key": "k0", "value": b"late"}, 60.0, True)
        except RocketError as raised:
            error = raised
        plan["refuse_until"] = -1.0
        await trio.sleep(plan["late_s"])
        found = await network.call(0, address, "KvGet", {"bucket": BUCKET, "key": "k0"}, 30.0, True)
        for node in nodes.values():
            node.crash()
    return error, found["entries"][0]


def test_a_write_out_when_the_broker_stops_retrying_is_unknown_not_unavailable(fast_disk,
                                                                                monkeypatch):
    """UNAVAILABLE from a KV write means no try was applied (a client may send it again); when the broker's retries
    end while a try is out, that try may yet be applied, so the answer is TIMEOUT: the outcome is unknown."""
    plan = {"refuse_until": INFINITY, "late_s": 10.0}
    kv_txn = KeyValues.kv_txn

    async def refused_then_late(self, request: dict) -> dict:
        if trio.current_time() < plan["refuse_until"]:
            raise RocketError(Code.UNAVAILABLE, "refused (planted)")
        result = await kv_txn(self, request)
        if plan["refuse_until"] > 0:
            await trio.sleep(plan["late_s"])
        return result

    def served_as_a_task(self, request: dict, slot) -> None:
        raise Unparked  # the planted refusals and the late answer are the task handler's

    monkeypatch.setattr(KeyValues, "kv_txn", refused_then_late)
    monkeypatch.setattr(KeyValues, "kv_txn_parked", served_as_a_task)
    error, entry = trio.run(put_cut_short_by_the_retry_deadline, fast_disk, plan,
                            clock=trio.testing.MockClock(autojump_threshold=0))
    assert bytes(entry["value"]) == b"late", entry  # the try that was out was applied
    assert error is not None and error.code == Code.TIMEOUT, error
