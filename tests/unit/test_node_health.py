"""Unhealthy-node decisions on scripted windows (issue 31): the threshold scorer, and the judge's hysteresis, minority
cap, pins and refusal to flap."""

from __future__ import annotations

from rocket import limits
from rocket.ml.health import DEGRADED, HEALTHY, HealthJudge, NodeWindow, ThresholdScorer

NODES = [1, 2, 3]


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
