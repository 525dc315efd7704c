"""The standalone controller's state machine (roles/controller/machine.py): groups registered by their replicas'
first heartbeats, elections and SyncStateSet changes judged as the embedded controller's are, snapshots; and the
nameservers' mirror of its word (metadata op mirror_control)."""

import pytest

from rocket.errors import Code
from rocket.roles.controller.machine import CONTROLLER_GROUP, ControllerMachine
from rocket.roles.nameserver.control import Control
from rocket.roles.nameserver.metadata import Metadata
from tests.unit.test_metadata import entries
from tests.unit.test_storage_classes import alter, create_class, elect, gold, refused
from tests.unit.test_metadata import apply as apply_metadata


def apply(machine: ControllerMachine, *commands: dict) -> list:
    return machine.apply(entries(*commands), [-1] * len(commands))


def word(group: int, voters: list[int], master: int, master_epoch: int = 1, sync_state_set: list[int] | None = None,
         set_epoch: int = 1, unclean: bool = False) -> dict:
    return {"group": group, "voters": voters, "unclean_election": unclean, "master": master,
            "master_epoch": master_epoch, "sync_state_set": sync_state_set or sorted(voters),
            "sync_state_set_epoch": set_epoch}


def registered() -> ControllerMachine:
    machine = ControllerMachine()
    apply(machine, {"op": "register", "groups": [word(3, [2, 1], 2), word(4, [3, 4], 3, unclean=True)]})
    return machine


def test_the_controllers_group_is_neither_the_node_heartbeat_nor_the_nameservers_nor_a_storage_group():
    assert CONTROLLER_GROUP not in (0, 1) and CONTROLLER_GROUP > 2**32


def test_a_group_is_registered_once_with_the_word_its_replica_brings():
    machine = registered()
    assert machine.control_of(3) == ((2, 1), Control(2, 1, (1, 2), 1))
    assert machine.unclean(4) and not machine.unclean(3)
    # a later registration (another replica, or a restarted one with an older assignment) changes nothing
    apply(machine, {"op": "register", "groups": [word(3, [2, 1], 1, master_epoch=1, sync_state_set=[1])]})
    assert machine.control_of(3) == ((2, 1), Control(2, 1, (1, 2), 1))
    assert [group for group, _, _ in machine.controlled()] == [3, 4]


def test_elections_and_sync_state_set_changes_are_judged_as_the_embedded_controllers_are():
    machine = registered()
    [elected] = apply(machine, elect(3, 1, from_epoch=1))
    assert elected == {"master": 1, "master_epoch": 2, "sync_state_set": [1], "sync_state_set_epoch": 2}
    assert "master epoch 2, not 1" in refused(apply(machine, elect(3, 2, from_epoch=1))[0], Code.FENCED)
    assert "only an unclean election" in refused(apply(machine, elect(3, 2, from_epoch=2))[0], Code.BAD_REQUEST)
    assert refused(apply(machine, alter(3, 2, 1, 1, [1, 2]))[0], Code.FENCED)  # the deposed master's
    [altered] = apply(machine, alter(3, 1, 2, 2, [1, 2]))
    assert altered["sync_state_set"] == [1, 2] and altered["sync_state_set_epoch"] == 3
    assert "not replicas" in refused(apply(machine, alter(3, 1, 2, 3, [1, 2, 9]))[0], Code.BAD_REQUEST)
    assert "not registered" in refused(apply(machine, elect(7, 1, from_epoch=1))[0], Code.BAD_REQUEST)
    assert [(entry["group"], entry["master"], entry["previous"]) for entry in machine.elections] == [(3, 1, 2)]


def test_a_replica_move_changes_the_replicas_and_keeps_the_leaving_one_out():
    """Node 5 replaces node 1 in group 3 (master 2, set [1, 2]): node 5 may join, node 1 may stay until dropped but
    not rejoin; the move done, the replicas are the new ones."""
    machine = registered()
    apply(machine, {"op": "members", "group": 3, "replicas": [2, 5], "leaving": 1})
    [joined] = apply(machine, alter(3, 2, 1, 1, [1, 2, 5]))
    assert joined["sync_state_set"] == [1, 2, 5]
    apply(machine, alter(3, 2, 1, 2, [2, 5]))  # dropped (Controller.drop)
    [kept_out] = apply(machine, alter(3, 2, 1, 3, [1, 2, 5]))
    assert kept_out["sync_state_set"] == [2, 5]
    assert "not a replica" in refused(apply(machine, elect(3, 1, from_epoch=1, unclean=True))[0], Code.BAD_REQUEST)
    apply(machine, {"op": "members", "group": 3, "replicas": [2, 5], "leaving": 0})
    restored = ControllerMachine()
    restored.restore(machine.snapshot())
    assert restored.control_of(3) == ((2, 5), Control(2, 1, (2, 5), 4)) and restored.groups[3].leaving == 0


def test_the_state_survives_a_snapshot():
    machine = registered()
    apply(machine, elect(4, 4, from_epoch=1))
    apply(machine, {"op": "members", "group": 4, "replicas": [3, 4], "leaving": 9})
    restored = ControllerMachine()
    restored.restore(machine.snapshot())
    assert restored.controlled() == machine.controlled() and restored.elections == machine.elections
    assert restored.unclean(4) and restored.groups[4].leaving == 9


@pytest.mark.parametrize("epochs, mirrored", [((2, 2), True), ((1, 2), True), ((1, 1), False), ((0, 5), False)])
def test_the_nameservers_mirror_only_a_newer_word(epochs, mirrored):
    metadata: Metadata = gold()  # group 3: master 2 at epochs (1, 1)
    master_epoch, set_epoch = epochs
    elections = [{"group": 3, "master_epoch": 2, "master": 1, "previous": 2, "unclean": False, "at_ms": 5,
                  "previous_last_index": 9, "master_last_index": 9}]
    apply_metadata(metadata, {"op": "mirror_control", "elections": elections,
                              "groups": [word(3, [2, 1], 1, master_epoch, [1], set_epoch), word(99, [1], 1)]})
    _, control = metadata.control_of(3)
    assert (control == Control(1, master_epoch, (1,), set_epoch)) is mirrored
    assert metadata.elections == elections


def test_a_class_of_the_embedded_controller_reads_through_the_same_interface():
    metadata = gold()
    apply_metadata(metadata, create_class("silver", [{"id": 5, "voters": [1, 4]}], unclean_election=True))
    assert [group for group, _, _ in metadata.controlled()] == [3, 4, 5]
    assert metadata.unclean(5) and not metadata.unclean(3)
