"""The append times a group's leader stamps on what it appends: never backwards within a queue. A part of
StorageRole, shared by appends, timers and transactions.
"""

from __future__ import annotations

from rocket import limits
from rocket.clock import Clock


class AppendStamps:
    """Append times never go backwards within a queue on this leader; replicas take the stamp. The least recently
    appended of limits.append_stamp_queues_max queues goes, its time kept in a floor all stamps keep."""

    def __init__(self, clock: Clock):
        self.clock = clock
        # (topic, queue) -> its last append time, most recent last: limits.append_stamp_queues_max
        self.last_ms: dict[tuple[str, int], int] = {}
        self.floor_ms = 0  # the latest time of the queues dropped from it

    def stamp(self, topic: str, queue: int) -> int:
        stamps = self.last_ms
        append_ms = max(self.clock.wall_ms(), stamps.pop((topic, queue), self.floor_ms))
        stamps[(topic, queue)] = append_ms  # at the end: the dict is in the order queues were last appended to
        if len(stamps) > limits.append_stamp_queues_max:
            oldest = next(iter(stamps))
            self.floor_ms = max(self.floor_ms, stamps.pop(oldest))
        return append_ms
