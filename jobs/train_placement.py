"""Train the placement load forecaster (issue 30): queue features -> Spark's GBTRegressor -> the JSON model
rocket.ml.forecast scores (the nameserver loads `models/forecast/latest.json` from the object store).

    python -m jobs.train_placement --telemetry rocket-data/tier/telemetry --models rocket-data/tier
    spark-submit --master spark://HOST:7077 jobs/train_placement.py --telemetry s3a://B/telemetry --models s3a://B

The rows are split by time: the last --held-out-days are held out for evaluation, or, when the data spans less
than twice that, its last 20% of time; training rows whose horizon reaches into the held-out time are left out, so
no label the model is scored on was seen in training. How much of the trees' correction of the last value the model
serves (0, 0.1, ... 1) is chosen on the last fifth of the training time, by trees fitted on the rest. The model is
compared with the naive forecaster (the queue's last minute) on the held-out rows, then exported, and the export is
proven: rocket.ml.forecast.Forecaster, given the exported JSON, must predict what Spark predicts for a sample of
held-out rows, or nothing is written. It becomes `latest.json` only when its RMSE on the held-out rows is below the
served model's on the same rows (jobs.models.publish); the decision is recorded either way.
"""

from __future__ import annotations

import sys
from pathlib import Path

if not __package__:  # spark-submit jobs/train_placement.py: the tree's root on the path, so that `import jobs` works
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import argparse  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
from datetime import datetime, timezone  # noqa: E402
from typing import NamedTuple  # noqa: E402

from jobs import tier  # noqa: E402
from jobs.models import TrainError, export_trees, model_version, publish  # noqa: E402
from rocket.ml.forecast import CHANGE_MAX, FEATURES, MODEL_FORMAT, MODEL_VERSION, STEP_MS, TARGET, Forecaster  # noqa: E402
from rocket.ml.trees import describe_decision  # noqa: E402

DAY_MS = 86_400_000
HELD_OUT_FRACTION = 0.2  # of the data's time, when it spans less than twice --held-out-days
MODELS_PREFIX = "models/forecast/"
CHECK_ROWS = 200  # held-out rows the export is proven on
CHECK_TOLERANCE = 1e-6  # relative (absolute below 1 byte/s)
SHRINKS = tuple(step / 10 for step in range(11))  # shares of the trees' correction the model may serve


def held_out_from(first_ms: int, last_ms: int, held_out_days: float) -> int:
    """The first at_ms of the held-out rows, of rows from first_ms to last_ms."""
    held_out_ms = held_out_days * DAY_MS
    span_ms = last_ms - first_ms + STEP_MS
    if span_ms >= 2 * held_out_ms:
        start = last_ms + STEP_MS - held_out_ms
    else:
        start = last_ms + STEP_MS - HELD_OUT_FRACTION * span_ms
    return int(math.floor(start / STEP_MS) * STEP_MS)  # at least one step held out


def split(queues, held_out_days: float, horizon_steps: int):
    """(train, held_out, held_out_from_ms) of the queues/ rows."""
    from pyspark.sql import functions as F

    bounds = queues.agg(F.min("at_ms"), F.max("at_ms"), F.count("*")).first()
    if not bounds[2]:
        raise TrainError("no queue rows: the telemetry holds no queue traffic, or spans less than the horizon")
    start = held_out_from(bounds[0], bounds[1], held_out_days)
    train = queues.filter(F.col("at_ms") + horizon_steps * STEP_MS <= start)
    held_out = queues.filter(F.col("at_ms") >= start)
    return train, held_out, start


def served(shrink: float):
    """The column of what the exported model serves: the last value plus the scale times shrink times Spark's
    prediction, that clipped at +-CHANGE_MAX, and never below 0 (rocket.ml.forecast.Forecaster.predict)."""
    from pyspark.sql import functions as F

    change = F.least(F.greatest(F.col("prediction") * shrink, F.lit(-CHANGE_MAX)), F.lit(CHANGE_MAX))
    return F.greatest(F.col("naive") + F.col("scale") * change, F.lit(0.0))


def export_model(model, horizon_steps: int, metrics: dict, now: datetime, shrink: float = 1.0) -> dict:
    """The forecast.py document of a fitted GBTRegressionModel, its tree weights times shrink."""
    trees = export_trees(model, shrink)
    return {"format": MODEL_FORMAT, "format_version": MODEL_VERSION,
            "model_version": model_version(trees, now), "features": list(FEATURES),
            "horizon_steps": horizon_steps, "target": TARGET, "trees": trees, "metrics": metrics}


def errors(frame, predicted: str) -> tuple[float, float]:
    """RMSE and MAE of column predicted against label."""
    from pyspark.sql import functions as F

    error = F.col(predicted) - F.col("label")
    row = frame.agg(F.sqrt(F.avg(error * error)), F.avg(F.abs(error))).first()
    return float(row[0]), float(row[1])


def check_export(text: str, predictions) -> int:
    """Raise TrainError unless Forecaster.from_json(text) predicts what Spark served (the last value plus the scale
    times Spark's prediction, clamped at 0, as Forecaster does) for up to CHECK_ROWS held-out rows; return how many were compared."""
    forecaster = Forecaster.from_json(text)
    rows = predictions.select(*FEATURES, "served").limit(CHECK_ROWS).collect()
    for row in rows:
        features = [row[name] for name in FEATURES]
        ours, spark = forecaster.predict(features), row["served"]
        if abs(ours - spark) > CHECK_TOLERANCE * max(1.0, abs(spark)):
            raise TrainError(f"the exported model predicts {ours!r} where Spark predicts {spark!r} for {features}")
    return len(rows)


def scored_rmse(held_out, text: bytes, horizon_steps: int) -> float:
    """RMSE of a model file (the served one, or the new) on the held-out rows, scored in the executors as a node does.
    ValueError (ModelError among them) when it cannot be: a file this code does not score, another horizon."""
    model = Forecaster.from_json(text)
    if model.horizon_steps != horizon_steps:
        raise ValueError(f"it forecasts {model.horizon_steps} steps ahead, these rows {horizon_steps}")

    def squares(rows):
        scorer, total, count = Forecaster.from_json(text), 0.0, 0
        for row in rows:
            error = scorer.predict([row[name] for name in FEATURES]) - row["label"]
            total, count = total + error * error, count + 1
        yield total, count

    parts = held_out.select(*FEATURES, "label").rdd.mapPartitions(squares).collect()
    count = sum(part[1] for part in parts)
    return math.sqrt(sum(part[0] for part in parts) / count) if count else math.nan


class Trained(NamedTuple):
    document: dict  # the model file's, its export checked
    model: object  # Spark's GBTRegressionModel
    held_out: object  # the held-out rows (DataFrame, with a features vector)
    decision: dict | None = None  # jobs.models.publish's, once written


def train(spark, queues, *, held_out_days: float, horizon_steps: int, max_iter: int = 30, max_depth: int = 4,
          seed: int = 30, weight: str = "none") -> Trained:
    """Fit, evaluate and export the forecaster on queues/ rows."""
    import pyspark
    from pyspark.ml.feature import VectorAssembler
    from pyspark.ml.regression import GBTRegressor
    from pyspark.sql import functions as F

    found = {row[0] for row in queues.select("horizon_steps").distinct().collect()}
    if found - {horizon_steps}:
        raise TrainError(f"the features were built for a horizon of {sorted(found)} steps, not {horizon_steps}")
    train_rows, held_out_rows, start = split(queues, held_out_days, horizon_steps)
    assembler = VectorAssembler(inputCols=list(FEATURES), outputCol="features")
    train_rows = assembler.transform(train_rows).persist()
    held_out_rows = assembler.transform(held_out_rows).persist()
    rows_train, rows_held_out = train_rows.count(), held_out_rows.count()
    if rows_train < 2 or rows_held_out < 1:
        raise TrainError(f"{rows_train} training and {rows_held_out} held-out rows: too few to train on")
    # The trees learn the change from the last value in units of the series' scale (rocket.ml.forecast): they only
    # correct the naive forecast, and a pattern learnt on a small series carries to a large one.
    # A series that leaps from nothing (a topic born, a burst on an idle queue) has a change of thousands of scales:
    # clipped at CHANGE_MAX, as the scorer clips, so that no leaf learns such a leap and serves it to a big series.
    # Rows weigh their scale: a big series' error costs more bytes/s (its squared error is scale^2 times that in
    # scales; weighing it so much lets a few series decide every tree).
    change = (F.col("label") - F.col("naive")) / F.col("scale")
    train_rows = train_rows.withColumn("target", F.least(F.greatest(change, F.lit(-CHANGE_MAX)), F.lit(CHANGE_MAX)))

    def fit(rows):
        return GBTRegressor(featuresCol="features", labelCol="target", weightCol="scale", maxIter=max_iter,
                            maxDepth=max_depth, stepSize=0.1, seed=seed).fit(rows)

    # How much of the trees' correction to serve (SHRINKS): the one that forecast best on the last fifth of the
    # training time, by trees fitted on the rest. Where the trees learnt nothing that holds, that is 0, and the
    # model forecasts the last value: a forecaster no worse than naive, where one with its noise would lose to it.
    fit_rows, validation_rows, _ = split(train_rows, float("inf"), horizon_steps)
    shrink, rows_validation = 1.0, validation_rows.count()
    if rows_validation and fit_rows.count() >= 2:
        probe = fit(fit_rows).transform(validation_rows)
        squared = [F.avg((served(k) - F.col("label")) ** 2) for k in SHRINKS]
        row = probe.agg(*squared).first()
        shrink = min(zip(row, SHRINKS))[1]
    model = fit(train_rows)
    predictions = model.transform(held_out_rows).withColumn("served", served(shrink))
    rmse, mae = errors(predictions, "served")  # the served prediction: Forecaster clamps at 0
    naive_rmse, naive_mae = errors(predictions, "naive")
    by_series = {}
    for series in sorted(row[0] for row in predictions.select("series").distinct().collect()):
        rows = predictions.filter(F.col("series") == series)
        (series_rmse, _), (series_naive_rmse, _) = errors(rows, "served"), errors(rows, "naive")
        by_series[series] = {"rmse": series_rmse, "naive_rmse": series_naive_rmse, "rows_held_out": rows.count()}
    now = datetime.now(timezone.utc)
    metrics = {"rmse": rmse, "mae": mae, "naive_rmse": naive_rmse, "naive_mae": naive_mae, "by_series": by_series,
               "rows_train": rows_train, "rows_validation": rows_validation, "shrink": shrink,
               "rows_held_out": rows_held_out, "held_out_from_ms": start, "trained_at_ms": int(now.timestamp() * 1000),
               "spark_version": pyspark.__version__}
    document = export_model(model, horizon_steps, metrics, now, shrink)
    check_export(json.dumps(document), predictions)
    train_rows.unpersist()
    return Trained(document, model, held_out_rows)


def summary(document: dict) -> str:
    metrics = document["metrics"]
    improvement = (100 * (metrics["naive_rmse"] - metrics["rmse"]) / metrics["naive_rmse"]
                   if metrics["naive_rmse"] else 0.0)
    return (f"forecast: model={document['model_version']} rmse={metrics['rmse']:.1f} "
            f"naive_rmse={metrics['naive_rmse']:.1f} improvement={improvement:.1f}% "
            f"rows={metrics['rows_train'] + metrics['rows_held_out']}")


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    from jobs.features import HORIZON_STEPS_DEFAULT

    parser = argparse.ArgumentParser(prog="python -m jobs.train_placement", description=__doc__.splitlines()[0])
    parser.add_argument("--telemetry", help="the telemetry/ prefix of an object store, or its root")
    parser.add_argument("--features", help="a features directory (jobs.features --out) to train on instead")
    parser.add_argument("--models", help="the object store root the model is put under")
    tier.add_arguments(parser)
    parser.add_argument("--master", default=None, help="Spark master (default local[*], or spark-submit's)")
    parser.add_argument("--held-out-days", type=float, default=7.0)
    parser.add_argument("--horizon-steps", type=int, default=HORIZON_STEPS_DEFAULT)
    parser.add_argument("--max-iter", type=int, default=30, help="trees (default %(default)s)")
    parser.add_argument("--max-depth", type=int, default=4, help="of each tree (default %(default)s)")
    parser.add_argument("--seed", type=int, default=30)
    args = parser.parse_args(argv)
    if args.telemetry and args.features:
        parser.error("give --telemetry or --features, not both")
    tier.resolve(parser, args, telemetry_needed=not args.features)
    return args


def run(spark, args: argparse.Namespace) -> Trained:
    """Build (or read) the queue features, train, publish the model (jobs.models.publish)."""
    from jobs.features import queue_table
    from jobs.spark import load_telemetry

    if args.features:
        queues = spark.read.parquet(f"{args.features.rstrip('/')}/queues")
    else:
        queues = queue_table(spark, load_telemetry(spark, args.telemetry).samples, args.horizon_steps)
    queues = queues.persist()
    trained = train(spark, queues, held_out_days=args.held_out_days, horizon_steps=args.horizon_steps,
                    max_iter=args.max_iter, max_depth=args.max_depth, seed=args.seed)
    queues.unpersist()
    decision = publish(spark, args.models, MODELS_PREFIX, trained.document, "rmse", True,
                       lambda text: scored_rmse(trained.held_out, text, args.horizon_steps))
    return trained._replace(decision=decision)


def main(argv: list[str] | None = None) -> None:
    from jobs.spark import session

    args = parse(argv)
    spark = session(args.master, "rocket-train-placement")
    try:
        trained = run(spark, args)
    except TrainError as error:
        raise SystemExit(f"forecast: {error}") from None
    print(summary(trained.document))
    if trained.decision:
        print(f"forecast: {describe_decision(trained.decision)}")


if __name__ == "__main__":
    from jobs.train_placement import main as run_main  # this module by name: Spark ships its functions by reference

    run_main()
