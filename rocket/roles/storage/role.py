"""The storage role: StorageRole hosts the groups the nameservers assign to this node, with the node's store as their
state machine, over a replication engine. It routes each call to a part, one per concern; gate.py checks that a
call's group is hosted, or led, here.
"""

from __future__ import annotations

import logging

import trio

from rocket.clock import Clock
from rocket.config import NodeConfig
from rocket.replication import Engine
from rocket.roles.peers import Peers
from rocket.roles.storage.appends import Appends
from rocket.roles.storage.assignment import Assignments
from rocket.roles.storage.drops import Drops
from rocket.roles.storage.gate import Gate
from rocket.roles.storage.groups import GroupMembers
from rocket.roles.storage.kv import KeyValues
from rocket.roles.storage.locks import QueueLocks
from rocket.roles.storage.pops import Pops
from rocket.roles.storage.reads import Reads
from rocket.roles.storage.reclaim import WalReclaim
from rocket.roles.storage.replicas import Replicas
from rocket.roles.storage.stamps import AppendStamps
from rocket.roles.storage.tiering import Tiering
from rocket.roles.storage.timers import Timers
from rocket.roles.storage.transactions import Transactions
from rocket.store.store import Store
from rocket.tier.cache import ChunkCache
from rocket.tier.cold import ColdReader
from rocket.tier.objectstore import ObjectStore
from rocket.transport.rpc import Dispatcher
from rocket.world import WORLD, World

log = logging.getLogger("rocket.storage")


class StorageRole:
    """The storage role's calls, routed to its parts, one concern per module: gate.py, stamps.py, assignment.py (the
    heartbeat), replicas.py (replica moves, backfill), appends.py, reads.py, pops.py, kv.py (KV shards), timers.py,
    transactions.py, groups.py, locks.py (orderly consumers' queue locks), tiering.py and offload.py (the tier),
    reclaim.py (the WAL), drops.py (deletes).
    Every per-key map that clients can grow has a bound in limits, or a comment saying what bounds it."""

    def __init__(self, config: NodeConfig, host: Engine, peers: Peers, addresses: dict[int, tuple[str, int]],
                 clock: Clock, objects: ObjectStore | None = None, world: World = WORLD):
        # world: the machine's threads and free space, which every part takes from the store
        self.store = Store.open(config.data_dir / "storage", host.wal.log, world)
        host.sync_before_snapshots = self.store.sync  # a group's snapshot covers what the store wrote up to it
        self.store.leads = host.leads  # the load a group's leader reports (assignment.py)
        self.gate = Gate(host, config.node_id)
        self.stamps = AppendStamps(clock)
        # addresses: node id -> address, shared with the Raft links; the assignment's nodes update it
        self.assignments = Assignments(self.store, host, self.gate, peers, config, addresses)
        self.assigned = self.assignments.assigned  # set once the first assignment arrived, or was restored from disk
        self.replicas = Replicas(self.store, host, self.gate, peers, config, addresses)
        # (consumer group, topic) -> member -> expiry: limits.group_member_keys_max, members expire (groups.py)
        self.group_members = GroupMembers(self.gate.leads)
        self.timers = Timers(self.store, host, self.gate, self.stamps, clock)
        self.transactions = Transactions(self.store, host, self.gate, self.stamps, clock, config)
        self.tiering = Tiering(self.store, host, self.gate, peers, config, objects, clock)
        self.wal_reclaim = WalReclaim(self.store, host)
        self.appends = Appends(host, self.gate, self.stamps, config)
        cache = None if config.tier_backend == "local" else ChunkCache(config.data_dir / "tier-cache",
                                                                       config.tier_cache_bytes)
        self.cold = ColdReader(objects, cache) if objects is not None else None
        self.reads = Reads(self.store, host, self.gate, self.cold, config.tier_read_mode == "force")
        self.pops = Pops(self.store, host, self.gate, self.reads, clock)
        self.kv = KeyValues(self.store, host, self.gate, clock)
        self.drops = Drops(host, self.gate, self.tiering.offloader)
        self.locks = QueueLocks(host, self.gate, clock)
        host.applying = self.store.holding

    def register(self, dispatcher: Dispatcher) -> None:
        for method, handler in (("StorageAppend", self.appends.append), ("StorageRead", self.reads.read),
                                ("StorageCommitOffsets", self.appends.commit_offsets),
                                ("StorageImport", self.appends.import_batches),
                                ("StorageQueues", self.reads.queues), ("StorageFindKey", self.reads.find_key),
                                ("StorageMembers", self.replicas.members),
                                ("StorageCancelTimer", self.timers.cancel_timer),
                                ("StoragePop", self.pops.pop), ("StorageReceipt", self.pops.receipt),
                                ("StorageBury", self.pops.bury),
                                ("StorageEndTransaction", self.transactions.end_transaction),
                                ("StorageGroupHeartbeat", self.group_members.group_heartbeat),
                                ("StorageTransactionChecks", self.transactions.transaction_checks),
                                ("StorageTier", self.tiering.tier_status),
                                ("StorageKvTxn", self.kv.kv_txn), ("StorageKvRead", self.kv.kv_read),
                                ("StorageKvWatch", self.kv.kv_watch), ("StorageDrop", self.drops.drop),
                                ("StorageLock", self.locks.lock)):
            dispatcher.handle(method, self.assignments.once_assigned(handler), parked={
                "StorageAppend": self.appends.append_parked, "StorageKvTxn": self.kv.kv_txn_parked,
                "StorageKvRead": self.kv.kv_read_parked}.get(method))

    async def serve(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Flush the store in the background and report to the nameservers until cancelled."""
        async with trio.open_nursery() as nursery:
            await nursery.start(self.store.run)
            await nursery.start(self.reads.run)
            self.assignments.restore()  # the groups it hosted, before any nameserver answers
            nursery.start_soon(self.replicas.backfill_forever)
            nursery.start_soon(self.reads.index_keys_forever)
            nursery.start_soon(self.replicas.sync_states_forever)
            nursery.start_soon(self.assignments.controller_heartbeats_forever)
            nursery.start_soon(self.timers.fire_forever)
            nursery.start_soon(self.wal_reclaim.reclaim_forever)
            nursery.start_soon(self.kv.expire_forever)
            nursery.start_soon(self.tiering.refresh_retention_forever)
            nursery.start_soon(self.tiering.offloader.run)
            if self.cold is not None and self.cold.cache is not None:
                nursery.start_soon(self.cold.cache.run)
            task_status.started()
            await self.assignments.heartbeat_forever()
