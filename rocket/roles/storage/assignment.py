"""A storage node's assignment: the heartbeat that brings it from the nameservers (Assignments, a part of
StorageRole), and its copy on the node's own disk (save, load), from which a node restarted while no nameserver
answers rejoins its groups.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from pathlib import Path

import orjson
import trio
from crc32c import crc32c

from rocket import limits
from rocket.clock import on_the_grid, sleep_periodic
from rocket.config import NodeConfig
from rocket.disk.files import replace_durably
from rocket.errors import RocketError
from rocket.model import Address
from rocket.replication import Control, Engine
from rocket.roles.peers import Peers
from rocket.roles.storage.gate import Gate, NotHosted
from rocket.store.store import GroupMachine, Store

log = logging.getLogger("rocket.storage")

FILE_NAME = "assignment.json"
FORMAT = 1


def encode(node: int, assignment: dict) -> bytes:
    """`assignment.json`: an 8-digit hex CRC-32C of the body, a newline, and the body (JSON of the node, the metadata
    version, groups and nodes)."""
    body = orjson.dumps({"format": FORMAT, "node": node, "version": assignment["version"],
                         "groups": assignment["groups"], "nodes": assignment["nodes"]})
    return b"%08x\n" % crc32c(body) + body


def decode(node: int, data: bytes) -> dict:
    """The assignment a file holds; ValueError says why it cannot be used."""
    checksum, newline, body = data[:8], data[8:9], data[9:]
    try:
        expected = int(checksum, 16)
    except ValueError:
        raise ValueError("it does not start with a checksum") from None
    if newline != b"\n" or crc32c(body) != expected:
        raise ValueError("its checksum does not match (damaged)")
    saved = orjson.loads(body)
    if saved.get("format") != FORMAT:
        raise ValueError(f"its format is {saved.get('format')!r}, not {FORMAT}")
    if saved.get("node") != node:
        raise ValueError(f"it is node {saved.get('node')}'s, not node {node}'s")
    return {"version": saved["version"], "groups": saved["groups"], "nodes": saved["nodes"], "unchanged": False}


def save(directory: Path, node: int, assignment: dict) -> None:
    """Write the assignment whole (replace_durably: a temporary, fsync, rename, directory fsync)."""
    replace_durably(directory / FILE_NAME, encode(node, assignment))


def load(directory: Path, node: int) -> dict | None:
    """The assignment saved last, or None when there is none or it is damaged (reported: the node then waits for a
    nameserver, as a new node does)."""
    path = directory / FILE_NAME
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    try:
        return decode(node, data)
    except (ValueError, KeyError, TypeError, AttributeError) as error:
        log.error("%s cannot be used, so this node waits for a nameserver to learn its groups: %s", path, error)
        return None


class Assignments:
    """The groups this node hosts and who their members are, as the nameservers' answers to its heartbeats say:
    `assigned` is set once the first answer came (or the saved assignment was restored), and once_assigned(handler)
    makes a call that names a group not hosted yet ask for the assignment at once."""

    def __init__(self, store: Store, host: Engine, gate: Gate, peers: Peers, config: NodeConfig,
                 addresses: dict[int, tuple[str, int]]):
        self.store = store
        self.host = host
        self.gate = gate
        self.peers = peers
        self.config = config
        self.addresses = addresses  # node id -> address, shared with the Raft links
        self.assigned = trio.Event()  # set once the first assignment arrived, or was restored from disk
        self._ask_now = trio.Event()  # a call named a group not hosted yet: ask for the assignment at once
        self._heartbeats_started = self._heartbeats_done = 0
        self._heartbeat_done = trio.Event()  # set (and replaced) as each heartbeat ends
        self._version = -1  # the metadata version of the assignment this node holds
        self._saved: tuple | None = None  # (groups, nodes) of the assignment saved last
        # With a standalone controller: each controller-mode group hosted here as its assignment describes it (what
        # registers it with the controller), and the ones the controller answered for (registered).
        self._controlled: dict[int, dict] = {}
        self._registered: set[int] = set()
        self._controller_silent = False  # logged once per outage

    def once_assigned(self, handler: Callable[[dict], Awaitable[dict]]) -> Callable[[dict], Awaitable[dict]]:
        """A call that names a group this node does not host yet (a topic just created, a replica just added) asks
        the nameservers for this node's assignment and is served once the answer came, if it brought the group:
        the broker need not poll. Every handler checks its group before it changes anything."""
        async def call(request: dict) -> dict:
            try:
                return await handler(request)
            except NotHosted:
                asked = self._heartbeats_started + 1  # a heartbeat under way may have read the assignment before
                self._ask_now.set()
                with trio.move_on_after(limits.assignment_wait_s_max):
                    while self._heartbeats_done < asked:
                        await self._heartbeat_done.wait()
                return await handler(request)
        return call

    async def heartbeat_forever(self) -> None:
        """Report to the nameservers every limits.node_heartbeat_s (sooner when a call asks), until cancelled."""
        while True:
            self._ask_now = trio.Event()
            asked_at = trio.current_time()
            self._heartbeats_started += 1
            try:
                await self.heartbeat()
            finally:
                self._heartbeats_done = self._heartbeats_started
                self._heartbeat_done.set()
                self._heartbeat_done = trio.Event()
            with trio.move_on_at(on_the_grid(self._heartbeat_interval_s())):
                await self._ask_now.wait()  # a group not hosted yet: ask at once, but not twice within the minimum
                await trio.sleep_until(asked_at + limits.assignment_ask_s_min)

    async def heartbeat(self) -> None:
        """One heartbeat: this node's load out, the assignment (when it changed) back."""
        groups = self.gate.storage_groups()
        if self.host.disk_refusal:
            self._hand_over_leadership(groups)
        leads = [group for group in groups if self.host.leads(group)]
        lagging = [{"group": group, "node": node, "entries": entries}
                   for group in leads for node, entries in self.host.lagging(group).items()]
        wal = self.host.wal.log
        group_bytes: dict[int, int] = {}
        topic_bytes: dict[str, int] = {}
        store = self.store
        taken = store.take_bytes_in()  # counted while this node led the group: it may have lost it since
        for (topic, group), count in taken.items():
            group_bytes[group] = group_bytes.get(group, 0) + count
            topic_bytes[topic] = topic_bytes.get(topic, 0) + count
        controlled = [{"group": group, "epoch": position[0], "last_index": position[1]}
                      for group in groups if (position := self.host.controlled_position(group)) is not None]
        load = {"groups": len(groups), "leads": leads, "bytes": wal.end_position - wal.start_position,  # on disk
                "free_disk_bytes": self.store.world.free_bytes(self.config.data_dir), "lagging": lagging,
                "group_bytes_in": [{"group": group, "bytes": count} for group, count in group_bytes.items()],
                "topic_bytes_in": [{"topic": topic, "bytes": count} for topic, count in topic_bytes.items()],
                "controlled": controlled}
        assignment = await self.peers.heartbeat(load, self._version)
        if assignment is None:
            store.give_back_bytes_in(taken)  # the next heartbeat carries them
            return
        if not assignment["unchanged"]:
            self._assign(assignment)
            self._save(assignment)
        self.assigned.set()

    async def controller_heartbeats_forever(self) -> None:
        """With a standalone controller (config controllers): report this node's controller-mode replicas to it as
        often as to the nameservers (sooner while one is orphaned), and take its word on their masters and
        SyncStateSets from the answer. It does not need the nameservers: it elects while they are all down."""
        if not self.config.controller_members():
            return
        while True:
            await sleep_periodic(self._heartbeat_interval_s())
            try:
                await self.controller_heartbeat()
            except RocketError as error:
                if not self._controller_silent:
                    log.warning("the standalone controller does not answer this node's heartbeat: %s", error)
                self._controller_silent = True
                continue
            self._controller_silent = False

    async def controller_heartbeat(self) -> None:
        replicas = [{"group": group, "epoch": position[0], "last_index": position[1]}
                    for group in sorted(self.gate.storage_groups())
                    if (position := self.host.controlled_position(group)) is not None]
        if not replicas:
            return
        register = [self._controlled[replica["group"]] for replica in replicas
                    if replica["group"] not in self._registered and replica["group"] in self._controlled]
        # A controller that cannot reach its leader holds the call: the next one is asked well before the leader would
        # take this node's masters for silent.
        answer = await self.peers.controller("ControllerHeartbeat", {"node": self.config.node_id, "replicas": replicas,
                                                                     "register": register},
                                             timeout_s=limits.controller_lapse_s / 3)
        for word in answer["groups"]:
            self._registered.add(word["group"])
            self.host.sync_state_granted(word["group"], word["master"], word["master_epoch"],
                                         frozenset(word["sync_state_set"]), word["sync_state_set_epoch"])
        self._registered.difference_update(answer["unknown"])

    def _hand_over_leadership(self, groups: set[int]) -> None:
        """While this node's disk is full it refuses new data: each Raft group it leads goes to the caught-up voter
        that lags least, so the group takes writes through the others (the nameservers, seeing the free disk in the
        heartbeat, lead nothing back here until there is room). Controller-mode groups follow their controller."""
        for group in groups:
            if not self.host.leads(group) or self.host.controlled_position(group) is not None:
                continue
            lagging = self.host.lagging(group)
            others = [voter for voter in self.host.voters(group)
                      if voter != self.config.node_id and self.host.caught_up(group, voter)]
            if others:
                successor = min(others, key=lambda voter: lagging.get(voter, 0))
                log.warning("group %d: this node's disk is full; leadership goes to node %d", group, successor)
                self.host.transfer_leadership(group, successor)

    def restore(self) -> None:
        """Before any heartbeat: host the groups of the assignment saved last, with their members' addresses, so a
        node restarted while no nameserver answers rejoins its groups. The first answer reconciles (_assign). The node
        is ready (assigned is set) without waiting for it."""
        saved = load(self.config.data_dir, self.config.node_id)
        if saved is None:
            return
        self._assign(saved)
        self._saved = (saved["groups"], saved["nodes"])
        log.info("hosting the %d storage groups of the assignment saved at metadata version %d, until a nameserver "
                 "answers", len(saved["groups"]), saved["version"])
        self.assigned.set()

    def _save(self, assignment: dict) -> None:
        """Keep the assignment on disk when its groups or nodes changed (a new metadata version alone is not worth an
        fsync: the next answer after a restart brings it). Written in the event loop's thread, which keeps the
        roles simulator deterministic; it is rare and small (a replica move, a new group, a node's new address)."""
        content = (assignment["groups"], assignment["nodes"])
        if content == self._saved:
            return
        try:
            save(self.config.data_dir, self.config.node_id, assignment)
        except OSError as error:  # a full or failing disk: keep serving; a restart then waits for a nameserver
            log.error("cannot save this node's assignment to %s: %s", self.config.data_dir, error)
            return
        self._saved = content

    def _heartbeat_interval_s(self) -> float:
        """How long until the next heartbeat: sooner while a controller-mode replica here has heard nothing from its
        master for an election timeout, so that it learns of the controller's election (in the answer) soon."""
        if any(self.host.orphaned(group) for group in self.gate.storage_groups()):
            return limits.controller_orphan_heartbeat_s
        return limits.node_heartbeat_s

    def _assign(self, assignment: dict) -> None:
        """Host the groups assigned to this node, and stop hosting the ones moved off it."""
        self._version = assignment["version"]
        for node in assignment["nodes"]:
            address = Address.parse(node["address"])
            self.addresses[node["id"]] = (address.host, address.port)
        assigned = {group["id"] for group in assignment["groups"]}
        for group in assignment["groups"]:
            control = self._control_of(group)
            if control is not None:
                self._controlled[group["id"]] = {
                    "group": group["id"], "voters": group["voters"], "unclean_election": group["unclean_election"],
                    "master": group["master"], "master_epoch": group["master_epoch"],
                    "sync_state_set": group["sync_state_set"], "sync_state_set_epoch": group["sync_state_set_epoch"]}
            if self.host.machine_of(group["id"]) is None:
                self.host.add_group(group["id"], tuple(group["voters"]), GroupMachine(self.store, group["id"]),
                                    tuple(group["learners"]), control)
            elif control is not None:
                self.host.control(group["id"], control)
        for group in self.gate.storage_groups() - assigned:
            log.info("storage group %d moved off this node", group)
            self._controlled.pop(group, None)
            self.host.remove_group(group)

    def _control_of(self, group: dict) -> Control | None:
        """The controller's word on a controller-mode group, from its assignment (None for a Raft group)."""
        if group.get("mode", "raft") != "controller":
            return None
        return Control(group["master"], group["master_epoch"], frozenset(group["sync_state_set"]),
                       group["sync_state_set_epoch"], group["min_in_sync_replicas"],
                       max(1, round(group["ha_max_lag_s"] / self.host.tick_s)))
