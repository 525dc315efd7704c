"""benchmarks/health_metrics.py (health_eval.py's figures) on scripted windows (no cluster): the replay through a
scorer and HealthJudge, window precision, recall and F1 per kind, detection latency and misses, and false
degradations per node-hour."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import health_eval  # noqa: E402
import health_metrics  # noqa: E402
from jobs.health_data import Label  # noqa: E402
from rocket.ml.health import NodeWindow, ThresholdScorer  # noqa: E402

WINDOW_S = 2.0
T0 = 1_800_000_000_000  # wall-clock ms of the first window's end


def window_records(at_ms: int, fsync_p99_s: dict[int, float], reporter: int = 1) -> list[dict]:
    """The records a nameserver notes for one judgement: fsync p99 and count per node, the window's length."""
    records = []
    for node, p99 in fsync_p99_s.items():
        for field, value in (("fsync_p99_s", p99), ("fsyncs", 100), ("seconds", WINDOW_S), ("at_ms", at_ms)):
            records.append({"time_ms": at_ms, "node": reporter, "metric": f"rocket_health_window_{field}",
                            "labels": {"target": str(node)}, "value": float(value), "rate": None})
    return records


def scripted(slow: dict[int, set[int]], count: int) -> list[dict]:
    """count judgements, 2 s apart; node 11, 12 or 13 has a 50 ms fsync p99 in the windows slow names, 1 ms else."""
    records = []
    for index in range(count):
        at_ms = T0 + index * int(WINDOW_S * 1000)
        records += window_records(at_ms, {node: 0.05 if index in slow.get(node, ()) else 0.001
                                          for node in (11, 12, 13)})
    return records


def test_judgements_group_by_reporter_and_time_and_drop_duplicates():
    """A record shipped twice (object store and spool) counts once; judgements come out oldest first."""
    records = scripted({}, 3)
    judged = health_metrics.judgements(list(reversed(records)) + records[:8])
    assert [each.at_ms for each in judged] == [T0, T0 + 2000, T0 + 4000]
    assert [window.node for window in judged[0].windows] == [11, 12, 13]
    assert judged[0].windows[0] == NodeWindow(11, 0.001, 100, seconds=WINDOW_S, at_ms=T0)


def test_a_slow_disk_is_detected_after_three_windows_and_scored_per_kind():
    """Node 12 slow in windows 5..14 (a fault from window 4's end to window 14's end): the threshold judges the ten
    windows inside slow_disk, the judge degrades it at the third; precision and recall 1, latency 3 windows."""
    judged = health_metrics.judgements(scripted({12: set(range(5, 15))}, 30))
    fault = Label("slow_disk", 12, 5.0, T0 + 4 * 2000, T0 + 14 * 2000)
    control = Label("control", 11, 0.0, T0 + 20 * 2000, T0 + 29 * 2000)
    figures = health_metrics.evaluate(ThresholdScorer(), judged, [fault, control], WINDOW_S, (T0 - 2000, T0 + 29 * 2000))
    windows = figures["windows"]
    assert windows["truth"] == {"healthy": 80, "slow_disk": 10}
    assert windows["kinds"]["slow_disk"] == {"precision": 1.0, "recall": 1.0, "f1": 1.0, "true_positives": 10}
    assert windows["kinds"]["link"]["f1"] == 0.0 and windows["f1"] == 1.0
    detection = figures["detection"]
    assert detection["kinds"]["slow_disk"] == {"detected": 1, "missed": 0, "latency_p50_s": 6.0, "latency_p99_s": 6.0}
    assert detection["faults"][0]["degraded_as"] == "slow_disk"
    assert detection["late"] == [] and detection["false"] == []
    assert figures["false_degradations_per_node_hour"]["overall"] == 0.0
    assert [(each["kind"], each["windows"], each["called"]) for each in figures["episodes"]] == [
        ("slow_disk", 10, {"slow_disk": 10}), ("control", 9, {"healthy": 9})]


def test_false_positive_windows_lower_precision_and_a_false_degradation_is_counted_per_node_hour():
    """Node 13 slow for 4 windows during the control run: 4 false slow_disk windows, one false degradation in the
    control run's 3 nodes x 18 s; a fault never seen is a miss."""
    judged = health_metrics.judgements(scripted({12: {5, 6}, 13: {20, 21, 22, 23}}, 30))
    fault = Label("slow_disk", 12, 5.0, T0 + 4 * 2000, T0 + 10 * 2000)
    control = Label("control", 11, 0.0, T0 + 20 * 2000, T0 + 29 * 2000)
    figures = health_metrics.evaluate(ThresholdScorer(), judged, [fault, control], WINDOW_S, (T0 - 2000, T0 + 29 * 2000))
    slow_disk = figures["windows"]["kinds"]["slow_disk"]
    assert slow_disk["precision"] == pytest.approx(2 / 6) and slow_disk["recall"] == pytest.approx(2 / 6)
    assert figures["detection"]["kinds"]["slow_disk"]["missed"] == 1
    assert [each["node"] for each in figures["detection"]["false"]] == [13]
    rates = figures["false_degradations_per_node_hour"]
    assert rates["control_false"] == 1 and rates["control"] == pytest.approx(1 / (3 * 18 / 3600))
    assert rates["overall_false"] == 1 and rates["node_hours"] == pytest.approx((3 * 60 - 12) / 3600)


def test_a_degradation_just_after_the_fault_is_late_not_false():
    """Degraded two windows after its fault ended (past end + one window): late, neither a detection nor false."""
    degrades = [health_metrics.Degrade(T0 + 16_000, 12, "slow_disk")]
    fault = Label("slow_disk", 12, 5.0, T0, T0 + 12_000)
    found = health_metrics.detections(degrades, [fault], WINDOW_S)
    assert found["kinds"]["slow_disk"]["missed"] == 1 and len(found["late"]) == 1 and found["false"] == []


def test_percentile_is_nearest_rank():
    """p50 and p99 are latencies some fault had; none without detections."""
    assert health_metrics.percentile([3.0, 1.0, 2.0, 10.0], 0.5) == 2.0
    assert health_metrics.percentile([3.0, 1.0, 2.0, 10.0], 0.99) == 10.0
    assert health_metrics.percentile([], 0.5) is None


def test_schedules_pair_each_kind_with_another_node_in_test():
    """TRAIN and TEST run the same kinds and severities, each (kind, severity) on a different node."""
    for mode in (health_eval.QUICK, health_eval.FULL):
        train, test = health_eval.schedule(mode, 0), health_eval.schedule(mode, 1)
        assert [(e.kind, e.severity) for e in train] == [(e.kind, e.severity) for e in test]
        assert all(a.node != b.node for a, b in zip(train, test))
        assert sum(e.kind == "control" for e in train) == len(next(iter(mode.severities.values())))
