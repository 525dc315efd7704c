"""Where a storage call's group is: hosted on this node, led by it, and the queue positions a request names, checked
before anything changes. A part of StorageRole that the others share.
"""

from __future__ import annotations

from rocket import limits
from rocket.errors import Code, RocketError
from rocket.replication import Engine, NotLeader
from rocket.store.store import GroupMachine


class NotHosted(RocketError):
    def __init__(self, group: int, node: int):
        super().__init__(Code.UNAVAILABLE, f"storage group {group} is not hosted on node {node}")


class Gate:
    """The storage groups this node hosts (its engine's groups whose machine is the store's), the ones it leads, and
    the checks a call passes first: NotHosted, NotLeader, DISK_FULL, positions out of range."""

    def __init__(self, host: Engine, node_id: int):
        self.host = host
        self.node_id = node_id

    def storage_groups(self) -> set[int]:
        return {group for group in self.host.groups if isinstance(self.host.machine_of(group), GroupMachine)}

    def led_terms(self) -> dict[int, int]:
        """The storage groups this node leads, each with its term."""
        return {group: self.host.term(group) for group in self.storage_groups() if self.host.leads(group)}

    def hosted(self, group: int) -> None:
        if not isinstance(self.host.machine_of(group), GroupMachine):
            raise NotHosted(group, self.node_id)

    def leads(self, group: int) -> None:
        """Writes, and reads that must see everything committed, are served by the group's leader."""
        self.hosted(group)
        if not self.host.leads(group):
            raise NotLeader(self.host.leader_of(group))

    def room_for_data(self) -> None:
        """New data (a produce, a KV put) needs the disk's free space above its reserve; offsets commits, acks and
        other small control writes do not ask, and take the reserve, so that consumers go on while it is full."""
        if self.host.disk_refusal:
            raise RocketError(Code.DISK_FULL, self.host.disk_refusal)

    @staticmethod
    def positions(entries: list[dict], field: str) -> dict[int, int]:
        """queue -> offset from a request, checked: what a group's log holds must apply on every replica."""
        positions = {}
        for entry in entries:
            queue, value = entry["queue"], entry[field]
            if not 0 <= queue < limits.queues_per_topic_max or not 0 <= value < 2**63:
                raise RocketError(Code.BAD_REQUEST, f"queue {queue} with {field} {value} is out of range")
            positions[queue] = value
        return positions
