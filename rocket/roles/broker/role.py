"""The broker role: the client-facing RPC methods, and nothing that cannot be lost. A router over its parts: routes
and storage calls (routes.py), admin.py, produce.py, pull.py, pop.py, groups.py and kv.py; this module wires them.
"""

from __future__ import annotations

import functools

import trio

from rocket.clock import Clock
from rocket.roles.broker.admin import Admin, GroupSettings
from rocket.roles.broker.groups import ConsumerGroups
from rocket.roles.broker.kv import KeyValues
from rocket.roles.broker.pop import PopConsumption
from rocket.roles.broker.produce import Produce
from rocket.roles.broker.pull import Filters, Pull
from rocket.roles.broker.routes import Routes, Turns
from rocket.roles.peers import Peers
from rocket.transport.rpc import Dispatcher
from rocket.world import WORLD, World

# What the nameservers answer, which a broker forwards: cluster status and operations, users, policies and quotas.
FORWARDED = ("ClusterStatus", "DrainNode", "Handover", "PlacementExplain", "NodeHealth", "PinNodeHealth",
             "AclCreateUser", "AclDeleteUser", "AclUsers", "AclGrant", "AclRevoke", "AclPolicies", "AclSetQuota",
             "AclQuotas")


class Broker:
    """The broker's parts, each owning its state, over one Routes: they share its route cache, its knowledge of the
    groups' leaders and silent nodes, and the nursery (Routes.run) of the tasks that outlive a call."""

    def __init__(self, peers: Peers, roles: tuple[str, ...], clock: Clock, world: World = WORLD):
        self.routes = Routes(peers, clock)
        turns, filters = Turns(), Filters()
        settings = GroupSettings(peers)
        self.admin = Admin(self.routes, peers, roles, settings)
        self.producer = Produce(self.routes, turns, world.random)
        self.pull = Pull(self.routes, filters)
        self.pop = PopConsumption(self.routes, clock, turns, filters, settings)
        self.groups = ConsumerGroups(self.routes, settings)
        self.kv = KeyValues(self.routes, peers)

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        await self.routes.run(task_status=task_status)

    def register(self, dispatcher: Dispatcher, forward_status: bool) -> None:
        handlers = {
            "Ping": self.admin.ping,
            "Produce": self.producer.produce,
            "Pull": self.pull.pull,
            "Subscribe": self.pull.subscribe,
            "CommitOffsets": self.groups.commit_offsets,
            "FetchOffsets": self.groups.fetch_offsets,
            "LockQueues": self.groups.lock_queues,
            "SearchOffset": self.admin.search_offset, "FindMessages": self.pull.find_messages,
            "CancelTimer": self.producer.cancel_timer,
            "EndTransaction": self.producer.end_transaction,
            "TransactionChecks": self.producer.transaction_checks,
            "Receive": self.pop.receive,
            "Ack": self.pop.ack,
            "ChangeInvisible": self.pop.change_invisible,
            "DeadLetter": self.pop.dead_letter,
            "Bury": self.pop.bury,
            "KvPut": self.kv.kv_put,
            "KvGet": self.kv.kv_get,
            "KvDelete": self.kv.kv_delete,
            "KvRange": self.kv.kv_range,
            "KvTxn": self.kv.kv_txn,
            "KvWatch": self.kv.kv_watch,
            "KvExport": self.kv.kv_export,
        }
        if forward_status:  # a broker without a nameserver beside it asks the nameservers
            for name in FORWARDED:
                handlers[name] = functools.partial(self.admin.forward, name)
        parked = {"Produce": self.producer.produce_parked, "KvPut": self.kv.kv_put_parked,
                  "KvGet": self.kv.kv_get_parked}
        for name, handler in handlers.items():
            dispatcher.handle(name, handler, parked=parked.get(name))
        typed_handlers = {  # these take and return typed messages (rocket/serde/typed.py)
            "CreateTopic": self.admin.create_topic,
            "ListTopics": self.admin.list_topics,
            "DescribeTopic": self.admin.describe_topic,
            "UpdateTopic": self.admin.update_topic,
            "DeleteTopic": self.admin.delete_topic,
            "CreateStorageClass": self.admin.create_storage_class,
            "StorageClasses": self.admin.storage_classes,
            "CreateConsumerGroup": self.admin.create_consumer_group,
            "UpdateConsumerGroup": self.admin.update_consumer_group,
            "ConsumerGroups": self.admin.consumer_groups,
            "GroupSettings": self.admin.group_settings,
            "TierStatus": self.admin.tier_status,
            "KvCreateBucket": self.kv.kv_create_bucket,
            "KvListBuckets": self.kv.kv_list_buckets,
            "KvDescribeBucket": self.kv.kv_describe_bucket,
            "KvDeleteBucket": self.kv.kv_delete_bucket,
            "DescribeGroup": self.groups.describe_group,
            "GroupHeartbeat": self.groups.group_heartbeat,
            "ResetGroup": self.groups.reset_group,
            "DeleteGroup": self.groups.delete_group,
        }
        for name, handler in typed_handlers.items():
            dispatcher.handle_typed(name, handler)
