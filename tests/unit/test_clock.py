"""The grid the node's periodic loops wait on (clock.on_the_grid, sleep_periodic): each loop passes once per period,
and loops of periods that divide one another wake at the same instants, one wake-up of the process for all."""

from __future__ import annotations

import random

import pytest
import trio
import trio.testing

from rocket.clock import on_the_grid, sleep_periodic


@pytest.mark.parametrize("period_s", [0.05, 0.1, 0.25, 0.5, 1.0, 2.0])
def test_the_next_grid_time_is_always_ahead_and_within_a_period(period_s):
    """However the clock lands, also on a multiple the division rounds down onto: a loop never passes twice at one
    instant (under a MockClock, that would spin without time moving)."""
    clock = trio.testing.MockClock()

    async def main() -> None:
        rng = random.Random(7)
        for step in range(20_000):
            clock.jump(rng.choice([rng.random() * 0.3, period_s, 3 * period_s, 0.1]))
            now = trio.current_time()
            due = on_the_grid(period_s)
            assert now < due <= now + period_s * (1 + 1e-9), (step, now, due)

    trio.run(main, clock=clock)


@pytest.mark.parametrize("period_s", [0.05, 0.1, 0.3, 0.25, 1.0])
async def test_a_loop_passes_once_per_period_on_the_multiples_it_lands_on(autojump_clock, period_s):
    """Under an autojump clock each pass lands exactly on the multiple it waited for, where the division may round
    down (43 * 0.1 / 0.1 < 43): the next wait still ends a period later."""
    passes = []
    for _ in range(500):
        await sleep_periodic(period_s)
        passes.append(trio.current_time())
    assert all(abs(b - a - period_s) < 1e-6 for a, b in zip(passes, passes[1:]))


async def test_loops_of_periods_that_divide_one_another_wake_together(autojump_clock):
    woken: dict[float, list[float]] = {0.5: [], 1.0: []}

    async def loop(period_s: float) -> None:
        await trio.sleep(0.137)  # started out of phase
        for _ in range(6 if period_s == 0.5 else 3):
            await sleep_periodic(period_s)
            woken[period_s].append(trio.current_time())

    async with trio.open_nursery() as nursery:
        nursery.start_soon(loop, 0.5)
        nursery.start_soon(loop, 1.0)
    assert woken[1.0] == woken[0.5][1::2]  # every wake-up of the slower loop is one of the faster loop's
    assert [round(b - a, 9) for a, b in zip(woken[0.5], woken[0.5][1:])] == [0.5] * 5
