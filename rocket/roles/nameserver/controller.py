"""The controller of RIP-44, on the nameservers' Raft group: it decides who is master of each controller-mode
storage group. Its state is in the metadata, so it survives the nameserver leader; the leader alone acts on it. A
part of Nameserver, over the metadata group.
"""

from __future__ import annotations

import logging

import trio

from rocket import limits
from rocket.clock import Clock, sleep_periodic
from rocket.errors import RocketError
from rocket.roles.nameserver.group import MetadataGroup
from rocket.serde.typed import AlterSyncStateSetRequest, ControlState, NodeLoad

log = logging.getLogger("rocket.controller")


class Controller:
    """The controller. Its state, each controller-mode group's Control in the metadata, is its master, master_epoch,
    SyncStateSet and sync_state_set_epoch. Replicas' heartbeats are the storage nodes' own (NodeHeartbeat, in the
    nameserver's heartbeats), which carry each controlled replica's epoch and log end."""

    def __init__(self, meta: MetadataGroup, heartbeats: dict[int, tuple[float, NodeLoad]], clock: Clock):
        self.meta = meta
        self.heartbeats = heartbeats  # node -> (when, load): the nameserver's, kept by its NodeHeartbeat calls
        self.clock = clock
        self._led_since: float | None = None  # when this nameserver's current term as leader began
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

    async def control_forever(self) -> None:
        """As the nameservers' leader, elect a new master for each controller-mode group whose master lapsed: every
        limits.controller_check_s while there are such groups, every limits.idle_recheck_s while there are none (a
        new group's master lapses no sooner than limits.controller_lapse_s after its creation)."""
        while True:
            controlled = any(members.control is not None for members in self.meta.metadata.groups.values())
            await sleep_periodic(limits.controller_check_s if controlled else limits.idle_recheck_s)
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
        log's end. A new nameserver leader gives every master controller_lapse_s from its election before judging it
        (_heard_within): it has not heard anyone yet."""
        for group, members in list(self.meta.metadata.groups.items()):
            control = members.control
            if control is None or self._heard_within(control.master, limits.controller_lapse_s):
                self._waiting.discard(group)
                continue
            live = [node for node in members.voters
                    if node != control.master and self._heard_within(node, limits.controller_lapse_s)]
            candidates = [node for node in live if node in control.sync_state_set]
            unclean = not candidates and self.meta.metadata.classes[members.storage_class].unclean_election
            if unclean:
                candidates = live
            if not candidates:
                if group not in self._waiting:
                    self._waiting.add(group)
                    log.warning("group %d: master %d is silent and no other member of its SyncStateSet %s is up: "
                                "the group waits for one", group, control.master, sorted(control.sync_state_set))
                continue
            master = max(candidates, key=lambda node: (self._log_end(node, group), -node))
            previous_end, master_end = self._log_end(control.master, group), self._log_end(master, group)
            await self.meta.propose({"op": "elect_master", "group": group, "master": master,
                                 "from_epoch": control.master_epoch, "unclean": unclean,
                                 "at_ms": self.clock.wall_ms(), "previous_last_index": previous_end,
                                 "master_last_index": master_end})
            self._waiting.discard(group)
            if unclean:
                log.error("group %d: UNCLEAN election of node %d at epoch %d (master %d silent, no SyncStateSet member "
                          "up): entries past %d may be lost (the old master reported %d)", group, master,
                          control.master_epoch + 1, control.master, master_end, previous_end)
            else:
                log.warning("group %d: node %d is master at epoch %d (master %d silent for %.1f s)", group, master,
                            control.master_epoch + 1, control.master, self._silent_s(control.master))
