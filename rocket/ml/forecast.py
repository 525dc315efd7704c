"""The load forecaster's features (queue_features), model file and scorer (Forecaster), issue 30. Pure: no I/O, no
clock, no pyspark. One definition of the features serves the PySpark job and the nameserver alike."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import cast

from rocket.ml.trees import ModelError, check_header, check_trees, ensemble_sum, parse

STEP_MS = 60_000  # one step of a queue's history
TARGET = "relative_change"  # what the trees predict: (bytes/s over the horizon - rate_1m) / scale
MODEL_FORMAT = "rocket.forecast"
MODEL_VERSION = 2  # 1: features in bytes/s, targets "level" and "change"
FEATURES = (
    "rate_1m",  # bytes/s in over the last step: the naive forecast the trees correct
    "scale",  # bytes/s: the larger of rate_10m and rate_60m, at least 1; the unit of the trees' output
    "log_scale",  # log10(scale)
    "last_1m",  # rate_1m / scale
    "last_10m",  # the mean of the last 10 steps / scale
    "last_60m",  # ... of the last 60 steps / scale
    "busiest_10m",  # the busiest of the last 10 steps / scale
    "trend_10m",  # (the last 10 steps' mean less the 10 steps' before them) / scale
    "hour_sin", "hour_cos",  # the time of day (UTC), on a circle
    "weekday_sin", "weekday_cos",  # the day of the week, on a circle
    "age_h",  # hours since the queue's first step with traffic (capped: see AGE_H_MAX)
    "topic_queues",  # queues of its topic
    "topic_share",  # its 10-step mean / its topic's (1 for a topic, a group, or a topic without traffic)
)
CALENDAR = slice(FEATURES.index("hour_sin"), FEATURES.index("weekday_cos") + 1)
SCALE_MIN = 1.0  # bytes/s
CHANGE_MAX = 10.0  # scales: the trees' correction is within +-this (training clips its targets, the scorer its sum)
AGE_H_MAX = 24 * 90  # older than this counts as this old: a model trained on 30 days knows no older queue


def window_mean(steps: Mapping[int, float], last_step: int, count: int) -> float:
    """The mean of steps last_step-count+1 .. last_step, a missing step counting 0."""
    return sum(steps.get(step, 0.0) for step in range(last_step - count + 1, last_step + 1)) / count


def queue_features(steps: Mapping[int, float], now_ms: int, first_step: int, topic_queues: int,
                   topic_rate_10m: float) -> list[float]:
    """The feature vector (in FEATURES order) of a queue at now_ms, from its history: step number (ms // STEP_MS) ->
    mean bytes/s in. Only steps before now's step count (now's is not over).

    One definition of the features serves both sides: the PySpark job (jobs/features.py) calls this inside its
    executors to build the training rows, and the nameserver calls it at placement time, so a model never sees
    features computed differently from those it was trained on. A queue's history is its bytes/s in, in one-minute
    steps, as the telemetry of its group's leader reported it (`rocket_queue_in_bytes_total`'s rate, averaged per
    step). A queue reports only when it moved: a missing step is an idle minute, 0 bytes/s.

    The features are scale-free: a queue's rates are divided by its `scale` (the larger of its 10- and 60-minute
    means, at least 1 byte/s; see Forecaster.predict for why)."""
    last = now_ms // STEP_MS - 1
    rate_1m = steps.get(last, 0.0)
    rate_10m = window_mean(steps, last, 10)
    rate_60m = window_mean(steps, last, 60)
    scale = max(rate_10m, rate_60m, SCALE_MIN)
    day_fraction = (now_ms % 86_400_000) / 86_400_000
    week_fraction = ((now_ms // 86_400_000 + 3) % 7 + day_fraction) / 7  # 1970-01-01 was a Thursday: Monday is 0
    age_h = min(max(0.0, (last - first_step + 1) * STEP_MS / 3_600_000), AGE_H_MAX)
    return [
        rate_1m,
        scale,
        math.log10(scale),
        rate_1m / scale,
        rate_10m / scale,
        rate_60m / scale,
        max(steps.get(step, 0.0) for step in range(last - 9, last + 1)) / scale,
        (rate_10m - window_mean(steps, last - 10, 10)) / scale,
        math.sin(2 * math.pi * day_fraction), math.cos(2 * math.pi * day_fraction),
        math.sin(2 * math.pi * week_fraction), math.cos(2 * math.pi * week_fraction),
        age_h,
        float(topic_queues),
        min(rate_10m / topic_rate_10m, 1.0) if topic_rate_10m > 0 else 1.0,
    ]


def future_rate(steps: Mapping[int, float], now_ms: int, horizon_steps: int) -> float:
    """What the forecaster learns to predict: the mean bytes/s in over the horizon from now's step on."""
    first = now_ms // STEP_MS
    return window_mean(steps, first + horizon_steps - 1, horizon_steps)


class Forecaster:
    """A gradient-boosted ensemble of regression trees: the prediction is the weighted sum of the trees' leaves.
    A node is {"feature": index, "threshold": t, "left": node, "right": node} (left when x[feature] <= t), or a
    leaf {"value": v}.

    The model file is JSON (`MODEL_FORMAT`, version `MODEL_VERSION`): the feature names in order, the horizon it
    predicts, the trees of a gradient-boosted ensemble with their weights, the target, and the training metrics.
    `from_json` refuses a file that is not exactly that, with one line saying why (ModelError), and the caller falls
    back to a heuristic."""

    def __init__(self, document: dict):
        self.document = document
        self.version: str = document["model_version"]
        self.horizon_steps: int = document["horizon_steps"]
        self.trees = [(tree["weight"], tree["root"]) for tree in document["trees"]]
        self.metrics: dict = document["metrics"]

    @classmethod
    def from_json(cls, text: str | bytes) -> Forecaster:
        document = parse(text)
        check_model(document)
        return cls(cast(dict, document))  # check_model raised unless it is an object

    def predict(self, features: Sequence[float]) -> float:
        """Bytes/s in over the horizon; never negative (a tree may extrapolate below zero). The trees predict the
        change from rate_1m (the "last value" forecast) in units of the queue's scale (`TARGET`): the prediction is
        rate_1m + scale x the trees' sum. So the trees only correct the naive forecast, and what they learn of a
        1 KB/s queue after a burst applies to a 100 MB/s one: topic sizes are heavy-tailed, and trees on raw bytes/s
        cannot carry a pattern from one size to another, nor reach past the levels they were trained on."""
        total = min(max(ensemble_sum(self.trees, features), -CHANGE_MAX), CHANGE_MAX)
        return max(0.0, features[0] + features[1] * total)  # rate_1m + scale x the correction


def check_model(document: object) -> None:
    """Raise ModelError unless document is a forecaster this code can score: the format and version, the same
    features in the same order, and trees whose every node is well formed."""
    check_header(document, MODEL_FORMAT, MODEL_VERSION, FEATURES)
    document = cast(dict, document)  # check_header raised unless it is an object
    horizon = document.get("horizon_steps")
    if not isinstance(horizon, int) or isinstance(horizon, bool) or not 1 <= horizon <= 7 * 24 * 60:
        raise ModelError(f"horizon_steps must be 1..10080 steps of a minute, got {horizon!r}")
    if document.get("target") != TARGET:
        raise ModelError(f"target must be {TARGET!r}, got {document.get('target')!r}")
    check_trees(document.get("trees"), len(FEATURES))
