"""The standalone controller role (RIP-44, `rocket run --role controller`): the controller on a Raft group of its own
nodes. Storage nodes heartbeat to it and ask it for SyncStateSet changes; nameservers hand it handovers and drains and
mirror its word for routes. It keeps electing masters while every nameserver is down."""

from __future__ import annotations

import trio

from rocket.clock import Clock
from rocket.config import NodeConfig
from rocket.replication import Engine
from rocket.roles.controller.machine import CONTROLLER_GROUP, ControllerMachine
from rocket.roles.nameserver.controller import Controller
from rocket.roles.nameserver.group import RoleGroup
from rocket.roles.peers import Peers
from rocket.serde.typed import (ControlledGroup, ControllerGroupsResponse, ControllerHeartbeatRequest,
                                ControllerMembersRequest, ElectionRecord, Empty, HandOverFromRequest, NodeLoad, plain)
from rocket.transport.rpc import Dispatcher


class ControllerRole:
    """The controller's calls over its group (RoleGroup over a ControllerMachine). The group's leader alone keeps the
    storage nodes' heartbeats, in memory, and elects: a new leader hears every node again within a heartbeat, and
    judges none before limits.controller_lapse_s (Controller._heard_within)."""

    def __init__(self, config: NodeConfig, host: Engine, peers: Peers, clock: Clock):
        self.members = config.controller_members()
        self.machine = ControllerMachine()
        host.add_group(CONTROLLER_GROUP, tuple(self.members), self.machine)
        self.group = RoleGroup(config, host, peers, self.members, CONTROLLER_GROUP, "controllers")
        self.heartbeats: dict[int, tuple[float, NodeLoad]] = {}  # storage node -> (when, its replicas' positions)
        self.controller = Controller(self.group, self.machine, self.heartbeats, clock, "ControllerHandover")

    def register(self, dispatcher: Dispatcher) -> None:
        dispatcher.handle_typed("ControllerHeartbeat", self.heartbeat)
        dispatcher.handle_typed("ControllerGroups", self.groups)
        dispatcher.handle_typed("ControllerAlterSyncStateSet", self.controller.alter_sync_state_set)
        dispatcher.handle_typed("ControllerHandover", self.controller.handover)
        dispatcher.handle_typed("ControllerHandOverFrom", self.hand_over_from)
        dispatcher.handle_typed("ControllerMembers", self.change_members)

    async def serve(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        await self.controller.control_forever()

    async def heartbeat(self, request: ControllerHeartbeatRequest) -> ControllerGroupsResponse:
        return await self.group.on_leader("ControllerHeartbeat", request, self._heartbeat_here)

    async def _heartbeat_here(self, request: ControllerHeartbeatRequest) -> ControllerGroupsResponse:
        """Note the node's replicas' positions; register the groups it names that the controller has not heard of;
        answer the controller's word on each of its groups (unknown: those still not registered)."""
        self.heartbeats[request.node] = (trio.current_time(), NodeLoad(controlled=request.replicas))
        fresh = [plain(word) for word in request.register if word.group not in self.machine.groups]
        if fresh:
            await self.group.propose({"op": "register", "groups": fresh})
        named = {replica.group for replica in request.replicas} | {word.group for word in request.register}
        return ControllerGroupsResponse(groups=[self._word(group) for group in sorted(named)
                                                if group in self.machine.groups],
                                        unknown=sorted(named - set(self.machine.groups)))

    async def groups(self, request: Empty) -> ControllerGroupsResponse:
        async def here(_: Empty) -> ControllerGroupsResponse:
            return ControllerGroupsResponse(groups=[self._word(group) for group in sorted(self.machine.groups)],
                                            elections=[ElectionRecord(**entry) for entry in self.machine.elections])

        return await self.group.read("ControllerGroups", request, here, locally=False)  # on the leader: its latest

    async def hand_over_from(self, request: HandOverFromRequest) -> Empty:
        async def here(request: HandOverFromRequest) -> Empty:
            unfit = set(request.nodes)
            await self.controller.hand_over_from(unfit.__contains__)
            return Empty()

        return await self.group.on_leader("ControllerHandOverFrom", request, here)

    async def change_members(self, request: ControllerMembersRequest) -> ControlledGroup:
        async def here(request: ControllerMembersRequest) -> ControlledGroup:
            await self.group.propose({"op": "members", "group": request.group, "replicas": request.replicas,
                                      "leaving": request.leaving})
            if request.drop:
                await self.controller.drop(request.group, request.drop)
            return self._word(request.group)

        return await self.group.on_leader("ControllerMembers", request, here)

    def _word(self, group: int) -> ControlledGroup:
        return ControlledGroup(**self.machine.groups[group].to_wire(group))
