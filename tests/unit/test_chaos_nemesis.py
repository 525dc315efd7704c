"""benchmarks/chaos.py's pure parts: the seeded fault plan, the proxies' cuts for each partition shape (and for
partitions that overlap), which early deliveries a clock jump explains, the comparison of replicas' copies, and the
logs' tracebacks counted."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from chaos import KINDS, ROLLING_AT, Fault, Partitions, caller, differ, excused, plan, rss_slopes  # noqa: E402
from kill_loop import NAMES, make_cluster, scan_logs  # noqa: E402

SECONDS = 300.0


def test_the_plan_comes_from_the_seed_and_keeps_to_its_kinds():
    assert plan(3, SECONDS, NAMES, KINDS) == plan(3, SECONDS, NAMES, KINDS)
    assert plan(3, SECONDS, NAMES, KINDS) != plan(4, SECONDS, NAMES, KINDS)
    faults = plan(3, SECONDS, NAMES, KINDS)
    assert {fault.kind for fault in faults} == set(KINDS)
    assert [fault.at_s for fault in faults] == sorted(fault.at_s for fault in faults)
    rolling = [fault for fault in faults if fault.kind == "rolling"]
    assert len(rolling) == 1 and rolling[0].at_s == SECONDS * ROLLING_AT
    for fault in faults:  # a node carries one fault of a kind at a time
        assert not [other for other in faults if other is not fault and (other.kind, other.node) == (
            fault.kind, fault.node) and fault.at_s <= other.at_s < fault.at_s + fault.for_s]
    for fault in faults:
        name = NAMES[fault.node]
        if fault.kind in ("slow_disk", "full_disk"):
            assert name.startswith("storage")
        if fault.kind == "partition":
            assert fault.shape in ("in", "isolated", "split")
            assert fault.minority == ((fault.node, *fault.minority[1:]) if fault.shape == "split" else ())
            assert len({NAMES[node][0] for node in fault.minority}) == len(fault.minority)  # one of each kind
    assert {NAMES[fault.node][0] for fault in faults if fault.kind == "partition"} == {"n", "s", "b"}  # every kind
    without = plan(3, SECONDS, NAMES, ("kill", "partition"))
    assert {fault.kind for fault in without} == {"kill", "partition"}


class FakeProxy:
    def __init__(self):
        self.callers: frozenset[str] | None = frozenset()
        self.reset = False

    def cut(self, callers, reset: bool) -> None:
        self.callers, self.reset = callers, reset


def partitions(tmp_path) -> tuple[Partitions, dict[int, FakeProxy], dict]:
    nodes = make_cluster(tmp_path)
    proxies = {node: FakeProxy() for node in NAMES}
    return Partitions(nodes, proxies), proxies, nodes  # type: ignore[arg-type]


def test_each_partition_shape_cuts_its_callers(tmp_path):
    cut, proxies, nodes = partitions(tmp_path)
    storage1, storage2, broker1 = 11, 12, 21
    assert cut.cuts(Fault("partition", storage1, 0, 1, shape="in")) == {storage1: None}
    isolated = cut.cuts(Fault("partition", storage1, 0, 1, shape="isolated"))
    assert isolated[storage1] is None
    assert all(isolated[proxy] == {caller(nodes[storage1])} for proxy in proxies if proxy != storage1)
    nameserver = cut.cuts(Fault("partition", 1, 0, 1, shape="isolated"))  # ns1, from its raft peers too
    assert nameserver[1] is None and nameserver[2] == nameserver[storage1] == {caller(nodes[1])}
    split = cut.cuts(Fault("partition", storage1, 0, 1, shape="split", minority=(storage1, broker1)))
    inside = {caller(nodes[storage1]), caller(nodes[broker1])}
    assert split[storage2] == inside and split[22] == inside
    assert split[storage1] == split[broker1] == {cut.harness} | {caller(node) for node in nodes.values()} - inside
    assert all(caller(node) not in caller(other) for node in nodes.values() for other in nodes.values()
               if other is not node)  # data1 is not taken for data11

    first = cut.apply(Fault("partition", storage1, 0, 1, severity=1.0, shape="isolated"))
    second = cut.apply(Fault("partition", storage2, 0, 1, shape="in"))
    assert proxies[storage1].callers is None and proxies[storage1].reset
    assert proxies[storage2].callers is None and proxies[storage2].reset  # one of its partitions resets
    assert proxies[broker1].callers == {caller(nodes[storage1])}
    cut.heal(first)
    assert proxies[storage1].callers == frozenset() and proxies[broker1].callers == frozenset()
    assert proxies[storage2].callers is None and not proxies[storage2].reset
    cut.heal(second)
    assert all(proxy.callers == frozenset() for proxy in proxies.values())


def test_a_clock_ahead_on_a_storage_node_explains_early_deliveries_it_could_have_caused():
    names = {11: "storage1", 1: "ns1"}
    jumps = [(11, 30.0, 100.0, 120.0), (1, 60.0, 100.0, 200.0)]  # storage1 30 s ahead from 100 to 120 s
    early = [("a", 5_000, 110_000),  # received in the jump, 5 s early
             ("b", 40_000, 110_000),  # more than 30 s early
             ("c", 5_000, 90_000),  # before the jump
             ("d", 5_000, 130_000),  # due at 135 s: fired at 105 s by the clock ahead, received later
             ("e", 1_000, 160_000)]  # due at 161 s: after the jump, 131 s is past its end
    still, by_clock = excused(early, jumps, names)
    assert [key for key, _, _ in by_clock] == ["a", "d"]
    assert [key for key, _, _ in still] == ["b", "c", "e"]
    assert excused(early, [(11, -30.0, 100.0, 120.0)], names) == (early, [])  # a clock behind fires late


def test_copies_are_compared_where_each_has_batches_and_below_the_shortest_end():
    same = {0: b"a", 10: b"b", 20: b"c"}
    assert differ([(same, 30), (dict(same), 30), (dict(same), 30)]) == (3, None)
    assert differ([(same, 30), ({0: b"a", 10: b"b"}, 20)]) == (2, None)  # lagging behind
    assert differ([(same, 30), ({20: b"c"}, 30)]) == (1, None)  # installed a snapshot, not backfilled yet
    assert differ([(same, 30), ({0: b"a", 10: b"X", 20: b"c"}, 30)]) == (3, 10)
    assert differ([(same, 30), ({0: b"a", 12: b"b", 20: b"c"}, 30)]) == (3, 10)  # other batch boundaries


def test_rss_is_judged_per_process_over_the_last_half_past_its_warm_up():
    flat = [(float(at), 11, 1, 100_000_000) for at in range(0, 400, 2)]
    growing = [(float(at), 12, 1, 100_000_000 + at * 100_000) for at in range(0, 400, 2)]  # +20 MB over the half
    restarted = ([(float(at), 13, 1, 100_000_000) for at in range(0, 250, 2)]
                 + [(float(at), 13, 2, 50_000_000 + (at - 250) * 1_000_000 if at < 280 else 80_000_000)
                    for at in range(250, 400, 2)])  # warms up for 30 s, then flat
    short = [(float(at), 21, 1, 100_000_000) for at in range(0, 210, 2)] + [
        (float(at), 21, 2, 10_000_000 + at * 1_000_000) for at in range(210, 300, 2)]  # too short a life to judge
    slopes = rss_slopes(flat + growing + restarted + short, half_at=200.0)
    assert slopes[11] == 0.0 and 0.15 < slopes[12] < 0.2
    assert abs(slopes[13]) < 0.01  # its first process's last 50 s too short; its second past its warm-up, flat
    assert 21 not in slopes


def test_the_log_scan_counts_each_traceback_an_exception_groups_once(tmp_path):
    """An exception group's traceback (a node that stopped on errors in two tasks at once) is counted, once."""
    (tmp_path / "node12.log").write_text(
        "2026-12-07 04:27:59,101 INFO rocket.node: stopped\n"
        "Traceback (most recent call last):\n  File \"x.py\", line 1, in <module>\nValueError\n"
        "  + Exception Group Traceback (most recent call last):\n  |   File \"y.py\", line 2, in run\n"
        "    | Exception Group Traceback (most recent call last):\n      | Traceback (most recent call last):\n")
    assert scan_logs(tmp_path)["node12.log"]["tracebacks"] == 2
