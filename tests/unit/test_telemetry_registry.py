"""The telemetry registry's sampler: counters with rates, histograms as the quantiles of each interval, the fsync max
of each interval, and per-queue traffic on the group's leader only."""

from __future__ import annotations

import os

import fastavro
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prometheus_client import CollectorRegistry, Histogram

from rocket.serde.schema import avro_schema
from rocket.telemetry.registry import (RPC_BUCKETS, Telemetry, Timings, bucket_quantile, counter_family, cpu_steal_s,
                                       cpu_throttled_s)


def by_metric(records: list[dict], metric: str) -> list[dict]:
    return [record for record in records if record["metric"] == metric]


def test_bucket_quantile_interpolates_within_the_bucket_like_prometheus():
    bounds = [0.001, 0.01, 0.1, float("inf")]
    assert bucket_quantile(0.5, bounds, [0, 0, 0, 0]) is None
    assert bucket_quantile(0.5, bounds, [10, 10, 10, 10]) == pytest.approx(0.0005)
    assert bucket_quantile(0.5, bounds, [0, 10, 10, 10]) == pytest.approx(0.0055)
    assert bucket_quantile(0.99, bounds, [0, 0, 0, 5]) == 0.1  # past the last finite bound: that bound


@given(st.lists(st.floats(min_value=0.00001, max_value=10.0), min_size=1, max_size=200))
def test_a_quantile_lies_within_the_bucket_of_the_true_one(values):
    bounds = [0.0001, 0.001, 0.01, 0.1, 1.0, float("inf")]
    cumulative = [sum(1 for value in values if value <= bound) for bound in bounds]
    true_p50 = sorted(values)[max(0, -(-len(values) // 2) - 1)]
    estimate = bucket_quantile(0.5, bounds, cumulative)
    lower = max([0.0] + [bound for bound in bounds if bound < true_p50])
    upper = min(bound for bound in bounds if bound >= true_p50)
    assert lower <= estimate <= (upper if upper != float("inf") else 1.0)


def test_counters_carry_their_rate_since_the_previous_sample(tmp_path):
    telemetry = Telemetry(7, tmp_path)
    total = [100]
    telemetry.add_collector(lambda: [counter_family("rocket_things", "things", ["kind"], [(["a"], total[0])])])
    [first] = by_metric(telemetry.sample(1000.0), "rocket_things_total")
    assert (first["node"], first["labels"], first["value"], first["rate"]) == (7, {"kind": "a"}, 100.0, None)
    total[0] = 150
    [second] = by_metric(telemetry.sample(1010.0), "rocket_things_total")
    assert second["rate"] == pytest.approx(5.0)
    assert second["time_ms"] == 1_010_000
    total[0] = 10  # the counter was reset (a restart): no negative rate
    [third] = by_metric(telemetry.sample(1020.0), "rocket_things_total")
    assert third["rate"] is None


def test_fsync_quantiles_and_max_are_of_the_interval_only(tmp_path):
    telemetry = Telemetry(1, tmp_path)
    for _ in range(100):
        telemetry.observe_fsync(0.004)
    first = telemetry.sample(1.0)
    assert 0.002 <= by_metric(first, "rocket_fsync_seconds_p50")[0]["value"] <= 0.005
    assert by_metric(first, "rocket_fsync_seconds_max")[0]["value"] == 0.004
    for _ in range(100):
        telemetry.observe_fsync(0.3)
    second = telemetry.sample(2.0)
    assert 0.2 <= by_metric(second, "rocket_fsync_seconds_p50")[0]["value"] <= 0.5
    assert by_metric(second, "rocket_fsync_seconds_max")[0]["value"] == 0.3
    assert by_metric(second, "rocket_fsync_seconds_count")[0]["rate"] == pytest.approx(100.0)
    third = telemetry.sample(3.0)  # nothing observed: no quantile, and a max of 0
    assert not by_metric(third, "rocket_fsync_seconds_p50")
    assert by_metric(third, "rocket_fsync_seconds_max")[0]["value"] == 0.0


def test_queue_traffic_is_reported_by_the_leader_and_summed_per_group(tmp_path):
    telemetry = Telemetry(1, tmp_path)
    rounds = [
        ([("orders", 0, 3, (10, 1000, 0, 0), (10, 1000, 0, 0), None), ("audit", 1, 4, (5, 50, 0, 0), None, None)], {3}),
        ([("orders", 0, 3, (30, 3000, 10, 1000), (20, 2000, 10, 1000), 20),
          ("audit", 1, 4, (9, 90, 0, 0), (4, 40, 0, 0), None)], {3}),
    ]
    telemetry.traffic = lambda: rounds.pop(0)
    telemetry.sample(100.0)
    records = telemetry.sample(110.0)
    [orders_in] = by_metric(records, "rocket_queue_in_messages_total")
    assert orders_in["labels"] == {"topic": "orders", "queue": "0", "group": "3"}
    assert (orders_in["value"], orders_in["rate"]) == (30.0, pytest.approx(2.0))
    [backlog] = by_metric(records, "rocket_queue_backlog_messages")
    assert (backlog["labels"]["topic"], backlog["value"]) == ("orders", 20.0)
    groups = {record["labels"]["group"]: record for record in by_metric(records, "rocket_group_in_messages_total")}
    assert groups["3"]["value"] == 30 and groups["3"]["rate"] == pytest.approx(2.0) and groups["3"]["labels"]["leader"] == "1"
    assert groups["4"]["value"] == 4 and groups["4"]["labels"]["leader"] == "0"  # its first increase was unknown


def test_every_sample_fits_the_avro_schema(tmp_path):
    telemetry = Telemetry(1, tmp_path)
    telemetry.observe_fsync(0.001)
    telemetry.peer_rpc_seconds.observe("127.0.0.1:1", 0.002)
    telemetry.sample(1.0)
    records = telemetry.sample(2.0)
    schema = avro_schema("TelemetrySample")
    assert all(fastavro.validate(record, schema) for record in records)
    assert {"process_cpu_seconds_total", "process_resident_memory_bytes", "rocket_disk_free_bytes",
            "rocket_peer_rpc_seconds_count"} <= {record["metric"] for record in records}


def test_cpu_steal_and_throttling_are_read_from_proc_and_the_cgroup(tmp_path):
    stat = tmp_path / "stat"
    ticks = os.sysconf("SC_CLK_TCK")
    stat.write_text(f"cpu  100 2 30 4000 5 0 6 {3 * ticks} 0 0\ncpu0 1 2 3 4 5 6 7 8 9 10\n")
    assert cpu_steal_s(stat) == 3.0
    assert cpu_steal_s(tmp_path / "absent") is None
    # cgroup v1: the cpu controller's own hierarchy, throttled_time in ns.
    proc = tmp_path / "cgroup"
    proc.write_text("4:memory:/x\n1:cpu,cpuacct:/rocket-faults/storage2\n0::/\n")
    v1 = tmp_path / "fs" / "cpu,cpuacct" / "rocket-faults" / "storage2"
    v1.mkdir(parents=True)
    (v1 / "cpu.stat").write_text("nr_periods 10\nnr_throttled 4\nthrottled_time 2500000000\n")
    assert cpu_throttled_s(proc, tmp_path / "fs") == 2.5
    # cgroup v2: one hierarchy, throttled_usec.
    proc.write_text("0::/system.slice/rocket.service\n")
    v2 = tmp_path / "fs" / "system.slice" / "rocket.service"
    v2.mkdir(parents=True)
    (v2 / "cpu.stat").write_text("usage_usec 9\nnr_throttled 1\nthrottled_usec 1500000\n")
    assert cpu_throttled_s(proc, tmp_path / "fs") == 1.5
    (v2 / "cpu.stat").unlink()
    assert cpu_throttled_s(proc, tmp_path / "fs") is None  # no cpu controller there: nothing to report


@settings(max_examples=50, deadline=None)
@given(observations=st.lists(st.tuples(st.sampled_from(["Produce", "Ping", "KvGet"]),
                                       st.floats(min_value=0, max_value=100, allow_nan=False)), max_size=60))
def test_timings_expose_what_a_labelled_histogram_does(observations):
    """Timings (the calls' histograms, observed on every call without a lock) are collected as prometheus_client's
    labelled Histogram would be for the same observations: the same samples, bucket by bucket."""
    registry = CollectorRegistry()
    histogram = Histogram("rocket_rpc_seconds", "calls", ["method"], buckets=RPC_BUCKETS, registry=registry)
    timings = Timings("rocket_rpc_seconds", "calls", "method", RPC_BUCKETS)
    for method, seconds in observations:
        histogram.labels(method).observe(seconds)
        timings.observe(method, seconds)

    def samples(family) -> list:
        return sorted((sample.name, tuple(sorted(sample.labels.items())), pytest.approx(sample.value))
                      for sample in family.samples if not sample.name.endswith("_created"))

    [expected] = registry.collect()
    assert samples(timings.family()) == samples(expected)
