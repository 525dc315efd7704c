"""The clock a node's runners read (DESIGN.md rule 2): wall time, for what is stamped, stored or sent (append
times, deadlines in epoch ms), and monotonic time, trio's clock, for ages and intervals. node.py gives the roles
one; a simulator gives them one whose wall time moves with trio's MockClock, so both kinds of time jump together.
"""

from __future__ import annotations

import math
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


def on_the_grid(period_s: float) -> float:
    """The next time on trio's clock that is a whole multiple of period_s. Periodic loops that wait for it wake
    together, one wake-up of the process for all of them (as the kernel rounds timers: round_jiffies), where each
    waiting period_s from its own last pass would wake it on a phase of its own. A loop still passes once per period."""
    # A time within a millionth of a period of a multiple counts as on it: landing there (an autojump clock lands
    # exactly on the multiple waited for), the division may round down (43 * 0.1 / 0.1 < 43), or the product up.
    return (math.floor(trio.current_time() / period_s + 1e-6) + 1) * period_s


async def sleep_periodic(period_s: float) -> None:
    """Sleep until on_the_grid(period_s): the wait between the passes of a loop that runs every period_s."""
    await trio.sleep_until(on_the_grid(period_s))
