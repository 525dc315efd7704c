"""Train the unhealthy-node model (issue 31): the windows the nameserver judged, labelled by benchmarks/faults.py's
runs -> one Spark GBTClassifier per fault kind -> the JSON model rocket.ml.health scores (the nameserver loads
`models/health/latest.json` from the object store).

    python -m jobs.train_health --telemetry rocket-cluster/tier --labels train.jsonl --models rocket-cluster/tier
    spark-submit --master spark://HOST:7077 jobs/train_health.py --telemetry s3a://B/telemetry --labels train.jsonl \
        --test-labels test.jsonl --models s3a://B

Held out are the windows inside the runs of --test-labels, or without it those from the start of the run that
begins the last ~30% of the labelled time (whole runs: the split falls between them). Each kind's probability
threshold is the one of best F1 on the windows of the training runs that begin their last fifth of time (again whole
runs), by trees fitted on the rest; the trees served are then refitted on every training window. The threshold
baseline (ThresholdScorer) is tuned by grid search on the training windows; both are scored on the held-out windows
by the Scorers the nameserver runs. The export is proven first: rocket.ml.health.HealthModel, given the JSON, must
give Spark's probabilities, or nothing is written. It becomes `latest.json` only when its F1 on the held-out windows
is above the served model's on the same windows (jobs.models.publish); the decision is recorded either way.
"""

from __future__ import annotations

import sys
from pathlib import Path

if not __package__:  # spark-submit jobs/train_health.py: the tree's root on the path, so that `import jobs` works
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import argparse  # noqa: E402
import collections  # noqa: E402
import itertools  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
from datetime import datetime, timezone  # noqa: E402
from typing import NamedTuple  # noqa: E402

from jobs import tier  # noqa: E402
from jobs.health_data import HEALTHY, Label, is_window_record, read_labels, window_label, windows  # noqa: E402
from jobs.models import TrainError, export_trees, model_version, publish  # noqa: E402
from rocket.ml.health import (FEATURES, KINDS, MODEL_FORMAT, MODEL_VERSION, HealthModel, ModelScorer,  # noqa: E402
                              NodeWindow, Recent, ThresholdScorer, health_features)
from rocket.ml.trees import describe_decision  # noqa: E402

MODELS_PREFIX = "models/health/"
HELD_OUT_SHARE = 0.3  # of the labelled time, without --test-labels
VALIDATION_SHARE = 0.2  # of the training runs' time (whole runs): where each kind's probability threshold is chosen
PROBABILITIES = tuple(step / 20 for step in range(1, 20))  # the thresholds a kind may get: 0.05 .. 0.95
# ThresholdScorer's parameters the baseline is tuned over (rocket.limits' defaults among them).
THRESHOLD_GRID = {"fsync_p99_s_min": (0.002, 0.005, 0.01, 0.02, 0.05), "peer_ratio": (1.5, 2.0, 3.0, 4.0, 6.0),
                  "error_rate_max": (0.02, 0.05, 0.1, 0.2, 0.3)}
CHECK_ROWS = 300  # held-out rows the export is proven on
CHECK_TOLERANCE = 1e-6  # of a probability


class Judged(NamedTuple):
    """One node's window in one judgement: what a scorer is shown, and what it was."""

    reporter: int  # the nameserver that judged it
    window: NodeWindow
    peers: list[NodeWindow]  # every window of the judgement, its own included
    earlier: tuple[list[NodeWindow], ...]  # the reporter's judgements before it (rocket.ml.health.Recent.before)
    label: str  # of KINDS, or HEALTHY
    held_out: bool


def held_out_from(labels: list[Label], share: float = HELD_OUT_SHARE) -> int:
    """The start of the run from which the last ~share of the labelled time is held out: a run that no earlier run
    outlasts (whole runs on each side), the one nearest the share."""
    runs = sorted((label.start_ms, label.end_ms) for label in labels)
    if not runs:
        raise TrainError("the labels hold no runs")
    first_ms, last_ms = runs[0][0], max(end_ms for _, end_ms in runs)
    candidates, ended_ms = [], runs[0][1]
    for start_ms, end_ms in runs[1:]:
        if start_ms >= ended_ms:
            candidates.append(start_ms)
        ended_ms = max(ended_ms, end_ms)
    if not candidates:
        raise TrainError(f"{len(runs)} labelled run(s) with no gap between them: no whole runs to hold out; give "
                         "--test-labels")
    target_ms = last_ms - share * (last_ms - first_ms)
    return min(candidates, key=lambda start_ms: (abs(start_ms - target_ms), start_ms))


def held_out_spans(labels: list[Label], test_labels: list[Label] | None) -> list[tuple[float, float]]:
    """The times whose windows are held out: the test runs, or everything from held_out_from(labels) on."""
    if test_labels is not None:
        return sorted((label.start_ms, label.end_ms) for label in test_labels)
    return [(held_out_from(labels), math.inf)]


def judge(item: tuple, labels: list[Label], spans: list[tuple[float, float]]) -> list[Judged]:
    """The labelled windows of one reporter's judgements (reporter, its window records), taken in time order as the
    reporter judged them, each with the judgements before it. Runs in the executors."""
    reporter, records = item
    by_time: dict[int, list[dict]] = collections.defaultdict(list)
    for record in records:
        by_time[record["time_ms"]].append(record)
    recent, judged = Recent(), []
    for time_ms in sorted(by_time):
        judgement = windows(by_time[time_ms])
        earlier = recent.before(judgement)
        for window in judgement:
            label = window_label(window, labels)
            if label is None:
                continue
            began_ms = window.at_ms - int(window.seconds * 1000)  # as window_label reckons it
            held_out = any(start_ms <= began_ms and window.at_ms <= end_ms for start_ms, end_ms in spans)
            judged.append(Judged(reporter, window, judgement, earlier, label, held_out))
    return judged


def judged_windows(samples, labels: list[Label], spans: list[tuple[float, float]]):
    """RDD[Judged] of the window records among samples. Each reporter's windows of one time are one judgement: two
    nameservers noting the same time (a leader change) judged separately."""
    return (samples.filter(is_window_record)
            .map(lambda record: (record["node"], record))
            .groupByKey()
            .flatMap(lambda item: judge(item, labels, spans)))


def schema():
    from pyspark.sql.types import BooleanType, DoubleType, LongType, StringType, StructField, StructType

    return StructType([StructField("reporter", LongType(), False), StructField("at_ms", LongType(), False),
                       StructField("node", LongType(), False), StructField("seconds", DoubleType(), False),
                       StructField("label", StringType(), False), StructField("held_out", BooleanType(), False),
                       *(StructField(name, DoubleType(), False) for name in FEATURES)])


def feature_row(item: Judged) -> tuple:
    """The row of a judged window: rocket.ml.health.health_features, the one definition. Runs in the executors."""
    window = item.window
    return (item.reporter, window.at_ms, window.node, float(window.seconds), item.label, item.held_out,
            *map(float, health_features(item.window, item.peers, item.earlier)))


def counts(tp: int, fp: int, fn: int) -> dict:
    """Precision, recall and F1 (None where undefined: nothing predicted, or nothing to find), with the counts."""
    return {"precision": tp / (tp + fp) if tp + fp else None, "recall": tp / (tp + fn) if tp + fn else None,
            "f1": 2 * tp / (2 * tp + fp + fn) if tp + fp + fn else None, "tp": tp, "fp": fp, "fn": fn}


def score_outcomes(outcomes: dict[tuple[str, str, str], int]) -> dict:
    """The metrics of held-out outcomes {(label, the model's verdict, the threshold's): windows}, a verdict being a
    kind or HEALTHY: overall (unhealthy against healthy) and per kind, for both scorers."""
    metrics: dict = {}
    by_kind: dict = {kind: {} for kind in KINDS}
    for index, prefix in ((1, ""), (2, "threshold_")):
        def total(test) -> int:
            return sum(count for outcome, count in outcomes.items() if test(outcome[0], outcome[index]))

        overall = counts(total(lambda label, said: label != HEALTHY and said != HEALTHY),
                         total(lambda label, said: label == HEALTHY and said != HEALTHY),
                         total(lambda label, said: label != HEALTHY and said == HEALTHY))
        metrics.update({f"{prefix}{name}": overall[name] for name in ("precision", "recall", "f1")})
        metrics[f"{prefix}counts"] = {name: overall[name] for name in ("tp", "fp", "fn")}
        for kind in KINDS:
            figures = counts(total(lambda label, said: label == kind and said == kind),
                             total(lambda label, said: label != kind and said == kind),
                             total(lambda label, said: label == kind and said != kind))
            by_kind[kind].update({f"{prefix}{name}": figures[name] for name in ("precision", "recall", "f1")})
    for kind in KINDS:
        by_kind[kind]["windows_held_out"] = sum(count for outcome, count in outcomes.items() if outcome[0] == kind)
    metrics["by_kind"] = by_kind
    return metrics


def threshold_grid() -> list[tuple[float, float, float]]:
    return list(itertools.product(*THRESHOLD_GRID.values()))


def grid_counts(items, grid: list[tuple[float, float, float]]):
    """(parameters, (tp, fp, fn)) of ThresholdScorer on a partition's judged windows, for each point of the grid:
    a window is found when the verdict is unhealthy and its label a fault. Runs in the executors."""
    scorers = [(parameters, ThresholdScorer(*parameters)) for parameters in grid]
    totals = {parameters: [0, 0, 0] for parameters in grid}
    for item in items:
        fault = item.label != HEALTHY
        for parameters, scorer in scorers:
            unhealthy = scorer.score(item.window, item.peers).unhealthy
            if unhealthy or fault:
                totals[parameters][0 if unhealthy and fault else 1 if unhealthy else 2] += 1
    return ((parameters, tuple(total)) for parameters, total in totals.items())


def tune_threshold(train_judged) -> tuple[dict, float | None]:
    """ThresholdScorer's parameters of the best F1 on the training windows (ties: rocket.limits' defaults, then the
    lowest point of the grid), and that F1."""
    grid = threshold_grid()
    found = (train_judged.mapPartitions(lambda items: grid_counts(items, grid))
             .reduceByKey(lambda a, b: tuple(x + y for x, y in zip(a, b)))
             .collect())  # one row per point of the grid
    default = ThresholdScorer()
    defaults = (default.fsync_p99_s_min, default.peer_ratio, default.error_rate_max)

    def key(entry):
        parameters, (tp, fp, fn) = entry
        f1 = counts(tp, fp, fn)["f1"] or 0.0
        return (-f1, parameters != defaults, parameters)

    parameters, (tp, fp, fn) = min(found, key=key)
    return dict(zip(THRESHOLD_GRID, parameters)), counts(tp, fp, fn)["f1"]


def outcomes_of(items, text: str | bytes, threshold: dict):
    """(label, the model's verdict, the threshold's) of a partition's judged windows, each verdict a kind or HEALTHY:
    the scorers the nameserver runs, on the exported model. Runs in the executors."""
    model, baseline = ModelScorer(HealthModel.from_json(text)), ThresholdScorer(**threshold)
    for item in items:
        said = [scorer.score(item.window, item.peers, item.earlier) for scorer in (model, baseline)]
        yield (item.label, *(verdict.kind if verdict.unhealthy else HEALTHY for verdict in said))


def probability(kind: str):
    """The column of Spark's probability that a row is of kind (its classifier's class 1)."""
    from pyspark.ml.functions import vector_to_array
    from pyspark.sql import functions as F

    return vector_to_array(F.col(f"probability_{kind}"))[1]


def choose_threshold(predictions, kind: str) -> tuple[float, float | None]:
    """The probability of PROBABILITIES with the best F1 for kind on predictions (ties: nearest 0.5), and that F1."""
    from pyspark.sql import functions as F

    positive = F.col("label") == kind
    columns = [F.sum(positive.cast("int"))]
    for threshold in PROBABILITIES:
        said = probability(kind) >= threshold
        columns += [F.sum((said & positive).cast("int")), F.sum((said & ~positive).cast("int"))]
    row = predictions.agg(*columns).first()
    positives = row[0] or 0
    scored = [(counts(row[1 + 2 * index] or 0, row[2 + 2 * index] or 0, positives - (row[1 + 2 * index] or 0))["f1"]
               or 0.0, threshold) for index, threshold in enumerate(PROBABILITIES)]
    f1, threshold = max(scored, key=lambda entry: (entry[0], -abs(entry[1] - 0.5)))
    return threshold, f1


def check_export(text: str, checked: list, kinds: list[str]) -> int:
    """Raise TrainError unless HealthModel.from_json(text) gives, for each kind, Spark's probability on the checked
    rows (each with FEATURES and probability_<kind> as a number); return how many rows were compared."""
    model = HealthModel.from_json(text)
    for row in checked:
        features = [row[name] for name in FEATURES]
        ours = model.probabilities(features)
        for kind in kinds:
            if abs(ours[kind] - row[f"p_{kind}"]) > CHECK_TOLERANCE:
                raise TrainError(f"the exported model gives {kind} a probability of {ours[kind]!r} where Spark gives "
                                 f"{row[f'p_{kind}']!r}, for features {features}")
    return len(checked)


class Trained(NamedTuple):
    document: dict  # the model file's, its export checked
    models: dict  # kind -> Spark's GBTClassificationModel
    held_out: object  # the held-out rows (DataFrame, with a features vector)
    decision: dict | None = None  # jobs.models.publish's, once written


def scored_f1(judged, text: bytes, threshold: dict) -> float | None:
    """F1 of a model file (the served one, or the new) on the held-out windows, by the scorer a nameserver runs;
    ModelError (a ValueError) when this code cannot score it."""
    HealthModel.from_json(text)
    outcomes = (judged.filter(lambda item: item.held_out)
                .mapPartitions(lambda items: outcomes_of(items, text, threshold)).countByValue())
    return score_outcomes(dict(outcomes))["f1"]


def fit(rows, kind: str, args: argparse.Namespace):
    """Spark's GBTClassifier of kind against the rest (healthy, or another kind) on rows."""
    from pyspark.ml.classification import GBTClassifier
    from pyspark.sql import functions as F

    rows = rows.withColumn("target", (F.col("label") == kind).cast("double"))
    model = GBTClassifier(featuresCol="features", labelCol="target", maxIter=args.max_iter, maxDepth=args.max_depth,
                          seed=args.seed).fit(rows)
    # Its columns named by kind, so that the kinds' models transform one frame in turn.
    return (model.setProbabilityCol(f"probability_{kind}").setRawPredictionCol(f"raw_{kind}")
            .setPredictionCol(f"prediction_{kind}"))


def train(spark, judged, args: argparse.Namespace, held_out: str, validation_from_ms: int | None) -> Trained:
    """Fit per kind, tune the baseline, score both on the held-out windows, export and check. Each kind's probability
    threshold is chosen on the training windows from validation_from_ms on (None: none, the threshold is 0.5)."""
    import pyspark
    from pyspark.ml.feature import VectorAssembler
    from pyspark.sql import functions as F

    assembler = VectorAssembler(inputCols=list(FEATURES), outputCol="features")
    rows = assembler.transform(spark.createDataFrame(judged.map(feature_row), schema())).persist()
    train_rows, held_out_rows = rows.filter(~F.col("held_out")), rows.filter(F.col("held_out"))
    by_label = collections.Counter({(row["held_out"], row["label"]): row["count"]
                                    for row in rows.groupBy("held_out", "label").count().collect()})
    rows_train = sum(count for (held_out, _), count in by_label.items() if not held_out)
    rows_held_out = sum(count for (held_out, _), count in by_label.items() if held_out)
    kinds = [kind for kind in KINDS if by_label[False, kind]]
    untrained = {kind: "no training windows" for kind in KINDS if kind not in kinds}
    if not kinds:
        raise TrainError(f"no training window of any fault kind ({', '.join(KINDS)}) among {rows_train}: the labels "
                         "name no fault the telemetry's windows saw")
    if not any(by_label[True, kind] for kind in KINDS):
        raise TrainError(f"no held-out window of a fault among {rows_held_out}: nothing to score the model on")
    # Each kind's threshold: the best F1 on the windows of the last training runs, by trees fitted on the rest.
    validating = F.col("at_ms") - F.col("seconds") * 1000 >= F.lit(validation_from_ms or math.inf)
    fit_rows, validation_rows = train_rows.filter(~validating), train_rows.filter(validating)
    fit_labels = {row["label"]: row["count"] for row in fit_rows.groupBy("label").count().collect()}
    rows_validation = rows_train - sum(fit_labels.values())
    thresholds, validation_f1 = {}, {}
    for kind in kinds:
        validation_positives = by_label[False, kind] - fit_labels.get(kind, 0)
        if fit_labels.get(kind) and validation_positives and len(fit_labels) > 1:
            thresholds[kind], validation_f1[kind] = choose_threshold(
                fit(fit_rows, kind, args).transform(validation_rows), kind)
        else:  # no windows of it on one side: the even odds
            thresholds[kind], validation_f1[kind] = 0.5, None
    models = {kind: fit(train_rows, kind, args) for kind in kinds}
    threshold_parameters, threshold_train_f1 = tune_threshold(judged.filter(lambda item: not item.held_out))
    window_s = float(rows.agg(F.percentile_approx("seconds", 0.5)).first()[0])
    now = datetime.now(timezone.utc)
    trees = {kind: export_trees(models[kind]) for kind in kinds}
    document = {"format": MODEL_FORMAT, "format_version": MODEL_VERSION, "model_version": model_version(trees, now),
                "features": list(FEATURES), "window_s": window_s,
                "kinds": {kind: {"trees": trees[kind], "threshold": thresholds[kind],
                                 "importances": [float(value) for value in models[kind].featureImportances.toArray()]}
                          for kind in kinds},
                "metrics": {}}
    text = json.dumps(document)
    checked = held_out_rows.limit(CHECK_ROWS)
    for kind in kinds:
        checked = models[kind].transform(checked).withColumn(f"p_{kind}", probability(kind))
    rows_checked = check_export(text, checked.select(*FEATURES, *(f"p_{kind}" for kind in kinds)).collect(), kinds)
    outcomes = (judged.filter(lambda item: item.held_out)
                .mapPartitions(lambda items: outcomes_of(items, text, threshold_parameters))
                .countByValue())  # at most (kinds + 1) ** 3 keys
    metrics = score_outcomes(dict(outcomes))
    for kind in KINDS:
        metrics["by_kind"][kind].update(windows_train=by_label[False, kind], threshold_validation=thresholds.get(kind),
                                        f1_validation=validation_f1.get(kind))
    metrics.update(threshold_params=threshold_parameters, threshold_train_f1=threshold_train_f1,
                   untrained_kinds=untrained, rows_train=rows_train, rows_validation=rows_validation,
                   rows_held_out=rows_held_out, rows_checked=rows_checked, validation_from_ms=validation_from_ms,
                   held_out=held_out, trained_at_ms=int(now.timestamp() * 1000), window_s=window_s,
                   spark_version=pyspark.__version__)
    document["metrics"] = metrics
    HealthModel.from_json(json.dumps(document))  # what is written is what a node accepts
    return Trained(document, models, held_out_rows)


def load_labels(path: str) -> list[Label]:
    """read_labels, its failures as TrainError with one line."""
    try:
        return read_labels(path)
    except OSError as error:
        raise TrainError(f"cannot read the labels: {error}") from None
    except (ValueError, KeyError, TypeError) as error:
        if str(error).startswith(f"{path}:"):
            raise TrainError(str(error)) from None
        raise TrainError(f"{path}: not a labels file (JSON lines of kind, node_id, severity, start_ms, end_ms): "
                         f"{type(error).__name__}: {error}") from None


def summary(document: dict) -> str:
    metrics = document["metrics"]

    def figure(value: float | None) -> str:
        return "n/a" if value is None else f"{value:.3f}"

    kinds = " ".join(f"{kind} f1={figure(metrics['by_kind'][kind]['f1'])}" if kind in document["kinds"]
                     else f"{kind}: not trained, {metrics['untrained_kinds'][kind]}" for kind in KINDS)
    return (f"health: model={document['model_version']} f1={figure(metrics['f1'])} "
            f"threshold_f1={figure(metrics['threshold_f1'])} rows={metrics['rows_train'] + metrics['rows_held_out']} "
            f"({kinds})")


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m jobs.train_health", description=__doc__.splitlines()[0])
    parser.add_argument("--telemetry", help="the telemetry/ prefix of an object store, or its root")
    parser.add_argument("--labels", required=True, help="the fault runs (benchmarks/faults.py's JSON lines)")
    parser.add_argument("--test-labels", help="runs to hold out (default: the last ~30%% of the labelled time)")
    parser.add_argument("--models", help="the object store root the model is put under")
    tier.add_arguments(parser)
    parser.add_argument("--master", default=None, help="Spark master (default local[*], or spark-submit's)")
    parser.add_argument("--max-iter", type=int, default=30, help="trees per kind (default %(default)s)")
    parser.add_argument("--max-depth", type=int, default=3, help="of each tree (default %(default)s)")
    parser.add_argument("--seed", type=int, default=31)
    args = parser.parse_args(argv)
    tier.resolve(parser, args)
    return args


def run(spark, args: argparse.Namespace, labels: list[Label], test_labels: list[Label] | None) -> Trained:
    """Judge the telemetry's windows again, train, publish the model (jobs.models.publish)."""
    from jobs.spark import load_telemetry

    spans = held_out_spans(labels, test_labels)
    held_out = (f"the {len(test_labels)} runs of {args.test_labels}" if test_labels is not None
                else f"the runs from {spans[0][0]} ms on")
    training_runs = labels if test_labels is not None else [label for label in labels if label.start_ms < spans[0][0]]
    try:
        validation_from_ms = held_out_from(training_runs, VALIDATION_SHARE)
    except TrainError:  # one training run, or none apart: no threshold is chosen
        validation_from_ms = None
    judged = judged_windows(load_telemetry(spark, args.telemetry).samples, labels + (test_labels or []),
                            spans).persist()
    trained = train(spark, judged, args, held_out, validation_from_ms)
    decision = publish(spark, args.models, MODELS_PREFIX, trained.document, "f1", False,
                       lambda text: scored_f1(judged, text, trained.document["metrics"]["threshold_params"]))
    judged.unpersist()
    return trained._replace(decision=decision)


def main(argv: list[str] | None = None) -> None:
    from jobs.spark import session

    args = parse(argv)
    try:
        labels = load_labels(args.labels)
        test_labels = load_labels(args.test_labels) if args.test_labels else None
        spark = session(args.master, "rocket-train-health")
        trained = run(spark, args, labels, test_labels)
    except TrainError as error:
        raise SystemExit(f"health: {error}") from None
    print(summary(trained.document))
    if trained.decision:
        print(f"health: {describe_decision(trained.decision)}")


if __name__ == "__main__":
    from jobs.train_health import main as run_main  # this module by name: Spark ships its functions by reference

    run_main()
