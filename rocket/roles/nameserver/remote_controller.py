"""The nameservers' side of a standalone controller (`rocket run --role controller`, config controllers): handovers
and drains go to it, and its word on each controller-mode group is mirrored into the metadata for routes and status.
A part of Nameserver, in the place of the embedded Controller."""

from __future__ import annotations

import logging
from collections.abc import Callable

from rocket import limits
from rocket.clock import sleep_periodic
from rocket.errors import RocketError
from rocket.roles.nameserver.group import MetadataGroup
from rocket.roles.peers import Peers
from rocket.serde.typed import ControlState, HandoverRequest, convert, plain

log = logging.getLogger("rocket.controller")


class RemoteController:
    """What Nameserver asks of its controller, asked of the standalone one. The mirror lags the controller by up to
    limits.node_heartbeat_s: a route naming a deposed master costs a produce one retry on the other replicas, and the
    storage nodes take the controller's word from it directly."""

    def __init__(self, meta: MetadataGroup, peers: Peers):
        self.meta = meta
        self.peers = peers
        self._unreachable = False  # logged once per outage

    async def handover(self, request: HandoverRequest) -> ControlState:
        return await self.meta.on_leader("Handover", request, self._handover_here)

    async def _handover_here(self, request: HandoverRequest) -> ControlState:
        """On the nameservers' leader: the controller hands over, and its word is mirrored at once, so that routes
        name the new master before the next mirror round."""
        wait_s = limits.handover_wait_s + limits.request_timeout_s_default
        handed = convert(await self.peers.controller("ControllerHandover", plain(request), timeout_s=wait_s),
                         ControlState)
        await self._mirror()
        return handed

    async def hand_over_from(self, unfit: Callable[[int], bool]) -> None:
        """On the leader, masters on nodes that drain or are degraded: the controller hands their groups over (and
        its word is mirrored at once)."""
        nodes = sorted({control.master for _, _, control in self.meta.metadata.controlled() if unfit(control.master)})
        if nodes:
            await self.peers.controller("ControllerHandOverFrom", {"nodes": nodes})
            await self._mirror()

    async def members(self, group: int, replicas: tuple[int, ...], leaving: int, drop: int = 0) -> None:
        """A replica move's change of the group's replicas (and, with drop, of its SyncStateSet), on the controller."""
        await self.peers.controller("ControllerMembers", {"group": group, "replicas": list(replicas),
                                                          "leaving": leaving, "drop": drop})

    async def drop(self, group: int, node: int) -> None:
        held = self.meta.metadata.control_of(group)[0]
        await self.members(group, held, node, drop=node)

    async def control_forever(self) -> None:
        """As the nameservers' leader, every limits.node_heartbeat_s while there are controller-mode groups: mirror the
        controller's newer words and its elections into the metadata."""
        while True:
            controlled = self.meta.metadata.controlled()
            await sleep_periodic(limits.node_heartbeat_s if controlled else limits.idle_recheck_s)
            if not controlled or not self.meta.leads():
                continue
            try:
                await self._mirror()
            except RocketError as error:
                if not self._unreachable:
                    log.warning("the standalone controller does not answer: %s", error)
                self._unreachable = True
                continue
            self._unreachable = False

    async def _mirror(self) -> None:
        answer = await self.peers.controller("ControllerGroups", {})
        held = {group: control for group, _, control in self.meta.metadata.controlled()}
        newer = [word for word in answer["groups"] if word["group"] in held
                 and (word["master_epoch"], word["sync_state_set_epoch"])
                 > (held[word["group"]].master_epoch, held[word["group"]].sync_state_set_epoch)]
        if newer or answer["elections"] != self.meta.metadata.elections:
            await self.meta.propose({"op": "mirror_control", "groups": newer, "elections": answer["elections"]})
