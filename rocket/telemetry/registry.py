"""One node's metrics: prometheus_client's registry, which the Prometheus endpoint can expose as it is, and the sampler
that turns one look at it into TelemetrySample records (rocket/serde/schemas/rocket.v1.TelemetrySample.avsc) for the
spool every telemetry_interval_s. Nothing here is on the hot path (Telemetry says why)."""

from __future__ import annotations

import bisect
import collections
import itertools
import os
import shutil
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, PlatformCollector, ProcessCollector
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.utils import floatToGoString

# Upper bounds in seconds: an fsync takes 0.1 ms on a fast SSD and up to seconds on a failing disk.
FSYNC_BUCKETS = (0.00005, 0.0001, 0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0,
                 5.0, float("inf"))
RPC_BUCKETS = (0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0,
               float("inf"))
QUANTILES = (("p50", 0.5), ("p99", 0.99))
NOTED_MAX = 100_000  # records noted between two samples (an hour of 10 s health windows of 100 nodes is 40,000)


class Timings:
    """A histogram of durations by one label, observed on every call (the calls a node serves, those it makes to
    others): per label value, a count per bucket and the sum, in a list. prometheus_client's Histogram takes a lock per
    counter it adds to, twice an observation, and its labels() costs more than that; this is observed by the trio thread
    only. Collected as a Prometheus histogram family, the same as a labelled Histogram's."""

    def __init__(self, name: str, documentation: str, label: str, buckets: tuple[float, ...]):
        self.name = name
        self.documentation = documentation
        self.label = label
        self.bounds = buckets  # the last one is infinity
        self._bucket_names = [floatToGoString(bound) for bound in buckets]
        self.series: dict[str, list] = {}  # label value -> [count in each bucket (not cumulative)..., sum]

    def observe(self, value: str, seconds: float) -> None:
        series = self.series.get(value)
        if series is None:
            series = self.series[value] = [0] * len(self.bounds) + [0.0]
        series[bisect.bisect_left(self.bounds, seconds)] += 1
        series[-1] += seconds

    def cumulative(self, value: str) -> list[int]:
        """The label value's bucket counts as Prometheus has them: each counts every observation up to its bound."""
        return list(itertools.accumulate(self.series[value][:-1]))

    def family(self) -> HistogramMetricFamily:
        family = HistogramMetricFamily(self.name, self.documentation, labels=[self.label])
        for value, series in self.series.items():
            family.add_metric([value], list(zip(self._bucket_names, self.cumulative(value))), series[-1])
        return family


class Telemetry:
    """A node's registry and its sampler. `collectors` are callables returning prometheus_client metric families,
    read at each collection; `traffic` returns the per-queue traffic since its last call (Store.take_traffic) with
    the groups this node leads, and may be None (a node without storage).

    Nothing here is on the hot path. Components count in attributes they keep anyway (a Raft host's fsyncs and WAL
    bytes, the listeners' Traffic, a queue's next offset and bytes), or observe a histogram once per fsync or peer
    call; every call a node serves or makes adds its time to a Timings (counts in a list, no lock). The registry
    reads them when it is collected. Per-queue and per-group traffic goes only to the telemetry files
    (Store.take_traffic), never to the registry: a node may hold a million queues, and Prometheus wants few series.
    The endpoint's per-topic sums (from store/meter.py) and the opt-in per-queue series (`metrics_per_queue`) are
    families.py's collectors."""

    def __init__(self, node_id: int, data_dir: Path):
        self.node_id = node_id
        self.data_dir = data_dir
        self.registry = CollectorRegistry(auto_describe=False)
        ProcessCollector(registry=self.registry)  # process_cpu_seconds_total, process_resident_memory_bytes, ...
        PlatformCollector(registry=self.registry)  # python_info
        self.fsync_seconds = Histogram("rocket_fsync_seconds", "Time of one fsync of the Raft WAL, which every "
                                       "acknowledged write waits for", buckets=FSYNC_BUCKETS, registry=self.registry)
        self.commit_seconds = Histogram("rocket_raft_commit_seconds", "Time from a proposal on this node to its "
                                        "entry committed and applied here; sampled, one proposal timed at a time "
                                        "(about one per round)", buckets=RPC_BUCKETS, registry=self.registry)
        self.peer_rpc_seconds = Timings("rocket_peer_rpc_seconds", "Time of one call to another node, by its "
                                        "address", "peer", RPC_BUCKETS)
        self.peer_rpc_errors = Counter("rocket_peer_rpc_errors", "Calls to another node that failed, by address and "
                                       "error code", ["peer", "code"], registry=self.registry)
        self.rpc_seconds = Timings("rocket_rpc_seconds", "Time of one call this node served from a client or "
                                   "another node, by method (long polls included)", "method", RPC_BUCKETS)
        self.rpc_errors = Counter("rocket_rpc_errors", "Calls this node served that failed, by method and error code",
                                  ["method", "code"], registry=self.registry)
        self.heartbeat_seconds = Gauge("rocket_heartbeat_seconds", "Time of this node's last heartbeat to the "
                                       "nameservers", registry=self.registry)
        self.samples_dropped = Counter("rocket_telemetry_dropped_samples", "Telemetry samples dropped: the spool was "
                                       "full, or could not be written", registry=self.registry)
        self._fsync_max_s = 0.0  # the slowest fsync since the last sample
        self._collectors: list[Callable[[], Iterable[Metric]]] = [self._node_metrics, self._timings]
        self.registry.register(self)
        self.traffic: Callable[[], tuple[list, set[int]]] | None = None
        self._sampled_s: float | None = None
        self._counters: dict[tuple, float] = {}  # (sample name, labels) -> value at the last sample
        self._buckets: dict[tuple, list[float]] = {}  # (histogram, labels) -> bucket counts at the last sample
        self._group_totals: dict[int, list[int]] = {}  # group -> [messages in, bytes in, messages out, bytes out]
        self._noted: collections.deque[dict] = collections.deque(maxlen=NOTED_MAX)  # what roles noted since the last sample

    def add_collector(self, collect: Callable[[], Iterable[Metric]]) -> None:
        self._collectors.append(collect)

    clock = staticmethod(time.perf_counter)  # what the roles time calls with: they read no clock themselves

    def call_took(self, peer: str, started: float) -> None:
        self.peer_rpc_seconds.observe(peer, time.perf_counter() - started)

    def call_failed(self, peer: str, code: str) -> None:
        self.peer_rpc_errors.labels(peer, code).inc()

    def heartbeat_took(self, started: float) -> None:
        self.heartbeat_seconds.set(time.perf_counter() - started)

    def observe_call(self, method: str, seconds: float, error: str | None) -> None:
        """One call served (Dispatcher.on_call): its time, and its error code if it failed."""
        self.rpc_seconds.observe(method, seconds)
        if error is not None:
            self.rpc_errors.labels(method, error).inc()

    def observe_fsync(self, seconds: float) -> None:
        """Called by the thread that ran the fsync."""
        self.fsync_seconds.observe(seconds)
        if seconds > self._fsync_max_s:
            self._fsync_max_s = seconds

    def health_counts(self) -> dict:
        """What a storage node's heartbeat tells the nameservers about its health, all cumulative since it started:
        its fsyncs per bucket of FSYNC_BUCKETS; per address of another node, the calls made to it that ended
        (answered or failed), those that failed, and the answered ones per bucket of RPC_BUCKETS; and the CPU time
        it was denied (steal and cgroup throttling). Read once per heartbeat from the histograms the fsyncs and calls
        feed anyway."""
        fsync = [int(sample.value) for metric in self.fsync_seconds.collect() for sample in metric.samples
                 if sample.name.endswith("_bucket")]
        calls: dict[str, dict] = {}
        for peer in self.peer_rpc_seconds.series:
            buckets = self.peer_rpc_seconds.cumulative(peer)
            calls[peer] = {"calls": buckets[-1], "errors": 0, "buckets": buckets}
        for metric in self.peer_rpc_errors.collect():
            for sample in metric.samples:
                if sample.name.endswith("_total"):
                    entry = calls.setdefault(sample.labels["peer"], {"calls": 0, "errors": 0, "buckets": []})
                    entry["calls"] += int(sample.value)
                    entry["errors"] += int(sample.value)
        starved = (cpu_steal_s() or 0.0) + (cpu_throttled_s() or 0.0)
        return {"fsync_buckets": fsync, "cpu_starved_s": starved,
                "peer_calls": [{"peer": peer, **entry} for peer, entry in sorted(calls.items())]}

    def note(self, time_ms: int, metric: str, labels: dict[str, str], value: float) -> None:
        """A record for the next sample, as a role measured it at time_ms (the nameserver's judged health windows):
        never in the registry. Past TELEMETRY_NOTED_MAX waiting, the oldest are dropped and counted."""
        if len(self._noted) == NOTED_MAX:
            self.samples_dropped.inc()
        self._noted.append({"time_ms": time_ms, "node": self.node_id, "metric": metric, "labels": labels,
                            "value": float(value), "rate": None})

    def collect(self) -> Iterable[Metric]:
        """prometheus_client's collector protocol: every family the components' collectors give."""
        for collect in self._collectors:
            yield from collect()

    def _timings(self) -> Iterable[Metric]:
        yield self.peer_rpc_seconds.family()
        yield self.rpc_seconds.family()

    def _node_metrics(self) -> Iterable[Metric]:
        disk = GaugeMetricFamily("rocket_disk_free_bytes", "Free bytes on the data directory's file system")
        disk.add_metric([], shutil.disk_usage(self.data_dir).free)
        yield disk
        steal, throttled = cpu_steal_s(), cpu_throttled_s()
        if steal is not None:
            yield counter_family("rocket_cpu_steal_seconds", "CPU time the hypervisor gave other guests, all CPUs of "
                                 "this machine", [], [([], steal)])
        if throttled is not None:
            yield counter_family("rocket_cpu_throttled_seconds", "Time this process's cgroup was held back by its "
                                 "CPU quota", [], [([], throttled)])

    def sample(self, now_s: float) -> list[dict]:
        """TelemetrySample records of every series now: gauges as they are; counters with their rate since the last
        sample; histograms as count and sum (counters) and the p50 and p99 of what they observed since the last
        sample; the fsync max since then; then the queues' and groups' traffic."""
        interval_s = None if self._sampled_s is None else max(now_s - self._sampled_s, 1e-9)
        self._sampled_s = now_s
        time_ms = int(now_s * 1000)
        records: list[dict] = []

        def add(metric: str, labels: dict, value: float, rate: float | None = None) -> None:
            records.append({"time_ms": time_ms, "node": self.node_id, "metric": metric, "labels": labels,
                            "value": float(value), "rate": rate})

        def counter(metric: str, labels: dict, value: float) -> None:
            key = (metric, tuple(sorted(labels.items())))
            before = self._counters.get(key)
            self._counters[key] = value
            rate = None if interval_s is None or before is None or value < before else (value - before) / interval_s
            add(metric, labels, value, rate)

        for family in self.registry.collect():
            if family.type == "histogram":
                self._histogram(family, counter, add)
            elif family.type == "counter":
                for sample in family.samples:
                    if sample.name.endswith("_total"):
                        counter(sample.name, sample.labels, sample.value)
            elif family.type == "gauge":
                for sample in family.samples:
                    add(sample.name, sample.labels, sample.value)
        fsync_max_s, self._fsync_max_s = self._fsync_max_s, 0.0
        add("rocket_fsync_seconds_max", {}, fsync_max_s)
        if self.traffic is not None:
            self._traffic(add, interval_s, self.traffic)
        records += self._noted
        self._noted.clear()
        return records

    def _histogram(self, family: Metric, counter, add) -> None:
        by_labels: dict[tuple, list] = {}
        for sample in family.samples:
            labels = {name: value for name, value in sample.labels.items() if name != "le"}
            if sample.name.endswith("_bucket"):
                by_labels.setdefault(tuple(sorted(labels.items())), []).append(
                    (float(sample.labels["le"]), sample.value))
            elif sample.name.endswith(("_count", "_sum")):
                counter(sample.name, labels, sample.value)
        for labels, buckets in by_labels.items():
            counts = [count for _, count in buckets]
            before = self._buckets.get((family.name, labels))
            self._buckets[(family.name, labels)] = counts
            increases = counts if before is None else [now - then for now, then in zip(counts, before)]
            for name, quantile in QUANTILES:
                value = bucket_quantile(quantile, [bound for bound, _ in buckets], increases)
                if value is not None:
                    add(f"{family.name}_{name}", dict(labels), value)

    def _traffic(self, add, interval_s: float | None, traffic: Callable[[], tuple[list, set[int]]]) -> None:
        """Per queue, on the node that leads its group (the cluster counts each queue once): messages and bytes in
        and out, totals and rates, and the backlog of its slowest consumer group; per group, the same summed, on every
        replica."""
        queues, leads = traffic()
        names = ("in_messages", "in_bytes", "out_messages", "out_bytes")
        for topic, queue, group, totals, increases, backlog in queues:
            group_totals = self._group_totals.setdefault(group, [0, 0, 0, 0])
            if increases is not None:
                for number, increase in enumerate(increases):
                    group_totals[number] += increase
            if group in leads:
                labels = {"topic": topic, "queue": str(queue), "group": str(group)}
                for name, total, increase in zip(names, totals, increases or (None,) * 4):
                    rate = None if increase is None or interval_s is None else increase / interval_s
                    add(f"rocket_queue_{name}_total", labels, total, rate)
                if backlog is not None:
                    add("rocket_queue_backlog_messages", labels, backlog)
        for group, group_totals in sorted(self._group_totals.items()):
            for name, total in zip(names, group_totals):
                key = (f"rocket_group_{name}_total", (("group", str(group)),))
                before = self._counters.get(key)
                self._counters[key] = total
                rate = None if before is None or interval_s is None else (total - before) / interval_s
                add(key[0], {"group": str(group), "leader": str(int(group in leads))}, total, rate)


def bucket_quantile(quantile: float, bounds: Sequence[float], cumulative: Sequence[float]) -> float | None:
    """The quantile of what a histogram's cumulative bucket counts hold, interpolated linearly within the bucket it
    falls in (as Prometheus's histogram_quantile does); None when they hold nothing. Past the last finite bound, that
    bound."""
    total = cumulative[-1] if cumulative else 0
    if total <= 0:
        return None
    rank = quantile * total
    lower, below = 0.0, 0.0
    for bound, count in zip(bounds, cumulative):
        if count >= rank:
            if bound == float("inf"):
                return lower
            inside = count - below
            return min(bound, lower + (bound - lower) * ((rank - below) / inside if inside else 1.0))
        lower, below = bound, count
    return lower


def family(kind: type[CounterMetricFamily] | type[GaugeMetricFamily], name: str, documentation: str,
           labels: list[str], values: Iterable[tuple[list[str], float]]) -> Metric:
    """A metric family of a collector (kind: CounterMetricFamily or GaugeMetricFamily), one value per label values."""
    found = kind(name, documentation, labels=labels)
    for label_values, value in values:
        found.add_metric(label_values, value)
    return found


def counter_family(name: str, documentation: str, labels: list[str], values) -> Metric:
    return family(CounterMetricFamily, name, documentation, labels, values)


def gauge_family(name: str, documentation: str, labels: list[str], values) -> Metric:
    return family(GaugeMetricFamily, name, documentation, labels, values)


def cpu_steal_s(stat: Path = Path("/proc/stat")) -> float | None:
    """The machine's CPU steal time so far (the eighth value of /proc/stat's "cpu" line, in clock ticks), or None
    where there is no such file."""
    try:
        fields = stat.read_text().split("\n", 1)[0].split()
    except OSError:
        return None
    return int(fields[8]) / os.sysconf("SC_CLK_TCK") if len(fields) > 8 and fields[0] == "cpu" else None


def cpu_throttled_s(proc_cgroup: Path = Path("/proc/self/cgroup"), root: Path = Path("/sys/fs/cgroup")
                    ) -> float | None:
    """How long this process's cgroup was throttled by its CPU quota so far: cgroup v2's cpu.stat throttled_usec,
    or v1's throttled_time (ns) where the cpu controller is bound to a v1 hierarchy; None without either. Read
    each time: a process may be moved to another cgroup while it runs."""
    try:
        lines = proc_cgroup.read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if "cpu" in controllers.split(","):
            candidates = [(root / "cpu" / path.lstrip("/") / "cpu.stat", "throttled_time", 1e-9),
                          (root / "cpu,cpuacct" / path.lstrip("/") / "cpu.stat", "throttled_time", 1e-9)]
        elif controllers == "":
            candidates = [(root / path.lstrip("/") / "cpu.stat", "throttled_usec", 1e-6),
                          (root / "unified" / path.lstrip("/") / "cpu.stat", "throttled_usec", 1e-6)]
        else:
            continue
        for stat, key, unit in candidates:
            try:
                for entry in stat.read_text().splitlines():
                    name, _, value = entry.partition(" ")
                    if name == key:
                        return int(value) * unit
            except (OSError, ValueError):
                continue
    return None
