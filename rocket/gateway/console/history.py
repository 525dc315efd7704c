"""The console's own rate history (pure): one point per sample (every 10 s by default, 360 of them: the last hour),
each the per-topic totals the console read (messages ever stored: the sum of the queues' next offsets; bytes
stored), and the rates between consecutive points."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Totals:
    messages: int  # the sum of the topic's queues' next offsets: every message ever stored, whatever was dropped
    bytes: int  # bytes stored now, locally and in the tier
    created_ms: int = 0


@dataclass(frozen=True, slots=True)
class Rate:
    wall_ms: int  # the end of the interval
    messages_s: float
    bytes_s: float


class RateHistory:
    def __init__(self, points_max: int = 360):
        self.points: deque[tuple[int, dict[str, Totals]]] = deque(maxlen=points_max)

    def add(self, wall_ms: int, totals: dict[str, Totals]) -> None:
        if self.points and wall_ms <= self.points[-1][0]:
            return  # a wall clock stepped back: the interval would mean nothing
        self.points.append((wall_ms, dict(totals)))

    def rates(self, topic: str | None = None) -> list[Rate]:
        """The rates between consecutive points, of one topic or (None) summed over every topic. A topic counts in an
        interval where both points hold it, or where it was created after the first (its totals started at 0); bytes
        that shrank (retention) count as none in."""
        found: list[Rate] = []
        for (start_ms, before), (end_ms, after) in zip(self.points, list(self.points)[1:]):
            seconds = (end_ms - start_ms) / 1000
            messages = stored = 0
            for name, now in after.items():
                if topic is not None and name != topic:
                    continue
                then = before.get(name)
                if then is None:
                    if now.created_ms < start_ms:
                        continue  # not read at the first point (a failed read, or over the cap): unknown
                    then = Totals(0, 0, now.created_ms)
                messages += max(0, now.messages - then.messages)
                stored += max(0, now.bytes - then.bytes)
            found.append(Rate(end_ms, messages / seconds, stored / seconds))
        return found

    def latest(self, topic: str | None = None) -> Rate | None:
        rates = self.rates(topic) if len(self.points) >= 2 else []
        return rates[-1] if rates else None
