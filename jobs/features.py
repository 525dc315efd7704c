"""Telemetry to feature tables (issue 30), as Parquet under --out:

- `queues/`: one row per series per minute step t whose horizon is inside the data: `series` (queue, topic or group),
  topic, queue, group (-1 where the series is not one), at_ms (t's start), the forecaster's FEATURES at at_ms,
  `label` (its mean bytes/s in over the horizon from t on), `naive` (rate_1m: the "last value" forecaster to beat)
  and `horizon_steps`. The features are rocket.ml.forecast.queue_features, called in the executors: the nameserver
  calls the same function when it scores. It forecasts topics (a new queue's share of its topic) and groups (where
  queues go) as well as queues, so their sums are rows too: a topic's with its queues for topic_queues, a group's with
  its queues seen so far; each is its own family (topic_share 1), as rocket.ml.load.ModelPredictor has it.
- `groups/`: per storage group per step: bytes/s and messages/s in and out, and the node that led it.
- `nodes/`: per node per step: CPU, memory, disk, fsyncs, WAL, network, peer calls, heartbeat (issue 31's
  unhealthy-node detection trains on it).

    python -m jobs.features --telemetry rocket-data/tier/telemetry --out features/ [--master local[2]]
    spark-submit --master spark://HOST:7077 jobs/features.py --telemetry s3a://bucket/telemetry --out ...

A queue's history is the mean of its leader's `rocket_queue_in_bytes_total` rates in each step; a step without a
sample is an idle minute (0 bytes/s: a queue reports only when it moved). The data's extent is that of all samples,
of every node and metric: the horizon of a row must end inside it.
"""

from __future__ import annotations

import sys
from pathlib import Path

if not __package__:  # spark-submit jobs/features.py: the tree's root on the path, so that `import jobs` works
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import argparse  # noqa: E402
import math  # noqa: E402
import time  # noqa: E402

from rocket.ml.forecast import FEATURES, STEP_MS, future_rate, queue_features, window_mean  # noqa: E402

HORIZON_STEPS_DEFAULT = 10
QUEUE_IN_BYTES = "rocket_queue_in_bytes_total"
GROUP_RATES = {  # column -> metric (its rate, bytes or messages per second)
    "in_bytes_per_s": "rocket_group_in_bytes_total",
    "in_messages_per_s": "rocket_group_in_messages_total",
    "out_bytes_per_s": "rocket_group_out_bytes_total",
    "out_messages_per_s": "rocket_group_out_messages_total",
}
# column -> (metric, what of a sample, how the step's samples combine). Rates are per second.
NODE_COLUMNS = {
    "cpu_seconds_per_s": ("process_cpu_seconds_total", "rate", "avg"),
    "cpu_steal_per_s": ("rocket_cpu_steal_seconds_total", "rate", "avg"),  # the machine's, all CPUs
    "cpu_throttled_per_s": ("rocket_cpu_throttled_seconds_total", "rate", "avg"),  # by the process's cgroup quota
    "rss_bytes": ("process_resident_memory_bytes", "value", "avg"),
    "disk_free_bytes": ("rocket_disk_free_bytes", "value", "min"),
    "fsync_p50_s": ("rocket_fsync_seconds_p50", "value", "avg"),
    "fsync_p99_s": ("rocket_fsync_seconds_p99", "value", "avg"),
    "fsync_max_s": ("rocket_fsync_seconds_max", "value", "max"),
    "fsyncs_per_s": ("rocket_fsyncs_total", "rate", "avg"),
    "wal_bytes_per_s": ("rocket_wal_written_bytes_total", "rate", "avg"),
    "received_bytes_per_s": ("rocket_received_bytes_total", "rate", "avg"),
    "sent_bytes_per_s": ("rocket_sent_bytes_total", "rate", "avg"),
    "peer_rpc_p99_s": ("rocket_peer_rpc_seconds_p99", "value", "max"),  # the slowest peer
    "heartbeat_s": ("rocket_heartbeat_seconds", "value", "max"),
}


def data_extent(samples) -> tuple[int, int]:
    """The first and last step any sample falls in."""
    first_ms, last_ms = samples.map(lambda record: (record["time_ms"], record["time_ms"])).reduce(
        lambda a, b: (min(a[0], b[0]), max(a[1], b[1])))
    return first_ms // STEP_MS, last_ms // STEP_MS


def queue_histories(samples):
    """RDD of ((topic, queue), (group, {step: mean bytes/s in})) over the steps each queue reported in; the group
    is that of its last report."""
    def keyed(record):
        labels = record["labels"]
        return (labels["topic"], int(labels["queue"])), (record["time_ms"], record["rate"], int(labels["group"]))

    def add(history, report):
        time_ms, rate, group = report
        history[1].setdefault(time_ms // STEP_MS, []).append(rate)
        return (time_ms, group) if time_ms >= history[0][0] else history[0], history[1]

    def merge(a, b):
        for step, rates in b[1].items():
            a[1].setdefault(step, []).extend(rates)
        return max(a[0], b[0]), a[1]

    def finish(history):  # fsum: the same figures however the samples were partitioned
        return history[0][1], {step: math.fsum(rates) / len(rates) for step, rates in history[1].items()}

    return (samples.filter(lambda record: record["metric"] == QUEUE_IN_BYTES and record["rate"] is not None)
            .map(keyed).aggregateByKey(((-1, -1), {}), add, merge).mapValues(finish))


def sum_histories(histories, key_of):
    """RDD of (key, ({step: bytes/s in of its queues}, [(member, its first step)])) of queue_histories, where
    key_of(item) gives a queue's (key, member): (topic, queue number) to sum topics, (group, 0) to sum groups."""
    def add(total, item):
        member, steps = item
        for step, rate in steps.items():
            total[0].setdefault(step, []).append(rate)
        total[1].append((member, min(steps)))
        return total

    def merge(a, b):
        for step, rates in b[0].items():
            a[0].setdefault(step, []).extend(rates)
        a[1].extend(b[1])
        return a

    def keyed(item):
        key, member = key_of(item)
        return key, (member, item[1][1])

    def finish(total):  # fsum and sorted: the same figures however the queues were partitioned
        return {step: math.fsum(rates) for step, rates in total[0].items()}, sorted(total[1])

    return histories.map(keyed).aggregateByKey(({}, []), add, merge).mapValues(finish)


def topic_histories(histories):
    """(topic, ({step: bytes/s in of all its queues}, [(queue, its first step)])) of queue_histories."""
    return sum_histories(histories, lambda item: (item[0][0], item[0][1]))


def queue_rows(topic: str, queue: int, group: int, steps: dict[int, float], topic_steps: dict[int, float],
               topic_queue_firsts: list[tuple[int, int]], last_data_step: int, horizon_steps: int):
    """The rows of one queue: one per step t from the one after its first report until the last whose horizon ends
    inside the data. topic_queues at t is the highest queue number of the topic seen before t, plus one (a topic's
    queues are numbered from 0, and an idle queue reports nothing); topic_share is against the topic's bytes/s in
    (topic_steps: the sum of its queues' steps) over the 10 steps before t."""
    first = min(steps)
    for step in range(first + 1, last_data_step - horizon_steps + 2):
        now_ms = step * STEP_MS
        topic_queues = 1 + max(number for number, queue_first in topic_queue_firsts if queue_first < step)
        features = queue_features(steps, now_ms, first, topic_queues, window_mean(topic_steps, step - 1, 10))
        yield ("queue", topic, queue, group, now_ms, *features, future_rate(steps, now_ms, horizon_steps), features[0],
               horizon_steps)


def sum_rows(series: str, topic: str, group: int, steps: dict[int, float], member_firsts: list[tuple[int, int]],
             last_data_step: int, horizon_steps: int, numbered: bool):
    """The rows of a sum of queues (a topic's, or a group's): members at t is, for a topic (numbered), its highest
    queue number seen before t plus one, as queue_rows has it; for a group, its queues seen before t. The family is
    the series itself."""
    first = min(steps)
    for step in range(first + 1, last_data_step - horizon_steps + 2):
        now_ms = step * STEP_MS
        seen = [member for member, member_first in member_firsts if member_first < step]
        members = 1 + max(seen) if numbered else len(seen)
        features = queue_features(steps, now_ms, first, max(1, members), window_mean(steps, step - 1, 10))
        yield (series, topic, -1, group, now_ms, *features, future_rate(steps, now_ms, horizon_steps), features[0],
               horizon_steps)


def group_histories(histories):
    """(group, ({step: bytes/s in of its queues}, [(0, a queue's first step)])) of queue_histories."""
    return sum_histories(histories, lambda item: (item[1][0], 0))


def queue_schema():
    from pyspark.sql.types import DoubleType, IntegerType, LongType, StringType, StructField, StructType

    return StructType([StructField("series", StringType(), False),
                       StructField("topic", StringType(), False), StructField("queue", IntegerType(), False),
                       StructField("group", IntegerType(), False), StructField("at_ms", LongType(), False),
                       *(StructField(name, DoubleType(), False) for name in FEATURES),
                       StructField("label", DoubleType(), False), StructField("naive", DoubleType(), False),
                       StructField("horizon_steps", IntegerType(), False)])


def queue_table(spark, samples, horizon_steps: int = HORIZON_STEPS_DEFAULT, extent: tuple[int, int] | None = None):
    """The `queues/` DataFrame of samples (an RDD of TelemetrySample dicts). Each queue's history is one task's, and
    its topic's summed history is joined to it: a queue's rows need no other queue's."""
    assert horizon_steps >= 1, horizon_steps
    _, last_data_step = extent or data_extent(samples)
    histories = queue_histories(samples).persist()

    def rows(item):
        topic, ((queue, group, history), (topic_history, firsts)) = item
        return queue_rows(topic, queue, group, history, topic_history, firsts, last_data_step, horizon_steps)

    def topic_sum_rows(item):
        topic, (steps, firsts) = item
        return sum_rows("topic", topic, -1, steps, firsts, last_data_step, horizon_steps, numbered=True)

    def group_sum_rows(item):
        group, (steps, firsts) = item
        return sum_rows("group", "", group, steps, firsts, last_data_step, horizon_steps, numbered=False)

    topics = topic_histories(histories).persist()
    joined = histories.map(lambda item: (item[0][0], (item[0][1], *item[1]))).join(topics)
    every = joined.flatMap(rows).union(topics.flatMap(topic_sum_rows)).union(
        group_histories(histories).flatMap(group_sum_rows))
    return spark.createDataFrame(every, queue_schema())


def samples_frame(spark, samples):
    """samples as a DataFrame (time_ms, step, node, metric, labels, value, rate)."""
    from pyspark.sql.types import (DoubleType, IntegerType, LongType, MapType, StringType, StructField,
                                   StructType)

    schema = StructType([StructField("time_ms", LongType(), False), StructField("step", LongType(), False),
                         StructField("node", IntegerType(), False), StructField("metric", StringType(), False),
                         StructField("labels", MapType(StringType(), StringType()), False),
                         StructField("value", DoubleType(), False), StructField("rate", DoubleType(), True)])
    return spark.createDataFrame(samples.map(lambda record: (
        record["time_ms"], record["time_ms"] // STEP_MS, record["node"], record["metric"], record["labels"],
        record["value"], record["rate"])), schema)


def group_table(frame):
    """The `groups/` DataFrame: per group per step the mean rates, as its leader reported them (every replica
    reports its groups; the leader's samples are used when the step has one), and the leader."""
    from pyspark.sql import functions as F
    from pyspark.sql import Window

    rows = (frame.filter(F.col("metric").isin(list(GROUP_RATES.values())) & F.col("rate").isNotNull())
            .select(F.col("labels")["group"].cast("int").alias("group"), "step", "node", "metric", "rate",
                    (F.col("labels")["leader"] == "1").alias("leads")))
    by_step = Window.partitionBy("group", "step")
    rows = rows.withColumn("any_leads", F.max("leads").over(by_step)).filter(F.col("leads") == F.col("any_leads"))
    return (rows.groupBy("group", "step")
            .agg(F.max(F.when(F.col("leads"), F.col("node"))).alias("leader"),
                 *(F.avg(F.when(F.col("metric") == metric, F.col("rate"))).alias(column)
                   for column, metric in GROUP_RATES.items()))
            .select("group", (F.col("step") * STEP_MS).alias("at_ms"), "leader", *GROUP_RATES)
            .orderBy("group", "at_ms"))


def node_table(frame):
    """The `nodes/` DataFrame: per node per step, NODE_COLUMNS (null where the step has no such sample)."""
    from pyspark.sql import functions as F

    metrics = sorted({metric for metric, _, _ in NODE_COLUMNS.values()})
    aggregates = {"avg": F.avg, "min": F.min, "max": F.max}
    return (frame.filter(F.col("metric").isin(metrics))
            .groupBy("node", "step")
            .agg(*(aggregates[how](F.when(F.col("metric") == metric, F.col(what))).alias(column)
                   for column, (metric, what, how) in NODE_COLUMNS.items()))
            .select("node", (F.col("step") * STEP_MS).alias("at_ms"), *NODE_COLUMNS)
            .orderBy("node", "at_ms"))


def write_features(spark, telemetry: str, out: str, horizon_steps: int = HORIZON_STEPS_DEFAULT) -> dict:
    """Read telemetry, write out/queues, out/groups, out/nodes; return what it counted."""
    from jobs.spark import load_telemetry

    loaded = load_telemetry(spark, telemetry)
    extent = data_extent(loaded.samples)
    frame = samples_frame(spark, loaded.samples).persist()
    counts = {"objects": loaded.objects, "corrupt": len(loaded.corrupt), "samples": frame.count(),
              "first_ms": extent[0] * STEP_MS, "last_ms": (extent[1] + 1) * STEP_MS}
    out = out.rstrip("/")
    queues = queue_table(spark, loaded.samples, horizon_steps, extent)
    tables = {"queues": queues.orderBy("series", "topic", "queue", "group", "at_ms"), "groups": group_table(frame),
              "nodes": node_table(frame)}
    for name, table in tables.items():
        table.coalesce(1).write.mode("overwrite").parquet(f"{out}/{name}")
        counts[name] = spark.read.parquet(f"{out}/{name}").count()
    frame.unpersist()
    return counts


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m jobs.features", description=__doc__.splitlines()[0])
    parser.add_argument("--telemetry", required=True, help="the telemetry/ prefix of an object store, or its root")
    parser.add_argument("--out", required=True, help="the directory the tables are written under")
    parser.add_argument("--master", default=None, help="Spark master (default local[*], or spark-submit's)")
    parser.add_argument("--horizon-steps", type=int, default=HORIZON_STEPS_DEFAULT,
                        help="minutes a label looks ahead (default %(default)s)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    from jobs.spark import session

    args = parse(argv)
    started = time.monotonic()
    spark = session(args.master, "rocket-features")
    counts = write_features(spark, args.telemetry, args.out, args.horizon_steps)
    print(f"features: {counts['objects']} objects ({counts['corrupt']} corrupt, skipped), {counts['samples']} "
          f"samples -> queues={counts['queues']} groups={counts['groups']} nodes={counts['nodes']} rows in "
          f"{args.out} ({time.monotonic() - started:.0f} s)")


if __name__ == "__main__":
    from jobs.features import main as run  # this module by its name, so that Spark ships its functions by reference

    run()
