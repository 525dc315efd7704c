"""The storage role: StorageRole hosts the groups the nameservers assign to this node, with the node's store as their
state machine, over a replication engine. It wires a part or a mixin per concern; gate.py checks that a call's group
is hosted, or led, here.
"""

from __future__ import annotations

import logging

import trio

from rocket import limits
from rocket.clock import Clock, on_the_grid
from rocket.config import NodeConfig
from rocket.replication import Engine
from rocket.roles.peers import Peers
from rocket.roles.storage.appends import Appends
from rocket.roles.storage.gate import Gate, NotHosted
from rocket.roles.storage.groups import GroupMembers
from rocket.roles.storage.kv import KeyValues
from rocket.roles.storage.pops import Pops
from rocket.roles.storage.reads import Reads
from rocket.roles.storage.reclaim import WalReclaim
from rocket.roles.storage.replicas import Replicas
from rocket.roles.storage.stamps import AppendStamps
from rocket.roles.storage.tiering import Tiering
from rocket.roles.storage.timers import Timers
from rocket.roles.storage.transactions import Transactions
from rocket.store.store import Store
from rocket.tier.cold import ColdReader
from rocket.tier.objectstore import ObjectStore
from rocket.transport.rpc import Dispatcher

log = logging.getLogger("rocket.storage")


class StorageRole(Replicas):
    """The storage role's calls, one concern per module: its parts' (gate.py, stamps.py, appends.py, reads.py,
    pops.py, kv.py (KV shards), timers.py, transactions.py, groups.py, tiering.py and offload.py (the tier),
    reclaim.py (the WAL)) and its mixin's (replicas.py: assignment, replica moves, backfill). Every per-key map that
    clients can grow has a bound in limits.py, or a comment saying what bounds it (as __init__'s do)."""

    def __init__(self, config: NodeConfig, host: Engine, peers: Peers, addresses: dict[int, tuple[str, int]],
                 clock: Clock, objects: ObjectStore | None = None):
        self.config = config
        self.clock = clock
        self.host = host
        self.peers = peers
        self.addresses = addresses  # node id -> address, shared with the Raft links
        self.store = Store.open(config.data_dir / "storage", host.wal.log)
        host.sync_before_snapshots = self.store.sync  # a group's snapshot covers what the store wrote up to it
        self.store.leads = host.leads  # the load a group's leader reports (replicas.py)
        self.gate = Gate(host, config.node_id)
        self.stamps = AppendStamps(clock)
        self.assigned = trio.Event()  # set once the first assignment arrived, or was restored from disk
        self._ask_now = trio.Event()  # a call named a group not hosted yet: ask for the assignment at once
        self._heartbeats_started = self._heartbeats_done = 0
        self._heartbeat_done = trio.Event()  # set (and replaced) as each heartbeat ends
        self._assignment_version = -1  # the metadata version of the assignment this node holds
        self._saved_assignment: tuple | None = None  # (groups, nodes) of the assignment saved last (replicas.py)
        # (consumer group, topic) -> member -> expiry: limits.group_member_keys_max, members expire (groups.py)
        self.group_members = GroupMembers(self.gate.leads)
        self.timers = Timers(self.store, host, self.gate, self.stamps, clock)
        self.transactions = Transactions(self.store, host, self.gate, self.stamps, clock, config)
        self.tiering = Tiering(self.store, host, self.gate, peers, config, objects, clock)
        self.wal_reclaim = WalReclaim(self.store, host)
        self.appends = Appends(host, self.gate, self.stamps, config)
        self.cold = ColdReader(objects) if objects is not None else None
        self.reads = Reads(self.store, host, self.gate, self.cold, config.tier_read_mode == "force")
        self.pops = Pops(self.store, host, self.gate, self.reads, clock)
        self.kv = KeyValues(self.store, host, self.gate, clock)
        host.applying = self.store.holding

    def register(self, dispatcher: Dispatcher) -> None:
        for method, handler in (("StorageAppend", self.appends.append), ("StorageRead", self.reads.read),
                                ("StorageCommitOffsets", self.appends.commit_offsets),
                                ("StorageQueues", self.reads.queues),
                                ("StorageMembers", self.members), ("StorageCancelTimer", self.timers.cancel_timer),
                                ("StoragePop", self.pops.pop), ("StorageReceipt", self.pops.receipt),
                                ("StorageBury", self.pops.bury),
                                ("StorageEndTransaction", self.transactions.end_transaction),
                                ("StorageGroupHeartbeat", self.group_members.group_heartbeat),
                                ("StorageTransactionChecks", self.transactions.transaction_checks),
                                ("StorageTier", self.tiering.tier_status),
                                ("StorageKvTxn", self.kv.kv_txn), ("StorageKvRead", self.kv.kv_read),
                                ("StorageKvWatch", self.kv.kv_watch)):
            dispatcher.handle(method, self._once_assigned(handler), parked={
                "StorageAppend": self.appends.append_parked, "StorageKvTxn": self.kv.kv_txn_parked,
                "StorageKvRead": self.kv.kv_read_parked}.get(method))

    def _once_assigned(self, handler):
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

    async def serve(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Flush the store in the background and report to the nameservers until cancelled."""
        async with trio.open_nursery() as nursery:
            await nursery.start(self.store.run)
            await nursery.start(self.reads.run)
            self._restore_assignment()  # the groups it hosted, before any nameserver answers
            nursery.start_soon(self._backfill_forever)
            nursery.start_soon(self._sync_states_forever)
            nursery.start_soon(self.timers.fire_forever)
            nursery.start_soon(self.wal_reclaim.reclaim_forever)
            nursery.start_soon(self.kv.expire_forever)
            nursery.start_soon(self.tiering.refresh_retention_forever)
            nursery.start_soon(self.tiering.offloader.run)
            task_status.started()
            while True:
                self._ask_now = trio.Event()
                asked_at = trio.current_time()
                self._heartbeats_started += 1
                try:
                    await self._heartbeat()
                finally:
                    self._heartbeats_done = self._heartbeats_started
                    self._heartbeat_done.set()
                    self._heartbeat_done = trio.Event()
                with trio.move_on_at(on_the_grid(self._heartbeat_interval_s())):
                    await self._ask_now.wait()  # a group not hosted yet: ask at once, but not twice within the minimum
                    await trio.sleep_until(asked_at + limits.assignment_ask_s_min)
