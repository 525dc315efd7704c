"""Queue placement by predicted load (issue 30): the pure pieces (load history, predictors, place_queues, the model
file's checks) and the metadata's queue-to-group table."""

from __future__ import annotations

import collections
import json
from types import SimpleNamespace

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from rocket.clock import TrioWallClock
from rocket.config import NodeConfig
from rocket.errors import Code, RocketError
from rocket.ml.forecast import (CHANGE_MAX, FEATURES, MODEL_FORMAT, MODEL_VERSION, STEP_MS, TARGET, Forecaster,
                                 ModelError, queue_features)
from rocket.ml.load import LoadHistory, ModelPredictor, RecentPredictor
from rocket.ml.placement import GroupLoad, MoveBudget, Planner, leader_transfer, new_queue_load, place_queues
from rocket.raft.core import Entry
from rocket.roles.nameserver.forecasts import Forecasts
from rocket.roles.nameserver.metadata import Metadata
from rocket.roles.storage.assignment import Assignments
from rocket.store.store import Store
from rocket.serde.typed import NodeLoad, convert
from rocket.world import World

NOW_MS = 1_800_000_000_000 // STEP_MS * STEP_MS  # the start of a step


def model_document(**overrides) -> dict:
    """A forecaster whose one tree says: rate_1m plus 5 scales, or 9 where the scale (feature 1) is above 1,000."""
    document = {"format": MODEL_FORMAT, "format_version": MODEL_VERSION, "features": list(FEATURES),
                "model_version": "20261126T1200Z-abc", "horizon_steps": 10, "target": TARGET,
                "trees": [{"weight": 1.0, "root": {"feature": 1, "threshold": 1000.0,
                                                   "left": {"value": 5.0}, "right": {"value": 9.0}}}],
                "metrics": {"trained_at_ms": NOW_MS, "rmse": 1.0}}
    document.update(overrides)
    return document


def test_history_sums_reports_into_steps_and_forgets_old_ones():
    history = LoadHistory()
    history.add(("group", 2), NOW_MS - STEP_MS + 1, 30_000)
    history.add(("group", 2), NOW_MS - 1, 30_000)  # two nodes' reports in one step add up
    history.add(("group", 2), NOW_MS - 5 * STEP_MS, 6_000)
    assert history.rates(("group", 2)) == {NOW_MS // STEP_MS - 1: 1000.0, NOW_MS // STEP_MS - 5: 100.0}
    assert RecentPredictor().predict(history, ("group", 2), NOW_MS) == pytest.approx(110.0)  # (1000 + 100) / 10
    history.forget_before(NOW_MS + 86 * STEP_MS)
    assert history.rates(("group", 2)) == {NOW_MS // STEP_MS - 1: 1000.0}
    history.forget_before(NOW_MS + 200 * STEP_MS)
    assert len(history) == 0


def test_the_model_predictor_feeds_the_features_the_job_trained_on():
    history = LoadHistory()
    for minute in range(1, 11):
        history.add(("topic", "hot"), NOW_MS - minute * STEP_MS, 5_000 * 60)  # 5,000 bytes/s for 10 minutes
    model = Forecaster.from_json(json.dumps(model_document()))
    predictor = ModelPredictor(model)
    assert predictor.predict(history, ("topic", "hot"), NOW_MS) == pytest.approx(5_000 + 9 * 5_000)
    assert predictor.predict(history, ("topic", "cold"), NOW_MS) == 5.0  # no traffic: 0 + 5 scales of 1 byte/s
    steps = history.rates(("topic", "hot"))
    features = queue_features(steps, NOW_MS, min(steps), 1, 5_000.0)
    assert features[FEATURES.index("scale")] == pytest.approx(5_000.0)  # the 10 minutes' mean > the hour's
    assert features[FEATURES.index("last_10m")] == pytest.approx(1.0)
    assert features[FEATURES.index("last_60m")] == pytest.approx(1 / 6)
    assert features[FEATURES.index("topic_share")] == pytest.approx(1.0)
    assert features[FEATURES.index("age_h")] == pytest.approx(10 / 60)


@pytest.mark.parametrize("change, reason", [
    ({"format": "other"}, "format"),
    ({"features": list(FEATURES)[:-1]}, "features"),
    ({"trees": []}, "trees"),
    ({"trees": [{"weight": 1.0, "root": {"feature": 99, "threshold": 1.0, "left": {"value": 1.0},
                                         "right": {"value": 2.0}}}]}, "feature"),
    ({"trees": [{"weight": 1.0, "root": {"value": float("nan")}}]}, "leaf"),
    ({"horizon_steps": 0}, "horizon"),
    ({"model_version": ""}, "model_version"),
])
def test_a_corrupt_model_is_refused_with_its_reason(change, reason):
    with pytest.raises(ModelError, match=reason):
        Forecaster.from_json(json.dumps(model_document(**change)))


def test_a_model_file_that_is_not_json_is_refused():
    with pytest.raises(ModelError, match="not JSON"):
        Forecaster.from_json(b"\x00garbage")


def test_new_queues_go_to_the_groups_with_the_lowest_predicted_load():
    groups = [GroupLoad(2, leader=1, predicted=90_000.0, queues=4), GroupLoad(3, leader=2, predicted=10.0, queues=4),
              GroupLoad(4, leader=3, predicted=0.0, queues=4), GroupLoad(5, leader=4, predicted=5_000.0, queues=4),
              GroupLoad(6, leader=5, predicted=0.0, queues=0, available=False)]
    choices = place_queues(0, 2, 1_000.0, groups)
    assert [choice.group for choice in choices] == [4, 3]  # the two least loaded of the four available
    assert choices[0].runner_up == 3 and choices[0].score < choices[0].runner_up_score
    assert all(choice.group != 6 for choice in choices)  # a group with a replica on a draining node: never
    assert groups[2].predicted == 0.0  # the caller's loads are not changed
    # Six queues over four groups: at most ceil(6 / 4) = 2 each, so the three least loaded take two, the hot one none.
    assert sorted(choice.group for choice in place_queues(0, 6, 1_000.0, groups)) == [3, 3, 4, 4, 5, 5]
    # Eight: two each, the hot group too; a topic's traffic is spread before it is known.
    assert sorted(choice.group for choice in place_queues(0, 8, 1_000.0, groups)) == [2, 2, 3, 3, 4, 4, 5, 5]


def test_a_topic_without_history_still_spreads_over_the_groups():
    groups = [GroupLoad(group, leader=group, predicted=0.0, queues=0) for group in (2, 3, 4, 5)]
    choices = place_queues(0, 8, 0.0, groups)
    assert sorted(choice.group for choice in choices) == [2, 2, 3, 3, 4, 4, 5, 5]


def test_no_available_group_is_unavailable():
    with pytest.raises(RocketError) as refused:
        place_queues(0, 1, 1.0, [GroupLoad(2, 1, 0.0, 0, available=False)])
    assert refused.value.code == Code.UNAVAILABLE


@given(st.lists(st.floats(min_value=0, max_value=1e9), min_size=1, max_size=12), st.integers(1, 40),
       st.floats(min_value=0, max_value=1e7))
def test_placement_never_picks_a_group_scored_worse_than_another(predicted, count, queue_load):
    groups = [GroupLoad(2 + number, leader=2 + number, predicted=value, queues=0) for number, value in
              enumerate(predicted)]
    choices = place_queues(0, count, queue_load, groups)
    assert len(choices) == count
    for choice in choices:
        assert choice.runner_up == 0 or choice.score <= choice.runner_up_score


def apply(metadata: Metadata, *commands: dict) -> list:
    return metadata.apply([Entry(1, number + 1, orjson.dumps(command)) for number, command in enumerate(commands)],
                          [-1] * len(commands))


def test_placed_queues_keep_their_groups_when_queues_are_added_and_across_a_snapshot():
    metadata = Metadata()
    new_groups = [{"id": group, "voters": [1]} for group in (2, 3, 4)]
    [spec] = apply(metadata, {"op": "create_topic", "name": "orders", "queues": 3, "created_ms": 1,
                              "new_groups": new_groups, "groups": [2, 3, 4], "queue_groups": [4, 4, 2]})
    assert [spec.group_of(queue) for queue in range(3)] == [4, 4, 2]
    assert metadata.route("orders", {}).queue_groups == [4, 4, 2]
    [grown] = apply(metadata, {"op": "add_queues", "name": "orders", "from_queues": 3, "queue_groups": [3, 3]})
    assert grown.queues == 5 and [grown.group_of(queue) for queue in range(5)] == [4, 4, 2, 3, 3]
    [stale] = apply(metadata, {"op": "add_queues", "name": "orders", "from_queues": 3, "queue_groups": [2]})
    assert isinstance(stale, RocketError) and metadata.topics["orders"].queues == 5
    restored = Metadata()
    restored.restore(metadata.snapshot())
    assert restored.topics == metadata.topics


def test_groups_created_for_new_nodes_join_the_pool_once():
    metadata = Metadata()
    apply(metadata, {"op": "create_topic", "name": "orders", "queues": 1, "created_ms": 1,
                     "new_groups": [{"id": 2, "voters": [1, 2, 3]}], "groups": [2]})
    version = metadata.version
    [created, again] = apply(metadata, {"op": "create_groups", "new_groups": [{"id": 3, "voters": [4, 1, 2]}]},
                             {"op": "create_groups", "new_groups": [{"id": 3, "voters": [4, 2, 3]}]})
    assert created is None and isinstance(again, RocketError)  # a stale proposal: the id is taken
    assert metadata.groups[3].voters == (4, 1, 2) and metadata.version > version
    assert [group.id for group in metadata.assignment(4).groups] == [3]


def test_a_topic_placed_by_hash_keeps_its_queues_where_they_were_when_queues_are_added():
    metadata = Metadata()
    [spec] = apply(metadata, {"op": "create_topic", "name": "old", "queues": 4, "created_ms": 1,
                              "new_groups": [{"id": group, "voters": [1]} for group in (2, 3, 4)], "groups": [2, 3, 4]})
    before = [spec.group_of(queue) for queue in range(4)]
    [grown] = apply(metadata, {"op": "add_queues", "name": "old", "from_queues": 4, "queue_groups": [2]})
    assert [grown.group_of(queue) for queue in range(5)] == before + [2]
    # A snapshot written before queue_groups existed (nine fields per topic) still restores.
    state = orjson.loads(metadata.snapshot()[0])
    state["topics"] = [topic[:9] for topic in state["topics"]]
    old = Metadata()
    old.restore([orjson.dumps(state)])
    assert old.topics["old"].queue_groups == () and old.topics["old"].groups == (2, 3, 4)


def test_leadership_moves_from_the_node_leading_the_most_predicted_load_to_a_voter_leading_less():
    voters = {group: (1, 2, 3) for group in range(2, 10)}
    idle = [GroupLoad(group, leader=1, predicted=0.0, queues=0) for group in range(2, 10)]  # node 1 leads all 8
    assert leader_transfer(idle, voters, [1, 2, 3]) == (2, 2) or leader_transfer(idle, voters, [1, 2, 3])[1] in (2, 3)
    hot = [GroupLoad(group, leader=1, predicted=5e6, queues=0) for group in (2, 3)] + [
        GroupLoad(group, leader=2, predicted=0.0, queues=0) for group in range(4, 10)]
    assert leader_transfer(hot, voters, [1, 2, 3]) == (2, 3)  # a hot group to the least loaded voter
    assert leader_transfer(hot, {2: (1, 2), 3: (1, 2)} | {g: voters[g] for g in range(4, 10)}, [1, 2, 3]) == (2, 2)
    assert leader_transfer(hot, voters, [1, 2]) == (2, 2)  # node 3 is down or draining: never to it
    one_hot = [GroupLoad(2, leader=1, predicted=10e6, queues=0)] + [GroupLoad(3, leader=2, predicted=0.0, queues=0)]
    assert leader_transfer(one_hot, voters, [1, 2, 3]) is None  # moving it would only move the gap


def test_a_transfer_must_narrow_the_gap_by_more_than_the_forecasts_own_error():
    """The model's error on groups (its held-out RMSE) sets how much a transfer must narrow the gap: a gap the
    forecast cannot tell from noise moves nothing; without a model, limits.leader_group_bytes_s does."""
    voters = {group: (1, 2) for group in (2, 3, 4, 5)}
    loads = [GroupLoad(2, leader=1, predicted=3e6, queues=0), GroupLoad(3, leader=1, predicted=1e6, queues=0),
             GroupLoad(5, leader=1, predicted=1e6, queues=0), GroupLoad(4, leader=2, predicted=2e6, queues=0)]
    assert leader_transfer(loads, voters, [1, 2]) == (3, 2)  # 5 against 2 MB/s becomes 4 against 3: 2 MB/s closer
    assert leader_transfer(loads, voters, [1, 2], narrow_bytes_s=1.5e6) == (3, 2)
    assert leader_transfer(loads, voters, [1, 2], narrow_bytes_s=2.5e6) is None
    metrics = {"trained_at_ms": NOW_MS, "rmse": 1.0, "by_series": {"group": {"rmse": 6e6}}}
    predictor = ModelPredictor(Forecaster.from_json(json.dumps(model_document(metrics=metrics))))
    assert predictor.error_bytes_s == 6e6 and RecentPredictor.error_bytes_s == 0.0
    for by_series in (None, [], {"group": "x"}, {"group": {"rmse": "1"}}, {"group": {"rmse": -1.0}}):  # not measured
        metrics = {"trained_at_ms": NOW_MS, "rmse": 1.0} | ({"by_series": by_series} if by_series is not None else {})
        assert ModelPredictor(Forecaster.from_json(json.dumps(model_document(metrics=metrics)))).error_bytes_s == 0.0
    assert Planner(60).leader_move(loads, voters, [1, 2], set(), 0.0) == (3, 2, False)
    assert Planner(60).leader_move(loads, voters, [1, 2], set(), 0.0, predictor.error_bytes_s) is None


@given(st.lists(st.tuples(st.integers(1, 4), st.floats(0, 1e7)), min_size=1, max_size=40))
def test_repeated_transfers_even_out_the_led_load_and_stop(groups):
    loads = [GroupLoad(2 + number, leader=leader, predicted=predicted, queues=0)
             for number, (leader, predicted) in enumerate(groups)]
    voters = {load.group: (1, 2, 3, 4) for load in loads}
    for _ in range(10 * len(loads) + 10):
        transfer = leader_transfer(loads, voters, [1, 2, 3, 4])
        if transfer is None:
            break
        group, target = transfer
        next(load for load in loads if load.group == group).leader = target
    else:
        raise AssertionError("transfers never stopped")


def test_the_move_budget_spends_an_hours_worth_at_once_then_refills_at_its_rate():
    budget = MoveBudget(6)
    assert [budget.take(100.0) for _ in range(7)] == [True] * 6 + [False]
    assert not budget.take(100.0 + 599)  # one every 600 s
    assert budget.take(100.0 + 601) and not budget.take(100.0 + 601)
    assert budget.left(1e9) == 6  # never more than an hour's worth
    assert not MoveBudget(0).take(0.0)


def test_the_planner_spends_its_budget_on_balancing_but_not_on_leaving_a_degraded_node():
    voters = {group: (1, 2, 3) for group in range(2, 10)}
    loads = [GroupLoad(group, leader=1, predicted=1e6, queues=0) for group in range(2, 10)]
    planner = Planner(moves_per_hour=1)
    group, target, degraded = planner.leader_move(loads, voters, [1, 2, 3], set(), 0.0)
    assert target in (2, 3) and not degraded
    assert planner.leader_move(loads, voters, [1, 2, 3], set(), 10.0) is None  # the hour's one move is spent
    group, target, degraded = planner.leader_move(loads, voters, [2, 3], {1}, 20.0)  # node 1 is degraded
    assert degraded and target in (2, 3)
    assert planner.leader_move(loads, voters, [1, 2, 3], set(), 3601.0) is not None
    balanced = [GroupLoad(group, leader=1 + group % 3, predicted=1e6, queues=0) for group in range(2, 11)]
    assert Planner(60).leader_move(balanced, voters | {10: (1, 2, 3)}, [1, 2, 3], set(), 0.0) is None
    assert Planner(60).describe(0.0) == "rebalancing: 60 of 60 moves an hour left"
    assert planner.describe(3601.0) == "rebalancing: 0 of 1 moves an hour left"  # spent at 3601 s just above
    assert Planner(0).describe(0.0).startswith("rebalancing off")
    choices = planner.place(0, 4, None, [GroupLoad(group, 1, 0.0, 0) for group in (2, 3)])
    assert sorted(choice.group for choice in choices) == [2, 2, 3, 3]


def test_the_trees_correct_the_last_value_in_scales_of_the_series():
    """The prediction is rate_1m + scale x the trees' sum, the sum clipped at +-CHANGE_MAX scales: a series beyond
    any level seen in training still scales, and no leaf can serve a leap of thousands of scales."""
    model = Forecaster.from_json(json.dumps(model_document(trees=[{"weight": 1.0, "root": {"value": -0.5}}])))
    features = [0.0] * len(FEATURES)
    features[FEATURES.index("rate_1m")], features[FEATURES.index("scale")] = 1e9, 1e9
    assert model.predict(features) == 0.5e9
    features[FEATURES.index("rate_1m")] = 10.0
    assert model.predict(features) == 0.0  # never below zero
    leap = Forecaster.from_json(json.dumps(model_document(trees=[{"weight": 2.0, "root": {"value": 1e6}}])))
    features[FEATURES.index("rate_1m")], features[FEATURES.index("scale")] = 100.0, 10.0
    assert leap.predict(features) == 100.0 + 10.0 * CHANGE_MAX
    for target in ("change", "level", None):
        with pytest.raises(ModelError, match="target"):
            Forecaster.from_json(json.dumps(model_document(target=target)))


def test_a_new_topics_queues_weigh_an_average_queue_and_spread():
    """A topic with no traffic yet: each queue weighs the cluster's average queue (a forecast of nothing would pile
    them all onto the least loaded group, as benchmarks/placement_eval.py found); one with history, its share."""
    groups = [GroupLoad(2, 1, 8_000.0, 8), GroupLoad(3, 2, 4_000.0, 8), GroupLoad(4, 3, 0.0, 8), GroupLoad(5, 1, 0.0, 8)]
    assert new_queue_load(None, 8, groups) == 12_000.0 / 32
    assert new_queue_load(1_600.0, 8, groups) == 200.0
    choices = place_queues(0, 8, new_queue_load(None, 8, groups), groups)
    assert {choice.group for choice in choices} >= {4, 5} and len({choice.group for choice in choices}) >= 2
    assert max(collections.Counter(choice.group for choice in choices).values()) <= 6


async def test_a_storage_nodes_bytes_in_wait_for_a_heartbeat_that_a_nameserver_answers(tmp_path):
    """The bytes a storage node counted (as the leader of their groups, Store.leads) reach the load history once: a
    heartbeat no nameserver answered leaves them for the next one, which reports them though the node no longer leads
    group 2."""
    sent: list[dict] = []
    answers = [None, {"unchanged": True}]

    async def heartbeat(load, version):
        sent.append(load)
        return answers.pop(0)

    store = SimpleNamespace(bytes_in={("orders", 1): 100, ("orders", 2): 50}, world=World())
    store.take_bytes_in = lambda: Store.take_bytes_in(store)  # type: ignore[attr-defined]
    store.give_back_bytes_in = lambda taken: Store.give_back_bytes_in(store, taken)  # type: ignore[attr-defined]
    host = SimpleNamespace(disk_refusal=False, leads=lambda group: group == 1, lagging=lambda group: {},
                           controlled_position=lambda group: None,
                           wal=SimpleNamespace(log=SimpleNamespace(end_position=0, start_position=0)))
    gate, peers = SimpleNamespace(storage_groups=lambda: {1, 2}), SimpleNamespace(heartbeat=heartbeat)
    assignments = Assignments(store, host, gate, peers, NodeConfig(node_id=1, data_dir=tmp_path), {})  # type: ignore
    await assignments.heartbeat()
    store.bytes_in[("orders", 1)] += 10
    await assignments.heartbeat()
    assert [load["group_bytes_in"] for load in sent] == [[{"group": 1, "bytes": 100}, {"group": 2, "bytes": 50}],
                                                          [{"group": 1, "bytes": 110}, {"group": 2, "bytes": 50}]]
    assert sent[1]["topic_bytes_in"] == [{"topic": "orders", "bytes": 160}] and store.bytes_in == {}


async def test_the_leaders_history_waits_for_a_nameserver_that_did_not_take_it():
    """The nameserver leader shares what heartbeats brought it with each other nameserver; one that failed to take a
    share gets it in the next interval, with what came since, and nothing twice."""
    calls: list[tuple[str, dict]] = []
    refuse = {"ns3"}

    async def call(address, method, request):
        if address in refuse:
            raise RocketError(Code.UNAVAILABLE, "node 3 is down")
        calls.append((address, request))  # taken
        return {}

    forecasts = Forecasts(NodeConfig(node_id=1), TrioWallClock(1_700_000_000.0),
                          SimpleNamespace(call=call), {1: "ns1", 2: "ns2", 3: "ns3"}, None)  # type: ignore[arg-type]

    def shared(address: str) -> dict:
        return {(step["kind"], step["group"] or step["topic"]): step["bytes"]
                for sent, request in calls if sent == address for step in request["steps"]}

    forecasts.record(convert({"group_bytes_in": [{"group": 7, "bytes": 100}],
                              "topic_bytes_in": [{"topic": "orders", "bytes": 100}]}, NodeLoad))
    await forecasts.share()
    assert shared("ns2") == {("group", 7): 100, ("topic", "orders"): 100} and shared("ns3") == {}
    refuse.clear()
    calls.clear()
    forecasts.record(convert({"group_bytes_in": [{"group": 7, "bytes": 5}]}, NodeLoad))
    await forecasts.share()
    assert shared("ns2") == {("group", 7): 5} and shared("ns3") == {("group", 7): 105, ("topic", "orders"): 100}
    calls.clear()
    await forecasts.share()
    assert calls == []
