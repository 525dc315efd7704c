"""The clock a node's runners read (DESIGN.md rule 2): wall time, for what is stamped, stored or sent (append
times, deadlines in epoch ms), and monotonic time, trio's clock, for ages and intervals. node.py gives the roles
one; a simulator gives them one whose wall time moves with trio's MockClock, so both kinds of time jump together.
"""

from __future__ import annotations

import time

import trio


class Clock:
    """Real time: wall time from time.time(), monotonic time from trio.current_time() (which follows a MockClock
    where trio runs on one)."""

    def wall_s(self) -> float:
        return time.time()

    def wall_ms(self) -> int:
        return int(self.wall_s() * 1000)

    def now_s(self) -> float:
        return trio.current_time()


class TrioWallClock(Clock):
    """Wall time that moves only with trio's clock: epoch_s + trio.current_time(). Under a MockClock, a jump
    over idle time moves wall time by as much, and a run replays to the same timestamps."""

    def __init__(self, epoch_s: float):
        self.epoch_s = epoch_s

    def wall_s(self) -> float:
        return self.epoch_s + trio.current_time()
