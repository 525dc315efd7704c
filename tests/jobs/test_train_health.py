"""jobs/train_health.py on synthetic windows that the nameserver's own writer notes (three storage nodes, 10 s windows,
faults of each kind raising the faulted node's fsync, call or CPU figures), shipped as a node ships telemetry: the
model it writes is one a node accepts, scores as Spark does, beats the tuned threshold on the held-out runs and names
the right kind; bad labels fail with one line. One SparkSession on local[2] serves the module."""

from __future__ import annotations

import json
import random
from argparse import Namespace
from pathlib import Path
from types import SimpleNamespace

import pytest

pytest.importorskip("pyspark")

import trio  # noqa: E402

from jobs.health_data import Label, window_label  # noqa: E402
from jobs.models import TrainError  # noqa: E402
from jobs.train_health import (MODELS_PREFIX, THRESHOLD_GRID, held_out_from, judge, load_labels, main, parse,  # noqa: E402
                               run, score_outcomes, summary)
from rocket.ml.health import FEATURES, KINDS, WINDOW_METRIC, HealthModel, ModelScorer, NodeWindow  # noqa: E402
from rocket.roles.nameserver.health import note_windows  # noqa: E402
from rocket.telemetry.registry import Telemetry  # noqa: E402
from rocket.telemetry.ship import ship_now  # noqa: E402
from rocket.telemetry.spool import Spool  # noqa: E402
from rocket.tier.local import LocalDirectoryStore  # noqa: E402

NODES = (1, 2, 3)  # the storage nodes
WINDOW_S = 10.0
WINDOWS = 480  # 80 minutes
START_MS = 1_767_225_600_000  # 2026-01-01
FAULT_S, GAP_S = 100, 60  # each run, then a healthy gap
TEST_RUNS = 9  # the last runs, held out through --test-labels
SECOND_REPORTER = (200, 230)  # windows a second nameserver also judged (a leader change)


def fault_runs() -> list[dict]:
    """faults.py's labels: the kinds in turn on the nodes in turn, starting mid-window, and one control run."""
    runs = []
    for number in range(WINDOWS * int(WINDOW_S) // (FAULT_S + GAP_S)):
        start_ms = START_MS + 35_000 + number * (FAULT_S + GAP_S) * 1000
        kind = "control" if number == 4 else KINDS[number % 3]
        node = NODES[number % len(NODES)]
        runs.append({"kind": kind, "node": f"storage{node}", "node_id": node, "severity": 10.0, "start_ms": start_ms,
                     "end_ms": start_ms + FAULT_S * 1000})
    return runs


def window_of(node: int, at_ms: int, fault: str | None, rng: random.Random) -> NodeWindow:
    """A storage node's window: noisy healthy figures, and the fault's mark on them."""
    fsync_p99_s = 0.001 * rng.lognormvariate(0, 0.3)
    call_p99_s = 0.002 * rng.lognormvariate(0, 0.3)
    fsyncs, calls = rng.randint(200, 400), rng.randint(100, 200)
    errors, starved, lag = rng.choice((0, 0, 0, 1)), 0.05 * rng.random(), rng.randint(0, 5)
    if fault == "slow_disk":
        fsync_p99_s, fsyncs = fsync_p99_s * rng.uniform(8, 20), fsyncs // 2
    elif fault == "link":
        call_p99_s, errors, lag = call_p99_s * rng.uniform(5, 15), int(calls * rng.uniform(0.05, 0.12)), lag + 100
    elif fault == "cpu":
        starved, fsync_p99_s, call_p99_s = rng.uniform(2, 5), fsync_p99_s * 1.5, call_p99_s * 1.5
    return NodeWindow(node, fsync_p99_s, fsyncs, calls, errors, call_p99_s, starved, lag, 4, WINDOW_S, at_ms)


def judgements() -> list[list[NodeWindow]]:
    """Every window time's windows of the three nodes; a node is faulted in a window its fault run touches."""
    rng, runs = random.Random(31), fault_runs()
    result = []
    for index in range(1, WINDOWS + 1):
        at_ms = START_MS + index * int(WINDOW_S * 1000)
        began_ms = at_ms - int(WINDOW_S * 1000)
        faults = {run["node_id"]: run["kind"] for run in runs
                  if run["kind"] != "control" and run["start_ms"] < at_ms and began_ms < run["end_ms"]}
        result.append([window_of(node, at_ms, faults.get(node), rng) for node in NODES])
    return result


async def ship(tier: Path, reporter: int, judged: list[list[NodeWindow]], spool_dir: Path) -> None:
    """Note the windows as the nameserver does (its own note_windows), sample and spool them as a node does once a
    minute, and ship the spool to the local object store under telemetry/."""
    telemetry = Telemetry(reporter, spool_dir)
    spool = Spool(spool_dir / "telemetry")
    for number, windows in enumerate(judged, 1):
        note_windows(telemetry, windows)
        if number % 6 == 0 or number == len(judged):
            spool.append(telemetry.sample(windows[0].at_ms / 1000))
    async with LocalDirectoryStore(tier) as store:
        assert await ship_now(spool, store, reporter) >= 1


def write_data(base: Path, reporters: tuple[int, int] = (1, 2)) -> list[list[NodeWindow]]:
    """Ship the windows two nameservers judged (the reporters' node ids) into base/tier, and write the train and
    test labels (base/train.jsonl, base/test.jsonl); return the windows."""
    judged = judgements()
    trio.run(ship, base / "tier", reporters[0], judged, base / f"node{reporters[0]}")
    trio.run(ship, base / "tier", reporters[1], judged[slice(*SECOND_REPORTER)], base / f"node{reporters[1]}")
    runs = fault_runs()
    (base / "train.jsonl").write_text("".join(json.dumps(run) + "\n" for run in runs[:-TEST_RUNS]))
    (base / "test.jsonl").write_text("".join(json.dumps(run) + "\n" for run in runs[-TEST_RUNS:]))
    return judged


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> SimpleNamespace:
    """The tier holding both nameservers' telemetry, the train and test labels, and the judgements shipped."""
    base = tmp_path_factory.mktemp("health")
    judged = write_data(base)
    labels = load_labels(str(base / "train.jsonl")) + load_labels(str(base / "test.jsonl"))
    return SimpleNamespace(base=base, judged=judged, labels=labels)


@pytest.fixture(scope="module")
def trained(spark, data):
    args = parse(["--telemetry", str(data.base / "tier"), "--labels", str(data.base / "train.jsonl"), "--test-labels",
                  str(data.base / "test.jsonl"), "--models", str(data.base / "models"), "--max-iter", "15"])
    return run(spark, args, load_labels(args.labels), load_labels(args.test_labels))


def read_model(models: Path, version: str) -> tuple[bytes, bytes]:
    async def read() -> tuple[bytes, bytes]:
        async with LocalDirectoryStore(models) as store:
            return await store.get(f"{MODELS_PREFIX}latest.json"), await store.get(f"{MODELS_PREFIX}{version}.json")

    return trio.run(read)


def test_the_model_written_is_one_a_node_accepts_and_it_beats_the_threshold(trained, data):
    document = trained.document
    latest, versioned = read_model(data.base / "models", document["model_version"])
    assert latest == versioned
    assert trained.decision == {"model_version": document["model_version"], "metric": "f1",
                                "decided_at_ms": document["metrics"]["trained_at_ms"],
                                "score": document["metrics"]["f1"], "served_version": None, "served_score": None,
                                "promoted": True, "reason": "no model was served"}
    model = HealthModel.from_json(latest)
    assert model.version == document["model_version"] and model.window_s == WINDOW_S
    assert set(model.kinds) == set(KINDS)
    metrics = model.metrics
    line = summary(document)
    print(line)
    assert line.startswith(f"health: model={model.version} f1=") and "cpu f1=" in line
    # Every labelled window of every judgement, the second nameserver's too, is a row: None labels left out.
    expected = sum(1 for index, windows in enumerate(data.judged) for window in windows
                   if window_label(window, data.labels) is not None
                   for _ in range(2 if SECOND_REPORTER[0] <= index < SECOND_REPORTER[1] else 1))
    assert metrics["rows_train"] + metrics["rows_held_out"] == expected
    assert 0 < metrics["rows_validation"] < metrics["rows_train"] and metrics["rows_held_out"] > 100
    assert metrics["rows_checked"] == min(300, metrics["rows_held_out"])
    assert metrics["f1"] >= 0.9 and metrics["f1"] > metrics["threshold_f1"]
    for kind in KINDS:
        figures = metrics["by_kind"][kind]
        assert figures["windows_held_out"] > 0 and figures["windows_train"] > 0
        assert figures["f1"] >= 0.8, (kind, figures)
        assert 0 < model.kinds[kind][1] < 1 and len(model.kinds[kind][2]) == len(FEATURES)
    assert metrics["by_kind"]["cpu"]["threshold_f1"] == 0.0  # the threshold never names CPU starvation
    assert metrics["trained_at_ms"] > START_MS and metrics["untrained_kinds"] == {}
    # The baseline's parameters are the grid's, tuned on the training windows.
    assert set(metrics["threshold_params"]) == set(THRESHOLD_GRID)
    assert all(metrics["threshold_params"][name] in values for name, values in THRESHOLD_GRID.items())
    assert 0 < metrics["threshold_train_f1"] <= 1


def test_the_export_gives_sparks_probabilities(trained):
    model = HealthModel.from_json(json.dumps(trained.document))
    frame = trained.held_out
    for kind, spark_model in trained.models.items():
        frame = spark_model.transform(frame)
    rows = frame.limit(100).collect()
    assert rows
    for row in rows:
        ours = model.probabilities([row[name] for name in FEATURES])
        for kind in trained.models:
            assert ours[kind] == pytest.approx(float(row[f"probability_{kind}"][1]), abs=1e-9)


def test_the_model_names_a_faulted_window_and_passes_a_healthy_one(trained):
    scorer = ModelScorer(HealthModel.from_json(json.dumps(trained.document)))
    rng = random.Random(7)
    for kind in KINDS:
        windows = [window_of(node, START_MS, kind if node == 2 else None, rng) for node in NODES]
        faulted = scorer.score(windows[1], windows)
        assert faulted.unhealthy and faulted.kind == kind, faulted
        healthy = scorer.score(windows[0], windows)
        assert not healthy.unhealthy and healthy.kind == "", healthy


def test_labels_of_an_unknown_kind_fail_with_one_line(tmp_path, capsys):
    labels = tmp_path / "labels.jsonl"
    labels.write_text(json.dumps({"kind": "slow_disk", "node_id": 1, "severity": 1, "start_ms": 1, "end_ms": 2}) + "\n"
                      + json.dumps({"kind": "disk_full", "node_id": 1, "severity": 1, "start_ms": 3, "end_ms": 4}) + "\n")
    with pytest.raises(SystemExit, match=r"^health: .*labels.jsonl:2: unknown fault kind 'disk_full'$"):
        main(["--telemetry", str(tmp_path), "--labels", str(labels), "--models", str(tmp_path)])
    (tmp_path / "garbage.jsonl").write_text("kind=cpu\n")
    with pytest.raises(SystemExit, match=r"^health: .*garbage.jsonl: not a labels file"):
        main(["--telemetry", str(tmp_path), "--labels", str(tmp_path / "garbage.jsonl"), "--models", str(tmp_path)])


def test_labels_of_no_fault_train_nothing(spark, data, tmp_path):
    """Only control runs: no kind has a training window, so there is no model, and the error says why."""
    labels = [Label("control", 1, 0.0, START_MS + 60_000, START_MS + 600_000),
              Label("control", 2, 0.0, START_MS + 900_000, START_MS + 1_500_000)]
    args = Namespace(telemetry=str(data.base / "tier"), test_labels=None, models=str(tmp_path), max_iter=5,
                     max_depth=3, seed=31)
    with pytest.raises(TrainError, match="no training window of any fault kind"):
        run(spark, args, labels, None)
    assert not (tmp_path / "models").exists()


def test_the_held_out_runs_are_whole_and_the_last_third_or_so():
    def label(start_s: int, end_s: int) -> Label:
        return Label("cpu", 1, 1.0, start_s * 1000, end_s * 1000)

    runs = [label(start, start + 60) for start in range(0, 1000, 100)]  # 0 .. 960 s
    assert held_out_from(runs) == 700_000  # the start nearest 960 - 0.3 * 960 = 672 s
    overlapping = [label(0, 500), label(100, 200), label(400, 700), label(800, 900)]
    assert held_out_from(overlapping) == 800_000  # 400 s starts inside the first run: not a place to split
    with pytest.raises(TrainError, match="no whole runs to hold out"):
        held_out_from([label(0, 500), label(100, 600)])


def test_a_reporters_windows_are_judged_in_time_order_with_the_judgements_before_them():
    """judge() takes one nameserver's window records in any order (as groupByKey hands them over) and gives each
    window the judgements before it, as the nameserver's Recent did: at most two, none across a gap."""
    def records(at_s: int) -> list[dict]:
        return [{"metric": WINDOW_METRIC + field, "labels": {"target": str(node)}, "value": value,
                 "time_ms": START_MS + at_s * 1000, "node": 7}
                for node in NODES for field, value in (("fsync_p99_s", 0.001 * node), ("seconds", WINDOW_S),
                                                        ("at_ms", START_MS + at_s * 1000))]

    times_s = (10, 20, 30, 40, 100, 110)
    shuffled = [record for at_s in times_s for record in records(at_s)]
    random.Random(5).shuffle(shuffled)
    judged = judge((7, shuffled), [], [])
    assert [item.window.at_ms for item in judged[::3]] == [START_MS + at_s * 1000 for at_s in times_s]
    before = [[judgement[0].at_ms - START_MS for judgement in item.earlier] for item in judged[::3]]
    assert before == [[], [10_000], [10_000, 20_000], [20_000, 30_000], [], [100_000]]  # 100 s: 60 s after 40 s
    assert all(item.reporter == 7 and item.label == "healthy" and not item.held_out for item in judged)


def test_outcomes_score_per_kind_and_overall():
    """Per kind, precision is over the windows predicted as that kind; overall, any fault found counts."""
    outcomes = {("slow_disk", "slow_disk", "slow_disk"): 8, ("slow_disk", "cpu", "healthy"): 2,
                ("cpu", "cpu", "healthy"): 5, ("healthy", "healthy", "link"): 10, ("healthy", "link", "healthy"): 1}
    metrics = score_outcomes(outcomes)
    assert metrics["f1"] == pytest.approx(2 * 15 / (2 * 15 + 1))
    assert metrics["threshold_recall"] == pytest.approx(8 / 15) and metrics["threshold_precision"] == pytest.approx(8 / 18)
    assert metrics["by_kind"]["cpu"]["precision"] == pytest.approx(5 / 7) and metrics["by_kind"]["cpu"]["recall"] == 1.0
    assert metrics["by_kind"]["slow_disk"]["recall"] == pytest.approx(0.8)
    assert metrics["by_kind"]["link"]["f1"] == 0.0 and metrics["by_kind"]["link"]["recall"] is None
    assert metrics["by_kind"]["cpu"]["threshold_precision"] is None and metrics["by_kind"]["cpu"]["threshold_f1"] == 0.0
