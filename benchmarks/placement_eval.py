"""Do placement and rebalancing by the trained load forecaster beat least-loaded and a PD-style baseline? (issues 30
and 56). Not part of CI.

    PYTHONPATH=. python benchmarks/placement_eval.py --quick           # 20 nodes, 5,000 queues, 16 days: ~2 min
    PYTHONPATH=. python benchmarks/placement_eval.py --quick --seeds 8 # seeds 30..37, then their medians
    PYTHONPATH=. python benchmarks/placement_eval.py                   # 100 nodes, 100,000 queues, 30 days
    PYTHONPATH=. python benchmarks/placement_eval.py --quick --recorded /tmp/pb/cl30/rc/tier/telemetry
        # re-extract benchmarks/results/recorded_topics.json from a recorded run's telemetry, then run

What it does, in the order it runs:

1. Trace. Per-topic bytes/s for every simulated step of the run: topic sizes Zipf (exponent 1.1) and queue counts
   that follow size within a factor of about 2 (an operator sizes a topic's queues to its traffic), a daily cycle with a per-topic phase (most topics peak in the afternoon UTC, some at any
   hour) and depth, a weekend dip, bursts (x3..x8 for 15 min..2 h, about one a day per topic), 5% lognormal noise
   per step, topics that grow (to x3 by the end) or die, 40% of topics present on day 0 and the others ARRIVING
   over the run (ramping up over 0.5..3 days), and `topic update --queues` growth (a topic doubles its queues).
   A queue carries its topic's rate times its key share (lognormal; a tenth of the topics have hot keys). Part of
   the topics (--recorded-share) take the shape of a recorded topic instead: the per-minute rates a real
   examples/cluster run under benchmarks/workload.py shipped as telemetry, its compressed day stretched to 24 h
   and scaled to the topic's size (`--recorded DIR` re-extracts benchmarks/results/recorded_topics.json from a
   LocalDirectoryStore tier dir; without it the committed extract is read).
   A simulated step is --step-min minutes (5 in the full run, 15 in --quick), not one: the forecaster's features
   are in steps (rate_1m is the last step, rate_60m the last 60 steps, the horizon 10 steps), as the history the
   nameserver keeps would be if its step were that long; the calendar features (hour, weekday) are of the
   simulated wall time. To keep rocket's own code unchanged, steps are given to it as minutes of a virtual clock
   (step k at k * STEP_MS) and the calendar features are taken from the simulated wall time (CalendarForecaster
   for the nameserver's ModelPredictor, the same substitution in the training rows); age_h is in step-hours.
   With --node-changes (the default), storage nodes fail and join (node_changes: one of each every 8 days).

2. Train. The cluster runs the trace under least-loaded placement (what a cluster does before it has a model);
   training rows are built from its series as jobs/features.py builds them (rocket.ml.forecast.queue_features for
   queue, topic and group series, a sample of steps of each: --rows), and jobs.train_placement.train (Spark,
   local[2]) fits the GBT and holds out the last --held-out-days days. Its RMSE/MAE against naive (the last step)
   on the held-out rows is reported.

3. Simulate. The same arrivals under six policies: random; hash (`TopicSpec.group_of` without queue_groups:
   what rocket did before issue 30); least-loaded (`place_queues` fed by `RecentPredictor`, the nameserver's
   fallback); pd (placed as least-loaded, balanced by `hot_group_move`, after TiKV PD's hot-region scheduler: the
   last step's flow, tolerances, leaderships and replicas moved, from day 0); model (`place_queues` fed by
   `ModelPredictor` with the trained model); planner (placed as model, balanced by `forecast_move`: pd's search on
   the model's forecasts, each move paying for itself over limits.plan_payback_s). Each storage group has 3
   replicas on distinct nodes (rocket.ml.placement.LeastLoaded placed them); a node's load is the traffic of the
   groups it leads plus FOLLOWER_SHARE (0.3) of that of the groups it follows (a follower appends and fsyncs what
   the leader sends but serves no clients). A moved replica copies the group's bytes of the last
   tier_local_retention_s_default at --copy-mb-s (the copy's own I/O is not added to the nodes' load), and
   switches when its copy ends; at most limits.replica_moves_max copies run at once. Random, hash, least-loaded
   and model balance leaders with the nameserver's `Planner.leader_move`; every policy's balancing moves come out
   of a `MoveBudget` of --moves-per-hour, as the nameserver's (rebalance_moves_per_hour). Every policy gets the
   nameserver's replica moves alike: a failed node's replicas replaced (repairs, copied the same way, outside the
   budget) and replica counts evened out while no copy runs (a joined node fills up), within it.
   Random, hash and least-loaded predict with RecentPredictor,
   model and planner with the model. The nameserver's calls are reproduced: group predictions
   with members = the group's queues and the topic's prediction (members = its queues so far) divided by its
   queues after the placement for a new queue's share; leader balancing predicts groups with members = 1. The
   model and planner policies start from the least-loaded cluster at the start of the held-out days (no model
   existed before it was trained on them), and so does pd, to be judged from the same state; random and hash run
   from day 0. Two diagnostics, not policies rocket could run: "oracle" (place_queues and leader_transfer fed the
   load each series really carries over the horizon, through the same Predictor interface), from the held-out days
   like the model; and, with --from-start (the default with --quick), "model, day 0", "planner, day 0", "pd, day 0"
   and "oracle, day 0" from day 0 (the model is then in-sample before the held-out days: its figures flatter it).

4. Metrics, on the held-out days: p99 over steps of (max node load / mean node load); simulated minutes with a
   node above 80% of its capacity, capacity being CAPACITY_FACTOR (2) times the peak mean node load of the run (its
   99th percentile over steps: all nodes alike, the same for every policy since the mean does not depend on
   placement); leader and replica moves (a queue never leaves its group: replicas move with their group's log) and
   the bytes they copied, repairs apart; the error of each policy's group predictions against the load that came
   over the horizon. JSON and a PNG chart go to --out; the last line printed is `placement: p99 max/mean load
   model=X least-loaded=Y improvement=Z% pd=W planner=V moves model=M pd=P planner=Q` (moves: leaderships and
   replicas, in the held-out days). With --seeds N, each seed's run goes to --out/seed-S, a line per seed says
   whether issue 56's goal holds in it (goal_met), and the last line gives the medians over the seeds and in how
   many the goal holds: one seed's p99 turns on where a few bursts land, and moves every policy's start with it.
"""

from __future__ import annotations

import argparse
import copy
import csv
import json
import math
import sys
import tempfile
import time
from collections import Counter, defaultdict
import dataclasses
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from rocket import limits  # noqa: E402
from rocket.ml.forecast import CALENDAR, STEP_MS, Forecaster, future_rate, queue_features, window_mean  # noqa: E402
from rocket.ml.load import LoadHistory, ModelPredictor, RecentPredictor  # noqa: E402
from rocket.ml.placement import (GroupLoad, LeastLoaded, NodeLoad, Planner, forecast_move,  # noqa: E402
                                  hot_group_move)
from rocket.model import TopicSpec  # noqa: E402

EPOCH_MS = int(datetime(2026, 11, 2, tzinfo=timezone.utc).timestamp() * 1000)  # a Monday, 00:00 UTC
DAY_MS = 86_400_000
HORIZON_STEPS = 10
FOLLOWER_SHARE = limits.hot_follower_share  # a follower's load per byte/s of a group, against a leader's 1
CAPACITY_FACTOR = 2.0  # a node's capacity: this many times the run's peak mean node load (its 99th percentile)
HOT = 0.8  # a node above this share of its capacity is hot
REPLICAS = 3
RECORDED_JSON = ROOT / "benchmarks/results/recorded_topics.json"
QUEUE_IN_BYTES = "rocket_queue_in_bytes_total"


@dataclass
class Scale:
    nodes: int
    groups: int
    queues: int
    days: int
    step_min: int
    held_out_days: int
    rows: int  # training rows per series kind (queue, topic, group), about

    @property
    def steps(self) -> int:
        return self.days * 1440 // self.step_min

    def step_of_day(self, day: float) -> int:
        return int(round(day * 1440 / self.step_min))


FULL = Scale(nodes=100, groups=200, queues=100_000, days=30, step_min=5, held_out_days=7, rows=60_000)
QUICK = Scale(nodes=20, groups=40, queues=5_000, days=16, step_min=15, held_out_days=7, rows=25_000)


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# ---- the recorded topics ------------------------------------------------------------------------------------------

def extract_recorded(tier_dir: str, day_s: float) -> dict:
    """Per topic, its bytes/s in for each minute of a recorded run: the mean of each queue's
    rocket_queue_in_bytes_total rates in the minute (as jobs/features.py has it), summed over the topic's queues."""
    from rocket.telemetry.ship import read_samples
    from rocket.tier.local import FOOTER_BYTES, FOOTER_MAGIC

    sums: dict[tuple[str, int, int], list[float]] = defaultdict(lambda: [0.0, 0])
    first = last = None
    files = sorted(Path(tier_dir).rglob("*.avro"))
    for path in files:
        data = path.read_bytes()
        if data.endswith(FOOTER_MAGIC):
            data = data[:-FOOTER_BYTES]
        for record in read_samples(data):
            minute = record["time_ms"] // 60_000
            first = minute if first is None else min(first, minute)
            last = minute if last is None else max(last, minute)
            if record["metric"] != QUEUE_IN_BYTES or record["rate"] is None:
                continue
            total = sums[(record["labels"]["topic"], int(record["labels"]["queue"]), minute)]
            total[0] += record["rate"]
            total[1] += 1
    if first is None:
        raise SystemExit(f"no telemetry under {tier_dir}")
    topics: dict[str, list[float]] = {}
    for (topic, _, minute), (rate, count) in sums.items():
        series = topics.setdefault(topic, [0.0] * (last - first + 1))
        series[minute - first] += rate / count
    busy = [minute for minute in range(last - first + 1) if any(series[minute] > 0 for series in topics.values())]
    if busy:  # the minutes the workload ran: not the cluster's idle ones before and after
        topics = {topic: series[busy[0]:busy[-1] + 1] for topic, series in topics.items()}
        first, last = first + busy[0], first + busy[-1]
    return {"source": str(tier_dir), "files": len(files), "first_ms": first * 60_000, "minutes": last - first + 1,
            "day_s": day_s, "topics": {topic: [round(rate, 1) for rate in series]
                                       for topic, series in sorted(topics.items())}}


def recorded_shapes(recorded: dict) -> list[np.ndarray]:
    """The recorded topics with traffic, each per recorded minute and scaled to a mean of 1."""
    shapes = []
    for series in recorded["topics"].values():
        values = np.asarray(series, dtype=float)
        if len(values) >= 3 and values.mean() > 0:
            shapes.append(values / values.mean())
    return shapes


# ---- the trace ------------------------------------------------------------------------------------------------------

@dataclass
class Trace:
    scale: Scale
    names: list[str]
    rates: np.ndarray  # [topic, step] bytes/s in, float32
    weights: list[np.ndarray]  # per topic, the key share weight of each of its queues (its final count)
    events: dict[int, list[tuple[int, int, int]]]  # step -> (topic, queues before, queues after)
    counts: np.ndarray  # [topic, step] its queues at the step (after the step's events)
    kinds: list[str]
    changes: dict[int, list[tuple[str, int]]] = dataclasses.field(default_factory=dict)  # step -> (fail|join, node)
    nodes_max: int = 0  # node ids 1..nodes_max: the first scale.nodes, then those that join


def node_changes(scale: Scale, rng: np.random.Generator) -> tuple[dict[int, list[tuple[str, int]]], int]:
    """Storage nodes that fail and nodes that join over the run, one of each every 8 days (2 each in --quick's 16),
    at random steps after the first day. A failed node comes back after 2..24 hours, empty (its replicas were
    replaced meanwhile); a joining node takes the next id."""
    count = max(1, round(scale.days / 8))
    changes: dict[int, list[tuple[str, int]]] = defaultdict(list)
    for number, node in enumerate(rng.choice(np.arange(1, scale.nodes + 1), size=count, replace=False)):
        failed = int(rng.integers(scale.step_of_day(1), scale.steps))
        changes[failed].append(("fail", int(node)))
        changes[failed + scale.step_of_day(rng.uniform(2, 24) / 24)].append(("join", int(node)))
        changes[int(rng.integers(scale.step_of_day(1), scale.steps))].append(("join", scale.nodes + 1 + number))
    return dict(changes), scale.nodes + count


def make_trace(scale: Scale, rng: np.random.Generator, shapes: list[np.ndarray], recorded_share: float,
               recorded_day_s: float) -> Trace:
    steps, step_min = scale.steps, scale.step_min
    # Sizes Zipf (exponent 1.1, ranks at random); queue counts follow size, as an operator sizes a topic (a queue's
    # traffic bounded: one queue lives on one group), within a factor of about 2 (lognormal 0.5), 16 a topic on
    # average: the count scaled until the total is scale.queues.
    topics = max(1, scale.queues // 16)
    share = 1.0 / rng.permutation(np.arange(1, topics + 1)) ** 1.1
    share /= share.sum()
    spread = share * rng.lognormal(0, 0.5, size=topics)
    factor = float(scale.queues)
    for _ in range(50):
        final = np.clip(np.round(spread * factor), 1, limits.queues_per_topic_max).astype(np.int64)
        if final.sum() == scale.queues:
            break
        factor *= scale.queues / final.sum()
    for topic in np.argsort(-final):  # what rounding left over, onto the biggest topics with room
        left = scale.queues - int(final.sum())
        if left == 0:
            break
        final[topic] = int(np.clip(final[topic] + left, 1, limits.queues_per_topic_max))
    # Which topics double their queues (`topic update --queues`) mid-run: half of the topics that grow, 5% of others.
    kinds = rng.choice(["steady", "growing", "dying"], size=topics, p=[0.6, 0.25, 0.15]).tolist()
    doubles = np.array([rng.random() < (0.5 if kind == "growing" else 0.05) for kind in kinds]) & (final >= 2)
    initial = np.where(doubles, final // 2, final)
    final = np.where(doubles, 2 * initial, final)
    arrive = np.where(rng.random(topics) < 0.4, 0, rng.integers(1, steps, size=topics))
    minute = np.arange(steps) * step_min  # simulated minutes since the epoch (a Monday)
    hour = (minute / 60) % 24
    weekday = (minute // 1440) % 7
    rates = np.empty((topics, steps), dtype=np.float32)
    # Total traffic at its mean about 15 MB/s per node, before growth and arrivals.
    scale_bytes = 15e6 * scale.nodes
    events: dict[int, list[tuple[int, int, int]]] = defaultdict(list)
    count_at = np.zeros((topics, steps), dtype=np.int32)
    recorded_topic = rng.random(topics) < (recorded_share if shapes else 0.0)
    for topic in range(topics):
        start = int(arrive[topic])
        if recorded_topic[topic]:
            shape = shapes[rng.integers(len(shapes))]
            # A recorded minute is day_s/60 minutes of a compressed day: 1440 * 60 / day_s simulated minutes.
            stretch = 1440 * 60 / recorded_day_s
            position = (minute / stretch + rng.uniform(0, len(shape))) % len(shape)
            base = np.interp(position, np.arange(len(shape) + 1), np.append(shape, shape[0]))
            kinds[topic] = "recorded"
        else:
            peak_h = (14 + rng.normal(0, 1.5)) % 24 if rng.random() < 0.7 else rng.uniform(0, 24)
            depth = rng.uniform(0.3, 0.9)
            daily = 1 - depth * (1 - np.cos(2 * np.pi * (hour - peak_h) / 24)) / 2
            weekend = rng.uniform(0.3, 1.0) if rng.random() < 0.8 else 1.0
            base = daily * np.where(weekday >= 5, weekend, 1.0)
            life = np.ones(steps)
            span = np.arange(steps) - start
            if kinds[topic] == "growing":
                life = 1 + 2 * np.clip(span / max(1, steps - start), 0, 1)
            elif kinds[topic] == "dying":
                dies_from = rng.integers(start, steps)
                life = np.clip(1 - (np.arange(steps) - dies_from) / scale.step_of_day(rng.uniform(1, 5)), 0, 1)
            if start > 0:  # a new topic ramps up
                life = life * np.clip(0.1 + 0.9 * span / scale.step_of_day(rng.uniform(0.5, 3)), 0.1, 1)
            base = base * life
            burst = np.ones(steps)
            for at in rng.integers(0, steps, size=rng.poisson(scale.days)):
                burst[at:at + max(1, int(rng.uniform(15, 120) / step_min))] *= rng.uniform(3, 8)
            base = base * burst
        noise = rng.lognormal(0, 0.05, size=steps)
        series = scale_bytes * share[topic] * base * noise
        series[:start] = 0
        rates[topic] = series
        events[start].append((topic, 0, int(initial[topic])))
        count_at[topic, start:] = initial[topic]
        if doubles[topic] and final[topic] > initial[topic]:
            at = int(rng.integers(start + 1, steps)) if start + 1 < steps else steps
            if at < steps:
                events[at].append((topic, int(initial[topic]), int(final[topic])))
                count_at[topic, at:] = final[topic]
    weights = [rng.lognormal(0, 1.0 if rng.random() < 0.1 else 0.25, size=int(n)) for n in final]
    names = [f"t{topic:05d}" for topic in range(topics)]
    return Trace(scale, names, rates, weights, dict(events), count_at, kinds, nodes_max=scale.nodes)


# ---- the cluster under a policy -----------------------------------------------------------------------------------

class CalendarForecaster:
    """The trained Forecaster, given the calendar features (hour, weekday) of the simulated wall time: rocket's
    ModelPredictor computes them from now_ms, which is the virtual clock of steps here (see the module's doc)."""

    def __init__(self, model: Forecaster, scale: Scale):
        self.model, self.scale, self.step = model, scale, 0
        self.version, self.metrics = model.version, model.metrics

    def predict(self, features: list[float]) -> float:
        features = list(features)
        features[CALENDAR] = calendar(self.scale, self.step)
        return self.model.predict(features)


def calendar(scale: Scale, step: int) -> list[float]:
    """The hour and weekday features of a step's simulated wall time, from rocket's own queue_features."""
    return queue_features({}, EPOCH_MS + step * scale.step_min * 60_000, 0, 1, 0.0)[CALENDAR]


class OraclePredictor:
    """A diagnostic, not a policy rocket could run: the bytes/s a series really carries over the horizon (a group's
    with the queues it holds now), through the same Predictor interface, to tell what perfect forecasts would buy
    place_queues and leader_transfer."""

    name = "oracle"
    error_bytes_s = 0.0

    def __init__(self, cluster: Cluster):
        self.cluster = cluster
        self._future: tuple = (-1, None)

    def predict(self, history: LoadHistory, series: tuple, now_ms: int, *, members: int = 1, context=None) -> float:
        step, trace = now_ms // STEP_MS, self.cluster.trace
        if self._future[0] != step:
            self._future = (step, trace.rates[:, step:step + HORIZON_STEPS].astype(float).mean(axis=1))
        future = self._future[1]
        if series[0] == "group":
            return float(future @ self.cluster.share[:, series[1]])
        return float(future[int(series[1][1:])])  # topic t00042 is row 42


class Cluster:
    """Groups, their voters and leaders, where each queue is, and what the nameserver's history holds."""

    def __init__(self, trace: Trace, policy: str, voters: dict[int, tuple[int, ...]], leaders: np.ndarray,
                 moves_per_hour: float, seed: int, copy_mb_s: float = 32.0):
        scale = trace.scale
        self.trace, self.policy, self.voters = trace, policy, dict(voters)
        self.leaders = leaders.copy()  # group (index 0..G-1) -> its leader node (1..N)
        self.voter_array = np.array([voters[group] for group in range(scale.groups)])  # [group, 3]
        self.planner = Planner(moves_per_hour)  # the nameserver's, its budget every policy's
        self.rng = np.random.default_rng(seed)
        self.share = np.zeros((len(trace.names), scale.groups), dtype=np.float32)  # topic -> its share in each group
        self.queue_groups: list[list[int]] = [[] for _ in trace.names]
        self.queues_in = np.zeros(scale.groups, dtype=np.int64)
        self.history = LoadHistory()  # the groups' (the nameserver's LoadHistory)
        self.group_rates = np.zeros((scale.groups, scale.steps))
        self.queues_in_at = np.zeros((scale.groups, scale.steps), dtype=np.int32)
        self.node_max = np.zeros(scale.steps)
        self.node_mean = np.zeros(scale.steps)
        self.node_max_id = np.zeros(scale.steps, dtype=np.int32)
        self.predicted = np.full((scale.groups, scale.steps), np.nan)  # balancing's prediction of each group
        self.predicted_members = np.full((scale.groups, scale.steps), np.nan)  # ... with members = its queues
        self.leader_moves = np.zeros(scale.steps, dtype=np.int32)
        self.replica_moves = np.zeros(scale.steps, dtype=np.int32)
        self.bytes_moved = np.zeros(scale.steps)
        self.kept_steps = max(1, round(limits.tier_local_retention_s_default / 60 / scale.step_min))
        self.live = list(range(1, scale.nodes + 1))  # the nodes up, in id order
        # group -> (source, target, the step its copy ends, whether the leadership goes to target then)
        self.copies: dict[int, tuple[int, int, int, bool]] = {}
        self.copy_bytes_s = copy_mb_s * 1e6
        self.repair_moves = np.zeros(scale.steps, dtype=np.int32)
        self.repair_bytes = np.zeros(scale.steps)
        self.predictor = RecentPredictor()
        self.calendar: CalendarForecaster | None = None
        self.predict_s = 0.0
        self.place_s = 0.0
        self._cache: dict = {}

    def now_s(self, step: int) -> float:
        return step * self.trace.scale.step_min * 60.0

    def use_model(self, model: Forecaster) -> None:
        self.calendar = CalendarForecaster(model, self.trace.scale)
        self.predictor = ModelPredictor(self.calendar)

    def predict(self, history: LoadHistory, series: tuple, step: int, members: int) -> float:
        """As the nameserver's _predict: kept for the step."""
        key = (series, members)
        found = self._cache.get(key)
        if found is None:
            started = time.perf_counter()
            found = self._cache[key] = self.predictor.predict(history, series, step * STEP_MS, members=members)
            self.predict_s += time.perf_counter() - started
        return found

    def topic_history(self, topic: int, step: int) -> LoadHistory:
        """The topic's series as the nameserver's history has it at step: its first step with bytes, and the last
        limits.load_history_steps (90) steps."""
        history = LoadHistory()
        rates = self.trace.rates[topic, :step]
        busy = np.flatnonzero(rates > 0)
        if len(busy):
            for at in sorted({int(busy[0]), *range(max(int(busy[0]), step - 90), step)}):
                history.add(("topic", self.trace.names[topic]), at * STEP_MS, float(rates[at]) * STEP_MS / 1000)
        return history

    def place(self, topic: int, before: int, after: int, step: int) -> None:
        scale, name = self.trace.scale, self.trace.names[topic]
        started = time.perf_counter()
        if self.policy == "random":
            chosen = self.rng.integers(0, scale.groups, size=after - before).tolist()
        elif self.policy == "hash":
            spec = TopicSpec(name, after, groups=tuple(range(scale.groups)))
            chosen = [spec.group_of(queue) for queue in range(before, after)]
        else:  # the nameserver's _place: place_queues on predicted group loads
            topic_queues = Counter(self.queue_groups[topic])
            loads = [GroupLoad(group, int(self.leaders[group]),
                               self.predict(self.history, ("group", group), step, max(1, int(self.queues_in[group]))),
                               int(self.queues_in[group]), topic_queues[group], True)
                     for group in range(scale.groups)]
            history = self.topic_history(topic, step)
            topic_predicted = (self.predict(history, ("topic", name), step, after)
                               if history.rates(("topic", name)) else None)
            chosen = [choice.group for choice in self.planner.place(before, after - before, topic_predicted, loads)]
        self.queue_groups[topic].extend(chosen)
        for group in chosen:
            self.queues_in[group] += 1
        weights = self.trace.weights[topic][:after]
        self.share[topic] = np.bincount(self.queue_groups[topic], weights=weights / weights.sum(),
                                        minlength=scale.groups)
        self.place_s += time.perf_counter() - started

    def balance(self, step: int) -> None:
        """The nameserver's _balance_leaders, within the planner's budget: group predictions with members = the
        group's queues, as placement and the training rows have them. The PD-style baseline moves by the flow of the
        last step instead (hot_group_move), leaderships and replicas."""
        scale = self.trace.scale
        if self.policy.startswith("pd"):
            flow = self.group_rates[:, step - 1] if step else np.zeros(scale.groups)
            self.balance_moves(step, flow, lambda loads, busy, replicas: hot_group_move(
                loads, self.voters, self.live, FOLLOWER_SHARE, busy=busy, replica_moves=replicas))
            return
        if self.policy.startswith("planner"):
            forecast = np.array([self.predict(self.history, ("group", group), step, max(1, int(self.queues_in[group])))
                                 for group in range(scale.groups)])
            kept = {group: self.kept_bytes(group, step) for group in range(scale.groups)}
            self.balance_moves(step, forecast, lambda loads, busy, replicas: forecast_move(
                loads, self.voters, self.live, kept, follower_share=FOLLOWER_SHARE, busy=busy, replica_moves=replicas))
            return
        loads = [GroupLoad(group, int(self.leaders[group]),
                           self.predict(self.history, ("group", group), step, max(1, int(self.queues_in[group]))), 0)
                 for group in range(scale.groups)]
        self.predicted[:, step] = [load.predicted for load in loads]
        self.predicted_members[:, step] = [self.predict(self.history, ("group", group), step,
                                                        max(1, int(self.queues_in[group])))
                                           for group in range(scale.groups)]
        while (transfer := self.planner.leader_move(loads, self.voters, self.live, set(), self.now_s(step),
                                                    self.predictor.error_bytes_s)):
            group, target, _ = transfer
            loads[group].leader = target
            self.leaders[group] = target
            self.leader_moves[step] += 1

    def balance_moves(self, step: int, load: np.ndarray, choose) -> None:
        """choose(group loads, the groups being copied, whether another copy may start) within the budget,
        each group's load given (pd: the last step's bytes/s; planner: the forecast). At most
        limits.replica_moves_max copies run at once, as the nameserver runs its replica moves."""
        loads = [GroupLoad(group, int(self.leaders[group]), float(load[group]), 0) for group in range(len(load))]
        self.predicted[:, step] = self.predicted_members[:, step] = load
        while self.planner.budget.left(self.now_s(step)) >= 1:
            move = choose(loads, set(self.copies), len(self.copies) < limits.replica_moves_max)
            if move is None:
                break
            self.planner.budget.take(self.now_s(step))
            if move.leader_only:
                self.leader_moves[step] += 1
                loads[move.group].leader = move.target
                self.leaders[move.group] = move.target
            else:  # the leadership goes with the replica, when its copy ends
                self.bytes_moved[step] += self.move_replica(move.group, move.source, move.target, step,
                                                            lead=loads[move.group].leader == move.source)
                self.replica_moves[step] += 1

    def move_replica(self, group: int, source: int, target: int, step: int, lead: bool = False) -> float:
        """Start copying the group's replica on source to target: what the group keeps locally (kept_bytes) at
        --copy-mb-s, the replica switching when the copy ends (end_copies). Returns the bytes."""
        kept = self.kept_bytes(group, step)
        steps = max(1, math.ceil(kept / self.copy_bytes_s / (self.trace.scale.step_min * 60)))
        self.copies[group] = (source, target, step + steps, lead)
        return kept

    def end_copies(self, step: int) -> None:
        """Copies that ended: the target replaces the source among the group's voters; a leader that left hands
        over to the target if the move was for its load, else to another voter."""
        for group, (source, target, end, lead) in list(self.copies.items()):
            if end > step:
                continue
            del self.copies[group]
            members = tuple(target if node == source else node for node in self.voters[group])
            self.voters[group] = members
            self.voter_array[group] = members
            if self.leaders[group] == source:
                self.leaders[group] = target if lead else self.rng.choice([node for node in members if node != target])

    def kept_bytes(self, group: int, step: int) -> float:
        """What the group keeps locally at step: its bytes of the last tier_local_retention_s_default."""
        kept = self.group_rates[group, max(0, step - self.kept_steps):step].sum()
        return float(kept) * self.trace.scale.step_min * 60

    def change_nodes(self, step: int) -> None:
        """The nameserver's replica moves (_plan_moves), every policy alike: a failed node's replicas are replaced
        on the nodes LeastLoaded picks (repairs, copied as moves are, however many run; a failed leader's group
        elects another voter at once), and replica counts even out while no copy runs (from the node holding the
        most to the one holding the fewest: a joined node fills up). Groups are not created for joined nodes
        (_grow_pool): the simulated pool is fixed."""
        self.end_copies(step)
        for kind, node in self.trace.changes.get(step, ()):
            if kind == "join":
                self.live = sorted({*self.live, node})
                continue
            self.live = [live for live in self.live if live != node]
            self.copies = {group: copy for group, copy in self.copies.items() if copy[1] != node}  # lost with it
            held = np.bincount(self.voter_array.ravel(), minlength=self.trace.nodes_max + 1)  # copies change no voter
            for group in np.flatnonzero((self.voter_array == node).any(axis=1)).tolist():
                if self.copies.get(group, (node,))[0] == node:
                    continue  # its replica there is being copied away already
                if self.leaders[group] == node:
                    self.leaders[group] = self.rng.choice([voter for voter in self.voters[group] if voter != node])
                led = np.bincount(self.leaders, minlength=self.trace.nodes_max + 1)
                loads = [NodeLoad(live, int(held[live]), int(led[live])) for live in self.live
                         if live not in self.voters[group]]
                target = LeastLoaded().place(1, 1, loads)[0][0]
                self.repair_bytes[step] += self.move_replica(group, node, target, step)
                self.repair_moves[step] += 1
        if self.copies:
            return
        held = np.bincount(self.voter_array.ravel(), minlength=self.trace.nodes_max + 1)
        low = min(self.live, key=lambda node: (held[node], node))
        high = max(self.live, key=lambda node: (held[node], -node))
        if held[high] - held[low] > 1:
            group = next((group for group in range(self.trace.scale.groups)
                          if high in self.voters[group] and low not in self.voters[group]), None)
            if group is not None and self.planner.budget.take(self.now_s(step)):
                self.bytes_moved[step] += self.move_replica(group, high, low, step)
                self.replica_moves[step] += 1

    def run(self, first: int, last: int) -> None:
        trace, scale = self.trace, self.trace.scale
        for step in range(first, last):
            self._cache = {}
            if self.calendar is not None:
                self.calendar.step = step
            self.change_nodes(step)
            for topic, before, after in trace.events.get(step, ()):
                self.place(topic, before, after, step)
            self.balance(step)
            rates = trace.rates[:, step] @ self.share  # each group's bytes/s in this step
            self.group_rates[:, step] = rates
            self.queues_in_at[:, step] = self.queues_in
            for group in range(scale.groups):
                self.history.add(("group", group), step * STEP_MS, float(rates[group]) * STEP_MS / 1000)
            if step % 10 == 0:
                self.history.forget_before(step * STEP_MS)
            if step % 1000 == 999:
                log(f"  {self.policy}: step {step + 1:,} of {last:,}")
            node = FOLLOWER_SHARE * np.bincount(self.voter_array.ravel(), weights=np.repeat(rates, REPLICAS),
                                                minlength=trace.nodes_max + 1)
            node += (1 - FOLLOWER_SHARE) * np.bincount(self.leaders, weights=rates, minlength=trace.nodes_max + 1)
            node = node[self.live]
            self.node_max[step], self.node_mean[step] = node.max(), node.mean()
            self.node_max_id[step] = self.live[int(node.argmax())]


def initial_cluster(scale: Scale, rng: np.random.Generator) -> tuple[dict[int, tuple[int, ...]], np.ndarray]:
    """Each group's voters, by rocket's LeastLoaded replica placement, and a first leader: one of them at random
    (as an election has it)."""
    placed = LeastLoaded().place(scale.groups, REPLICAS, [NodeLoad(node) for node in range(1, scale.nodes + 1)])
    voters = {group: members for group, members in enumerate(placed)}
    leaders = np.array([members[rng.integers(REPLICAS)] for members in placed])
    return voters, leaders


# ---- training ------------------------------------------------------------------------------------------------------

def series_rows(kind: str, topic: str, queue: int, group: int, steps_of: np.ndarray, members_of, family: np.ndarray,
                scale: Scale, sample: np.ndarray):
    """The rows of one series at the sampled steps, as jobs/features.py makes them (queue_rows / sum_rows), with
    the calendar features of the simulated wall time."""
    busy = np.flatnonzero(steps_of > 0)
    if not len(busy):
        return
    first = int(busy[0])
    steps = {int(at): float(steps_of[at]) for at in busy}
    family_steps = steps if family is steps_of else {int(at): float(family[at]) for at in np.flatnonzero(family > 0)}
    for step in sample:
        step = int(step)
        if step <= first or step + HORIZON_STEPS > scale.steps:
            continue
        now_ms = step * STEP_MS
        features = queue_features(steps, now_ms, first, max(1, members_of(step)),
                                  window_mean(family_steps, step - 1, 10))
        features[CALENDAR] = calendar(scale, step)
        yield (kind, topic, queue, group, now_ms, *features, future_rate(steps, now_ms, HORIZON_STEPS), features[0],
               HORIZON_STEPS)


def sample_steps(scale: Scale, series: int, rng: np.random.Generator) -> np.ndarray:
    """Every k-th step from a random offset, k such that series * steps / k is about scale.rows; the last step whose
    horizon is inside the run always (so the held-out split is where it is meant to be)."""
    stride = max(1, math.ceil(series * scale.steps / scale.rows))
    last = scale.steps - HORIZON_STEPS
    return np.unique(np.append(np.arange(int(rng.integers(stride)), last + 1, stride), last))


def training_rows(trace: Trace, cluster: Cluster, rng: np.random.Generator) -> list[tuple]:
    scale = trace.scale
    rows: list[tuple] = []
    for group in range(scale.groups):
        rows.extend(series_rows("group", "", -1, group, cluster.group_rates[group],
                                lambda step, group=group: int(cluster.queues_in_at[group, step - 1]),
                                cluster.group_rates[group], scale, sample_steps(scale, scale.groups, rng)))
    topics = rng.permutation(len(trace.names))[:min(len(trace.names), 400)]
    for topic in topics:
        series = trace.rates[topic].astype(float)
        rows.extend(series_rows("topic", trace.names[topic], -1, -1, series,
                                lambda step, topic=topic: int(trace.counts[topic, step - 1]), series, scale,
                                sample_steps(scale, len(topics), rng)))
    queue_count = min(sum(len(weights) for weights in trace.weights), 800)
    for topic in rng.integers(0, len(trace.names), size=queue_count):
        weights = trace.weights[topic]
        queue = int(rng.integers(len(weights)))
        counts = trace.counts[topic]
        total = np.concatenate([[1.0], np.cumsum(weights)])  # by the topic's queue count (0: none yet)
        fraction = np.where(queue < counts, weights[queue] / total[counts], 0.0)
        topic_series = trace.rates[topic].astype(float)
        rows.extend(series_rows("queue", trace.names[topic], queue, -1, topic_series * fraction,
                                lambda step, topic=topic: int(trace.counts[topic, step - 1]), topic_series, scale,
                                sample_steps(scale, queue_count, rng)))
    return rows


def train_model(rows: list[tuple], scale: Scale, boundary: int, master: str) -> dict:
    """jobs.train_placement.train on the rows (the queues/ schema), holding out the steps from boundary on."""
    from jobs.features import queue_schema
    from jobs.spark import session
    from jobs.train_placement import train

    with tempfile.TemporaryDirectory(prefix="placement-eval-") as directory:
        path = Path(directory) / "queues.csv"
        with path.open("w", newline="") as file:
            csv.writer(file).writerows(rows)
        spark = session(master, "rocket-placement-eval")
        try:
            frame = spark.read.schema(queue_schema()).csv(str(path)).persist()
            last_ms = max(row[4] for row in rows)
            held_out_days = (last_ms + STEP_MS - boundary * STEP_MS) / DAY_MS  # in virtual days: steps as minutes
            trained = train(spark, frame, held_out_days=held_out_days, horizon_steps=HORIZON_STEPS)
            frame.unpersist()
        finally:
            spark.stop()
    document = trained.document
    assert document["metrics"]["held_out_from_ms"] == boundary * STEP_MS, document["metrics"]["held_out_from_ms"]
    return document


# ---- metrics -------------------------------------------------------------------------------------------------------

def metrics(cluster: Cluster, first: int, last: int, capacity: float, scale: Scale) -> dict:
    span = slice(first, last)
    ratio = cluster.node_max[span] / np.maximum(cluster.node_mean[span], 1e-9)
    hot = cluster.node_max[span] > HOT * capacity
    error_span = slice(first, last - HORIZON_STEPS + 1)
    actual = np.stack([cluster.group_rates[:, step:step + HORIZON_STEPS].mean(axis=1)
                       for step in range(error_span.start, error_span.stop)], axis=1)
    error = cluster.predicted[:, error_span] - actual
    error_members = cluster.predicted_members[:, error_span] - actual
    queues = cluster.queues_in.astype(float)
    return {"p99_max_mean": float(np.percentile(ratio, 99)), "p50_max_mean": float(np.percentile(ratio, 50)),
            "max_max_mean": float(ratio.max()), "p99_max_load_of_capacity": float(np.percentile(
                cluster.node_max[span], 99) / capacity),
            "hot_minutes": int(hot.sum()) * scale.step_min,
            # ... of which no placement could avoid: the busiest group alone (one leader) is above HOT x capacity
            "hot_minutes_one_group": int((cluster.group_rates[:, span].max(axis=0) > HOT * capacity).sum())
            * scale.step_min, "leader_moves": int(cluster.leader_moves[span].sum()),
            "leader_moves_whole_run": int(cluster.leader_moves.sum()),
            "replica_moves": int(cluster.replica_moves[span].sum()),
            "bytes_moved": float(cluster.bytes_moved[span].sum()),
            "repair_moves": int(cluster.repair_moves[span].sum()),
            "repair_bytes": float(cluster.repair_bytes[span].sum()),
            "group_prediction_rmse": float(np.sqrt(np.nanmean(error ** 2))),
            "group_prediction_mae": float(np.nanmean(np.abs(error))),
            "group_prediction_rmse_members_queues": float(np.sqrt(np.nanmean(error_members ** 2))),
            "max_queues_in_a_group_of_mean": float(queues.max() / queues.mean()),
            "p99_max_group_load_of_mean": float(np.percentile(cluster.group_rates[:, span].max(axis=0) / np.maximum(
                cluster.group_rates[:, span].mean(axis=0), 1e-9), 99)),
            "predict_s": round(cluster.predict_s, 1), "place_s": round(cluster.place_s, 1)}


def chart(path: Path, clusters: dict[str, Cluster], first: int, last: int, capacity: float, scale: Scale) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    days = (np.arange(first, last) * scale.step_min) / 1440
    figure, axis = plt.subplots(figsize=(11, 4.5))
    for policy, cluster in clusters.items():
        axis.plot(days, cluster.node_max[first:last] / capacity, label=f"max node: {policy}", linewidth=0.8)
    axis.plot(days, next(iter(clusters.values())).node_mean[first:last] / capacity, label="mean node", color="black",
              linewidth=1.2, linestyle="--")
    axis.axhline(HOT, color="red", linewidth=0.6, linestyle=":", label=f"{HOT:.0%} of capacity")
    axis.set_xlabel("simulated day (held-out days)")
    axis.set_ylabel("node load / capacity (log)")
    axis.set_yscale("log")
    axis.set_title(f"Busiest node per step, {scale.nodes} nodes, {scale.groups} groups, {scale.queues:,} queues")
    axis.legend(fontsize=7, ncol=3)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


# ---- main ----------------------------------------------------------------------------------------------------------

def parse(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="20 nodes, 5,000 queues, 16 days of 15-min steps")
    parser.add_argument("--out", default=str(ROOT / "benchmarks/results/placement_eval"))
    parser.add_argument("--recorded", default="", help="a LocalDirectoryStore tier dir (its telemetry/) to extract "
                        "the recorded topics from, into --recorded-json")
    parser.add_argument("--recorded-json", default=str(RECORDED_JSON))
    parser.add_argument("--recorded-day-s", type=float, default=600.0, help="the recorded run's --day-s")
    parser.add_argument("--recorded-share", type=float, default=0.1, help="of the topics, shaped as recorded ones")
    parser.add_argument("--moves-per-hour", type=float, default=12.0,
                        help="leadership transfers per simulated hour, every policy (default %(default)s)")
    parser.add_argument("--from-start", action=argparse.BooleanOptionalAction, default=None,
                        help="also run the model and the oracle from day 0 (default: with --quick only)")
    parser.add_argument("--node-changes", action=argparse.BooleanOptionalAction, default=True,
                        help="storage nodes fail and join during the run (default: on)")
    parser.add_argument("--copy-mb-s", type=float, default=32.0, help="a replica move copies its group's data at "
                        "this rate, MB/s (CockroachDB's rebalancing snapshots: 32 MiB/s; default %(default)s)")
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--seed", type=int, default=30)
    parser.add_argument("--seeds", type=int, default=1, help="run seeds --seed.. this many, each into --out/seed-S, "
                        "and end with their medians and in how many the goal holds (default %(default)s)")
    return parser.parse_args(argv)


SAME_P99 = 0.01  # "the same p99" in issue 56's goal: the model's no more than this share above pd's


def goal_met(results: dict) -> bool:
    """Issue 56's goal on one run: the model's p99 max/mean at least 15% below pd's with no more moves, or the same
    (SAME_P99) with at most half pd's moves. Moves: leaderships and replicas, in the held-out days."""
    model, pd = results["model"], results["pd"]
    model_moves, pd_moves = (figures["leader_moves"] + figures["replica_moves"] for figures in (model, pd))
    return (model["p99_max_mean"] <= 0.85 * pd["p99_max_mean"] and model_moves <= pd_moves) or (
        model["p99_max_mean"] <= (1 + SAME_P99) * pd["p99_max_mean"] and 2 * model_moves <= pd_moves)


POLICIES_REPORTED = ("model", "least-loaded", "pd", "planner")


def figures_of(results: dict) -> tuple[dict, dict]:
    """Each reported policy's p99 max/mean and moves (leaderships and replicas, in the held-out days)."""
    return ({policy: results[policy]["p99_max_mean"] for policy in POLICIES_REPORTED},
            {policy: results[policy]["leader_moves"] + results[policy]["replica_moves"]
             for policy in POLICIES_REPORTED})


def summary_line(p99: dict, moves: dict, label: str = "placement:") -> str:
    return (f"{label} p99 max/mean load model={p99['model']:.3f} least-loaded={p99['least-loaded']:.3f} "
            f"improvement={100 * (p99['least-loaded'] - p99['model']) / p99['least-loaded']:.1f}% "
            f"pd={p99['pd']:.3f} planner={p99['planner']:.3f} moves model={moves['model']:g} pd={moves['pd']:g} "
            f"planner={moves['planner']:g}")


def main(argv=None) -> None:
    arguments = parse(argv)
    if arguments.seeds <= 1:
        print(summary_line(*figures_of(evaluate(arguments))))
        return
    runs = {}
    for seed in range(arguments.seed, arguments.seed + arguments.seeds):
        runs[seed] = evaluate(argparse.Namespace(**vars(arguments) | {
            "seed": seed, "out": str(Path(arguments.out) / f"seed-{seed}")}))
    for seed, results in runs.items():
        goal = "met" if goal_met(results) else "missed"
        print(summary_line(*figures_of(results), f"seed {seed}:") + f" goal={goal}")
    figures = [figures_of(results) for results in runs.values()]
    medians = tuple({policy: float(np.median([each[part][policy] for each in figures])) for policy in POLICIES_REPORTED}
                    for part in (0, 1))
    met = sum(goal_met(results) for results in runs.values())
    print(summary_line(*medians, f"placement ({len(runs)} seeds, medians):") + f" goal met in {met} of {len(runs)}")


def evaluate(arguments: argparse.Namespace) -> dict:
    """One seed's run: trace, training, every policy simulated; prints its table and returns each policy's metrics."""
    started = time.monotonic()
    scale = QUICK if arguments.quick else FULL
    if arguments.from_start is None:
        arguments.from_start = arguments.quick
    rng = np.random.default_rng(arguments.seed)
    out = Path(arguments.out)
    out.mkdir(parents=True, exist_ok=True)
    if arguments.recorded:
        recorded = extract_recorded(arguments.recorded, arguments.recorded_day_s)
        Path(arguments.recorded_json).write_text(json.dumps(recorded, separators=(",", ":")))
        log(f"recorded: {len(recorded['topics'])} topics, {recorded['minutes']} minutes -> {arguments.recorded_json}")
    recorded_path = Path(arguments.recorded_json)
    recorded = json.loads(recorded_path.read_text()) if recorded_path.exists() else None
    shapes = recorded_shapes(recorded) if recorded else []
    timings = {}

    trace = make_trace(scale, rng, shapes, arguments.recorded_share,
                       recorded["day_s"] if recorded else arguments.recorded_day_s)
    if arguments.node_changes:
        trace.changes, trace.nodes_max = node_changes(scale, np.random.default_rng(arguments.seed + 4))
    timings["trace_s"] = time.monotonic() - started
    log(f"trace: {len(trace.names):,} topics, {scale.queues:,} queues, {scale.steps:,} steps of {scale.step_min} min "
        f"({Counter(trace.kinds)}; {sum(len(v) for v in trace.events.values()):,} placements; node changes "
        f"{sorted((step, *change) for step, changes in trace.changes.items() for change in changes)})")

    boundary = scale.steps - scale.step_of_day(scale.held_out_days)
    voters, leaders = initial_cluster(scale, np.random.default_rng(arguments.seed + 1))
    clusters: dict[str, Cluster] = {}
    for policy in ("random", "hash"):
        mark = time.monotonic()
        clusters[policy] = Cluster(trace, policy, voters, leaders, arguments.moves_per_hour, arguments.seed + 2,
                                   arguments.copy_mb_s)
        clusters[policy].run(0, scale.steps)
        timings[f"simulate_{policy}_s"] = time.monotonic() - mark
        log(f"{policy}: simulated in {timings[f'simulate_{policy}_s']:.0f} s")
    mark = time.monotonic()
    least = Cluster(trace, "least-loaded", voters, leaders, arguments.moves_per_hour, arguments.seed + 2,
                    arguments.copy_mb_s)
    least.run(0, boundary)
    model_cluster = copy.deepcopy(least, {id(trace): trace})  # the cluster as it is when the model arrives
    model_cluster.policy = "model"
    planner = copy.deepcopy(least, {id(trace): trace})
    planner.policy = "planner"
    pd = copy.deepcopy(least, {id(trace): trace})
    pd.policy = "pd"
    oracle = copy.deepcopy(least, {id(trace): trace})
    oracle.policy = "oracle"
    least.run(boundary, scale.steps)
    clusters["least-loaded"] = least
    pd.run(boundary, scale.steps)
    clusters["pd"] = pd
    timings["simulate_least_loaded_s"] = time.monotonic() - mark
    log(f"least-loaded: simulated in {timings['simulate_least_loaded_s']:.0f} s")

    mark = time.monotonic()
    rows = training_rows(trace, least, np.random.default_rng(arguments.seed + 3))
    timings["rows_s"] = time.monotonic() - mark
    log(f"training rows: {len(rows):,} ({Counter(row[0] for row in rows)}) in {timings['rows_s']:.0f} s")
    mark = time.monotonic()
    document = train_model(rows, scale, boundary, arguments.master)
    timings["train_s"] = time.monotonic() - mark
    forecast = document["metrics"]
    log(f"trained in {timings['train_s']:.0f} s: rmse={forecast['rmse']:.0f} naive_rmse={forecast['naive_rmse']:.0f}")
    (out / "model.json").write_text(json.dumps(document))

    mark = time.monotonic()
    model_cluster.use_model(Forecaster.from_json(json.dumps(document)))
    model_cluster.run(boundary, scale.steps)
    clusters["model"] = model_cluster
    mark = time.monotonic()
    planner.use_model(Forecaster.from_json(json.dumps(document)))
    planner.run(boundary, scale.steps)
    clusters["planner"] = planner
    timings["simulate_planner_s"] = time.monotonic() - mark
    log(f"planner: simulated in {timings['simulate_planner_s']:.0f} s")
    timings["simulate_model_s"] = time.monotonic() - mark
    log(f"model: simulated in {timings['simulate_model_s']:.0f} s")

    mark = time.monotonic()
    oracle.predictor = OraclePredictor(oracle)
    oracle.run(boundary, scale.steps)
    clusters["oracle"] = oracle
    timings["simulate_oracle_s"] = time.monotonic() - mark

    if arguments.from_start:  # the model (in-sample before the held-out days), pd and the oracle from day 0
        for policy in ("model, day 0", "planner, day 0", "pd, day 0", "oracle, day 0"):
            mark = time.monotonic()
            cluster = Cluster(trace, policy, voters, leaders, arguments.moves_per_hour, arguments.seed + 2,
                              arguments.copy_mb_s)
            if policy.startswith(("model", "planner")):
                cluster.use_model(Forecaster.from_json(json.dumps(document)))
            elif policy.startswith("oracle"):
                cluster.predictor = OraclePredictor(cluster)
            cluster.run(0, scale.steps)
            clusters[policy] = cluster
            timings[f"simulate_{policy}_s"] = time.monotonic() - mark
            log(f"{policy}: simulated in {timings[f'simulate_{policy}_s']:.0f} s")

    capacity = CAPACITY_FACTOR * float(np.percentile(least.node_mean, 99))
    results = {policy: metrics(cluster, boundary, scale.steps, capacity, scale) for policy, cluster in
               clusters.items()}
    chart(out / "placement_eval.png", clusters, boundary, scale.steps, capacity, scale)
    timings["total_s"] = time.monotonic() - started
    report = {"scale": scale.__dict__ | {"steps": scale.steps}, "topics": len(trace.names),
              "kinds": dict(Counter(trace.kinds)), "placements": sum(len(v) for v in trace.events.values()),
              "node_changes": sorted((step, *change) for step, changes in trace.changes.items() for change in changes),
              "held_out_from_step": boundary, "capacity_bytes_s": capacity, "follower_share": FOLLOWER_SHARE,
              "capacity_factor": CAPACITY_FACTOR, "moves_per_hour": arguments.moves_per_hour,
              "recorded": {"source": recorded["source"], "topics": len(shapes), "minutes": recorded["minutes"]}
              if recorded else None,
              "forecaster": {key: forecast[key] for key in ("rmse", "mae", "naive_rmse", "naive_mae", "by_series",
                                                            "rows_train", "rows_held_out")},
              "model_version": document["model_version"], "policies": results,
              "timings_s": {key: round(value, 1) for key, value in timings.items()}}
    (out / "placement_eval.json").write_text(json.dumps(report, indent=1))

    print(f"forecaster on held-out rows: rmse={forecast['rmse']:,.0f} mae={forecast['mae']:,.0f} "
          f"naive rmse={forecast['naive_rmse']:,.0f} mae={forecast['naive_mae']:,.0f} "
          f"({forecast['rows_train']:,} training rows, {forecast['rows_held_out']:,} held out)")
    for series, figures in forecast["by_series"].items():
        print(f"  {series:6} rmse={figures['rmse']:,.0f} naive={figures['naive_rmse']:,.0f}")
    header = (f"{'policy':14} {'p99 max/mean':>12} {'p50':>6} {'p99 max/cap':>11} {'hot min':>8} {'(1 group)':>9} "
              f"{'leader mv':>9} {'replica mv':>10} {'moved GB':>9} {'grp pred rmse':>13} {'(members=queues)':>16} "
              f"{'max grp q/mean':>14}")
    print(header)
    for policy, figures in results.items():
        print(f"{policy:14} {figures['p99_max_mean']:12.3f} {figures['p50_max_mean']:6.3f} "
              f"{figures['p99_max_load_of_capacity']:11.3f} {figures['hot_minutes']:8d} "
              f"{figures['hot_minutes_one_group']:9d} {figures['leader_moves']:9d} "
              f"{figures['replica_moves']:10d} {figures['bytes_moved'] / 1e9:9.1f} "
              f"{figures['group_prediction_rmse'] / 1e6:8.2f} MB/s "
              f"{figures['group_prediction_rmse_members_queues'] / 1e6:11.2f} MB/s "
              f"{figures['max_queues_in_a_group_of_mean']:14.1f}")
    print(f"({timings['total_s']:.0f} s in all; JSON and chart in {out})")
    return results


if __name__ == "__main__":
    main()
