"""Unhealthy-node decisions in the roles simulator (issue 31): three all-role nodes run the real nameserver, storage
and broker code, and each storage node's heartbeats carry scripted health counts (fsyncs at a scripted latency,
calls to the other nodes with a scripted share failing). The nameserver leader judges them every window and acts:
the tests watch its states and its nodes' leaderships on the simulated clock.
"""

from __future__ import annotations

import dataclasses
import functools
import json

import trio
import trio.testing

from rocket.errors import Code, RocketError
from rocket.roles.nameserver.metadata import META_GROUP
from rocket.telemetry.registry import FSYNC_BUCKETS, RPC_BUCKETS, Telemetry
from tests.sim.roles_sim import NetworkFaults, cluster, start_nodes

WINDOW_S = 2.0  # two heartbeats: a window never lacks one
FSYNCS_PER_S = 200
CALLS_PER_S = 100
FAST_S = 0.001


class ScriptedHealth(Telemetry):
    """A node's telemetry whose health counts follow a script: at t seconds after origin[0] (before it, t < 0),
    fsync_s(node, t) is the latency of its fsyncs, and error_share(target, t) the share of its calls to another node
    that fail."""

    def __init__(self, node: int, data_dir, addresses: dict[int, str], fsync_s, error_share, origin: list[float]):
        super().__init__(node, data_dir)
        self.addresses, self.fsync_s, self.error_share, self.origin = addresses, fsync_s, error_share, origin
        self.fsync_buckets = [0] * len(FSYNC_BUCKETS)
        self.calls = {target: {"calls": 0, "errors": 0, "buckets": [0] * len(RPC_BUCKETS)}
                      for target in addresses if target != node}
        self.counted_to: float | None = None

    def health_counts(self) -> dict:
        now = trio.current_time()
        elapsed = 0.0 if self.counted_to is None else now - self.counted_to
        self.counted_to = now
        fsyncs, calls = int(FSYNCS_PER_S * elapsed), int(CALLS_PER_S * elapsed)
        t = now - self.origin[0]
        latency = self.fsync_s(self.node_id, t)
        self.fsync_buckets = [count + (fsyncs if latency <= bound else 0)
                              for count, bound in zip(self.fsync_buckets, FSYNC_BUCKETS)]
        for target, entry in self.calls.items():
            failed = round(calls * self.error_share(target, t))
            entry["calls"] += calls
            entry["errors"] += failed
            entry["buckets"] = [count + (calls - failed if 0.002 <= bound else 0)
                                for count, bound in zip(entry["buckets"], RPC_BUCKETS)]
        return {"fsync_buckets": list(self.fsync_buckets), "cpu_starved_s": 0.0,
                "peer_calls": [{"peer": self.addresses[target], **entry} for target, entry in self.calls.items()]}


def never(*_) -> float:
    return 0.0


def fast(*_) -> float:
    return FAST_S


async def scenario(base, fsync_s, error_share, seconds: float, objects=None, actions=(), **config) -> dict:
    """Three nodes with scripted health for `seconds` of simulated time; what the nameserver leader decided,
    sampled every half window: the degraded set over time, and the groups each node led (and, in "replicas", the
    replicas each held then). actions: (t, function of the nodes) to run once t has passed."""
    network, nodes = cluster(7, base, NetworkFaults(), groups=3)
    addresses = {number: str(node.config.address) for number, node in nodes.items()}
    origin = [float("inf")]
    for number, node in nodes.items():
        node.config = dataclasses.replace(node.config, health_window_s=WINDOW_S, **config)
        node.telemetry = ScriptedHealth(number, node.config.data_dir, addresses, fsync_s, error_share, origin)
        node.nameserver_objects = objects
    timeline: list[tuple[float, frozenset[int], dict[int, int]]] = []
    replicas: list[dict[int, int]] = []
    leader_ids: list[int] = []
    async with trio.open_nursery() as nursery:
        await start_nodes(nursery, nodes)
        first = nodes[1].config.listen  # the first topic makes the pool of storage groups
        await network.call(0, (first.host, first.port), "CreateTopic", {"topic": "orders", "queues": 6}, 30.0, True)
        began = origin[0] = trio.current_time()
        pending = sorted(actions, key=lambda action: action[0])
        while trio.current_time() - began < seconds:
            await trio.sleep(WINDOW_S / 2)
            while pending and trio.current_time() - began >= pending[0][0]:
                pending.pop(0)[1](nodes)
            leader = next((node.nameserver for node in nodes.values() if node.up and node.nameserver.leads()), None)
            if leader is not None:
                leader_ids.append(leader.config.node_id)
                leads = {number: sum(1 for group in node.host.groups if group != META_GROUP and node.host.leads(group))
                         for number, node in nodes.items()}
                timeline.append((trio.current_time() - began, frozenset(leader.degraded()), leads))
                replicas.append({number: leader.metadata.replicas(number) for number in nodes})
        states = {number: node.nameserver.health.model_state for number, node in nodes.items()}
        for node in nodes.values():
            node.crash()
    return {"timeline": timeline, "model_states": states, "replicas": replicas, "leaders": leader_ids}


def run(base, fsync_s, error_share, seconds: float, objects=None, actions=(), **config) -> dict:
    clock = trio.testing.MockClock(autojump_threshold=0)
    return trio.run(functools.partial(scenario, base, fsync_s, error_share, seconds, objects, actions, **config),
                    clock=clock)


def transitions(timeline) -> list[tuple[float, frozenset[int]]]:
    """(time, degraded set) at each change of the degraded set."""
    changes, last = [], frozenset()
    for at, degraded, _ in timeline:
        if degraded != last:
            changes.append((at, degraded))
            last = degraded
    return changes


def test_a_slow_disk_is_degraded_after_three_windows_leads_nothing_and_returns_after_six(fast_disk):
    """Hysteresis and the action: node 2's fsyncs 50x slower from 5 s to 30 s."""
    report = run(fast_disk, lambda node, t: 0.05 if node == 2 and 5 <= t < 30 else FAST_S, never, 60)
    changes = transitions(report["timeline"])
    assert [degraded for _, degraded in changes] == [frozenset({2}), frozenset()], changes
    degraded_at, returned_at = changes[0][0], changes[1][0]
    assert 5 + 2 * WINDOW_S <= degraded_at <= 5 + 5 * WINDOW_S, changes  # 3 unhealthy windows, not fewer
    assert 30 + 5 * WINDOW_S <= returned_at <= 30 + 8 * WINDOW_S, changes  # 6 healthy windows
    # while degraded, its leaderships moved off within a few heartbeats
    settled = [leads for at, degraded, leads in report["timeline"] if degraded_at + 5 <= at < returned_at]
    assert settled and all(leads[2] == 0 and sum(leads.values()) == 3 for leads in settled), settled


def test_the_replicas_of_a_node_degraded_past_the_limit_move_to_healthy_nodes(fast_disk):
    """Two replicas per group over three nodes: node 2, degraded from about 11 s, holds its replicas until it has
    been degraded for health_move_after_s, then they move to the healthy nodes, a move at a time at most
    limits.replica_moves_max."""
    report = run(fast_disk, lambda node, t: 0.05 if node == 2 and t >= 5 else FAST_S, never, 60,
                 replication=2, health_move_after_s=20.0)
    degraded_at = next(at for at, degraded, _ in report["timeline"] if degraded == {2})
    held = [(at, replicas[2]) for (at, _, _), replicas in zip(report["timeline"], report["replicas"])]
    assert all(count > 0 for at, count in held if at < degraded_at + 20 - WINDOW_S), held
    first, last = report["replicas"][0], report["replicas"][-1]
    assert held[-1][1] == 0 and sum(last.values()) == sum(first.values()), (first, last)  # none lost on the way


def test_a_new_nameserver_leader_keeps_the_degraded_nodes(fast_disk):
    """The judge's states are in the metadata: when the nameserver leadership moves while node 3 is degraded, the
    new leader starts with node 3 degraded (not healthy for three windows, handing it leaderships back)."""
    leaders = []

    def move_nameserver_leadership(nodes) -> None:
        leader = next(number for number, node in nodes.items() if node.nameserver.leads())
        target = next(number for number in nodes if number not in (leader, 3))
        leaders.append((leader, target))
        nodes[leader].host.transfer_leadership(META_GROUP, target)

    report = run(fast_disk, lambda node, t: 0.05 if node == 3 and t >= 5 else FAST_S, never, 40,
                 actions=[(20.0, move_nameserver_leadership)])
    changes = transitions(report["timeline"])
    assert [degraded for _, degraded in changes] == [frozenset({3})], (changes, leaders)
    assert report["leaders"][-1] == leaders[0][1], (report["leaders"], leaders)


def test_never_more_than_a_minority_degraded(fast_disk):
    """Nodes 2 and 3 both fail half the calls made to them: with three storage nodes, one may be degraded."""
    report = run(fast_disk, fast, lambda target, t: 0.5 if target in (2, 3) and t >= 0 else 0.0, 30)
    degraded_sets = {degraded for _, degraded, _ in report["timeline"]}
    assert any(degraded for degraded in degraded_sets), degraded_sets
    assert all(len(degraded) <= 1 for degraded in degraded_sets), degraded_sets
    assert len(transitions(report["timeline"])) == 1  # the one degraded stays so: never swapped for the other


def test_no_flapping_on_a_node_at_the_edge(fast_disk):
    """Slow one window in three never degrades a node (three in a row do); once degraded, a slow window in every
    four keeps it degraded (six healthy in a row bring it back). Its state changes once in the whole run."""
    def fsync_s(node, t):
        if node != 2 or t < 0:
            return FAST_S
        if t < 60:
            return 0.05 if t % (3 * WINDOW_S) < WINDOW_S else FAST_S
        if t < 80:
            return 0.05  # degraded here
        return 0.05 if t % (4 * WINDOW_S) < WINDOW_S else FAST_S
    report = run(fast_disk, fsync_s, never, 140)
    changes = transitions(report["timeline"])
    assert [degraded for _, degraded in changes] == [frozenset({2})], changes
    assert changes[0][0] >= 60, changes


class CorruptModel:
    """An object store whose health model is not one a node can score, and which has no forecast model."""

    async def get(self, key: str, start: int = 0, end: int | None = None) -> bytes:
        if key.endswith("models/health/latest.json"):
            return json.dumps({"format": "rocket.health", "format_version": 1, "kinds": "everything"}).encode()
        raise RocketError(Code.NOT_FOUND, key)


def test_a_bad_model_is_refused_and_the_threshold_still_acts(fast_disk):
    report = run(fast_disk, lambda node, t: 0.05 if node == 3 and t >= 5 else FAST_S, never, 20, CorruptModel())
    assert all(state.startswith("model refused") for state in report["model_states"].values()), report
    assert any(degraded == frozenset({3}) for _, degraded, _ in report["timeline"])
