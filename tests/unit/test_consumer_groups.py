"""Consumer groups' settings in the metadata state machine (RIP-18): create, update only what is given, refusals
(duplicates, unknown groups, settings out of range, the bound on their count), and snapshots old and new."""

import orjson
import pytest

from rocket import limits
from rocket.errors import Code, RocketError
from rocket.roles.nameserver.consumer_groups import settings_of
from rocket.roles.nameserver.metadata import ConsumerGroup, Metadata
from tests.unit.test_metadata import apply, create, registered


def create_group(name: str, **settings) -> dict:
    return {"op": "create_consumer_group", "group": name, "settings": settings}


def update_group(name: str, **settings) -> dict:
    return {"op": "update_consumer_group", "group": name, "settings": settings}


def refused(result, code: Code) -> str:
    assert isinstance(result, RocketError) and result.code == code, result
    return result.message


def test_a_group_is_created_with_its_settings_and_defaults_for_the_rest():
    metadata = Metadata()
    [made, plain] = apply(metadata, create_group("billing", max_attempts=2, retry_backoff_s=[1, 5.5], fifo=True),
                          create_group("audit"))
    assert made == ConsumerGroup("billing", 2, (1.0, 5.5), "clustering", True)
    assert plain == ConsumerGroup("audit") and plain.max_attempts == 0 and plain.retry_backoff_s == ()
    assert made.to_wire() == {"group": "billing", "max_attempts": 2, "retry_backoff_s": [1.0, 5.5],
                              "consume_mode": "clustering", "fifo": True}
    assert metadata.version == 2 and metadata.consumer_group("billing") is made


def test_an_update_changes_only_the_settings_given():
    metadata = Metadata()
    apply(metadata, create_group("billing", max_attempts=2, retry_backoff_s=[1, 5], consume_mode="broadcasting"))
    [updated] = apply(metadata, update_group("billing", max_attempts=5))
    assert updated == ConsumerGroup("billing", 5, (1.0, 5.0), "broadcasting", False)
    [cleared] = apply(metadata, update_group("billing", max_attempts=0, retry_backoff_s=[], fifo=True))
    assert cleared == ConsumerGroup("billing", 0, (), "broadcasting", True)
    assert metadata.consumer_groups["billing"] == cleared


def test_a_second_create_and_an_update_of_an_unknown_group_are_refused():
    metadata = Metadata()
    apply(metadata, create_group("billing", max_attempts=3))
    version = metadata.version
    [again, unknown] = apply(metadata, create_group("billing", max_attempts=9), update_group("nope", max_attempts=2))
    assert "update" in refused(again, Code.GROUP_EXISTS)
    assert refused(unknown, Code.UNKNOWN_GROUP) == "consumer group 'nope' has no settings: create it first"
    assert metadata.consumer_groups["billing"].max_attempts == 3 and "nope" not in metadata.consumer_groups
    assert metadata.version == version
    with pytest.raises(RocketError) as caught:
        metadata.consumer_group("nope")
    assert caught.value.code == Code.UNKNOWN_GROUP


@pytest.mark.parametrize("settings, says", [
    ({"max_attempts": -1}, f"max_attempts must be 1..{limits.checks_config_max}"),
    ({"max_attempts": limits.checks_config_max + 1}, f"max_attempts must be 1..{limits.checks_config_max}"),
    ({"max_attempts": True}, "max_attempts must be"),
    ({"retry_backoff_s": [1, -1]}, "each step of retry_backoff_s must be 0.."),
    ({"retry_backoff_s": [float("nan")]}, "retry_backoff_s must be"),  # JSON writes NaN as null
    ({"retry_backoff_s": [1] * (limits.group_retry_backoff_steps_max + 1)}, "steps; at most"),
    ({"retry_backoff_s": ["1s"]}, "retry_backoff_s must be a list of seconds"),
    ({"consume_mode": "pubsub"}, "consume_mode must be one of clustering, broadcasting, got 'pubsub'"),
    ({"fifo": "yes"}, "fifo must be true or false"),
    ({"colour": "red"}, "a consumer group has no setting 'colour'"),
])
def test_settings_out_of_range_are_refused_by_create_and_update(settings, says):
    metadata = Metadata()
    apply(metadata, create_group("billing", max_attempts=3))
    [made, updated] = apply(metadata, create_group("other", **settings), update_group("billing", **settings))
    assert says in refused(made, Code.BAD_REQUEST) and says in refused(updated, Code.BAD_REQUEST)
    assert "other" not in metadata.consumer_groups and metadata.consumer_groups["billing"].max_attempts == 3


def test_a_bad_group_name_is_refused():
    [made] = apply(Metadata(), create_group("bad name!"))
    assert "group name" in refused(made, Code.BAD_REQUEST)


def test_the_count_of_groups_with_settings_is_bounded(monkeypatch):
    monkeypatch.setattr(limits, "consumer_groups_max", 2)
    metadata = Metadata()
    apply(metadata, create_group("a"), create_group("b"))
    [third] = apply(metadata, create_group("c"))
    assert "maximum of 2 consumer groups" in refused(third, Code.OVERLOADED)


def test_the_nameserver_checks_a_request_before_it_proposes():
    request = {"group": "g", "max_attempts": 2, "retry_backoff_s": [1.0], "consume_mode": "clustering", "fifo": False}
    assert settings_of(request, ["max_attempts"]) == {"max_attempts": 2}
    with pytest.raises(RocketError) as caught:
        settings_of(request, ["max_attempts", "colour"])
    assert "no setting 'colour'" in caught.value.message
    with pytest.raises(RocketError) as caught:
        settings_of({**request, "max_attempts": 1001}, ["max_attempts"])
    assert caught.value.code == Code.BAD_REQUEST


def test_groups_settings_survive_a_snapshot():
    metadata = registered()
    apply(metadata, create("orders", 2, [{"id": 2, "voters": [1, 2, 3]}], [2]),
          create_group("billing", max_attempts=2, retry_backoff_s=[1, 5]), create_group("audit", fifo=True),
          update_group("audit", consume_mode="broadcasting"))
    copy = Metadata()
    copy.restore(metadata.snapshot())
    assert copy.snapshot() == metadata.snapshot()
    assert copy.consumer_groups == metadata.consumer_groups
    assert copy.consumer_groups["audit"] == ConsumerGroup("audit", 0, (), "broadcasting", True)


def test_a_snapshot_from_before_group_settings_restores_with_none():
    """The layout written before consumer-group settings: no consumer_groups field."""
    old = orjson.dumps({
        "version": 7,
        "topics": [["orders", 2, 5, [2], "normal", -1.0, -1.0, 1, 0, [2, 2], "raft"]],
        "groups": [[2, [1, 2, 3], [], 0, "raft", None]],
        "nodes": [{"id": 1, "address": "127.0.0.1:9001", "roles": ["storage"], "state": "up"}],
        "classes": [], "elections": [],
    })
    metadata = Metadata()
    metadata.restore([old])
    assert metadata.version == 7 and metadata.consumer_groups == {} and "orders" in metadata.topics
    [made] = apply(metadata, create_group("billing", max_attempts=2))
    assert made.max_attempts == 2 and metadata.version == 8
