"""Unhealthy storage nodes (issue 31): a Scorer judges one node's window against its peers' (ThresholdScorer is the
baseline a trained model must beat, behind the same interface), and HealthJudge turns verdicts into states with
hysteresis, operator pins and a minority cap. Pure: no I/O, no clock; windows come in already measured.
"""

from __future__ import annotations

import dataclasses
import statistics
from typing import Protocol

from rocket import limits

HEALTHY, DEGRADED, AUTO = "healthy", "degraded", "auto"
PINS = (HEALTHY, DEGRADED, AUTO)


@dataclasses.dataclass(frozen=True, slots=True)
class NodeWindow:
    """What one storage node's heartbeats showed in one window."""

    node: int
    fsync_p99_s: float | None = None  # None: too few fsyncs to say (limits.health_fsyncs_min)
    fsyncs: int = 0
    calls: int = 0  # calls the other nodes made to this one (that ended: answered or failed)
    call_errors: int = 0  # ... and those that failed

    @property
    def error_rate(self) -> float | None:
        """The share of calls to this node that failed; None with too few to say (limits.health_calls_min)."""
        return self.call_errors / self.calls if self.calls >= limits.health_calls_min else None


@dataclasses.dataclass(frozen=True, slots=True)
class Verdict:
    node: int
    unhealthy: bool
    reason: str  # one line for an operator: "slow disk: ...", "failing calls: ...", or why it is healthy
    score: float  # how far past its bounds, 1.0 at a bound: the worst-scoring node is degraded first
    features: dict[str, float]  # the features the verdict rests on, by name, most telling first


class Scorer(Protocol):
    name: str

    def score(self, node: NodeWindow, peers: list[NodeWindow]) -> Verdict:
        """The verdict on node's window, given the other storage nodes' windows of the same time."""
        ...


class ThresholdScorer:
    """The baseline: a slow disk is an fsync p99 above an absolute bound and k times the other nodes' median p99 (so
    that a slow period of the whole cluster is nobody's fault); a bad node is one failing a share of the calls the
    other nodes make to it above a bound."""

    name = "threshold"

    def __init__(self, fsync_p99_s_min: float = limits.health_fsync_p99_s_min,
                 peer_ratio: float = limits.health_fsync_peer_ratio,
                 error_rate_max: float = limits.health_error_rate_max):
        self.fsync_p99_s_min = fsync_p99_s_min
        self.peer_ratio = peer_ratio
        self.error_rate_max = error_rate_max

    def score(self, node: NodeWindow, peers: list[NodeWindow]) -> Verdict:
        peer_p99s = [peer.fsync_p99_s for peer in peers if peer.node != node.node and peer.fsync_p99_s is not None]
        peer_median_s = statistics.median(peer_p99s) if peer_p99s else None
        features: dict[str, float] = {}
        fsync_score, error_score = 0.0, 0.0
        if node.fsync_p99_s is not None:
            features["fsync_p99_s"] = node.fsync_p99_s
            if peer_median_s is not None:
                features["peer_fsync_p99_s"] = peer_median_s
                ratio = node.fsync_p99_s / max(peer_median_s, 1e-6)
                features["fsync_peer_ratio"] = ratio
                fsync_score = min(ratio / self.peer_ratio, node.fsync_p99_s / self.fsync_p99_s_min)
        error_rate = node.error_rate
        if error_rate is not None:
            features["call_error_rate"] = error_rate
            error_score = error_rate / self.error_rate_max
        if error_score > fsync_score:  # the most telling feature first
            features = {"call_error_rate": features.pop("call_error_rate"), **features}
        if fsync_score >= 1.0 and fsync_score >= error_score:
            return Verdict(node.node, True, f"slow disk: fsync p99 {node.fsync_p99_s * 1000:.1f} ms, "
                           f"{features['fsync_peer_ratio']:.1f}x the other nodes' median", fsync_score, features)
        if error_score >= 1.0:
            return Verdict(node.node, True, f"failing calls: {error_rate:.0%} of {node.calls} calls from other "
                           "nodes failed", error_score, features)
        if node.fsync_p99_s is None and error_rate is None:
            return Verdict(node.node, False, "no data in this window", 0.0, features)
        return Verdict(node.node, False, "within bounds", max(fsync_score, error_score), features)


@dataclasses.dataclass(slots=True)
class NodeHealth:
    """One node as the judge sees it: its state (the pin's, when pinned), the automatic state under it, the runs of
    unhealthy and healthy windows, and the last verdict."""

    node: int
    state: str = HEALTHY
    automatic: str = HEALTHY
    pin: str = AUTO
    unhealthy_windows: int = 0
    healthy_windows: int = 0
    reason: str = ""  # why it is in its state, for `rocket cluster status`
    verdict: Verdict | None = None


class HealthJudge:
    """A node unhealthy for degrade_windows windows in a row becomes degraded; degraded and healthy for
    recover_windows in a row, it returns. Fewer than half of the storage nodes are ever degraded at once, pins
    included: candidates are taken worst score first while there is room, and the others wait (a node already
    degraded is never swapped for a worse one, which would flap). A pin overrides the automatic state."""

    def __init__(self, degrade_windows: int = limits.health_degrade_windows,
                 recover_windows: int = limits.health_recover_windows):
        assert 1 <= degrade_windows and 1 <= recover_windows
        self.degrade_windows = degrade_windows
        self.recover_windows = recover_windows
        self.nodes: dict[int, NodeHealth] = {}

    def degraded(self) -> set[int]:
        return {node for node, health in self.nodes.items() if health.state == DEGRADED}

    def judge(self, verdicts: list[Verdict], storage_nodes: list[int], pins: dict[int, str]) -> dict[int, NodeHealth]:
        """One window: the verdicts of the nodes that had one, over every storage node, with the operators' pins.
        Returns every storage node's health after it."""
        assert all(pin in PINS for pin in pins.values())
        self.nodes = {node: self.nodes.get(node) or NodeHealth(node) for node in storage_nodes}
        by_node = {verdict.node: verdict for verdict in verdicts}
        for node, health in self.nodes.items():
            health.pin = pins.get(node, AUTO)
            health.verdict = by_node.get(node)
            self._count(health)
        for health in self.nodes.values():
            health.state = health.automatic if health.pin == AUTO else health.pin
            if health.pin != AUTO:
                health.reason = f"pinned {health.pin} by an operator"
        cap = (len(self.nodes) - 1) // 2  # fewer than half of the storage nodes
        candidates = sorted((health for health in self.nodes.values() if health.pin == AUTO
                             and health.automatic == HEALTHY and health.unhealthy_windows >= self.degrade_windows),
                            key=lambda health: (-health.verdict.score if health.verdict else 0.0, health.node))
        for health in candidates:
            degraded = len(self.degraded())
            if degraded >= cap:
                health.reason += f"; not degraded: {degraded} of {len(self.nodes)} storage nodes are, the most the " \
                                 "minority cap allows"
                continue
            health.automatic = health.state = DEGRADED
        return self.nodes

    def _count(self, health: NodeHealth) -> None:
        """A window's verdict into the node's runs, its automatic recovery, and its reason. No verdict (no heartbeat
        in the window) is evidence of neither a fault nor health: the runs stay as they are."""
        verdict = health.verdict
        if verdict is None:
            return
        if verdict.unhealthy:
            health.unhealthy_windows, health.healthy_windows = health.unhealthy_windows + 1, 0
        else:
            health.unhealthy_windows, health.healthy_windows = 0, health.healthy_windows + 1
        if health.automatic == DEGRADED:
            if health.healthy_windows >= self.recover_windows:
                health.automatic, health.reason = HEALTHY, f"recovered: healthy for {health.healthy_windows} windows"
            elif verdict.unhealthy:
                health.reason = f"{verdict.reason} ({health.unhealthy_windows} windows)"
            else:
                health.reason = f"recovering: healthy for {health.healthy_windows} of {self.recover_windows} windows"
        elif verdict.unhealthy:
            health.reason = f"{verdict.reason} ({health.unhealthy_windows} of {self.degrade_windows} windows)"
        else:
            health.reason = verdict.reason
