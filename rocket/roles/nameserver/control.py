"""The controller's rules (RIP-44), pure: its word on a controller-mode group (Control), and how an election and a
master's SyncStateSet change are judged (elect, alter). The nameservers' metadata and the standalone controller's
machine (roles/controller/machine.py) hold their state by them alike."""

from __future__ import annotations

import dataclasses

from rocket.errors import Code, RocketError


@dataclasses.dataclass(slots=True)
class Control:
    """The controller's view of a controller-mode group: its master, and the replicas known to hold everything
    acknowledged (the SyncStateSet). Each epoch rises with its part, so a stale request is FENCED."""

    master: int
    master_epoch: int
    sync_state_set: tuple[int, ...]
    sync_state_set_epoch: int

    def to_wire(self) -> dict:
        return {"master": self.master, "master_epoch": self.master_epoch,
                "sync_state_set": list(self.sync_state_set), "sync_state_set_epoch": self.sync_state_set_epoch}


def elect(command: dict, voters: tuple[int, ...], control: Control) -> tuple[Control, dict]:
    """A new master, decided under the master epoch it replaces (FENCED otherwise): alone in the sync state set, since
    only it is known to hold everything it will acknowledge. Returns it and the election's record."""
    group, master = command["group"], command["master"]
    if control.master_epoch != command["from_epoch"]:
        raise RocketError(Code.FENCED, f"group {group} is at master epoch {control.master_epoch}, not "
                          f"{command['from_epoch']}")
    if master not in voters:
        raise RocketError(Code.BAD_REQUEST, f"node {master} is not a replica of group {group}")
    if not command["unclean"] and master not in control.sync_state_set:
        raise RocketError(Code.BAD_REQUEST, f"node {master} is not in group {group}'s sync state set "
                          f"{list(control.sync_state_set)}: only an unclean election may choose it")
    elected = Control(master, control.master_epoch + 1, (master,), control.sync_state_set_epoch + 1)
    return elected, {"group": group, "master_epoch": elected.master_epoch, "master": master,
                     "previous": control.master, "unclean": bool(command["unclean"]), "at_ms": command["at_ms"],
                     "previous_last_index": command["previous_last_index"],
                     "master_last_index": command["master_last_index"]}


def alter(command: dict, voters: tuple[int, ...], control: Control, leaving: int = 0) -> Control:
    """The master's new sync state set, decided under the epochs it was asked under: a deposed master's or an older
    change is FENCED. It may add only replicas in voters, and keep any member it has; a replica leaving in a move is
    left out of what it asks (a subset of a set the master waited for holds everything acknowledged too)."""
    group, master = command["group"], command["master"]
    if (control.master, control.master_epoch, control.sync_state_set_epoch) != (
            master, command["master_epoch"], command["sync_state_set_epoch"]):
        raise RocketError(Code.FENCED, f"group {group} has master {control.master} at epoch "
                          f"{control.master_epoch}, sync state set epoch {control.sync_state_set_epoch}; the "
                          f"change was asked by node {master} at epochs {command['master_epoch']} and "
                          f"{command['sync_state_set_epoch']}")
    wanted = tuple(sorted(set(command["sync_state_set"]) - ({leaving} - set(control.sync_state_set))))
    if master not in wanted:
        raise RocketError(Code.BAD_REQUEST, f"group {group}'s master {master} must be in its sync state set")
    strangers = sorted(set(wanted) - set(voters) - set(control.sync_state_set))  # a member may stay until dropped
    if strangers:
        raise RocketError(Code.BAD_REQUEST, f"nodes {strangers} are not replicas of group {group}")
    return dataclasses.replace(control, sync_state_set=wanted, sync_state_set_epoch=control.sync_state_set_epoch + 1)
