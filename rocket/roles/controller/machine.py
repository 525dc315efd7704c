"""The standalone controller's state machine (RIP-44), on the controllers' own Raft group: each controller-mode group's
replicas and the controller's word on it, and the last elections. Pure: no I/O, no clock; commands are JSON objects
decided by the group's leader, whose elections and SyncStateSet changes are judged as the embedded controller's are."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

import orjson

from rocket import limits
from rocket.errors import Code, RocketError
from rocket.roles.nameserver.control import Control, alter, elect
from rocket.roles.nameserver.metadata import apply_json

# The controllers' Raft group: past any storage group (group 0 carries node heartbeats, 1 is the nameservers').
CONTROLLER_GROUP = 2**62


@dataclasses.dataclass(slots=True)
class Controlled:
    """A controller-mode storage group as the controller knows it since its first replica registered it."""

    voters: tuple[int, ...]  # the replicas it may elect or keep in the SyncStateSet
    control: Control
    unclean_election: bool = False
    leaving: int = 0  # a replica being replaced (a replica move): not let into the SyncStateSet again

    def to_wire(self, group: int) -> dict:
        return {"group": group, "voters": list(self.voters), "unclean_election": self.unclean_election,
                **self.control.to_wire()}


class ControllerMachine:
    """The state machine: storage group -> Controlled, and the last limits.elections_kept_max elections. A group is
    registered by the first heartbeat of one of its replicas that carries it (with the word its assignment holds: a
    group made by the nameservers starts at its first master and epochs 1), and changed by elections and SyncStateSet
    changes, each judged under the epochs it was decided at, and by the nameservers' replica moves (members)."""

    def __init__(self) -> None:
        self.groups: dict[int, Controlled] = {}
        self.elections: list[dict] = []

    def apply(self, entries, positions) -> list:
        return apply_json(entries, self._command)

    def _command(self, command: dict):
        operation = command["op"]
        if operation == "register":
            for word in command["groups"]:
                if word["group"] not in self.groups:  # a later registration of a known group changes nothing
                    self.groups[word["group"]] = Controlled(
                        tuple(word["voters"]), Control(word["master"], word["master_epoch"],
                                                       tuple(sorted(word["sync_state_set"])),
                                                       word["sync_state_set_epoch"]),
                        word["unclean_election"])
            return None
        if operation == "elect_master":
            known, control = self._known(command["group"])
            elected, record = elect(command, known.voters, control)
            known.control = elected
            self.elections.append(record)
            del self.elections[:-limits.elections_kept_max]
            return elected.to_wire()
        if operation == "alter_sync_state_set":
            known, control = self._known(command["group"])
            known.control = alter(command, known.voters, control, known.leaving)
            return known.control.to_wire()
        if operation == "members":  # a replica move (the nameservers' _move), step by step
            known, _ = self._known(command["group"])
            known.voters, known.leaving = tuple(command["replicas"]), command["leaving"]
            return None
        raise RocketError(Code.BAD_REQUEST, f"unknown controller command {operation!r}")

    def _known(self, group: int) -> tuple[Controlled, Control]:
        known = self.groups.get(group)
        if known is None:
            raise RocketError(Code.BAD_REQUEST, f"storage group {group} is not registered with the controller")
        return known, known.control

    # ---- what the controller reads (ControlledGroups) -------------------------------------------------

    def controlled(self) -> list[tuple[int, tuple[int, ...], Control]]:
        return [(group, known.voters, known.control) for group, known in self.groups.items()]

    def control_of(self, group: int) -> tuple[tuple[int, ...], Control]:
        known, control = self._known(group)
        return known.voters, control

    def unclean(self, group: int) -> bool:
        return self.groups[group].unclean_election

    # ---- snapshots ------------------------------------------------------------------------------------

    def snapshot(self) -> list[bytes]:
        return [orjson.dumps({"groups": [{**known.to_wire(group), "leaving": known.leaving}
                                         for group, known in self.groups.items()],
                              "elections": self.elections})]

    def restore(self, chunks: Iterable[bytes]) -> None:
        data = b"".join(chunks)
        if not data:
            return
        state = orjson.loads(data)
        self.groups = {word["group"]: Controlled(tuple(word["voters"]),
                                                 Control(word["master"], word["master_epoch"],
                                                         tuple(word["sync_state_set"]), word["sync_state_set_epoch"]),
                                                 word["unclean_election"], word["leaving"])
                       for word in state["groups"]}
        self.elections = list(state["elections"])
