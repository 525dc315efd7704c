"""The PD-style baseline (rocket.ml.placement.hot_group_move, after TiKV PD's hot-region scheduler): one move by the
flow groups carry now, leadership first, replicas where no voter can take it, and none that would swap back. The
forecast planner (forecast_move) searches the same way, and makes a move only when it pays for itself."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from rocket import limits
from rocket.ml.placement import GroupLoad, Move, forecast_move, hot_group_move, node_flows

NODES = [1, 2, 3, 4]


def test_a_hot_leader_goes_to_a_cool_voter():
    """Node 1 leads the hot groups 10 and 13: group 10's leadership goes to its cooler follower, 3 (node 2 is near
    the mean: no target)."""
    groups = [GroupLoad(10, 1, 60.0, 1), GroupLoad(13, 1, 60.0, 1), GroupLoad(11, 2, 20.0, 1),
              GroupLoad(12, 4, 20.0, 1)]
    voters = {10: (1, 2, 3), 13: (1, 2, 4), 11: (2, 3, 4), 12: (2, 3, 4)}
    assert hot_group_move(groups, voters, NODES) == Move(10, 1, 3, True)


def test_a_replica_moves_when_no_voter_can_take_the_leadership():
    """Group 10's voters are all hot; node 4 holds nothing: the hottest node's replica of it goes to node 4, with
    the leadership it held."""
    groups = [GroupLoad(10, 1, 100.0, 1), GroupLoad(11, 2, 90.0, 1), GroupLoad(12, 3, 90.0, 1)]
    voters = {10: (1, 2, 3), 11: (1, 2, 3), 12: (1, 2, 3)}
    assert hot_group_move(groups, voters, NODES) == Move(10, 1, 4, False)
    # Node 4 holding as many replicas as the others (of cold groups): a replica moved there would be moved back by
    # the balancing of replica counts, so none goes.
    cold = {group: (4, *[(1, 2), (2, 3), (3, 1)][group % 3]) for group in range(20, 29)}  # 9 replicas on each
    assert hot_group_move(groups + [GroupLoad(group, 4, 0.0, 1) for group in cold], voters | cold, NODES) is None


def test_balanced_nodes_and_moves_that_would_swap_back_are_left_alone():
    even = [GroupLoad(group, node, 50.0, 1) for group, node in zip(range(10, 14), NODES)]
    voters = {10: (1, 2, 3), 11: (2, 3, 4), 12: (3, 4, 1), 13: (4, 1, 2)}
    assert hot_group_move(even, voters, NODES) is None
    # One group carries nearly everything: wherever it goes, that node is as hot as node 1 was.
    alone = [GroupLoad(10, 1, 1000.0, 1), GroupLoad(11, 2, 1.0, 1)]
    assert hot_group_move(alone, {10: (1, 2, 3), 11: (2, 3, 4)}, NODES) is None


@given(st.lists(st.floats(0, 1e6), min_size=4, max_size=12), st.randoms(use_true_random=False))
def test_repeated_moves_lower_the_hottest_node_and_stop(flows, random):
    """Applied one after another, the moves never raise the hottest node's load and end within a bound."""
    groups, voters = [], {}
    for group, flow in enumerate(flows):
        members = tuple(random.sample(NODES, 3))
        voters[group] = members
        groups.append(GroupLoad(group, members[0], flow, 1))
    hottest = max(node_flows(groups, voters, NODES).values())
    for _ in range(10 * len(groups)):
        move = hot_group_move(groups, voters, NODES)
        if move is None:
            break
        group = groups[move.group]
        assert move.source in voters[move.group] and (move.target in voters[move.group]) == move.leader_only
        if not move.leader_only:
            voters[move.group] = tuple(move.target if node == move.source else node for node in voters[move.group])
        if move.leader_only or group.leader == move.source:
            group.leader = move.target
        now = max(node_flows(groups, voters, NODES).values())
        assert now <= hottest * (1 + 1e-9)
        hottest = now
    else:
        raise AssertionError("the moves did not stop")


def test_the_planner_moves_a_replica_only_when_the_load_it_moves_pays_for_the_copy():
    """The hot replica move of the test above takes 54 bytes/s off the hottest node (154 to 100): over
    limits.plan_payback_s that pays for copying a group that keeps little, not for one that keeps three days of its
    100 bytes/s. A leadership costs only its stall, and moves."""
    groups = [GroupLoad(10, 1, 100.0, 1), GroupLoad(11, 2, 90.0, 1), GroupLoad(12, 3, 90.0, 1)]
    voters = {10: (1, 2, 3), 11: (1, 2, 3), 12: (1, 2, 3)}
    little, much = 54.0 * limits.plan_payback_s * 0.9, 100.0 * 3 * 86_400
    assert forecast_move(groups, voters, NODES, {10: little, 11: much, 12: much}) == Move(10, 1, 4, False)
    assert forecast_move(groups, voters, NODES, {10: much, 11: much, 12: much}) is None
    leads = [GroupLoad(10, 1, 60.0, 1), GroupLoad(13, 1, 60.0, 1), GroupLoad(11, 2, 20.0, 1), GroupLoad(12, 4, 20.0, 1)]
    led = {10: (1, 2, 3), 13: (1, 2, 4), 11: (2, 3, 4), 12: (2, 3, 4)}
    assert forecast_move(leads, led, NODES, dict.fromkeys(led, much)) == Move(10, 1, 3, True)
