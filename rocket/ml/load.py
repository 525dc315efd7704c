"""What the nameserver knows of traffic (LoadHistory: one-minute steps per group and per topic), and what it predicts
of it (a Predictor: ModelPredictor with a trained forecaster, RecentPredictor with the last 10 minutes), issue 30.
Pure: no I/O, no clock."""

from __future__ import annotations

from collections.abc import Hashable
from typing import Protocol

from rocket import limits
from rocket.ml.forecast import STEP_MS, Forecaster, queue_features, window_mean
from rocket.ml.trees import finite


class LoadHistory:
    """Bytes per one-minute step of each series (a group, a topic), kept for the last limits.load_history_steps
    steps; a series with no bytes for that long is forgotten. Storage nodes report, with each heartbeat, the bytes
    appended since their last one to the groups they lead, per group and per topic: they are added up here into
    steps of forecast.STEP_MS."""

    def __init__(self) -> None:
        self._steps: dict[Hashable, dict[int, float]] = {}
        self._first: dict[Hashable, int] = {}  # series -> its first step with bytes

    def add(self, series: Hashable, at_ms: int, byte_count: float) -> None:
        if byte_count <= 0:
            return
        step = at_ms // STEP_MS
        steps = self._steps.setdefault(series, {})
        steps[step] = steps.get(step, 0.0) + byte_count
        self._first.setdefault(series, step)

    def forget_before(self, now_ms: int) -> None:
        """Drop steps older than the window, and series left with none."""
        oldest = now_ms // STEP_MS - limits.load_history_steps
        for series in list(self._steps):
            steps = self._steps[series]
            for step in [step for step in steps if step < oldest]:
                del steps[step]
            if not steps:
                del self._steps[series]
                self._first.pop(series, None)

    def rates(self, series: Hashable) -> dict[int, float]:
        """Step -> mean bytes/s in that step."""
        return {step: total * 1000 / STEP_MS for step, total in self._steps.get(series, {}).items()}

    def first_step(self, series: Hashable, now_ms: int) -> int:
        return self._first.get(series, now_ms // STEP_MS)

    def __len__(self) -> int:
        return len(self._steps)


class Predictor(Protocol):
    name: str
    error_bytes_s: float  # how far off its group predictions are (RMSE, bytes/s): leader balancing's tolerance

    def predict(self, history: LoadHistory, series: Hashable, now_ms: int, *, members: int = 1,
                context: Hashable | None = None) -> float:
        """Bytes/s the series is expected to carry over the horizon. members and context: the size of the
        series' family and the series of the family (a topic for a queue); by default the series itself."""
        ...


def group_error(metrics: dict) -> float:
    """A model's RMSE on the groups' held-out load (bytes/s over the horizon), as the training job measured it
    (metrics.by_series.group.rmse); 0 where it is missing or not a finite number at least 0."""
    by_series = metrics.get("by_series")
    group = by_series.get("group") if isinstance(by_series, dict) else None
    rmse = group.get("rmse") if isinstance(group, dict) else None
    return float(rmse) if isinstance(rmse, (int, float)) and finite(rmse) and rmse >= 0 else 0.0


class RecentPredictor:
    """The fallback without a (valid, fresh) model: the next minutes look like the last ten."""

    name = "recent load (no model)"
    error_bytes_s = 0.0  # its error on groups is not measured

    def predict(self, history: LoadHistory, series: Hashable, now_ms: int, *, members: int = 1,
                context: Hashable | None = None) -> float:
        return window_mean(history.rates(series), now_ms // STEP_MS - 1, 10)


class ModelPredictor:
    """The trained forecaster, fed the same features the Spark job trained it on."""

    def __init__(self, model: Forecaster):
        self.model = model
        self.name = f"model {model.version}"
        self.error_bytes_s = group_error(model.metrics)

    def predict(self, history: LoadHistory, series: Hashable, now_ms: int, *, members: int = 1,
                context: Hashable | None = None) -> float:
        steps = history.rates(series)
        family = history.rates(context) if context is not None else steps
        features = queue_features(steps, now_ms, history.first_step(series, now_ms), members,
                                  window_mean(family, now_ms // STEP_MS - 1, 10))
        return self.model.predict(features)
