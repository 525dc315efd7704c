"""The nameservers' state machine and the placement score: pure cores, driven with entries and loads."""

import orjson
import pytest

from rocket.errors import Code, RocketError
from rocket.ml.placement import LeastLoaded, NodeLoad
from rocket.raft.core import Entry
from rocket.roles.nameserver.metadata import FIRST_STORAGE_GROUP, Metadata
from rocket.serde.typed import plain


def entries(*commands: dict, first: int = 1) -> list[Entry]:
    return [Entry(1, first + number, orjson.dumps(command)) for number, command in enumerate(commands)]


def apply(metadata: Metadata, *commands: dict) -> list:
    return metadata.apply(entries(*commands), [-1] * len(commands))


def registered() -> Metadata:
    metadata = Metadata()
    apply(metadata, *({"op": "register", "node": node, "address": f"127.0.0.1:{9000 + node}",
                       "roles": ["storage"]} for node in (1, 2, 3, 4)))
    return metadata


def create(name: str, queues: int, new_groups: list[dict], groups: list[int]) -> dict:
    return {"op": "create_topic", "name": name, "queues": queues, "created_ms": 7, "new_groups": new_groups,
            "groups": groups}


def test_topics_spread_their_queues_over_their_groups_and_routes_name_every_replica():
    metadata = registered()
    groups = [{"id": FIRST_STORAGE_GROUP + i, "voters": voters} for i, voters in
              enumerate(([1, 2, 3], [2, 3, 4], [1, 3, 4], [1, 2, 4]))]
    [spec] = apply(metadata, create("orders", 16, groups, [group["id"] for group in groups]))
    assert spec.name == "orders" and spec.groups == (2, 3, 4, 5) and metadata.version == 5
    route = plain(metadata.route("orders", {3: 4}))
    assert sorted(set(route["queue_groups"])) == [2, 3, 4, 5]
    assert all(route["queue_groups"].count(group) == 4 for group in (2, 3, 4, 5))  # even within a topic
    assert {group["id"]: group["leader"] for group in route["groups"]} == {2: 0, 3: 4, 4: 0, 5: 0}
    assert [node["id"] for node in route["nodes"]] == [1, 2, 3, 4]
    assert [group["id"] for group in plain(metadata.assignment(4))["groups"]] == [3, 4, 5]
    [again] = apply(metadata, create("orders", 2, [], [2]))
    assert isinstance(again, RocketError) and again.code == Code.TOPIC_EXISTS
    [clash] = apply(metadata, create("other", 2, [{"id": 2, "voters": [1]}], [2]))
    assert isinstance(clash, RocketError) and "other" not in metadata.topics
    with pytest.raises(RocketError) as unknown:
        metadata.route("nope", {})
    assert unknown.value.code == Code.UNKNOWN_TOPIC


def test_a_move_adds_a_learner_then_swaps_it_for_the_leaving_replica():
    metadata = registered()
    apply(metadata, create("t", 1, [{"id": 2, "voters": [1, 2, 3]}], [2]))
    apply(metadata, {"op": "move_start", "group": 2, "add": 4, "remove": 2})
    assert metadata.members_of(2) == (1, 2, 3, 4) and metadata.groups[2].learners == (4,)
    assert plain(metadata.assignment(4))["groups"][0]["learners"] == [4]
    [busy] = apply(metadata, {"op": "move_start", "group": 2, "add": 4, "remove": 1})
    assert isinstance(busy, RocketError)
    apply(metadata, {"op": "move_done", "group": 2})
    assert metadata.groups[2].voters == (1, 3, 4) and not metadata.groups[2].learners
    assert metadata.replicas(2) == 0 and plain(metadata.assignment(2))["groups"] == []


def test_read_replicas_are_learners_that_stay_beside_a_move():
    """A topic's read_replicas is what its groups want (the most of their topics'); a reader is a learner in the
    group's assignment and routes, named apart as a reader, and kept by a move that may not take its node."""
    metadata = registered()
    apply(metadata, create("t", 1, [{"id": 2, "voters": [1, 2, 3]}], [2]), create("u", 1, [], [2]))
    assert metadata.readers_wanted() == {}
    apply(metadata, {"op": "update_topic", "name": "t", "retention_s": -1.0, "local_retention_s": -1.0,
                     "read_replicas": 2})
    assert metadata.topics["t"].read_replicas == 2 and metadata.readers_wanted() == {2: 2}
    apply(metadata, {"op": "reader_add", "group": 2, "node": 4})
    assert metadata.members_of(2) == (1, 2, 3, 4) and metadata.replicas(4) == 1
    [info] = plain(metadata.assignment(4))["groups"]
    assert info["learners"] == [4] and info["readers"] == [4] and info["voters"] == [1, 2, 3]
    assert plain(metadata.route("u", {}))["groups"][0]["readers"] == [4]
    [taken] = apply(metadata, {"op": "reader_add", "group": 2, "node": 1})
    [moved_onto] = apply(metadata, {"op": "move_start", "group": 2, "add": 4, "remove": 3})
    assert isinstance(taken, RocketError) and isinstance(moved_onto, RocketError)
    apply(metadata, {"op": "register", "node": 5, "address": "127.0.0.1:9005", "roles": ["storage"]},
          {"op": "move_start", "group": 2, "add": 5, "remove": 3}, {"op": "move_done", "group": 2})
    assert metadata.groups[2].voters == (1, 2, 5) and metadata.groups[2].readers == (4,)
    copy = Metadata()
    copy.restore(metadata.snapshot())
    assert copy.groups[2].readers == (4,) and copy.topics["t"].read_replicas == 2
    apply(metadata, {"op": "reader_remove", "group": 2, "node": 4})
    assert metadata.replicas(4) == 0 and plain(metadata.assignment(4))["groups"] == []


def test_snapshot_and_restore_give_the_same_metadata():
    metadata = registered()
    apply(metadata, create("t", 3, [{"id": 2, "voters": [1, 2, 3]}], [2]),
          {"op": "node_state", "node": 3, "state": "draining"},
          {"op": "move_start", "group": 2, "add": 4, "remove": 3})
    copy = Metadata()
    copy.restore(metadata.snapshot())
    assert copy.snapshot() == metadata.snapshot()
    assert copy.route("t", {}) == metadata.route("t", {}) and copy.nodes[3].state == "draining"
    assert copy.groups[2] == metadata.groups[2]


def test_a_deleted_topics_name_is_taken_until_dropped_then_remembered_until_made_again():
    """drop_topic takes the topic out of the routes but keeps its name; topic_dropped frees the name and remembers
    its groups (tombstones), which a snapshot carries; a create must say the groups took the name again."""
    metadata = registered()
    groups = [{"id": 2, "voters": [1, 2, 3]}, {"id": 3, "voters": [2, 3, 4]}]
    apply(metadata, create("t", 4, groups, [2, 3]), {"op": "drop_topic", "name": "t"})
    with pytest.raises(RocketError) as unknown:
        metadata.route("t", {})
    assert unknown.value.code == Code.UNKNOWN_TOPIC and "t" in metadata.deleting
    [busy] = apply(metadata, create("t", 1, [], [2]))
    assert isinstance(busy, RocketError) and busy.code == Code.UNAVAILABLE and "being deleted" in busy.message
    apply(metadata, {"op": "topic_dropped", "name": "t", "dropped_ms": 99})
    assert not metadata.deleting and metadata.tombstones == {"t": ((2, 3), 99)}
    copy = Metadata()
    copy.restore(metadata.snapshot())
    assert copy.snapshot() == metadata.snapshot() and copy.tombstones == metadata.tombstones
    with pytest.raises(AssertionError):  # the groups would still refuse its appends
        apply(metadata, create("t", 1, [], [2]))
    [spec] = apply(metadata, {**create("t", 1, [], [2]), "reopened": True})
    assert spec.queues == 1 and not metadata.tombstones


def test_a_create_sent_again_with_its_request_id_gets_the_first_answer():
    metadata = registered()
    first = {**create("t", 2, [{"id": 2, "voters": [1, 2, 3]}], [2]), "request_id": "r1",
             "retention_s": 3600.0, "local_retention_s": 60.0}
    [made] = apply(metadata, first)
    assert (made.retention_s, made.local_retention_s) == (3600.0, 60.0)
    [again] = apply(metadata, {**first, "new_groups": []})
    assert again == made
    [other] = apply(metadata, {**first, "new_groups": [], "request_id": "r2"})
    assert isinstance(other, RocketError) and other.code == Code.TOPIC_EXISTS
    copy = Metadata()
    copy.restore(metadata.snapshot())
    assert copy.created_by("r1", "topic") == "t" and copy.created_by("r1", "class") is None


def test_least_loaded_placement_spreads_replicas_and_skips_unavailable_nodes():
    loads = [NodeLoad(1), NodeLoad(2), NodeLoad(3, replicas=5), NodeLoad(4), NodeLoad(5, available=False)]
    placed = LeastLoaded().place(6, 3, loads)
    assert all(len(set(voters)) == 3 and 5 not in voters for voters in placed)
    counts = {node: sum(node in voters for voters in placed) for node in (1, 2, 3, 4)}
    assert max(counts[1], counts[2], counts[4]) - min(counts[1], counts[2], counts[4]) <= 1
    assert counts[3] < counts[1]  # the loaded node gets fewer
    with pytest.raises(RocketError) as short:
        LeastLoaded().place(1, 5, loads)  # node 5 is down: four are available
    assert short.value.code == Code.UNAVAILABLE


def test_a_topic_moves_to_another_class_start_switch_done_and_nothing_else_meanwhile():
    """class_move_start places the queues on the new class's groups (the route stays), class_move_switch routes the
    queues there, class_move_done ends it; meanwhile the topic cannot be deleted, given queues, or moved elsewhere."""
    metadata = registered()
    gold = {"op": "create_class", "name": "gold", "mode": "controller", "replicas": 2, "min_in_sync_replicas": 1,
            "unclean_election": False, "ha_max_lag_s": 10.0,
            "new_groups": [{"id": 3, "voters": [3, 4]}, {"id": 4, "voters": [4, 3]}, {"id": 5, "voters": [2, 3]}]}
    apply(metadata, create("t", 2, [{"id": 2, "voters": [1, 2]}], [2]), gold,
          {**create("later", 1, [], [2]), "message_type": "delay"})
    unknown, delay, same = apply(metadata, {"op": "class_move_start", "name": "t", "storage_class": "silver",
                                            "queue_groups": [3, 4]},
                                 {"op": "class_move_start", "name": "later", "storage_class": "gold",
                                  "queue_groups": [3]},
                                 {"op": "class_move_start", "name": "t", "storage_class": "raft", "queue_groups": []})
    assert isinstance(unknown, RocketError) and unknown.code == Code.BAD_REQUEST and "silver" in unknown.message
    assert isinstance(delay, RocketError) and "delay topic" in delay.message
    assert same.storage_class == "raft" and not metadata.class_moves
    [shared] = apply(metadata, {"op": "class_move_start", "name": "t", "storage_class": "gold", "queue_groups": [3, 5]})
    assert isinstance(shared, RocketError) and "queue 1: its new group 5 has a replica on node 2" in shared.message
    [started, again, elsewhere] = apply(metadata, *({"op": "class_move_start", "name": "t", "storage_class": to,
                                                    "queue_groups": [3, 4]} for to in ("gold", "gold", "raft")))
    assert started.storage_class == again.storage_class == "raft"  # the topic stays until it switches
    assert isinstance(elsewhere, RocketError) and elsewhere.code == Code.UNAVAILABLE
    assert plain(metadata.route("t", {}))["queue_groups"] == [2, 2]
    deleted, grown = apply(metadata, {"op": "drop_topic", "name": "t"},
                           {"op": "add_queues", "name": "t", "from_queues": 2, "queue_groups": [2]})
    assert all(isinstance(error, RocketError) and "moving to storage class 'gold'" in error.message
               for error in (deleted, grown))
    copy = Metadata()
    copy.restore(metadata.snapshot())
    assert copy.class_moves == metadata.class_moves and copy.snapshot() == metadata.snapshot()
    apply(metadata, {"op": "class_move_switch", "name": "t"}, {"op": "class_move_switch", "name": "t"})
    spec = metadata.topic("t")
    assert (spec.storage_class, spec.queue_groups, spec.groups) == ("gold", (3, 4), (3, 4))
    assert plain(metadata.route("t", {}))["queue_groups"] == [3, 4] and metadata.class_moves["t"].old_groups == (2, 2)
    apply(metadata, {"op": "class_move_done", "name": "t"})
    assert not metadata.class_moves
    [gone] = apply(metadata, {"op": "drop_topic", "name": "t"})
    assert gone is None and "t" in metadata.deleting
