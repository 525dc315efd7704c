"""The controller of RIP-44: it decides who is master of each controller-mode storage group, on a lapse, on an
operator's handover, or off a node that drains or is degraded. Embedded, its state is in the nameservers' metadata;
standalone (roles/controller), in the controllers' own Raft group. The group's leader alone acts on it."""

from __future__ import annotations

import logging

import trio

from collections.abc import Callable
from typing import Protocol

from rocket import limits
from rocket.clock import Clock, sleep_periodic
from rocket.errors import Code, RocketError
from rocket.roles.nameserver.group import RoleGroup
from rocket.roles.nameserver.control import Control
from rocket.serde.typed import AlterSyncStateSetRequest, ControlState, HandoverRequest, NodeLoad

log = logging.getLogger("rocket.controller")


class ControlledGroups(Protocol):
    """The controller's state as it reads it: the metadata (embedded) or the controllers' machine (standalone)."""

    def controlled(self) -> list[tuple[int, tuple[int, ...], Control]]: ...

    def control_of(self, group: int) -> tuple[tuple[int, ...], Control]: ...

    def unclean(self, group: int) -> bool: ...


class Controller:
    """The controller. Its state, each controller-mode group's Control in `state`, is its master, master_epoch,
    SyncStateSet and sync_state_set_epoch; meta is the Raft group that holds it. Replicas' heartbeats carry each
    controlled replica's epoch and log end: the storage nodes' NodeHeartbeat (embedded) or ControllerHeartbeat."""

    def __init__(self, meta: RoleGroup, state: ControlledGroups, heartbeats: dict[int, tuple[float, NodeLoad]],
                 clock: Clock, handover_method: str = "Handover"):
        self.meta = meta
        self.handover_method = handover_method  # what the group's nodes serve handover() as (forwarded to the leader)
        self.state = state
        self.heartbeats = heartbeats  # node -> (when, load): kept by the heartbeat calls the group's leader answers
        self.clock = clock
        self._led_since: float | None = None  # when this node's current term as the group's leader began
        self._waiting: set[int] = set()  # groups whose master lapsed with no replica to elect (logged once)

    async def alter_sync_state_set(self, request: AlterSyncStateSetRequest) -> ControlState:
        return await self.meta.on_leader("ControllerAlterSyncStateSet", request, self._alter_here)

    async def _alter_here(self, request: AlterSyncStateSetRequest) -> ControlState:
        """A master's change of its SyncStateSet, applied only when made under the current epochs (FENCED otherwise),
        so that a deposed master, or a request overtaken by an election, changes nothing."""
        altered = await self.meta.propose({"op": "alter_sync_state_set", "group": request.group,
                                           "master": request.master, "master_epoch": request.master_epoch,
                                           "sync_state_set_epoch": request.sync_state_set_epoch,
                                           "sync_state_set": sorted(request.sync_state_set)})
        return ControlState(**altered)  # the metadata's Control.to_wire(): the record's fields

    async def handover(self, request: HandoverRequest) -> ControlState:
        return await self.meta.on_leader(self.handover_method, request, self._handover_here)

    async def _handover_here(self, request: HandoverRequest) -> ControlState:
        """Make node `to` the group's master on purpose: once it is in the SyncStateSet (it holds everything the
        master acknowledged; waited for up to limits.handover_wait_s) and heard from, it is elected at the next
        epoch, which fences the old master: its appends and its SyncStateSet changes are refused from then on."""
        group, target = request.group, request.to
        with trio.move_on_after(limits.handover_wait_s):
            while True:
                voters, control = self.state.control_of(group)
                if target not in voters:
                    raise RocketError(Code.BAD_REQUEST, f"node {target} is not a replica of group {group} "
                                      f"(its replicas: {list(voters)})")
                if control.master == target:
                    return ControlState(**control.to_wire())
                if target in control.sync_state_set and self._heard_within(target, limits.controller_lapse_s):
                    return ControlState(**await self._elect(group, target, control, "handed over by an operator"))
                await trio.sleep(limits.controller_check_s)
        raise RocketError(Code.UNAVAILABLE, f"node {target} did not join group {group}'s SyncStateSet "
                          f"{sorted(control.sync_state_set)} within {limits.handover_wait_s:g} s: it must hold "
                          "everything the master acknowledged first")

    async def hand_over_from(self, unfit: Callable[[int], bool]) -> None:
        """On the leader: a master on a node that drains or is degraded (unfit) hands its group over to the live
        member of its SyncStateSet with the longest log that is fit, if there is one."""
        for group, _, control in self.state.controlled():
            if not unfit(control.master):
                continue
            candidates = [node for node in control.sync_state_set if node != control.master and not unfit(node)
                          and self._heard_within(node, limits.controller_lapse_s)]
            if candidates:
                target = max(candidates, key=lambda node: (self._log_end(node, group), -node))
                await self._elect(group, target, control, f"node {control.master} drains or is degraded")

    async def members(self, group: int, replicas: tuple[int, ...], leaving: int) -> None:
        """A replica move's change of the group's replicas: embedded, the metadata holds them already (Members)."""

    async def drop(self, group: int, node: int) -> None:
        """On the leader: drop a replica being replaced from the group's SyncStateSet, at the next epoch, as the
        controller (a shrink keeps the invariant: every member left holds everything acknowledged). Never the
        master: it hands over first."""
        while node in (control := self.state.control_of(group)[1]).sync_state_set:
            if node == control.master:
                raise RocketError(Code.UNAVAILABLE, f"node {node} is group {group}'s master: it hands over first")
            try:
                await self.meta.propose({"op": "alter_sync_state_set", "group": group, "master": control.master,
                                         "master_epoch": control.master_epoch,
                                         "sync_state_set_epoch": control.sync_state_set_epoch,
                                         "sync_state_set": sorted(set(control.sync_state_set) - {node})})
            except RocketError as error:
                if error.code != Code.FENCED:  # the master changed the set meanwhile: read it again
                    raise
        log.info("group %d: node %d dropped from the SyncStateSet %s", group, node, sorted(control.sync_state_set))

    async def _elect(self, group: int, master: int, control: Control, why: str, unclean: bool = False) -> dict:
        elected = await self.meta.propose({
            "op": "elect_master", "group": group, "master": master, "from_epoch": control.master_epoch,
            "unclean": unclean, "at_ms": self.clock.wall_ms(),
            "previous_last_index": self._log_end(control.master, group),
            "master_last_index": self._log_end(master, group)})
        report = log.error if unclean else log.warning
        report("group %d: node %d is master at epoch %d (%s)", group, master, control.master_epoch + 1, why)
        return elected

    async def control_forever(self) -> None:
        """As the group's leader, elect a new master for each controller-mode group whose master lapsed: every
        limits.controller_check_s while there are such groups, every limits.idle_recheck_s while there are none (a
        new group's master lapses no sooner than limits.controller_lapse_s after its creation)."""
        while True:
            await sleep_periodic(limits.controller_check_s if self.state.controlled() else limits.idle_recheck_s)
            if not self.meta.leads():
                self._led_since = None
                continue
            if self._led_since is None:
                self._led_since = trio.current_time()
            try:
                await self._elect_masters()
            except RocketError as error:
                log.warning("electing controller-mode masters: %s", error)

    def _heard_within(self, node: int, seconds: float) -> bool:
        """Whether the node's heartbeat came within seconds; one not heard yet gets the doubt for seconds after
        this leader's election."""
        return self._silent_s(node) < seconds

    def _silent_s(self, node: int) -> float:
        heard = self.heartbeats.get(node)
        since = heard[0] if heard is not None else self._led_since
        return trio.current_time() - since if since is not None else 0.0  # not leading: nothing to judge

    def _log_end(self, node: int, group: int) -> int:
        """The last index of the node's replica of the group, as its last heartbeat reported (-1: unknown)."""
        heard = self.heartbeats.get(node)
        for replica in heard[1].controlled if heard is not None else ():
            if replica.group == group:
                return replica.last_index
        return -1

    async def _elect_masters(self) -> None:
        """Replace each master whose heartbeats lapsed for limits.controller_lapse_s by the live member of its
        SyncStateSet with the longest log, at the next epoch; the new SyncStateSet is the new master alone. With no
        live member, the group waits for one, unless its class allows an unclean election: then the live replica with
        the longest log is elected, and the election is recorded and logged as a possible loss of the entries past its
        log's end. A new leader gives every master controller_lapse_s from its election before judging it
        (_heard_within): it has not heard anyone yet."""
        for group, voters, control in self.state.controlled():
            if self._heard_within(control.master, limits.controller_lapse_s):
                self._waiting.discard(group)
                continue
            live = [node for node in voters
                    if node != control.master and self._heard_within(node, limits.controller_lapse_s)]
            candidates = [node for node in live if node in control.sync_state_set]
            unclean = not candidates and self.state.unclean(group)
            if unclean:
                candidates = live
            if not candidates:
                if group not in self._waiting:
                    self._waiting.add(group)
                    log.warning("group %d: master %d is silent and no other member of its SyncStateSet %s is up: "
                                "the group waits for one", group, control.master, sorted(control.sync_state_set))
                continue
            master = max(candidates, key=lambda node: (self._log_end(node, group), -node))
            if unclean:
                why = (f"UNCLEAN: master {control.master} silent, no SyncStateSet member up: entries past "
                       f"{self._log_end(master, group)} may be lost, the old master reported "
                       f"{self._log_end(control.master, group)}")
            else:
                why = f"master {control.master} silent for {self._silent_s(control.master):.1f} s"
            await self._elect(group, master, control, why, unclean)
            self._waiting.discard(group)
