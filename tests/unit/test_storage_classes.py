"""Storage classes and the controller's records in the metadata state machine (issue 32): classes and their groups,
elections and sync state set changes fenced by their epochs, placement onto a class, snapshots old and new."""

import orjson
import pytest

from rocket import limits
from rocket.errors import Code, RocketError
from rocket.roles.nameserver.classes import check_class_request
from rocket.roles.nameserver.control import Control
from rocket.roles.nameserver.metadata import DEFAULT_CLASS, Metadata
from rocket.serde.typed import plain
from tests.unit.test_metadata import apply, create, registered


def create_class(name: str, groups: list[dict], mode: str = "controller", replicas: int = 2, **settings) -> dict:
    return {"op": "create_class", "name": name, "mode": mode, "replicas": replicas, "min_in_sync_replicas": 1,
            "unclean_election": False, "ha_max_lag_s": 5.0, "new_groups": groups, **settings}


def elect(group: int, master: int, from_epoch: int, unclean: bool = False, previous_last: int = 0,
          master_last: int = 0) -> dict:
    return {"op": "elect_master", "group": group, "master": master, "from_epoch": from_epoch, "unclean": unclean,
            "at_ms": 1_000, "previous_last_index": previous_last, "master_last_index": master_last}


def alter(group: int, master: int, master_epoch: int, set_epoch: int, members: list[int]) -> dict:
    return {"op": "alter_sync_state_set", "group": group, "master": master, "master_epoch": master_epoch,
            "sync_state_set_epoch": set_epoch, "sync_state_set": members}


def refused(result, code: Code) -> str:
    assert isinstance(result, RocketError) and result.code == code, result
    return result.message


def gold() -> Metadata:
    """Four storage nodes, one raft group with a topic on it, and class gold: groups 3 and 4 of two replicas."""
    metadata = registered()
    apply(metadata, create("plain", 2, [{"id": 2, "voters": [1, 2, 3]}], [2]),
          create_class("gold", [{"id": 3, "voters": [2, 1]}, {"id": 4, "voters": [3, 4]}]))
    return metadata


def test_a_controller_class_starts_each_group_with_its_first_voter_master_and_every_replica_in_sync():
    metadata = gold()
    assert metadata.classes["gold"].mode == "controller" and metadata.classes["gold"].replicas == 2
    assert metadata.groups[3].storage_class == "gold" and metadata.groups[3].control == Control(2, 1, (1, 2), 1)
    assert metadata.groups[2].storage_class == DEFAULT_CLASS and metadata.groups[2].control is None
    assert metadata.raft_groups() == [2] and metadata.class_groups("gold") == [3, 4]
    info = plain(metadata.group_info(3, {3: 1}))
    assert info["leader"] == 2, "a controller group's leader is the controller's master, not the one reported"
    assert {key: info[key] for key in ("storage_class", "mode", "master", "master_epoch", "sync_state_set",
                                       "sync_state_set_epoch", "min_in_sync_replicas", "ha_max_lag_s",
                                       "unclean_election")} == {
        "storage_class": "gold", "mode": "controller", "master": 2, "master_epoch": 1, "sync_state_set": [1, 2],
        "sync_state_set_epoch": 1, "min_in_sync_replicas": 1, "ha_max_lag_s": 5.0, "unclean_election": False}
    raft = plain(metadata.group_info(2, {2: 3}))
    assert raft["leader"] == 3 and raft["mode"] == "raft" and raft["master"] == 0 and raft["sync_state_set"] == []
    assert [group["id"] for group in plain(metadata.assignment(4))["groups"]] == [4]
    version = metadata.version
    for again in ("gold", "raft"):
        [result] = apply(metadata, create_class(again, [{"id": 9, "voters": [1, 2]}]))
        assert refused(result, Code.BAD_REQUEST) == f"storage class {again!r} exists"
    assert 9 not in metadata.groups and metadata.version == version


def test_a_raft_mode_class_has_no_controller():
    metadata = registered()
    [made] = apply(metadata, create_class("fast", [{"id": 2, "voters": [1]}], mode="raft", replicas=1))
    assert made.mode == "raft" and metadata.groups[2].control is None and metadata.groups[2].storage_class == "fast"
    assert metadata.group_info(2, {2: 1}).leader == 1 and metadata.raft_groups() == []


def test_an_election_fences_older_epochs_and_leaves_the_master_alone_in_sync():
    metadata = gold()
    version = metadata.version
    [control] = apply(metadata, elect(3, 1, from_epoch=1))
    assert control == {"master": 1, "master_epoch": 2, "sync_state_set": [1], "sync_state_set_epoch": 2}
    assert metadata.groups[3].control == Control(1, 2, (1,), 2) and metadata.version == version + 1
    assert metadata.elections == [{"group": 3, "master_epoch": 2, "master": 1, "previous": 2, "unclean": False,
                                   "at_ms": 1_000, "previous_last_index": 0, "master_last_index": 0}]
    [stale] = apply(metadata, elect(3, 2, from_epoch=1))  # a second controller decision made on the old epoch
    assert "master epoch 2, not 1" in refused(stale, Code.FENCED)
    [outside] = apply(metadata, elect(3, 2, from_epoch=2))  # node 2 left the sync state set with the election
    assert "only an unclean election" in refused(outside, Code.BAD_REQUEST)
    [stranger] = apply(metadata, elect(3, 4, from_epoch=2, unclean=True))
    assert "not a replica of group 3" in refused(stranger, Code.BAD_REQUEST)
    [raft] = apply(metadata, elect(2, 1, from_epoch=1))
    assert "not in controller mode" in refused(raft, Code.BAD_REQUEST)
    [missing] = apply(metadata, elect(99, 1, from_epoch=1))
    assert "does not exist" in refused(missing, Code.BAD_REQUEST)
    assert metadata.groups[3].control == Control(1, 2, (1,), 2) and len(metadata.elections) == 1
    assert metadata.version == version + 1, "a refused command changes nothing"
    [unclean] = apply(metadata, elect(3, 2, from_epoch=2, unclean=True, previous_last=120, master_last=100))
    assert unclean["master"] == 2 and unclean["master_epoch"] == 3
    assert metadata.elections[-1] == {"group": 3, "master_epoch": 3, "master": 2, "previous": 1, "unclean": True,
                                      "at_ms": 1_000, "previous_last_index": 120, "master_last_index": 100}


def test_the_sync_state_set_changes_only_under_the_current_master_and_epochs():
    metadata = gold()
    [shrunk] = apply(metadata, alter(3, 2, 1, 1, [2]))
    assert shrunk == {"master": 2, "master_epoch": 1, "sync_state_set": [2], "sync_state_set_epoch": 2}
    [grown] = apply(metadata, alter(3, 2, 1, 2, [1, 2, 2]))
    assert grown["sync_state_set"] == [1, 2] and metadata.groups[3].control.sync_state_set == (1, 2)
    for stale, why in ((alter(3, 2, 1, 2, [2]), "an older set's epoch"), (alter(3, 1, 1, 3, [1]), "not the master"),
                       (alter(3, 2, 0, 3, [2]), "an older master epoch")):
        [result] = apply(metadata, stale)
        assert "master 2 at epoch 1, sync state set epoch 3" in refused(result, Code.FENCED), why
    [without_master] = apply(metadata, alter(3, 2, 1, 3, [1]))
    assert "must be in its sync state set" in refused(without_master, Code.BAD_REQUEST)
    [stranger] = apply(metadata, alter(3, 2, 1, 3, [2, 4]))
    assert "[4] are not replicas" in refused(stranger, Code.BAD_REQUEST)
    apply(metadata, elect(3, 1, from_epoch=1))
    [deposed] = apply(metadata, alter(3, 2, 1, 3, [1, 2]))  # the old master, after the election
    assert refused(deposed, Code.FENCED)
    assert metadata.groups[3].control == Control(1, 2, (1,), 4)


def test_elections_kept_are_the_last_ones():
    metadata = gold()
    for epoch in range(1, limits.elections_kept_max + 6):
        [result] = apply(metadata, elect(3, 1 + epoch % 2, from_epoch=epoch, unclean=True))
        assert result["master_epoch"] == epoch + 1
    assert len(metadata.elections) == limits.elections_kept_max
    assert metadata.elections[0]["master_epoch"] == 7 and metadata.elections[-1]["master_epoch"] == 206


def test_topics_are_placed_on_their_class():
    metadata = gold()
    [spec] = apply(metadata, {**create("orders", 2, [], [3, 4]), "queue_groups": [3, 4], "storage_class": "gold"})
    assert spec.storage_class == "gold" and spec.to_wire()["storage_class"] == "gold"
    assert metadata.topics["plain"].storage_class == DEFAULT_CLASS
    [unknown] = apply(metadata, {**create("t", 1, [], [3]), "storage_class": "silver"})
    assert refused(unknown, Code.BAD_REQUEST) == "storage class 'silver' does not exist"
    apply(metadata, {"op": "add_queues", "name": "orders", "from_queues": 2, "queue_groups": [4]})
    assert metadata.topics["orders"].queue_groups == (3, 4, 4)
    with pytest.raises(RocketError) as missing:
        metadata.class_groups("silver")
    assert missing.value.code == Code.BAD_REQUEST


def test_a_controller_groups_replica_is_replaced_only_once_the_controller_dropped_it_from_the_set():
    """Group 3 of gold: replicas 2 (master) and 1; node 3 replaces node 1. While the move runs, node 3 may join the
    SyncStateSet and be elected, node 1 neither; the move finishes only once node 1 is out of the set."""
    metadata = gold()
    apply(metadata, {"op": "move_start", "group": 3, "add": 3, "remove": 1})
    assert metadata.control_of(3) == ((2, 3), Control(2, 1, (1, 2), 1))
    [joined] = apply(metadata, alter(3, 2, 1, 1, [1, 2, 3]))  # node 3 in; node 1, leaving, may stay
    assert joined["sync_state_set"] == [1, 2, 3]
    [dropped] = apply(metadata, alter(3, 2, 1, 2, [2, 3]))  # the controller drops node 1 (Nameserver._hand_off)
    assert dropped["sync_state_set"] == [2, 3]
    [kept_out] = apply(metadata, alter(3, 2, 1, 3, [1, 2, 3]))  # node 1, leaving, is not let in again
    assert kept_out["sync_state_set"] == [2, 3]
    assert "not replicas" in refused(apply(metadata, alter(3, 2, 1, 4, [2, 3, 4]))[0], Code.BAD_REQUEST)
    assert "not a replica" in refused(apply(metadata, elect(3, 1, from_epoch=1, unclean=True))[0], Code.BAD_REQUEST)
    apply(metadata, {"op": "move_done", "group": 3})
    assert metadata.groups[3].voters == (2, 3) and metadata.groups[3].control.sync_state_set == (2, 3)


def test_a_move_waits_for_the_leaving_replica_to_leave_the_sync_state_set():
    metadata = gold()
    apply(metadata, {"op": "move_start", "group": 3, "add": 3, "remove": 1})
    assert "still in group 3's SyncStateSet" in refused(apply(metadata, {"op": "move_done", "group": 3})[0],
                                                        Code.UNAVAILABLE)
    assert metadata.groups[3].leaving == 1


def test_a_move_keeps_a_groups_class():
    metadata = registered()
    apply(metadata, create_class("fast", [{"id": 2, "voters": [1, 2]}], mode="raft"),
          {"op": "move_start", "group": 2, "add": 3, "remove": 1}, {"op": "move_done", "group": 2})
    assert metadata.groups[2].voters == (2, 3) and metadata.groups[2].storage_class == "fast"


def test_classes_controls_and_elections_survive_a_snapshot():
    metadata = gold()
    apply(metadata, {**create("orders", 2, [], [3, 4]), "queue_groups": [3, 4], "storage_class": "gold"},
          elect(3, 1, from_epoch=1, unclean=True, previous_last=9, master_last=7), alter(3, 1, 2, 2, [1, 2]))
    copy = Metadata()
    copy.restore(metadata.snapshot())
    assert copy.snapshot() == metadata.snapshot()
    assert copy.classes == metadata.classes and copy.groups == metadata.groups and copy.elections == metadata.elections
    assert copy.topics["orders"].storage_class == "gold" and copy.route("orders", {}) == metadata.route("orders", {})
    assert copy.describe_class(copy.classes["gold"], {}, True) == metadata.describe_class(metadata.classes["gold"],
                                                                                          {}, True)


def test_a_snapshot_from_before_classes_restores_into_the_default_class():
    """The layout written before storage classes: topics of ten fields, groups of four, no classes or elections."""
    old = orjson.dumps({
        "version": 7,
        "topics": [["orders", 2, 5, [2], "normal", -1.0, -1.0, 1, 0, [2, 2]]],
        "groups": [[2, [1, 2, 3], [], 0]],
        "nodes": [{"id": 1, "address": "127.0.0.1:9001", "roles": ["storage"], "state": "up"}],
    })
    metadata = Metadata()
    metadata.restore([old])
    assert metadata.version == 7 and metadata.classes == {} and metadata.elections == []
    assert metadata.topics["orders"].storage_class == DEFAULT_CLASS and metadata.topics["orders"].queue_groups == (2, 2)
    assert metadata.groups[2].storage_class == DEFAULT_CLASS and metadata.groups[2].control is None
    assert metadata.raft_groups() == [2]
    [made] = apply(metadata, create_class("gold", [{"id": 3, "voters": [1, 2]}]))
    assert made.name == "gold" and metadata.version == 8


def request(**changes) -> dict:
    return {"name": "gold", "mode": "controller", "replicas": 2, "groups": 0, "min_in_sync_replicas": 1,
            "unclean_election": False, "ha_max_lag_s": 5.0, **changes}


@pytest.mark.parametrize("changes, says", [
    ({"name": "bad name!"}, "storage class name 'bad name!'"),
    ({"name": ""}, "storage class name ''"),
    ({"mode": "paxos"}, "mode must be one of raft, controller, got 'paxos'"),
    ({"replicas": 1}, "a controller-mode class needs 2..7 replicas"),
    ({"mode": "raft", "replicas": 0}, "replicas must be 1..7, got 0"),
    ({"replicas": 8}, "a controller-mode class needs 2..7 replicas"),
    ({"min_in_sync_replicas": 3}, "min_in_sync_replicas must be 1..2"),
    ({"min_in_sync_replicas": 0}, "min_in_sync_replicas must be 1..2"),
    ({"ha_max_lag_s": 0.0}, "ha_max_lag_s must be 0.5..3600 seconds"),
    ({"ha_max_lag_s": float("nan")}, "ha_max_lag_s must be"),
    ({"groups": -1}, "groups must be 1..100000"),
])
def test_a_bad_class_request_is_refused_in_one_line(changes, says):
    with pytest.raises(RocketError) as caught:
        check_class_request(request(**changes))
    assert caught.value.code == Code.BAD_REQUEST and says in caught.value.message and "\n" not in caught.value.message


def test_good_class_requests_pass():
    for changes in ({}, {"mode": "raft", "replicas": 1}, {"replicas": 3, "min_in_sync_replicas": 3, "groups": 4},
                    {"ha_max_lag_s": limits.ha_lag_s_max, "unclean_election": True}):
        check_class_request(request(**changes))
