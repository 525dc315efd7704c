"""rocket/parked.py: every parked slot completes exactly once, whatever order results, failures, sweeps and late
results come in."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from rocket.errors import Code, RocketError
from rocket.parked import Deadlines, Slot


def test_a_slot_completes_once_and_drops_what_comes_later():
    finished = []
    slot = Slot(finished.append)
    late = Slot.late
    assert slot.complete(1)
    assert not slot.complete(RocketError(Code.TIMEOUT, "late"))
    assert finished == [1] and Slot.late == late + 1


def test_then_transforms_values_and_passes_errors_and_turns_a_bug_into_internal():
    finished = []
    assert Slot(finished.append).then(lambda value: value * 2).complete(21)
    error = RocketError(Code.UNAVAILABLE, "lost")
    Slot(finished.append).then(lambda value: value * 2).complete(error)
    Slot(finished.append).then(lambda value: 1 / value).complete(0)
    Slot(finished.append).then(lambda value: (_ for _ in ()).throw(RocketError(Code.BAD_REQUEST, "no"))).complete(0)
    assert finished[:2] == [42, error]
    assert finished[2].code == Code.INTERNAL and "ZeroDivisionError" in finished[2].message
    assert finished[3].code == Code.BAD_REQUEST


def test_a_finish_that_raises_is_logged_not_raised(caplog):
    def broken(outcome):
        raise ValueError("a bug in an answer")
    assert Slot(broken).complete(1)  # the round loop that completed it goes on
    assert "completion failed" in caplog.text


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["add", "result", "sweep"]), st.integers(0, 30)), max_size=120))
def test_every_slot_completes_exactly_once_under_any_interleaving(steps):
    """Slots added with one timeout, results arriving for any slot (twice too, or after their sweep), sweeps at any
    time: each finish runs once, and once the clock passed every deadline a sweep leaves none waiting."""
    timeout, now = 5, 0
    sweep, slots, finished = Deadlines(), [], []
    for action, number in steps:
        now += 1
        if action == "add":
            slot = Slot(lambda outcome, n=len(slots): finished.append(n), deadline=now + timeout)
            slots.append(slot)
            sweep.add(slot)
        elif action == "result" and slots:
            slots[number % len(slots)].complete("applied")
        elif action == "sweep":
            sweep.sweep(now, lambda: RocketError(Code.TIMEOUT, "swept"))
    sweep.sweep(now + timeout, lambda: RocketError(Code.TIMEOUT, "swept"))
    assert sorted(finished) == list(range(len(slots)))
    assert len(sweep) == 0 and all(slot.done for slot in slots)
