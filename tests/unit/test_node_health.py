"""Unhealthy-node decisions on scripted windows (issue 31): the threshold scorer, and the judge's hysteresis, minority
cap, pins and refusal to flap; the nameserver's windows from heartbeat counts, pins in the metadata, and leaderships
off a degraded node."""

from __future__ import annotations

import math
from types import SimpleNamespace

import orjson
import pytest
import trio

from rocket import limits
from rocket.clock import TrioWallClock
from rocket.config import NodeConfig
from rocket.errors import Code, RocketError
from rocket.ml.health import (DEGRADED, FEATURES, HEALTHY, RECENT_OF, WINDOW_FEATURES, HealthJudge, HealthModel,
                              ModelScorer, NodeWindow, Recent, ThresholdScorer, health_features)
from rocket.ml.trees import ModelError
from rocket.ml.placement import GroupLoad, degraded_leader_transfer
from rocket.raft.core import Entry
from rocket.roles.nameserver.health import NodeHealthChecks, fsync_window, node_windows
from rocket.roles.nameserver.metadata import Metadata
from rocket.serde.typed import NodeLoad, convert
from rocket.telemetry.registry import FSYNC_BUCKETS, RPC_BUCKETS

NODES = [1, 2, 3]


def loads(counts: dict[int, dict]) -> dict[int, NodeLoad]:
    """Each node's heartbeat load, from the counts it carries in their plain form."""
    return {node: convert(load, NodeLoad) for node, load in counts.items()}


def windows(slow: dict[int, float] | None = None, errors: dict[int, int] | None = None, base_s: float = 0.001,
            nodes=NODES) -> list[NodeWindow]:
    """One window of every node: fsync p99 base_s, or slow[node]; 100 calls to each, errors[node] of them failed."""
    slow, errors = slow or {}, errors or {}
    return [NodeWindow(node, slow.get(node, base_s), 500, 100, errors.get(node, 0)) for node in nodes]


def run(judge: HealthJudge, script: list[list[NodeWindow]], pins: dict[int, str] | None = None,
        nodes=NODES) -> list[dict[int, str]]:
    """Each window scored by the threshold scorer and judged; the states after each window."""
    scorer, states = ThresholdScorer(), []
    for window in script:
        verdicts = [scorer.score(node, window) for node in window]
        states.append({node: health.state for node, health in judge.judge(verdicts, nodes, pins or {}).items()})
    return states


def test_a_slow_disk_is_judged_against_its_peers():
    """Slow past both the absolute bound and k times the others' median: unhealthy, with the features it rests on."""
    verdict = ThresholdScorer().score(NodeWindow(3, 0.040, 500), windows())
    assert verdict.unhealthy and verdict.reason.startswith("slow disk")
    assert verdict.features["fsync_p99_s"] == 0.040 and verdict.features["peer_fsync_p99_s"] == 0.001
    assert list(verdict.features)[0] == "fsync_p99_s" and verdict.score == 8.0  # 40 ms / 5 ms, the nearer bound
    assert not ThresholdScorer().score(NodeWindow(3, 0.003, 500), windows()).unhealthy  # 3x the peers, under 5 ms


def test_failing_calls_are_unhealthy_only_with_enough_of_them():
    """Over the error rate bound with enough calls: unhealthy; a few calls say nothing."""
    verdict = ThresholdScorer().score(NodeWindow(2, 0.001, 500, 100, 30), windows())
    assert verdict.unhealthy and verdict.reason.startswith("failing calls")
    assert list(verdict.features)[0] == "call_error_rate"
    few = NodeWindow(2, 0.001, 500, limits.health_calls_min - 1, limits.health_calls_min - 1)
    assert not ThresholdScorer().score(few, windows()).unhealthy


def test_degraded_after_n_windows_and_back_after_m():
    """Hysteresis: degraded at the Nth unhealthy window in a row, healthy again at the Mth healthy one."""
    judge = HealthJudge(degrade_windows=3, recover_windows=6)
    states = run(judge, [windows({3: 0.05})] * 3 + [windows()] * 6)
    assert [state[3] for state in states] == [HEALTHY] * 2 + [DEGRADED] * 6 + [HEALTHY]
    assert all(state[1] == state[2] == HEALTHY for state in states)
    assert judge.nodes[3].reason.startswith("recovered")


def test_no_flapping_on_alternating_windows():
    """A node that is slow every other window never degrades; a degraded one that is so never returns."""
    alternating = [windows({3: 0.05}), windows()] * 10
    assert all(state[3] == HEALTHY for state in run(HealthJudge(3, 6), alternating))
    judge = HealthJudge(3, 6)
    states = run(judge, [windows({3: 0.05})] * 3 + alternating)
    assert all(state[3] == DEGRADED for state in states[2:])


def test_a_cluster_wide_slowdown_degrades_nobody():
    """Every node slow at once (a shared disk, a busy host): no node is slow against its peers."""
    states = run(HealthJudge(3, 6), [windows(base_s=0.2)] * 10)
    assert all(state == {1: HEALTHY, 2: HEALTHY, 3: HEALTHY} for state in states)


def test_minority_cap_takes_the_worst_first_and_waits():
    """Two of four nodes slow: only one (fewer than half) is degraded, the worse; the other waits, and is not
    degraded while the first stays so."""
    five = [1, 2, 3, 4, 5]
    judge = HealthJudge(3, 6)
    states = run(judge, [windows({2: 0.03, 3: 0.05}, nodes=five)] * 5, nodes=five)
    assert states[-1] == {1: HEALTHY, 2: DEGRADED, 3: DEGRADED, 4: HEALTHY, 5: HEALTHY}  # 2 of 5
    four = [1, 2, 3, 4]
    judge = HealthJudge(3, 6)
    states = run(judge, [windows({2: 0.03, 3: 0.05}, nodes=four)] * 5, nodes=four)
    assert states[-1] == {1: HEALTHY, 2: HEALTHY, 3: DEGRADED, 4: HEALTHY}  # 1 of 4
    assert "minority cap" in judge.nodes[2].reason
    assert run(HealthJudge(3, 6), [windows({1: 0.05}, nodes=[1, 2])] * 5, nodes=[1, 2])[-1] == {1: HEALTHY, 2: HEALTHY}


def test_pins_override_and_count_toward_the_cap():
    """A pin wins over the windows either way; a node pinned degraded fills the cap; unpinned, the windows rule."""
    judge = HealthJudge(3, 6)
    assert run(judge, [windows({3: 0.05})] * 4, pins={3: HEALTHY})[-1][3] == HEALTHY
    assert judge.nodes[3].reason == "pinned healthy by an operator"
    assert run(judge, [windows({3: 0.05})] * 3)[0][3] == DEGRADED  # unpinned: its unhealthy run counted on
    judge = HealthJudge(3, 6)
    states = run(judge, [windows({3: 0.05})] * 4, pins={1: DEGRADED})
    assert states[-1] == {1: DEGRADED, 2: HEALTHY, 3: HEALTHY}
    assert run(judge, [windows()] * 1, pins={1: "auto"})[-1][1] == HEALTHY


def test_a_window_without_data_keeps_the_runs():
    """A node that sent nothing in a window (no heartbeat) keeps its runs: silence is neither fault nor health."""
    judge = HealthJudge(3, 6)
    scorer = ThresholdScorer()
    for window in [windows({3: 0.05}), windows({3: 0.05})[:2], windows({3: 0.05}), windows({3: 0.05})]:
        judge.judge([scorer.score(node, window) for node in window], NODES, {})
    assert judge.nodes[3].state == DEGRADED and judge.nodes[3].unhealthy_windows == 3


def test_windows_are_the_differences_of_the_heartbeats_counts():
    """The nameserver's window: fsync p99 from bucket differences (None below the minimum count or after a restart),
    and the calls other nodes made to a node by its address, with their failures."""
    def buckets(fast: int, slow: int) -> list[int]:  # fast ones under 1 ms, slow ones under 50 ms (cumulative)
        return [0] * 4 + [fast] * 5 + [fast + slow] * (len(FSYNC_BUCKETS) - 9)

    p99_s, fsyncs, p50_s = fsync_window(buckets(100, 0), buckets(100, 130))  # 130 slow, 30 of them past the median
    assert fsyncs == 130 and 0.02 < p50_s < p99_s <= 0.05
    assert fsync_window(buckets(100, 0), buckets(104, 0)) == (None, 4, None)  # too few to say
    few, fsyncs, median = fsync_window(buckets(100, 0), buckets(100, 10))  # a disk so slow it synced 10 times
    assert fsyncs == 10 and 0.02 < few <= 0.05 and few == median  # their median stands for the p99
    assert ThresholdScorer().score(NodeWindow(3, few, fsyncs), [NodeWindow(1, 0.001, 30), NodeWindow(2, 0.001, 30)]
                                   ).kind == "slow_disk"
    assert fsync_window(buckets(100, 0), buckets(50, 0)) == (None, 0, None)  # restarted: counts went back
    before = {1: {"fsync_buckets": buckets(10, 0), "peer_calls": [{"peer": "h:3", "calls": 10, "errors": 0}]},
              3: {"fsync_buckets": buckets(10, 0), "peer_calls": []}}
    after = {1: {"fsync_buckets": buckets(60, 0), "peer_calls": [{"peer": "h:3", "calls": 60, "errors": 20},
                                                                 {"peer": "h:1", "calls": 5, "errors": 5}]},
             3: {"fsync_buckets": buckets(10, 50), "peer_calls": []}, 2: {"fsync_buckets": buckets(60, 0)}}
    windows = {window.node: window for window in node_windows(loads(before), loads(after), {"h:1": 1, "h:3": 3})}
    assert windows[3].calls == 50 and windows[3].call_errors == 20 and windows[3].fsyncs == 50
    assert windows[1].calls == 0  # its calls to itself do not count
    assert windows[2].fsync_p99_s is None  # no count at the window's start


def test_pins_are_kept_in_the_metadata_and_its_snapshots():
    """A health_pin command sets a node's pin, health_judged what the judge degraded it for; a snapshot keeps both; a
    snapshot from before them reads as auto and not degraded."""
    metadata = Metadata()
    commands = [{"op": "register", "node": 3, "address": "h:3", "roles": ["storage"]},
                {"op": "health_pin", "node": 3, "pin": "degraded"},
                {"op": "register", "node": 3, "address": "h:4", "roles": ["storage"]},
                {"op": "health_pin", "node": 9, "pin": "degraded"},
                {"op": "health_judged", "node": 3, "degraded_for": "slow_disk"}]
    results = metadata.apply([Entry(1, number + 1, orjson.dumps(command)) for number, command in enumerate(commands)],
                             None)
    assert metadata.nodes[3].health_pin == "degraded" and "BAD_REQUEST" in str(results[-2])
    restored = Metadata()
    restored.restore(metadata.snapshot())
    assert restored.nodes[3].health_pin == "degraded" and restored.nodes[3].degraded_for == "slow_disk"
    old = orjson.loads(b"".join(metadata.snapshot()))
    del old["nodes"][0]["health_pin"], old["nodes"][0]["degraded_for"]
    restored.restore([orjson.dumps(old)])
    assert restored.nodes[3].health_pin == "auto" and restored.nodes[3].degraded_for == ""


def test_leaderships_leave_a_degraded_node_for_its_least_loaded_healthy_voter():
    """The busiest group a degraded node leads goes first, to the healthy voter leading least."""
    groups = [GroupLoad(2, 3, 100.0, 0), GroupLoad(3, 3, 900.0, 0), GroupLoad(4, 1, 50.0, 0)]
    voters = {2: (1, 2, 3), 3: (1, 2, 3), 4: (1, 2, 3)}
    assert degraded_leader_transfer(groups, voters, [1, 2], {3}) == (3, 2)
    assert degraded_leader_transfer(groups, voters, [1, 2], set()) is None
    assert degraded_leader_transfer(groups, {2: (3,), 3: (3,), 4: (1,)}, [1, 2], {3}) is None  # no healthy voter


def test_windows_carry_the_calls_p99_the_cpu_denied_and_the_raft_lag():
    """The answered calls' histograms are summed over the callers for the p99; CPU denied is the difference of the
    node's count; lag is what its groups' leaders report at the window's end, over the groups it follows."""
    def calls(fast: int, slow: int) -> list[int]:  # fast ones under 1 ms, slow ones under 100 ms (cumulative)
        return [0] * 2 + [fast] * 6 + [fast + slow] * (len(RPC_BUCKETS) - 8)

    before = {1: {"peer_calls": [{"peer": "h:3", "calls": 10, "errors": 0, "buckets": calls(10, 0)}]},
              2: {"peer_calls": [{"peer": "h:3", "calls": 0, "errors": 0, "buckets": calls(0, 0)}]},
              3: {"cpu_starved_s": 1.0}}
    after = {1: {"peer_calls": [{"peer": "h:3", "calls": 40, "errors": 0, "buckets": calls(20, 20)}],
                 "lagging": [{"group": 5, "node": 3, "entries": 40}]},
             2: {"peer_calls": [{"peer": "h:3", "calls": 20, "errors": 0, "buckets": calls(0, 20)}]},
             3: {"cpu_starved_s": 3.5}}
    before, after = loads(before), loads(after)
    windows = {window.node: window for window in node_windows(before, after, {"h:3": 3}, 5.0, 1234, {3: 2})}
    assert windows[3].calls == 50 and 0.05 < windows[3].call_p99_s <= 0.1  # 40 slow of 50 answered
    assert 0.05 < windows[3].call_p50_s < windows[3].call_p99_s
    assert windows[3].cpu_starved_s == 2.5 and windows[3].raft_lag_entries == 40 and windows[3].followed == 2
    assert windows[3].seconds == 5.0 and windows[3].at_ms == 1234
    assert windows[1].call_p99_s is None  # nobody called it
    only_storage = node_windows(before, after, {"h:3": 3}, 5.0, 1234, {3: 2}, judged={3})  # 1 and 2: brokers
    assert [window.node for window in only_storage] == [3] and only_storage[0].calls == 50


def model_document(**change) -> dict:
    """A hand-made model: slow_disk when the fsync p99 is over 4x the peers' median (log2 > 2)."""
    split = {"feature": FEATURES.index("fsync_peer_log2"), "threshold": 2.0, "left": {"value": -2.0},
             "right": {"value": 2.0}}
    document = {"format": "rocket.health", "format_version": 1, "model_version": "m1", "features": list(FEATURES),
                "window_s": 10.0, "metrics": {"f1": 0.95, "threshold_f1": 0.8, "trained_at_ms": 0},
                "kinds": {"slow_disk": {"trees": [{"weight": 1.0, "root": split}], "threshold": 0.5,
                                        "importances": [1.0 if name == "fsync_peer_log2" else 0.0
                                                        for name in FEATURES]}}}
    document.update(change)
    return document


def test_the_model_scorer_names_the_kind_and_the_features_it_rests_on():
    model = HealthModel.from_json(orjson.dumps(model_document()))
    scorer = ModelScorer(model)
    verdict = scorer.score(NodeWindow(3, 0.040, 500), windows())
    assert verdict.unhealthy and verdict.kind == "slow_disk" and verdict.reason.startswith("slow disk: fsync p99 40.0")
    assert verdict.features["p_slow_disk"] > 0.95 and verdict.features["fsync_peer_log2"] > 5
    assert not scorer.score(NodeWindow(3, 0.002, 500), windows()).unhealthy
    features = health_features(NodeWindow(3, None, 0), windows())
    assert features[FEATURES.index("fsync_peer_log2")] == 0.0  # missing: like its peers
    assert all(math.isfinite(value) for value in features)


def test_the_recent_features_are_the_means_over_the_judgements_that_follow_on():
    """Each recent feature is its window feature's mean over this window and the RECENT_WINDOWS - 1 judgements
    before it in which the node had a window; Recent keeps those while they follow on, and forgets them over a gap."""
    def judgement(at_s: float, slow_s: float) -> list[NodeWindow]:
        return [NodeWindow(1, 0.002, 500, seconds=5.0, at_ms=int(at_s * 1000), fsync_p50_s=0.001),
                NodeWindow(2, 0.002, 500, seconds=5.0, at_ms=int(at_s * 1000), fsync_p50_s=0.001),
                NodeWindow(3, slow_s, 500, seconds=5.0, at_ms=int(at_s * 1000), fsync_p50_s=slow_s / 2)]

    recent, seen = Recent(), []
    for at_s, slow_s in ((5, 0.002), (10, 0.008), (15, 0.032), (20, 0.032)):
        earlier = recent.before(judgement(at_s, slow_s))
        seen.append(health_features(judgement(at_s, slow_s)[2], judgement(at_s, slow_s), earlier))
    index, recent_index = FEATURES.index("fsync_peer_log2"), FEATURES.index("fsync_peer_log2_recent")
    assert [features[index] for features in seen] == [0.0, 2.0, 4.0, 4.0]
    assert [features[recent_index] for features in seen] == [0.0, 1.0, 2.0, 10 / 3]  # at most 3 windows
    assert seen[2][FEATURES.index("fsync_p50_peer_log2")] == 4.0  # a 16 ms median against the peers' 1 ms
    assert len(seen[0]) == len(FEATURES) and len(RECENT_OF) + len(WINDOW_FEATURES) == len(FEATURES)
    assert recent.before(judgement(40, 0.032)) == ()  # 20 s after the last: a gap of more than two windows
    assert len(recent.before(judgement(45, 0.032))) == 1
    assert recent.before(judgement(44, 0.032)) == ()  # the clock went back
    assert recent.before([]) == (judgement(44, 0.032),)  # nobody judged: nothing changes


@pytest.mark.parametrize("change, reason", [
    ({"format_version": 2}, "version"), ({"features": ["x"]}, "features"), ({"window_s": 0}, "window_s"),
    ({"kinds": {"disk": {}}}, "kinds"), ({"kinds": {}}, "kinds"),
    ({"kinds": {"cpu": {"trees": [], "threshold": 0.5, "importances": [0.0] * len(FEATURES)}}}, "trees"),
    ({"kinds": {"cpu": {"trees": [{"weight": 1.0, "root": {"value": 1.0}}], "threshold": 1.5,
                        "importances": [0.0] * len(FEATURES)}}}, "threshold"),
])
def test_a_corrupt_health_model_is_refused_with_its_reason(change, reason):
    with pytest.raises(ModelError, match=reason):
        HealthModel.from_json(orjson.dumps(model_document(**change)))
    with pytest.raises(ModelError, match="JSON"):
        HealthModel.from_json(b"{")


def test_a_degraded_node_returns_only_on_evidence_of_what_degraded_it():
    """Degraded for failing calls, it then leads nothing and gets no calls: windows without calls say nothing of
    its links, however healthy its disk; windows with calls that succeed bring it back."""
    judge, scorer = HealthJudge(), ThresholdScorer()

    def judged(window: list[NodeWindow]) -> str:
        return judge.judge([scorer.score(node, window) for node in window], NODES, {})[2].state

    failing = windows(errors={2: 50})
    assert [judged(failing) for _ in range(3)][-1] == DEGRADED
    no_calls = [NodeWindow(node, 0.001, 500) for node in NODES]
    assert all(judged(no_calls) == DEGRADED for _ in range(10))
    assert judge.nodes[2].reason.endswith("no evidence of it")
    assert [judged(windows()) for _ in range(6)][-1] == HEALTHY


def test_the_nameserver_scores_by_a_model_only_while_it_is_fresh_fits_and_beats_the_threshold():
    class Store:
        text: bytes | None = None

        async def get(self, key: str, start: int = 0, end: int | None = None) -> bytes:
            if self.text is None:
                raise RocketError(Code.NOT_FOUND, key)
            return self.text

    store = Store()
    meta = SimpleNamespace(metadata=None)
    host = NodeHealthChecks(meta, NodeConfig(health_window_s=10.0), TrioWallClock(10_000.0),  # type: ignore[arg-type]
                            store, nodes=None)  # type: ignore[arg-type]  # wall_ms 10,000,000 at a run's start
    states = []
    for document in (None, model_document(metrics={"trained_at_ms": 9_000_000, "f1": 0.9, "threshold_f1": 0.8}),
                     model_document(metrics={"trained_at_ms": 9_000_000, "f1": 0.7, "threshold_f1": 0.8}),
                     model_document(window_s=60.0, metrics={"trained_at_ms": 9_000_000}),
                     model_document(metrics={"trained_at_ms": 10_000_000 - int(limits.model_stale_s * 1000) - 1}),
                     {"format": "nonsense"}):
        store.text = None if document is None else orjson.dumps(document)
        trio.run(host.follow_model)
        states.append((host.scorer.name, host.model_state))
    assert states[0] == ("threshold", "no model")
    assert states[1] == ("model m1", "model m1")
    assert states[2][0] == "threshold" and "F1 0.70 is below the threshold's 0.80" in states[2][1]
    assert states[3][0] == "threshold" and "trained on 60 s windows" in states[3][1]
    assert states[4][0] == "threshold" and "stale" in states[4][1]
    assert states[5][0] == "threshold" and states[5][1].startswith("model refused: format")
    store.text = orjson.dumps(model_document(metrics={"trained_at_ms": 9_000_000}))
    trio.run(host.follow_model)
    assert host.scorer.name == "model m1"
    host.clock = TrioWallClock(10_000.0 + limits.model_stale_s)  # the same file, two weeks on
    trio.run(host.follow_model)
    assert host.scorer.name == "threshold" and "stale" in host.model_state
