"""benchmarks/health_eval.py's figures, pure (tests/unit/test_health_eval.py): the judged windows the nameserver
noted, regrouped into judgements and replayed through a scorer and a HealthJudge; per kind precision, recall and F1
of windows; detection latency and misses per fault; false degradations per node-hour.
"""

from __future__ import annotations

import collections
import dataclasses
import math
from collections import Counter

from faults import NODE_IDS
from jobs.health_data import HEALTHY, Label, window_label, windows
from rocket.ml.health import KINDS, HealthJudge, Recent, Scorer

STORAGE = ("storage1", "storage2", "storage3")  # examples/cluster's storage nodes
STORAGE_IDS = tuple(NODE_IDS[name] for name in STORAGE)


@dataclasses.dataclass(frozen=True)
class Judgement:
    """One window the nameserver leader judged: every storage node's NodeWindow of it."""

    at_ms: int
    reporter: int
    windows: list


@dataclasses.dataclass(frozen=True)
class Degrade:
    at_ms: int
    node: int
    kind: str  # the verdict's kind that degraded it


def judgements(records: list[dict]) -> list[Judgement]:
    """Window records (any order, duplicates allowed) grouped into judgements by reporter and time, oldest first."""
    grouped: dict[tuple[int, int], dict] = {}
    for record in records:
        key = (record["time_ms"], record["node"])
        grouped.setdefault(key, {})[(record["metric"], record["labels"]["target"])] = record
    return [Judgement(at_ms, reporter, windows(list(found.values()))) for (at_ms, reporter), found in sorted(grouped.items())]


def replay(scorer: Scorer, judged: list[Judgement], storage_nodes=STORAGE_IDS):
    """Each judgement through the scorer (with the judgements its reporter made before it) and a fresh HealthJudge,
    as the nameserver leader would have: ([(window, verdict)], [Degrade])."""
    judge, recent = HealthJudge(), collections.defaultdict(Recent)
    scored, degrades = [], []
    for judgement in judged:
        earlier = recent[judgement.reporter].before(judgement.windows)
        verdicts = [scorer.score(window, judgement.windows, earlier) for window in judgement.windows]
        scored.extend(zip(judgement.windows, verdicts))
        before = judge.degraded()
        nodes = judge.judge(verdicts, list(storage_nodes), {})
        for node in sorted(judge.degraded() - before):
            degrades.append(Degrade(judgement.at_ms, node, nodes[node].kind))
    return scored, degrades


def ratio(numerator: float, denominator: float) -> float:
    """0 where nothing was counted: a scorer that names no window of a kind has no precision to show for it."""
    return numerator / denominator if denominator else 0.0


def f1(precision: float, recall: float) -> float:
    return ratio(2 * precision * recall, precision + recall)


def window_metrics(scored: list, labels: list[Label]) -> dict:
    """Per kind and overall (unhealthy against healthy): precision, recall, F1 and counts, over the windows whose
    label is known (window_label not None)."""
    pairs = []
    for window, verdict in scored:
        truth = window_label(window, labels)
        if truth is not None:
            pairs.append((truth, verdict.kind if verdict.unhealthy else HEALTHY))
    figures = {"windows": len(pairs), "truth": dict(Counter(truth for truth, _ in pairs)),
               "predicted": dict(Counter(predicted for _, predicted in pairs)), "kinds": {}}
    for kind in KINDS:
        true_positive = sum(1 for truth, predicted in pairs if truth == predicted == kind)
        precision = ratio(true_positive, sum(1 for _, predicted in pairs if predicted == kind))
        recall = ratio(true_positive, sum(1 for truth, _ in pairs if truth == kind))
        figures["kinds"][kind] = {"precision": precision, "recall": recall, "f1": f1(precision, recall),
                                  "true_positives": true_positive}
    true_positive = sum(1 for truth, predicted in pairs if truth != HEALTHY and predicted != HEALTHY)
    precision = ratio(true_positive, sum(1 for _, predicted in pairs if predicted != HEALTHY))
    recall = ratio(true_positive, sum(1 for truth, _ in pairs if truth != HEALTHY))
    figures.update(precision=precision, recall=recall, f1=f1(precision, recall))
    return figures


def percentile(values: list[float], fraction: float) -> float | None:
    """Nearest rank: with few faults per kind, an interpolated p99 would be a value no fault had."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(fraction * len(ordered)) - 1)]


def detections(degrades: list[Degrade], labels: list[Label], window_s: float, degrade_windows: int = 3) -> dict:
    """Each fault's detection (its node's first degradation from its start to its end plus one window), the
    latencies per kind, the misses; and the degradations no fault explains (false), apart from late ones (after
    that, within the degrade_windows more windows a detection can lag)."""
    window_ms = int(window_s * 1000)
    faults_only = [label for label in labels if label.kind != "control"]
    explained: set[Degrade] = set()
    per_fault, latencies, misses = [], {kind: [] for kind in KINDS}, Counter()
    for label in faults_only:
        found = next((degrade for degrade in degrades if degrade.node == label.node_id
                      and label.start_ms <= degrade.at_ms <= label.end_ms + window_ms), None)
        if found is None:
            misses[label.kind] += 1
        else:
            explained.add(found)
            latencies[label.kind].append((found.at_ms - label.start_ms) / 1000)
        per_fault.append({"kind": label.kind, "node": label.node_id, "severity": label.severity,
                          "start_ms": label.start_ms, "detected": found is not None,
                          "latency_s": (found.at_ms - label.start_ms) / 1000 if found else None,
                          "degraded_as": found.kind if found else None})
    late = [degrade for degrade in degrades if degrade not in explained and any(
        degrade.node == label.node_id and label.start_ms <= degrade.at_ms
        <= label.end_ms + (degrade_windows + 1) * window_ms for label in faults_only)]
    false = [degrade for degrade in degrades if degrade not in explained and degrade not in late]
    kinds = {kind: {"detected": len(latencies[kind]), "missed": misses[kind],
                    "latency_p50_s": percentile(latencies[kind], 0.5), "latency_p99_s": percentile(latencies[kind], 0.99)}
             for kind in KINDS}
    return {"kinds": kinds, "faults": per_fault, "late": [dataclasses.asdict(each) for each in late],
            "false": [dataclasses.asdict(each) for each in false]}


def false_rates(false: list[dict], labels: list[Label], span_ms: tuple[int, int], nodes: int = len(STORAGE)) -> dict:
    """False degradations per node-hour: on the control runs (every node, none under a fault), and over the span
    (the node-time no fault of its own covered)."""
    controls = [label for label in labels if label.kind == "control"]
    control_node_h = nodes * sum(label.end_ms - label.start_ms for label in controls) / 3_600_000
    in_controls = sum(1 for degrade in false if any(label.start_ms <= degrade["at_ms"] <= label.end_ms
                                                    for label in controls))
    faulted_ms = sum(label.end_ms - label.start_ms for label in labels if label.kind != "control")
    clear_node_h = (nodes * (span_ms[1] - span_ms[0]) - faulted_ms) / 3_600_000
    return {"control": ratio(in_controls, control_node_h), "control_false": in_controls,
            "control_node_hours": control_node_h, "overall": ratio(len(false), clear_node_h),
            "overall_false": len(false), "node_hours": clear_node_h}


def episodes(scored: list, labels: list[Label]) -> list[dict]:
    """Per label (controls too), the windows of its node wholly inside it and the kinds the scorer called them."""
    found = []
    for label in labels:
        called = Counter(verdict.kind if verdict.unhealthy else HEALTHY for window, verdict in scored
                         if window.node == label.node_id and label.start_ms <= window.at_ms - int(window.seconds * 1000)
                         and window.at_ms <= label.end_ms)
        found.append({"kind": label.kind, "node": label.node_id, "severity": label.severity,
                      "start_ms": label.start_ms, "end_ms": label.end_ms, "windows": sum(called.values()),
                      "called": dict(called)})
    return found


def evaluate(scorer: Scorer, judged: list[Judgement], labels: list[Label], window_s: float,
             span_ms: tuple[int, int]) -> dict:
    """Every figure of one scorer on one schedule's judgements."""
    scored, degrades = replay(scorer, judged)
    found = detections(degrades, labels, window_s)
    return {"scorer": scorer.name, "windows": window_metrics(scored, labels), "detection": found,
            "false_degradations_per_node_hour": false_rates(found["false"], labels, span_ms),
            "episodes": episodes(scored, labels), "degrades": [dataclasses.asdict(each) for each in degrades],
            "unhealthy_windows": [[window.at_ms, window.node, verdict.kind] for window, verdict in scored
                                  if verdict.unhealthy]}
