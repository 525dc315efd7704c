"""Read replicas (issue 53): each storage group keeps as many learners as the topics on it ask for
(`read_replicas`), on nodes placement chooses; ReadReplicas adds and removes them, on the nameservers' leader."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

import trio

from rocket import limits
from rocket.errors import Code, RocketError
from rocket.ml.placement import NodeLoad, Placement
from rocket.roles.nameserver.group import MetadataGroup
from rocket.roles.nameserver.metadata import Metadata

log = logging.getLogger("rocket.nameserver")


def check_read_replicas(metadata: Metadata, storage_class: str, count: int) -> None:
    """BAD_REQUEST unless count read replicas may serve a topic of storage_class: 0..limits.read_replicas_max, and
    only on a Raft class (a controller-mode group's slaves serve reads already, as RocketMQ's do)."""
    if not 0 <= count <= limits.read_replicas_max:
        raise RocketError(Code.BAD_REQUEST, f"read_replicas must be 0..{limits.read_replicas_max}, got {count}")
    if count and storage_class in metadata.classes and metadata.classes[storage_class].mode != "raft":
        raise RocketError(Code.BAD_REQUEST, f"read replicas need a raft storage class; {storage_class!r} is "
                          f"{metadata.classes[storage_class].mode}")


class ReadReplicas:
    """Brings each group's readers to what its topics want, one change per group per round: a reader on a node that
    leaves (down, draining, long degraded) goes, then one too many goes, or one goes to the least loaded node
    available that does not hold the group yet. An added reader is recorded first (reader_add: its node hosts the
    group as a learner from its next heartbeat), then added on the group's leader; a removed one is removed on the
    leader first, then from the record. Adds are repeated until a leader confirms them (a change already made
    answers at once), so a new nameserver leader, or a failed call, picks up where the last left off."""

    def __init__(self, meta: MetadataGroup, metadata: Metadata, placement: Placement,
                 loads: Callable[[], list[NodeLoad]], leaving: Callable[[int], bool],
                 change_members: Callable[[int, str, int], Awaitable[None]]):
        self.meta = meta
        self.metadata = metadata
        self.placement = placement
        self.loads = loads
        self.leaving = leaving
        self.change_members = change_members
        self._confirmed: set[tuple[int, int]] = set()  # (group, node): a leader added the learner (this leader's term)
        self._planning = False

    def forget(self) -> None:
        """No longer the leader: a later term confirms the readers again."""
        self._confirmed.clear()

    def start(self, nursery: trio.Nursery, moving: set[int]) -> None:
        """A round in the background, unless one runs: a leader slow to answer holds it, not the caller's loop."""
        if not self._planning:
            self._planning = True
            nursery.start_soon(self._plan, moving)

    async def _plan(self, moving: set[int]) -> None:
        """One round over the groups. A group whose replica move runs is left alone, and one whose readers change
        counts as moving meanwhile: one membership change at a time."""
        try:
            wanted = self.metadata.readers_wanted()
            for group, members in list(self.metadata.groups.items()):
                if group in moving or members.control is not None or not (members.readers or wanted.get(group)):
                    continue
                moving.add(group)
                try:
                    await self._plan_group(group, wanted.get(group, 0))
                except RocketError as error:
                    log.warning("group %d: read replicas: %s; trying again later", group, error)
                finally:
                    moving.discard(group)
        finally:
            self._planning = False

    async def _plan_group(self, group: int, wanted: int) -> None:
        members = self.metadata.groups[group]
        gone = [node for node in members.readers if self.leaving(node)]
        if gone or len(members.readers) > wanted:
            node = gone[0] if gone else members.readers[-1]
            await self.change_members(group, "remove", node)
            await self.meta.propose({"op": "reader_remove", "group": group, "node": node})
            self._confirmed.discard((group, node))
            log.info("group %d: read replica on node %d removed", group, node)
            return
        for node in members.readers:
            if (group, node) not in self._confirmed:
                await self.change_members(group, "add_learner", node)
                self._confirmed.add((group, node))
        if len(members.readers) < wanted:
            loads = [load for load in self.loads() if load.node not in self.metadata.members_of(group)]
            if not any(load.available for load in loads):
                return  # no node left for one more: the group serves with the readers it has
            node = self.placement.place(1, 1, loads)[0][0]
            await self.meta.propose({"op": "reader_add", "group": group, "node": node})
            await self.change_members(group, "add_learner", node)
            self._confirmed.add((group, node))
            log.info("group %d: read replica added on node %d", group, node)
