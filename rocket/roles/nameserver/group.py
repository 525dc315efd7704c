"""A Raft group of a role's own, as the role's parts reach it: a change proposed, a call run on the group's leader
(forwarded there from a follower), and a read answered here or on the leader. MetadataGroup: the nameservers'."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import msgspec
import orjson
import trio

from rocket import limits
from rocket.config import NodeConfig
from rocket.errors import Code, RocketError
from rocket.replication import Engine
from rocket.roles.nameserver.metadata import META_GROUP, Metadata
from rocket.roles.peers import RETRYABLE, Peers
from rocket.serde import typed
from rocket.transport.methods import method_spec


class RoleGroup:
    """The Raft group `group` of the nodes `members` (node -> its address), called `name` in errors."""

    def __init__(self, config: NodeConfig, host: Engine, peers: Peers, members: dict, group: int, name: str):
        self.node_id = config.node_id
        self.host = host
        self.peers = peers
        self.members = members
        self.group = group
        self.name = name

    def leads(self) -> bool:
        return self.host.leader_of(self.group) == self.node_id

    async def on_leader(self, method: str, request: Any, here: Callable[[Any], Awaitable[Any]]) -> Any:
        """Run here when this node leads the metadata group, else forward the call to the leader. A typed request
        (rocket/serde/typed.py) goes in its plain form, and its answer comes back typed."""
        with trio.move_on_after(limits.leader_wait_s_max):
            while True:
                leader = self.host.leader_of(self.group)
                if leader == self.node_id:
                    return await here(request)
                if leader in self.members:
                    try:
                        if not isinstance(request, msgspec.Struct):
                            return await self.peers.call(self.members[leader], method, request)
                        answer = await self.peers.call(self.members[leader], method, typed.plain(request))
                        return typed.convert(answer, typed.STRUCTS[method_spec(method).response_type])
                    except RocketError as error:
                        if error.code not in RETRYABLE:
                            raise
                await trio.sleep(limits.leader_poll_s)  # an election is on, or the leader just failed
        raise RocketError(Code.UNAVAILABLE, f"the {self.name} have no leader after {limits.leader_wait_s_max} s")

    async def propose(self, command: dict):
        return await self.host.propose(self.group, orjson.dumps(command))

    def in_sync(self) -> bool:
        """A follower answers reads itself while it is in sync with the leader (it heard from
        it within an election timeout and applied nearly all it committed): stale by a bounded amount."""
        return self.host.in_sync(self.group, limits.follower_read_lag_entries_max)

    async def read(self, method: str, request: Any, here: Callable[[Any], Awaitable[Any]], locally: bool = True) -> Any:
        """A read of the metadata: here when in sync (and locally allowed), else on the leader after a
        read barrier (its lease, or a round of heartbeats), so that a new or deposed leader does not
        answer from old state."""
        if locally and not self.leads() and self.in_sync():
            return await here(request)

        async def on_leader(request):
            await self.host.read_barrier(self.group, lease=True)
            return await here(request)

        return await self.on_leader(method, request, on_leader)


class MetadataGroup(RoleGroup):
    """The nameservers' group, whose state machine is the cluster metadata."""

    def __init__(self, config: NodeConfig, host: Engine, peers: Peers, members: dict, metadata: Metadata):
        super().__init__(config, host, peers, members, META_GROUP, "nameservers")
        self.metadata = metadata
