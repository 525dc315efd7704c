"""Where new replicas go. One interface, Placement; this module's LeastLoaded scores nodes by load,
and the trained model of rocket/ml plugs into the same interface later. Pure: no I/O, no clock."""

from __future__ import annotations

import dataclasses
from typing import Protocol

from rocket import limits
from rocket.errors import Code, RocketError


@dataclasses.dataclass(slots=True)
class NodeLoad:
    node: int
    replicas: int = 0  # replicas hosted, counting ones placed by this decision
    leads: int = 0  # groups it leads: a proxy for the traffic it serves
    bytes: int = 0  # bytes stored
    free_disk_bytes: int = 0
    available: bool = True  # up and not draining: never place on a down or draining node


class Placement(Protocol):
    def place(self, groups: int, replicas: int, nodes: list[NodeLoad]) -> list[tuple[int, ...]]:
        """Replica sets for `groups` new groups, each on `replicas` distinct available nodes."""
        ...


class LeastLoaded:
    """Each replica goes to the available node with the lowest score that does not hold one yet."""

    def score(self, load: NodeLoad) -> float:
        """In replicas: each hosted replica counts one, and leads, stored bytes and a low disk add their weights."""
        low_disk = load.free_disk_bytes and load.free_disk_bytes < limits.placement_free_disk_bytes_min
        free_penalty = limits.placement_low_disk_replicas if low_disk else 0.0
        return (load.replicas + limits.placement_lead_replicas * load.leads
                + load.bytes / limits.placement_replica_bytes + free_penalty)

    def place(self, groups: int, replicas: int, nodes: list[NodeLoad]) -> list[tuple[int, ...]]:
        loads = {load.node: dataclasses.replace(load) for load in nodes if load.available}
        if len(loads) < replicas:
            raise RocketError(Code.UNAVAILABLE, f"{replicas} replicas need {replicas} available storage nodes; "
                              f"{len(loads)} are available")
        placed = []
        for _ in range(groups):
            chosen: list[int] = []
            for _ in range(replicas):
                node = min((load for load in loads.values() if load.node not in chosen),
                           key=lambda load: (self.score(load), load.node)).node
                loads[node].replicas += 1
                chosen.append(node)
            placed.append(tuple(sorted(chosen)))
        return placed
