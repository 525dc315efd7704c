"""The PySpark jobs (issue 30) on the telemetry a real dev node shipped (tests/jobs/data/tier, made by make_sample.py:
topics `steady`, `rising`, `bursty` and `dying` over about 15 minutes): the feature tables agree with the raw
samples, training exports a model rocket.ml.forecast scores exactly as Spark does, and a corrupt object is skipped
and counted. One SparkSession on local[1] serves the module."""

from __future__ import annotations

import collections
import json
import math
import shutil
from argparse import Namespace
from pathlib import Path

import pytest

pytest.importorskip("pyspark")

import trio  # noqa: E402

from jobs import tier  # noqa: E402
from jobs.features import NODE_COLUMNS, write_features  # noqa: E402
from jobs.spark import load_telemetry, objects_glob  # noqa: E402
from jobs.tier import tier_of  # noqa: E402
from jobs.train_placement import held_out_from, run, summary  # noqa: E402
from rocket.ml.forecast import CHANGE_MAX, FEATURES, STEP_MS, Forecaster  # noqa: E402
from rocket.telemetry.ship import read_samples  # noqa: E402
from rocket.tier.local import FOOTER_BYTES, LocalDirectoryStore  # noqa: E402

DATA = Path(__file__).parent / "data" / "tier"
HORIZON_STEPS = 2
TOPIC_QUEUES = {"steady": 2, "rising": 2, "bursty": 3, "dying": 1}  # make_sample.TOPICS


@pytest.fixture(scope="module")
def samples() -> list[dict]:
    """The sample's records, read without Spark."""
    return [record for path in sorted(DATA.rglob("*.avro")) for record in read_samples(path.read_bytes()[:-FOOTER_BYTES])]


@pytest.fixture(scope="module")
def features(spark, tmp_path_factory):
    out = tmp_path_factory.mktemp("features")
    counts = write_features(spark, str(DATA / "telemetry"), str(out), HORIZON_STEPS)
    tables = {name: [row.asDict() for row in spark.read.parquet(str(out / name)).collect()]
              for name in ("queues", "groups", "nodes")}
    return out, counts, tables


def test_the_sample_is_what_a_node_leaves(samples):
    objects = sorted(DATA.rglob("*.avro"))
    assert objects and all(path.relative_to(DATA).parts[:3] == ("telemetry", "v1", "node=1") for path in objects)
    assert sum(path.stat().st_size for path in DATA.rglob("*")) <= 1_500_000
    span_ms = max(record["time_ms"] for record in samples) - min(record["time_ms"] for record in samples)
    assert span_ms >= 10 * STEP_MS
    assert {record["labels"]["topic"] for record in samples if "topic" in record["labels"]} == set(TOPIC_QUEUES)


def test_telemetry_is_found_under_the_tier_root_or_its_telemetry_prefix(spark):
    assert objects_glob(spark, str(DATA)) == f"{DATA}/telemetry/v1/node=*/date=*/*.avro"
    assert objects_glob(spark, str(DATA / "telemetry") + "/") == f"{DATA}/telemetry/v1/node=*/date=*/*.avro"


def test_the_store_a_config_names_gives_the_samples_the_files_do(spark, samples, monkeypatch):
    """--tier-config's path: the driver lists the objects, the executors fetch them through rocket's client."""
    monkeypatch.setattr(tier, "PARTITION_OBJECTS_MAX", 2)  # more partitions than objects per partition
    store = tier_of(str(DATA), None)
    assert store is not None
    loaded = load_telemetry(spark, store)
    assert loaded.objects == len(list(DATA.rglob("*.avro"))) and not loaded.corrupt
    assert loaded.glob == "local:telemetry/v1/node=*/date=*/*.avro"
    key = lambda record: (record["time_ms"], record["node"], record["metric"], sorted(record["labels"].items()))  # noqa: E731
    assert sorted(loaded.samples.collect(), key=key) == sorted(samples, key=key)


def rate_10m(row) -> float:
    """A row's bytes/s over its last 10 steps (its features are in units of its scale)."""
    return row["last_10m"] * row["scale"]


def test_queue_features_agree_with_the_raw_samples(features, samples):
    _, counts, tables = features
    assert counts["corrupt"] == 0 and counts["objects"] == len(list(DATA.rglob("*.avro")))
    assert counts["samples"] == len(samples)
    rows = [row for row in tables["queues"] if row["series"] == "queue"]
    assert {(row["topic"], row["queue"]) for row in rows} == {
        (topic, queue) for topic, queues in TOPIC_QUEUES.items() for queue in range(queues)}
    last_step = max(record["time_ms"] for record in samples) // STEP_MS
    for row in rows:
        assert row["at_ms"] % STEP_MS == 0 and row["at_ms"] // STEP_MS + HORIZON_STEPS - 1 <= last_step
        assert all(math.isfinite(row[name]) for name in FEATURES), row
        assert row["label"] >= 0 and row["naive"] == row["rate_1m"] and row["horizon_steps"] == HORIZON_STEPS
        assert row["busiest_10m"] >= row["last_10m"] >= 0 and row["scale"] >= 1
        assert row["last_1m"] * row["scale"] == pytest.approx(row["rate_1m"])
    by_queue = collections.defaultdict(list)
    for row in rows:
        by_queue[row["topic"], row["queue"]].append(row)
    for (topic, queue), queue_rows in by_queue.items():
        queue_rows.sort(key=lambda row: row["at_ms"])
        assert queue_rows[-1]["topic_queues"] == TOPIC_QUEUES[topic]
        # A queue's bytes in, summed over its steps, are what its rocket_queue_in_bytes_total grew by meanwhile.
        reports = sorted((record["time_ms"], record["value"]) for record in samples
                         if record["metric"] == "rocket_queue_in_bytes_total"
                         and record["labels"]["topic"] == topic and record["labels"]["queue"] == str(queue))
        first_ms, last_ms = queue_rows[0]["at_ms"], queue_rows[-1]["at_ms"]  # rate_1m: the step before at_ms
        summed = sum(row["rate_1m"] for row in queue_rows[1:]) * STEP_MS / 1000
        before = [value for time_ms, value in reports if time_ms < first_ms]
        within = [value for time_ms, value in reports if time_ms < last_ms]
        grew = within[-1] - before[-1]
        if grew > 0:
            assert summed == pytest.approx(grew, rel=0.05), (topic, queue)
        else:
            assert summed == 0
    rising = [rate_10m(row) for row in by_queue["rising", 0]]
    assert rising[-1] > 2 * rising[0] > 0
    dying = by_queue["dying", 0]
    assert dying[-1]["rate_1m"] == 0 < dying[0]["rate_1m"]  # it stopped two thirds of the way through
    bursty = [row["rate_1m"] for row in by_queue["bursty", 1]]
    assert max(bursty) > 5 * min(bursty) > 0


def test_topics_and_groups_are_series_of_their_queues_sums(features):
    """The forecaster also predicts topics and groups (the nameserver asks it for both): their rows' recent rates
    are the sums of their queues' at the same step, and a topic's queue count is its queues'."""
    _, _, tables = features
    by_series = collections.defaultdict(dict)
    for row in tables["queues"]:
        key = {"queue": (row["topic"], row["queue"]), "topic": row["topic"], "group": row["group"]}[row["series"]]
        by_series[row["series"]].setdefault(key, {})[row["at_ms"]] = row
    assert set(by_series["topic"]) == set(TOPIC_QUEUES)
    assert set(by_series["group"]) == {row["group"] for row in tables["queues"] if row["series"] == "queue"}
    for series, members in (("topic", lambda queue_key, row: queue_key[0]), ("group", lambda queue_key, row: row["group"])):
        for key, rows in by_series[series].items():
            for at_ms, row in rows.items():
                parts = [rate_10m(queue_rows[at_ms]) for queue_key, queue_rows in by_series["queue"].items()
                         if at_ms in queue_rows and members(queue_key, queue_rows[at_ms]) == key]
                assert rate_10m(row) == pytest.approx(sum(parts), rel=1e-6, abs=1e-6), (series, key, at_ms)
                assert row["topic_share"] == 1.0
    for topic, rows in by_series["topic"].items():
        assert rows[max(rows)]["topic_queues"] == TOPIC_QUEUES[topic]


def test_group_and_node_tables(features):
    _, counts, tables = features
    groups = tables["groups"]
    queue_groups = {row["group"] for row in tables["queues"] if row["series"] == "queue"}
    assert queue_groups <= {row["group"] for row in groups}
    assert all(row["leader"] == 1 and row["at_ms"] % STEP_MS == 0 for row in groups)
    assert all(row[column] is None or row[column] >= 0 for row in groups
               for column in ("in_bytes_per_s", "in_messages_per_s", "out_bytes_per_s", "out_messages_per_s"))
    assert max(row["in_bytes_per_s"] or 0 for row in groups) > 10_000
    assert max(row["out_bytes_per_s"] or 0 for row in groups) > 0  # the consumer group read `steady`
    nodes = tables["nodes"]
    assert {row["node"] for row in nodes} == {1} and len(nodes) >= 10
    assert set(NODE_COLUMNS) <= set(nodes[0])
    for row in nodes:
        assert row["rss_bytes"] > 10_000_000 and row["disk_free_bytes"] > 0
    assert max(row["cpu_seconds_per_s"] or 0 for row in nodes) > 0
    assert max(row["wal_bytes_per_s"] or 0 for row in nodes) > 10_000
    assert max(row["fsyncs_per_s"] or 0 for row in nodes) > 0
    assert max(row["received_bytes_per_s"] or 0 for row in nodes) > 10_000


def test_training_exports_a_model_that_scores_as_spark_does(spark, features, tmp_path):
    out, _, _ = features
    args = Namespace(telemetry=None, features=str(out), models=str(tmp_path), held_out_days=7.0,
                     horizon_steps=HORIZON_STEPS, max_iter=8, max_depth=3, seed=30)
    trained = run(spark, args)
    line = summary(trained.document)
    print(line)
    assert line.startswith(f"forecast: model={trained.document['model_version']} rmse=")

    async def read() -> tuple[bytes, bytes]:
        async with LocalDirectoryStore(tmp_path) as store:
            return (await store.get("models/forecast/latest.json"),
                    await store.get(f"models/forecast/{trained.document['model_version']}.json"))

    latest, versioned = trio.run(read)
    assert latest == versioned
    forecaster = Forecaster.from_json(latest)
    assert forecaster.version == trained.document["model_version"] and forecaster.horizon_steps == HORIZON_STEPS
    assert len(forecaster.trees) == 8
    metrics = forecaster.metrics
    assert set(metrics) == {"rmse", "mae", "naive_rmse", "naive_mae", "by_series", "rows_train", "rows_held_out",
                            "rows_validation", "shrink", "held_out_from_ms", "trained_at_ms", "spark_version"}
    assert 0 < metrics["rows_validation"] < metrics["rows_train"] and 0 <= metrics["shrink"] <= 1
    assert set(metrics["by_series"]) == {"queue", "topic", "group"}
    assert sum(part["rows_held_out"] for part in metrics["by_series"].values()) == metrics["rows_held_out"]
    assert metrics["rows_train"] > metrics["rows_held_out"] > 0
    assert all(math.isfinite(metrics[name]) and metrics[name] >= 0 for name in ("rmse", "mae", "naive_rmse"))
    # The file the node reads predicts what Spark predicts, on every held-out row.
    predicted = trained.model.transform(trained.held_out).select(*FEATURES, "at_ms", "prediction").collect()
    assert predicted and all(row["at_ms"] >= metrics["held_out_from_ms"] for row in predicted)
    for row in predicted:
        ours = forecaster.predict([row[name] for name in FEATURES])
        change = min(max(row["prediction"] * metrics["shrink"], -CHANGE_MAX), CHANGE_MAX)
        assert ours == pytest.approx(max(0.0, row["rate_1m"] + row["scale"] * change), rel=1e-6, abs=1e-6)
    assert json.loads(latest)["features"] == list(FEATURES)


def test_a_model_no_better_than_the_served_one_is_refused(spark, features, tmp_path):
    out, _, _ = features
    args = Namespace(telemetry=None, features=str(out), models=str(tmp_path), held_out_days=7.0,
                     horizon_steps=HORIZON_STEPS, max_iter=8, max_depth=3, seed=30)
    first = run(spark, args)
    assert first.decision and first.decision["promoted"] and first.decision["reason"] == "no model was served"
    second = run(spark, args)  # the same trees: not strictly better
    decision = second.decision
    assert decision and not decision["promoted"] and decision["served_version"] == first.document["model_version"]
    # The served model is scored on this run's held-out rows as a node scores it: its RMSE is the one it was
    # exported with, and the same trees score the same.
    assert decision["served_score"] == pytest.approx(first.document["metrics"]["rmse"], rel=1e-9)
    assert decision["score"] == pytest.approx(decision["served_score"], rel=1e-9)
    assert decision["reason"].startswith("rmse ") and "does not beat the served model's" in decision["reason"]

    async def read() -> tuple[bytes, bytes, bytes, bytes]:
        async with LocalDirectoryStore(tmp_path) as store:
            version = second.document["model_version"]
            return (await store.get("models/forecast/latest.json"), await store.get(f"models/forecast/{version}.json"),
                    await store.get("models/forecast/decision.json"),
                    await store.get(f"models/forecast/decisions/{version}.json"))

    latest, refused, last, recorded = trio.run(read)
    assert json.loads(latest)["model_version"] == first.document["model_version"]  # still the served one
    assert json.loads(refused) == second.document  # kept beside it
    assert json.loads(last) == json.loads(recorded) == decision


def test_the_held_out_time_is_the_last_days_or_the_last_fifth():
    day_ms = 86_400_000
    assert held_out_from(0, 30 * day_ms - STEP_MS, 7) == 23 * day_ms
    assert held_out_from(0, 10 * day_ms - STEP_MS, 7) == 8 * day_ms  # under 14 days: the last 20%
    assert held_out_from(0, 99 * STEP_MS, 7) == 80 * STEP_MS


def test_a_corrupt_object_is_skipped_and_counted(spark, samples, tmp_path):
    tier = tmp_path / "tier"
    shutil.copytree(DATA, tier)
    good = sorted(tier.rglob("*.avro"))
    torn = bytearray(good[0].read_bytes())
    torn[100] ^= 0xFF  # the MD5 in its footer no longer matches
    (good[0].parent / "1-2-3.avro").write_bytes(bytes(torn))
    (good[0].parent / "4-5-6.avro").write_bytes(b"not avro at all")  # no footer (as from S3), not Avro
    loaded = load_telemetry(spark, str(tier))
    assert loaded.objects == len(good) + 2
    assert [(Path(path).name, why.split(":")[0]) for path, why in loaded.corrupt] == [
        ("1-2-3.avro", "fails its MD5 checksum"), ("4-5-6.avro", "not an Avro file of samples")]
    assert loaded.samples.count() == len(samples)
