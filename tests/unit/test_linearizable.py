"""The linearizability checker of benchmarks/linearizable.py: hand-written histories, and generated ones that are
linearizable by construction (and stop being so when a read is changed to a value never written)."""

from __future__ import annotations

import itertools
import random
import sys
import time
from pathlib import Path

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from linearizable import Op, check  # noqa: E402

NEVER = b"never-written"


def put(t0: float, t1: float | None, value: bytes, key: str = "k", client: int = 0, ok: bool | None = True) -> Op:
    """A put; t1 None: its outcome is unknown (ok None)."""
    ok = ok if t1 is not None else None
    return Op(client=client, key=key, kind="put", value=value, invoked=t0, completed=t1, ok=ok)


def get(t0: float, t1: float | None, result: bytes | None, key: str = "k", client: int = 0) -> Op:
    """A get that saw result (None: the key was absent)."""
    return Op(client=client, key=key, kind="get", invoked=t0, completed=t1, result=result)


def cas(t0: float, t1: float | None, expected: bytes | None, value: bytes, ok: bool | None, key: str = "k",
        client: int = 0) -> Op:
    """A compare-and-set from expected (None: absent) to value."""
    return Op(client=client, key=key, kind="cas", expected=expected, value=value, invoked=t0, completed=t1, ok=ok)


def test_sequential_puts_and_gets_are_linearizable():
    history = [get(0, 1, None), put(2, 3, b"a"), get(4, 5, b"a"), put(6, 7, b"b"), get(8, 9, b"b"),
               cas(10, 11, b"b", b"c", True), cas(12, 13, b"b", b"d", False), get(14, 15, b"c")]
    assert check(history).ok is True


def test_a_stale_read_after_a_completed_put_is_not_linearizable():
    result = check([put(0, 1, b"a"), put(2, 3, b"b"), get(4, 5, b"a")])
    assert result.ok is False
    assert result.bad_keys == ["k"]
    assert "get -> b'a'" in result.details["k"]


def test_a_get_concurrent_with_a_put_may_see_either_value():
    for seen in (b"old", b"new"):
        history = [put(0, 1, b"old"), put(2, 6, b"new", client=1), get(3, 5, seen, client=2), get(7, 8, b"new")]
        assert check(history).ok is True, seen


def test_a_cas_that_succeeded_from_a_state_it_did_not_expect_is_not_linearizable():
    assert check([put(0, 1, b"a"), cas(2, 3, b"b", b"c", True)]).ok is False
    assert check([put(0, 1, b"a"), cas(2, 3, b"a", b"c", False)]).ok is False  # failed though the state matched
    assert check([cas(0, 1, None, b"c", True), get(2, 3, b"c")]).ok is True  # None expected: absent


def test_two_overlapping_cas_from_one_value_cannot_both_succeed():
    history = [put(0, 1, b"a"), cas(2, 5, b"a", b"b", True, client=1), cas(3, 6, b"a", b"c", True, client=2)]
    assert check(history).ok is False
    history[2] = cas(3, 6, b"a", b"c", False, client=2)
    assert check(history).ok is True


def test_an_unknown_put_whose_value_is_read_later_is_linearizable():
    history = [put(0, 1, b"a"), put(2, None, b"b", client=1), get(10, 11, b"a"), get(12, 13, b"b"),
               get(14, 15, b"b")]
    assert check(history).ok is True
    # Once it has taken effect, it cannot be undone: the old value again is not linearizable.
    assert check([*history, get(16, 17, b"a")]).ok is False


def test_an_unknown_put_whose_value_is_never_read_is_linearizable():
    history = [put(0, 1, b"a"), put(2, None, b"b", client=1), get(3, 4, b"a"), get(10, 11, b"a"),
               cas(12, None, b"a", b"c", None), get(13, 14, b"a")]
    assert check(history).ok is True


def test_an_op_known_to_have_ended_takes_effect_by_its_end_or_never():
    """completed set, ok None (the reply was lost, not the deadline): after completed, it can no longer happen."""
    ended = Op(client=1, key="k", kind="put", value=b"b", invoked=2, completed=3, ok=None)
    assert check([put(0, 1, b"a"), ended, get(4, 5, b"a"), get(6, 7, b"a")]).ok is True
    assert check([put(0, 1, b"a"), ended, get(4, 5, b"b"), get(6, 7, b"b")]).ok is True
    assert check([put(0, 1, b"a"), ended, get(4, 5, b"a"), get(6, 7, b"b")]).ok is False


def test_a_read_of_a_value_never_written_is_not_linearizable():
    assert check([put(0, 1, b"a"), get(0.5, 2, NEVER)]).ok is False
    assert check([get(0, 1, b"a"), put(2, 3, b"a")]).ok is False  # read before the write was invoked


def test_keys_are_checked_independently():
    history = [put(0, 1, b"a", key="good"), put(0, 1, b"a", key="bad"), get(2, 3, b"a", key="good"),
               get(2, 3, b"a", key="bad"), put(4, 5, b"b", key="bad"), get(6, 7, b"a", key="bad"),
               get(6, 7, b"a", key="good")]
    result = check(history)
    assert result.ok is False
    assert result.bad_keys == ["bad"]
    assert set(result.details) == {"bad"}
    assert result.timed_out_keys == []


def test_empty_and_dropped_histories_are_linearizable():
    assert check([]).ok is True
    assert check([get(0, None, NEVER)]).ok is True  # a get whose outcome is unknown says nothing


VALUES = [b"x", b"y", b"z"]

step = st.tuples(
    st.integers(0, 1),  # key
    st.sampled_from(["get", "put", "cas"]),
    st.integers(0, len(VALUES) - 1),  # value
    st.integers(0, len(VALUES) + 1),  # cas expected: the current state, absent, or one of VALUES
    st.floats(0, 3),  # how long before its linearization point it was invoked
    st.floats(0, 3),  # how long after it completed
    st.integers(0, 9),  # 0: its outcome is unknown
    st.booleans(),  # with an unknown outcome: whether it took effect all the same
)


def linearizable_history(steps: list[tuple[int, str, int, int, float, float, int, bool]]) -> list[Op]:
    """Ops applied in order to a dict (op i at time i), each given an interval around its linearization point."""
    model: dict[str, bytes] = {}
    history = []
    for i, (key_index, kind, value_index, expected_index, before, after, unknown, applies) in enumerate(steps):
        key, value = f"k{key_index}", VALUES[value_index]
        unknown_outcome = unknown == 0
        takes_effect = applies or not unknown_outcome
        current = model.get(key)
        completed = None if unknown_outcome else i + after
        common = {"client": i % 3, "key": key, "invoked": i - before, "completed": completed}
        if kind == "get":
            history.append(Op(kind="get", result=current, **common))
        elif kind == "put":
            if takes_effect:
                model[key] = value
            history.append(Op(kind="put", value=value, ok=None if unknown_outcome else True, **common))
        else:
            expected = current if expected_index == 0 else None if expected_index == 1 else VALUES[expected_index - 2]
            succeeded = current == expected
            if succeeded and takes_effect:
                model[key] = value
            ok = None if unknown_outcome else succeeded
            history.append(Op(kind="cas", value=value, expected=expected, ok=ok, **common))
    return history


@settings(max_examples=150, deadline=None)
@given(st.lists(step, min_size=10, max_size=60))
def test_generated_linearizable_histories_pass(steps):
    history = linearizable_history(steps)
    result = check(history)
    assert result.ok is True, result.details


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])
@given(st.lists(step, min_size=5, max_size=60), st.data())
def test_a_read_changed_to_a_value_never_written_fails(steps, data):
    history = linearizable_history(steps)
    reads = [i for i, op in enumerate(history)
             if op.kind == "get" and op.completed is not None and op.result is not None]
    assume(reads)
    i = data.draw(st.sampled_from(reads))
    changed = Op(client=history[i].client, key=history[i].key, kind="get", invoked=history[i].invoked,
                 completed=history[i].completed, result=NEVER)
    history[i] = changed
    result = check(history)
    assert result.ok is False
    assert result.bad_keys == [changed.key]
    assert result.details[changed.key]


def simulated_clients(rng: random.Random, clients: int, ops: int, unknown_rate: float,
                      unique: bool = False) -> list[Op]:
    """Clients each running one op at a time on one key; ops take effect in the order of their random linearization
    points, inside their intervals; an op of unknown outcome (a timeout) may or may not have taken effect. Values
    come from VALUES, or with unique, each write has its own."""
    planned = []  # (linearization point, client, invoked, completed)
    for client in range(clients):
        t = rng.uniform(0, 1)
        for _ in range(ops // clients):
            point = t + rng.uniform(0, 1)
            completed = point + rng.uniform(0, 1)
            planned.append((point, client, t, completed))
            t = completed + rng.uniform(0, 0.2)
    planned.sort()
    state: bytes | None = None
    written = list(VALUES)
    history = []
    for n, (_, client, invoked, completed) in enumerate(planned):
        unknown = rng.random() < unknown_rate
        effect = not unknown or rng.random() < 0.5
        end = None if unknown else completed
        value = f"v{n}".encode() if unique else rng.choice(VALUES)
        roll = rng.random()
        if roll < 0.5:
            history.append(Op(client=client, key="k", kind="get", invoked=invoked, completed=end, result=state))
        elif roll < 0.75:
            history.append(Op(client=client, key="k", kind="put", value=value, invoked=invoked, completed=end,
                              ok=None if unknown else True))
            state = value if effect else state
        else:
            expected = state if rng.random() < 0.5 else rng.choice([None, *written[-5:]])
            succeeded = state == expected
            history.append(Op(client=client, key="k", kind="cas", expected=expected, value=value, invoked=invoked,
                              completed=end, ok=None if unknown else succeeded))
            state = value if succeeded and effect else state
        written.append(value)
    rng.shuffle(history)  # the checker must not rely on the order it is given
    return history


def last_read_changed(history: list[Op]) -> list[Op]:
    """The history with its last read of a value (by invocation) changed to NEVER."""
    last = max((i for i, op in enumerate(history) if op.kind == "get" and op.completed is not None
                and op.result is not None), key=lambda i: history[i].invoked)
    op = history[last]
    changed = Op(client=op.client, key=op.key, kind="get", invoked=op.invoked, completed=op.completed, result=NEVER)
    return [*history[:last], changed, *history[last + 1:]]


def test_three_clients_two_thousand_ops_on_one_key():
    history = simulated_clients(random.Random(20240601), clients=3, ops=2001, unknown_rate=0.02)
    assert len(history) == 2001
    started = time.perf_counter()
    result = check(history, time_limit_s=20.0)
    elapsed = time.perf_counter() - started
    assert result.ok is True, (result, elapsed)
    print(f"checked {len(history)} ops of 3 clients in {elapsed:.3f} s")


def test_three_clients_two_thousand_ops_with_a_bad_read_at_the_end():
    """The search has to rule out every linearization of all the ops before it (each write its own value: with a
    few values shared by many writes of unknown outcome, it can take longer than any time limit)."""
    history = simulated_clients(random.Random(7), clients=3, ops=2001, unknown_rate=0.02, unique=True)
    assert check(history, time_limit_s=20.0).ok is True
    started = time.perf_counter()
    result = check(last_read_changed(history), time_limit_s=20.0)
    elapsed = time.perf_counter() - started
    assert result.ok is False, (result, elapsed)
    assert "never-written" in result.details["k"]
    print(f"found the bad read among {len(history)} ops in {elapsed:.3f} s")


def brute_force(history: list[Op]) -> bool:
    """Linearizable, by trying every order of every choice of the ops of unknown outcome to take effect."""
    ops = [op for op in history if not (op.kind == "get" and op.completed is None)
           and not (op.kind == "put" and op.ok is False and op.completed is not None)]
    unknown = [op for op in ops if op.completed is None or (op.kind != "get" and op.ok is None)]
    known = [op for op in ops if op not in unknown]
    for r in range(len(unknown) + 1):
        for taking_effect in itertools.combinations(unknown, r):
            for order in itertools.permutations([*known, *taking_effect]):
                if any(later.completed is not None and later.completed < earlier.invoked
                       for n, earlier in enumerate(order) for later in order[n + 1:]):
                    continue
                state: bytes | None = None
                for op in order:
                    if (op.kind == "get" and op.result != state) or (op.kind == "cas" and (
                            (op.ok is False) == (op.expected == state))):
                        break
                    if op.kind == "put" or (op.kind == "cas" and op.ok is not False):
                        state = op.value
                else:
                    return True
    return False


@st.composite
def small_op(draw: st.DrawFn) -> Op:
    """Any op on a few values and short times: most histories of them are not linearizable."""
    kind = draw(st.sampled_from(["get", "put", "cas"]))
    invoked, unknown = draw(st.integers(0, 5)), draw(st.booleans())
    completed = None if unknown else invoked + draw(st.integers(0, 3))
    if kind == "get":
        return Op(client=0, key="k", kind="get", invoked=invoked, completed=completed,
                  result=draw(st.sampled_from([b"a", b"b", None])))
    ok = None if unknown else draw(st.sampled_from([True, False, None]))
    expected = draw(st.sampled_from([b"a", b"b", None])) if kind == "cas" else None
    value = draw(st.sampled_from([b"a", b"b"]))
    return Op(client=0, key="k", kind=kind, invoked=invoked, completed=completed, value=value, expected=expected, ok=ok)


@settings(max_examples=300, deadline=None)
@given(st.lists(small_op(), max_size=5))
def test_small_histories_agree_with_brute_force(history):
    assert check(history).ok is brute_force(history), [op.describe() for op in history]
