"""The broker role: the client-facing RPC methods, and nothing that cannot be lost. Topics and routes come from the
nameservers (routes.py), messages and consumer offsets live in the storage groups. Any broker serves any client.
One concern per module: routes.py, admin.py, produce.py, pull.py, pop.py, groups.py, kv.py; this module wires them.
"""

from __future__ import annotations

import functools
import itertools
import logging
import secrets

import trio

from rocket.clock import Clock
from rocket.filter import Filter
from rocket.model import Address
from rocket.parked import Deadlines
from rocket.roles.broker.admin import Admin
from rocket.roles.broker.groups import ConsumerGroups
from rocket.roles.broker.kv import KeyValues
from rocket.roles.broker.pop import PopConsumption
from rocket.roles.broker.produce import Produce
from rocket.roles.broker.pull import Pull
from rocket.roles.broker.routes import Route, Routes
from rocket.roles.peers import Peers
from rocket.transport.background import Background
from rocket.transport.rpc import Dispatcher

log = logging.getLogger("rocket.broker")


# What the nameservers answer, which a broker forwards: cluster status and operations, users, policies and quotas.
FORWARDED = ("ClusterStatus", "DrainNode", "PlacementExplain", "NodeHealth", "PinNodeHealth", "AclCreateUser",
             "AclDeleteUser", "AclUsers", "AclGrant", "AclRevoke", "AclPolicies", "AclSetQuota", "AclQuotas")


class Broker(Routes, Admin, Produce, Pull, PopConsumption, ConsumerGroups, KeyValues, Background):
    """run() holds the nursery (Background) of tasks that serve a streaming call but cannot live in its frame (a
    stream's generator must not hold a nursery across its yields): the shards a KV watch follows."""

    def __init__(self, peers: Peers, roles: tuple[str, ...], clock: Clock):
        self.peers = peers
        self.clock = clock
        self.roles = roles
        # Keyed by topics, storage groups and nodes the metadata holds (a route is kept only once the nameservers
        # gave it): bounded by limits.topics_max, storage_groups_max and the nodes.
        self._routes: dict[str, Route] = {}
        self._leaders: dict[int, int] = {}  # storage group -> the node that last served it as leader
        # storage node -> when a call to it last went unanswered (a partition, a hung node): asked last, and briefly,
        # for limits.storage_silent_s by every call, not only the one that waited (routes.py)
        self._silent: dict[int, float] = {}
        self._addresses: dict[int, Address] = {}
        self._forwarded = Deadlines()  # storage calls forwarded without a task (routes.py, _forward_parked)
        self._sweeping = False
        # The producer the broker is for clients that number no batches (its gateways'), so that its own storage
        # retries store a batch once: a random id, and one sequence for all its batches (store/producers.py).
        self._producer_id = secrets.randbits(63) or 1
        self._sequences = itertools.count()
        self._read_turns: dict[int, int] = {}  # storage group -> which replica reads next
        self._round_robin: dict[str, int] = {}  # topic -> its last turn: limits.round_robin_topics_max (routes.py)
        self._filters: dict[tuple[str, str], Filter] = {}  # compiled filters, the most recent limits.filters_cached_max
        # storage group -> the KV batch that takes transactions now, and the lock held while its call is out (kv.py):
        # a route's groups, so bounded by limits.storage_groups_max
        self._kv_open: dict = {}
        self._kv_sending: dict[int, trio.Lock] = {}
        # consumer group -> (read at, its settings or None): the latest limits.group_settings_cache_entries_max
        self._group_settings: dict[str, tuple[float, dict | None]] = {}

    def register(self, dispatcher: Dispatcher, forward_status: bool) -> None:
        handlers = {
            "Ping": self.ping,
            "CreateTopic": self.create_topic,
            "ListTopics": self.list_topics,
            "DescribeTopic": self.describe_topic,
            "Produce": self.produce,
            "Pull": self.pull,
            "Subscribe": self.subscribe,
            "CommitOffsets": self.commit_offsets,
            "FetchOffsets": self.fetch_offsets,
            "SearchOffset": self.search_offset,
            "CancelTimer": self.cancel_timer,
            "EndTransaction": self.end_transaction,
            "TransactionChecks": self.transaction_checks,
            "DescribeGroup": self.describe_group,
            "GroupHeartbeat": self.group_heartbeat,
            "ResetGroup": self.reset_group,
            "Receive": self.receive,
            "Ack": self.ack,
            "ChangeInvisible": self.change_invisible,
            "DeadLetter": self.dead_letter,
            "Bury": self.bury,
            "UpdateTopic": self.update_topic,
            "CreateStorageClass": self.create_storage_class,
            "StorageClasses": self.storage_classes,
            "CreateConsumerGroup": self.create_consumer_group,
            "UpdateConsumerGroup": self.update_consumer_group,
            "ConsumerGroups": self.consumer_groups,
            "GroupSettings": self.group_settings,
            "TierStatus": self.tier_status,
            "KvCreateBucket": self.kv_create_bucket,
            "KvListBuckets": self.kv_list_buckets,
            "KvDescribeBucket": self.kv_describe_bucket,
            "KvDeleteBucket": self.kv_delete_bucket,
            "KvPut": self.kv_put,
            "KvGet": self.kv_get,
            "KvDelete": self.kv_delete,
            "KvRange": self.kv_range,
            "KvTxn": self.kv_txn,
            "KvWatch": self.kv_watch,
            "KvExport": self.kv_export,
        }
        if forward_status:  # a broker without a nameserver beside it asks the nameservers
            for name in FORWARDED:
                handlers[name] = functools.partial(self.forward, name)
        for name, handler in handlers.items():
            dispatcher.handle(name, handler, parked={"Produce": self.produce_parked, "KvPut": self.kv_put_parked,
                                                       "KvGet": self.kv_get_parked}.get(name))
