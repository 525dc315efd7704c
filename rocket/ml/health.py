"""Unhealthy storage nodes (issue 31): a Scorer judges one node's window against its peers' (ThresholdScorer is the
baseline a trained model must beat, behind the same interface), and HealthJudge turns verdicts into states with
hysteresis, operator pins and a minority cap. Pure: no I/O, no clock; windows come in already measured.
"""

from __future__ import annotations

import collections
import dataclasses
import math
import statistics
from collections.abc import Sequence
from typing import Protocol, cast

from rocket import limits
from rocket.ml.trees import ModelError, check_header, check_trees, ensemble_sum, finite, parse

HEALTHY, DEGRADED, AUTO = "healthy", "degraded", "auto"
PINS = (HEALTHY, DEGRADED, AUTO)


@dataclasses.dataclass(frozen=True, slots=True)
class NodeWindow:
    """What one storage node's heartbeats (and its group leaders') showed in one window. The nameserver leader logs
    every window it judges to its telemetry (`WINDOW_FIELDS`), and the Spark job trains on those logged windows:
    the model learns from exactly what it will be shown."""

    node: int
    fsync_p99_s: float | None = None  # None: too few fsyncs to say (limits.health_fsyncs_min)
    fsyncs: int = 0
    calls: int = 0  # calls the other nodes made to this one (that ended: answered or failed)
    call_errors: int = 0  # ... and those that failed
    call_p99_s: float | None = None  # the p99 of the answered ones (None: fewer than limits.health_calls_min)
    cpu_starved_s: float = 0.0  # CPU seconds the node was denied in the window (steal and cgroup throttling)
    raft_lag_entries: int = 0  # entries it was behind its groups' leaders at the window's end, summed
    followed: int = 0  # groups it follows (a voter, not the leader): what raft_lag_entries is over
    seconds: float = limits.health_window_s_default  # the window's length
    at_ms: int = 0  # the window's end, wall-clock ms
    # The medians: a disk or link slow in every operation moves them, and a window's p99 is a few operations' noise.
    fsync_p50_s: float | None = None  # None: fewer than limits.health_fsyncs_few fsyncs
    call_p50_s: float | None = None  # None: fewer than limits.health_calls_min answered calls

    @property
    def error_rate(self) -> float | None:
        """The share of calls to this node that failed; None with too few to say (limits.health_calls_min)."""
        return self.call_errors / self.calls if self.calls >= limits.health_calls_min else None


WINDOW_FIELDS = tuple(field.name for field in dataclasses.fields(NodeWindow))
WINDOW_METRIC = "rocket_health_window_"  # + a field: the windows the nameserver judged, noted in its telemetry
KINDS = ("slow_disk", "link", "cpu")  # the faults a verdict names (faults.py injects each)
# The model's features of a node's window, all relative to the other storage nodes' windows of the same time where
# that makes sense, so that a busy or slow period of the whole cluster is nobody's fault. Perseus (FAST 2023) regresses
# latency on throughput across the fleet; here a node's latency over its peers' median sits beside its throughput
# over theirs, and the trees learn where a ratio stops being load.
WINDOW_FEATURES = (
    "fsync_p99_log10",  # seconds; missing: the peers' median
    "fsync_peer_log2",  # log2 of the fsync p99 over the peers' median
    "fsyncs_peer_log2",  # log2 of its fsyncs (+1) over the peers' median (+1): the throughput the latency is at
    "call_p99_log10",  # seconds, of the calls the other nodes made to it; missing: the peers' median
    "call_peer_log2",
    "calls_peer_log2",
    "call_error_rate",  # missing: 0
    "cpu_starved_share",  # CPU seconds denied per second
    "cpu_starved_peer",  # ... minus the peers' median
    "raft_lag_log10",  # log10 of 1 + the entries it is behind, per group it follows
    "raft_lag_peer_log2",
    "fsync_p50_peer_log2",  # log2 of the fsync median over the peers' median of theirs
    "call_p50_peer_log2",
)
# ... and, of the peer-relative ones, their mean over the node's last RECENT_WINDOWS windows the judge saw (this one
# included): a mild fault shows in most windows but not in each, and noise seldom in several in a row.
RECENT_OF = ("fsync_peer_log2", "call_peer_log2", "call_error_rate", "cpu_starved_peer", "raft_lag_peer_log2",
             "fsync_p50_peer_log2", "call_p50_peer_log2")
RECENT_WINDOWS = 3
FEATURES = (*WINDOW_FEATURES, *(f"{name}_recent" for name in RECENT_OF))
RECENT_INDEXES = tuple(WINDOW_FEATURES.index(name) for name in RECENT_OF)
FLOOR_S = 1e-5  # latencies below this (and a missing peer median) count as this


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def _log2_ratio(value: float | None, reference: float | None, floor: float) -> float:
    if value is None or reference is None:
        return 0.0
    return math.log2(max(value, floor) / max(reference, floor))


def health_features(node: NodeWindow, peers: list[NodeWindow], earlier: Sequence[list[NodeWindow]] = ()) -> list[float]:
    """FEATURES of node's window, given every storage node's window of the same time (node's own is skipped) and the
    judgements before it (Recent.before: the last RECENT_WINDOWS - 1 count). One definition: the nameserver calls it
    to score, and the Spark job inside its executors to build training rows."""
    now = _window_features(node, peers)
    seen = [now, *(_window_features(mine, judgement) for judgement in earlier[-(RECENT_WINDOWS - 1):]
                   for mine in judgement if mine.node == node.node)]
    return [*now, *(statistics.fmean(features[index] for features in seen) for index in RECENT_INDEXES)]


class Recent:
    """The judgements one judge made last, for health_features: the RECENT_WINDOWS - 1 before the one being judged,
    while they follow on from each other. A gap of more than two windows (a lost leadership, a stalled leader) or a
    clock gone back starts afresh."""

    def __init__(self) -> None:
        self._judgements: collections.deque[list[NodeWindow]] = collections.deque(maxlen=RECENT_WINDOWS - 1)

    def before(self, windows: list[NodeWindow]) -> tuple[list[NodeWindow], ...]:
        """The judgements before windows' (every storage node's window of one time), oldest first; then windows
        join them."""
        if not windows:
            return tuple(self._judgements)
        if self._judgements:
            since_ms = windows[0].at_ms - self._judgements[-1][0].at_ms
            if not 0 < since_ms <= 2 * windows[0].seconds * 1000:
                self._judgements.clear()
        earlier = tuple(self._judgements)
        self._judgements.append(windows)
        return earlier


def _window_features(node: NodeWindow, peers: list[NodeWindow]) -> list[float]:
    """WINDOW_FEATURES of node's window."""
    others = [peer for peer in peers if peer.node != node.node]
    fsync_median = _median([peer.fsync_p99_s for peer in others if peer.fsync_p99_s is not None])
    call_median = _median([peer.call_p99_s for peer in others if peer.call_p99_s is not None])
    fsync_p50_median = _median([peer.fsync_p50_s for peer in others if peer.fsync_p50_s is not None])
    call_p50_median = _median([peer.call_p50_s for peer in others if peer.call_p50_s is not None])
    fsyncs_median = _median([peer.fsyncs for peer in others])
    calls_median = _median([peer.calls for peer in others])
    starved = node.cpu_starved_s / max(node.seconds, 1e-3)
    starved_median = _median([peer.cpu_starved_s / max(peer.seconds, 1e-3) for peer in others]) or 0.0
    lag = node.raft_lag_entries / node.followed if node.followed else 0.0
    lag_median = _median([peer.raft_lag_entries / peer.followed for peer in others if peer.followed])
    fsync = node.fsync_p99_s if node.fsync_p99_s is not None else fsync_median
    call = node.call_p99_s if node.call_p99_s is not None else call_median
    return [
        math.log10(max(fsync or FLOOR_S, FLOOR_S)),
        _log2_ratio(node.fsync_p99_s, fsync_median, FLOOR_S),
        _log2_ratio(node.fsyncs + 1, None if fsyncs_median is None else fsyncs_median + 1, 1.0),
        math.log10(max(call or FLOOR_S, FLOOR_S)),
        _log2_ratio(node.call_p99_s, call_median, FLOOR_S),
        _log2_ratio(node.calls + 1, None if calls_median is None else calls_median + 1, 1.0),
        node.error_rate or 0.0,
        starved,
        starved - starved_median,
        math.log10(1.0 + lag),
        _log2_ratio(lag + 1.0, None if lag_median is None else lag_median + 1.0, 1.0),
        _log2_ratio(node.fsync_p50_s, fsync_p50_median, FLOOR_S),
        _log2_ratio(node.call_p50_s, call_p50_median, FLOOR_S),
    ]


def evidence(node: NodeWindow) -> frozenset[str]:
    """The KINDS a window can tell about: a disk with enough fsyncs, a link with enough calls or a group to follow;
    CPU always. A degraded node returns only on windows that speak of what degraded it (a node that leads nothing
    gets few calls, and their absence says nothing of its links)."""
    kinds = {"cpu"}
    if node.fsync_p99_s is not None:
        kinds.add("slow_disk")
    if node.calls >= limits.health_calls_min or node.followed:
        kinds.add("link")
    return frozenset(kinds)


@dataclasses.dataclass(frozen=True, slots=True)
class Verdict:
    node: int
    unhealthy: bool
    reason: str  # one line for an operator: "slow disk: ...", "failing calls: ...", or why it is healthy
    score: float  # how far past its bounds, 1.0 at a bound: the worst-scoring node is degraded first
    features: dict[str, float]  # the features the verdict rests on, by name, most telling first
    kind: str = ""  # of KINDS when unhealthy: what is wrong
    judged: frozenset[str] = frozenset(KINDS)  # the kinds the window had evidence of (evidence())


class Scorer(Protocol):
    name: str

    def score(self, node: NodeWindow, peers: list[NodeWindow], earlier: Sequence[list[NodeWindow]] = ()) -> Verdict:
        """The verdict on node's window, given the other storage nodes' windows of the same time and the judgements
        before it (Recent.before)."""
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

    def score(self, node: NodeWindow, peers: list[NodeWindow], earlier: Sequence[list[NodeWindow]] = ()) -> Verdict:
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
        judged = evidence(node) - {"cpu"}  # the threshold knows nothing of CPU
        if fsync_score >= 1.0 and fsync_score >= error_score:
            return Verdict(node.node, True, f"slow disk: fsync p99 {features['fsync_p99_s'] * 1000:.1f} ms, "
                           f"{features['fsync_peer_ratio']:.1f}x the other nodes' median", fsync_score, features,
                           "slow_disk", judged)
        if error_score >= 1.0:
            return Verdict(node.node, True, f"failing calls: {error_rate:.0%} of {node.calls} calls from other "
                           "nodes failed", error_score, features, "link", judged)
        if node.fsync_p99_s is None and error_rate is None:
            return Verdict(node.node, False, "no data in this window", 0.0, features, "", judged)
        return Verdict(node.node, False, "within bounds", max(fsync_score, error_score), features, "", judged)


MODEL_FORMAT = "rocket.health"
MODEL_VERSION = 1
KIND_NAMES = {"slow_disk": "slow disk", "link": "slow or failing link", "cpu": "CPU starved"}


class HealthModel:
    """The node-health model jobs/train_health.py exports: per kind of fault, a gradient-boosted ensemble of
    classification trees (Spark's GBTClassifier: the probability is 1 / (1 + exp(-2 x the trees' sum))), the
    probability above which a window is that kind of unhealthy (chosen by the job for the best F1), and the features'
    importances. The file is JSON (MODEL_FORMAT, MODEL_VERSION); from_json refuses anything else with one line."""

    def __init__(self, document: dict):
        self.document = document
        self.version: str = document["model_version"]
        self.window_s: float = document["window_s"]
        self.metrics: dict = document["metrics"]
        self.kinds = {kind: ([(tree["weight"], tree["root"]) for tree in spec["trees"]], spec["threshold"],
                             spec["importances"]) for kind, spec in document["kinds"].items()}

    @classmethod
    def from_json(cls, text: str | bytes) -> HealthModel:
        document = parse(text)
        check_model(document)
        return cls(cast(dict, document))  # check_model raised unless it is an object

    def probabilities(self, features: list[float]) -> dict[str, float]:
        return {kind: 1.0 / (1.0 + math.exp(-2.0 * min(max(ensemble_sum(trees, features), -300.0), 300.0)))
                for kind, (trees, _, _) in self.kinds.items()}


def check_model(document: object) -> None:
    """Raise ModelError unless document is a node-health model this code can score."""
    check_header(document, MODEL_FORMAT, MODEL_VERSION, FEATURES)
    document = cast(dict, document)  # check_header raised unless it is an object
    if not finite(document.get("window_s")) or not document["window_s"] > 0:
        raise ModelError(f"window_s must be a positive number, got {document.get('window_s')!r}")
    kinds = document.get("kinds")
    if not isinstance(kinds, dict) or not kinds or not set(kinds) <= set(KINDS):
        raise ModelError(f"kinds must be an object of some of {', '.join(KINDS)}")
    for kind, spec in kinds.items():
        if not isinstance(spec, dict):
            raise ModelError(f"kinds.{kind} must be an object")
        check_trees(spec.get("trees"), len(FEATURES), f"kinds.{kind}.trees")
        if not finite(spec.get("threshold")) or not 0 < spec["threshold"] < 1:
            raise ModelError(f"kinds.{kind}.threshold must be a probability in (0, 1)")
        importances = spec.get("importances")
        if not isinstance(importances, list) or len(importances) != len(FEATURES) or not all(map(finite, importances)):
            raise ModelError(f"kinds.{kind}.importances must be {len(FEATURES)} numbers")


def describe(kind: str, node: NodeWindow, features: list[float]) -> str:
    """What an operator checks first for a kind of fault, in the window's own figures."""
    named = dict(zip(FEATURES, features))
    if kind == "slow_disk":
        p99 = f"{node.fsync_p99_s * 1000:.1f} ms" if node.fsync_p99_s is not None else "unknown"
        return f"fsync p99 {p99}, {2 ** named['fsync_peer_log2']:.1f}x the other nodes' median"
    if kind == "link":
        p99 = f"{node.call_p99_s * 1000:.1f} ms" if node.call_p99_s is not None else "unknown"
        return (f"calls to it: p99 {p99}, {2 ** named['call_peer_log2']:.1f}x the other nodes', "
                f"{named['call_error_rate']:.0%} failed; {node.raft_lag_entries} entries behind its leaders")
    return f"denied {named['cpu_starved_share']:.0%} of a CPU"


class ModelScorer:
    """Scores windows with a HealthModel: unhealthy when some kind's probability reaches that kind's threshold (the
    worst kind, relative to its threshold, names the reason). The verdict's features are the kind's most important
    ones, with this window's values."""

    def __init__(self, model: HealthModel):
        self.model = model
        self.name = f"model {model.version}"

    def score(self, node: NodeWindow, peers: list[NodeWindow], earlier: Sequence[list[NodeWindow]] = ()) -> Verdict:
        features = health_features(node, peers, earlier)
        probabilities = self.model.probabilities(features)
        judged = evidence(node)
        kind = max(probabilities, key=lambda kind: (probabilities[kind] / self.model.kinds[kind][1], kind))
        threshold, importances = self.model.kinds[kind][1], self.model.kinds[kind][2]
        score = probabilities[kind] / threshold
        top = sorted(range(len(FEATURES)), key=lambda index: -importances[index])[:4]
        named = {f"p_{name}": probabilities[name] for name in sorted(probabilities, key=probabilities.__getitem__,
                                                                        reverse=True)}
        named.update((FEATURES[index], features[index]) for index in top)
        if score >= 1.0:
            return Verdict(node.node, True, f"{KIND_NAMES[kind]}: {describe(kind, node, features)} "
                           f"(p={probabilities[kind]:.2f})", score, named, kind, judged)
        return Verdict(node.node, False, f"within bounds (worst: {KIND_NAMES[kind]}, p={probabilities[kind]:.2f} "
                       f"of {threshold:.2f})", score, named, "", judged)


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
    kind: str = ""  # what degraded it (of KINDS), while it is


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
            health.kind = health.verdict.kind if health.verdict else ""
        return self.nodes

    def _count(self, health: NodeHealth) -> None:
        """A window's verdict into the node's runs, its automatic recovery, and its reason. No verdict (no heartbeat
        in the window), or one without evidence (too few fsyncs and calls to say; for a degraded node, nothing of
        what degraded it), is evidence of neither a fault nor health: the runs stay as they are."""
        verdict = health.verdict
        if verdict is None:
            return
        if not verdict.unhealthy and not verdict.judged:
            return  # no evidence of anything (too few fsyncs and calls): neither a fault nor health
        if health.automatic == DEGRADED and not verdict.unhealthy and health.kind and health.kind not in verdict.judged:
            health.reason = f"degraded ({KIND_NAMES.get(health.kind, health.kind)}); this window had no evidence of it"
            return
        if verdict.unhealthy:
            health.unhealthy_windows, health.healthy_windows = health.unhealthy_windows + 1, 0
        else:
            health.unhealthy_windows, health.healthy_windows = 0, health.healthy_windows + 1
        if health.automatic == DEGRADED:
            if health.healthy_windows >= self.recover_windows:
                health.automatic, health.kind = HEALTHY, ""
                health.reason = f"recovered: healthy for {health.healthy_windows} windows"
            elif verdict.unhealthy:
                health.reason = f"{verdict.reason} ({health.unhealthy_windows} windows)"
            else:
                health.reason = f"recovering: healthy for {health.healthy_windows} of {self.recover_windows} windows"
        elif verdict.unhealthy:
            health.reason = f"{verdict.reason} ({health.unhealthy_windows} of {self.degrade_windows} windows)"
        else:
            health.reason = verdict.reason
