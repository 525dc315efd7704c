"""The nameserver role: the cluster metadata on the nameservers' Raft group, served to brokers and storage nodes.
Nameserver holds its calls (node heartbeats, topics and routes, replica moves, drains, status) and wires its parts.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import trio

from rocket import limits
from rocket.clock import Clock, sleep_periodic
from rocket.config import ROLES, ConfigError, NodeConfig, parse_address
from rocket.errors import Code, RocketError
from rocket.ml.placement import LeastLoaded, NodeLoad, Placement
from rocket.model import (KV_PREFIX, Address, bucket_topic, check_message_type, check_name, check_request_id,
                          check_retention_s, check_user_topic_name)
from rocket.raft.host import RaftHost
from rocket.roles.nameserver.acl import AclAdmin
from rocket.roles.nameserver.classes import StorageClasses
from rocket.roles.nameserver.consumer_groups import ConsumerGroupSettings
from rocket.roles.nameserver.controller import Controller
from rocket.roles.nameserver.class_moves import ClassMoves
from rocket.roles.nameserver.deletes import TopicDeletes
from rocket.roles.nameserver.forecasts import Forecasts, with_training
from rocket.roles.nameserver.group import MetadataGroup
from rocket.roles.nameserver.health import NodeHealthChecks
from rocket.roles.nameserver.control import Control
from rocket.roles.nameserver.metadata import DEFAULT_CLASS, META_GROUP, Metadata, exists
from rocket.roles.nameserver.queues import QueuePlacement
from rocket.roles.nameserver.readers import ReadReplicas, check_read_replicas
from rocket.roles.nameserver.remote_controller import RemoteController
from rocket.roles.peers import RETRYABLE, Peers
from rocket.serde.typed import NodeLoad as LoadReport
from rocket.serde.typed import (Assignment, BucketRequest, ClusterStatusResponse, CreateBucketRequest,
                                CreateTopicRequest, DrainNodeRequest, Empty, HandoverRequest, ListTopicsResponse,
                                NodeHeartbeatRequest, NodeStatus, ReplicaLag, Route, TopicInfo, TopicRequest,
                                UpdateTopicRequest, topic_info)
from rocket.transport.rpc import Dispatcher

log = logging.getLogger("rocket.nameserver")
NO_LOAD = LoadReport()  # the load of a node not heard from (shared: never changed)


class Nameserver:
    """The nameserver's calls and its parts' (acl, consumer_group_settings, controller, classes, queue_placement,
    health over meta; forecasts).
    Writes run on the group's leader (other nameservers forward them); routes are served by any nameserver from its
    applied state. The leader alone tracks liveness and load from the nodes' heartbeats, in memory: a new leader
    learns them again within a heartbeat."""

    def __init__(self, config: NodeConfig, host: RaftHost, peers: Peers, clock: Clock,
                 placement: Placement | None = None, objects=None):
        self.config = config
        self.clock = clock
        self.host = host
        self.peers = peers
        self.placement = placement or LeastLoaded()
        self.members = config.nameserver_members()
        self.metadata = Metadata()
        host.add_group(META_GROUP, tuple(self.members), self.metadata)
        # Keyed by nodes, each registered in the metadata by its first heartbeat, and by the metadata's groups.
        self.heartbeats: dict[int, tuple[float, LoadReport]] = {}  # node -> (when, load): on the leader only
        # node -> its rocket version and schema version, from its last heartbeat (on the leader)
        self._versions: dict[int, tuple[str, int]] = {}
        self.leaders: dict[int, int] = {}  # storage group -> the node that last reported leading it
        self.creating = trio.Lock()  # topic creations are placed one at a time
        self.moving: set[int] = set()  # storage groups whose replica move runs now
        self.meta = MetadataGroup(config, host, peers, self.members, self.metadata)
        self.consumer_group_settings = ConsumerGroupSettings(self.meta)
        # The RIP-44 controller: embedded (its state in the metadata), or a standalone group's (config controllers).
        self.controller = (RemoteController(self.meta, peers) if config.controller_members()
                           else Controller(self.meta, self.metadata, self.heartbeats, clock))
        self.acl = AclAdmin(self.meta, config, clock)
        self.classes = StorageClasses(self.meta, config, self)
        self.forecasts = Forecasts(config, clock, peers, self.members, objects)
        self.queue_placement = QueuePlacement(self.meta, config, clock, self.forecasts, self)
        self.health = NodeHealthChecks(self.meta, config, clock, objects, self)
        self.deletes = TopicDeletes(self.meta, clock, self.call_group_leader)
        self.class_moves = ClassMoves(self.meta, self.queue_placement, self.call_group_leader)
        self.readers = ReadReplicas(self.meta, self.metadata, self.placement, self.loads, self.leaving,
                                    self._change_members)

    def register(self, dispatcher: Dispatcher) -> None:
        dispatcher.handle_typed("NodeHeartbeat", self.node_heartbeat)
        if isinstance(self.controller, Controller):  # a standalone controller answers its storage nodes itself
            dispatcher.handle_typed("ControllerAlterSyncStateSet", self.controller.alter_sync_state_set)
        dispatcher.handle_typed("GetRoute", self.get_route)
        dispatcher.handle_typed("MetaCreateTopic", self.create_topic)
        dispatcher.handle_typed("MetaListTopics", self.list_topics)
        dispatcher.handle_typed("MetaUpdateTopic", self.update_topic)
        dispatcher.handle_typed("MetaDeleteTopic", self.deletes.delete_topic)
        dispatcher.handle_typed("MetaCreateBucket", self.create_bucket)
        dispatcher.handle_typed("MetaDeleteBucket", self.delete_bucket)
        dispatcher.handle_typed("ClusterStatus", self.cluster_status)
        dispatcher.handle_typed("DrainNode", self.drain_node)
        dispatcher.handle_typed("Handover", self.controller.handover)
        dispatcher.handle_typed("PlacementExplain", self.queue_placement.placement_explain)
        dispatcher.handle_typed("MetaLoadShare", self.forecasts.load_share)
        dispatcher.handle_typed("NodeHealth", self.health.node_health)
        dispatcher.handle_typed("PinNodeHealth", self.health.pin_node_health)
        dispatcher.handle_typed("MetaCreateStorageClass", self.classes.create_storage_class)
        dispatcher.handle_typed("MetaStorageClasses", self.classes.storage_classes)
        dispatcher.handle_typed("MetaCreateConsumerGroup", self.consumer_group_settings.create_consumer_group)
        dispatcher.handle_typed("MetaUpdateConsumerGroup", self.consumer_group_settings.update_consumer_group)
        dispatcher.handle_typed("MetaConsumerGroups", self.consumer_group_settings.consumer_groups)
        dispatcher.handle_typed("MetaDeleteConsumerGroup", self.consumer_group_settings.delete_consumer_group)
        dispatcher.handle_typed("MetaAclState", self.acl.acl_state)
        for name, handler in self.acl_methods().items():
            dispatcher.handle_typed(name, handler)

    def acl_methods(self) -> dict:
        """The user and policy calls; a broker without a nameserver forwards them here."""
        acl = self.acl
        return {"AclCreateUser": acl.acl_create_user, "AclDeleteUser": acl.acl_delete_user,
                "AclUsers": acl.acl_users, "AclGrant": acl.acl_grant, "AclRevoke": acl.acl_revoke,
                "AclPolicies": acl.acl_policies, "AclSetQuota": acl.acl_set_quota, "AclQuotas": acl.acl_quotas}

    async def serve(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """On the leader, every heartbeat interval: create storage groups as storage nodes join, plan replica
        moves (they run here too), and balance leaders."""
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._follow_models_forever)
            nursery.start_soon(self.controller.control_forever)
            nursery.start_soon(self.deletes.finish_forever, self.leads)
            nursery.start_soon(self.class_moves.finish_forever, self.leads)
            if self.config.auth:
                nursery.start_soon(self.acl.bootstrap_admin_forever)
            task_status.started()
            while True:
                await sleep_periodic(limits.node_heartbeat_s)
                if not self.leads():
                    self.health.forget_window()
                    self.readers.forget()
                    await self.forecasts.share()  # what it recorded while it led, for the new leader
                    continue
                try:
                    await self.health.judge_window()
                    await self.controller.hand_over_from(self.unfit_master)
                    await self._grow_pool()
                    await self._plan_moves(nursery)
                    self.readers.start(nursery, self.moving)
                    await self.queue_placement.balance_leaders()
                    await self.forecasts.share()
                except RocketError as error:
                    log.warning("planning replica moves and leaders: %s", error)

    async def _follow_models_forever(self) -> None:
        """Every limits.model_poll_s, on every nameserver: the forecast and health models in the object store."""
        while True:
            await self.forecasts.follow_model()
            await self.health.follow_model()
            await trio.sleep(limits.model_poll_s)

    def leads(self) -> bool:
        return self.meta.leads()

    async def _on_leader(self, method: str, request: Any, here):
        return await self.meta.on_leader(method, request, here)

    async def _propose(self, command: dict):
        return await self.meta.propose(command)

    # ---- nodes ---------------------------------------------------------------------------------------

    async def node_heartbeat(self, request: NodeHeartbeatRequest) -> Assignment:
        if request.node < 1 or not set(request.roles) <= set(ROLES):
            raise RocketError(Code.BAD_REQUEST, f"node {request.node} with roles {request.roles} is not valid")
        try:
            parse_address("address", request.address)
        except ConfigError as error:
            raise RocketError(Code.BAD_REQUEST, str(error)) from None
        return await self._on_leader("NodeHeartbeat", request, self._heartbeat_here)

    async def _heartbeat_here(self, request: NodeHeartbeatRequest) -> Assignment:
        node, load = request.node, request.load
        known = self.metadata.nodes.get(node)
        if known is None and len(self.metadata.nodes) >= limits.nodes_max:
            raise RocketError(Code.OVERLOADED, f"the cluster has {len(self.metadata.nodes)} nodes, the most it takes "
                              f"(limits.nodes_max); node {node} is not registered")
        if known is None or known.address != request.address or list(known.roles) != request.roles:
            await self._propose({"op": "register", "node": node, "address": request.address, "roles": request.roles})
        self.heartbeats[node] = (trio.current_time(), load)
        self._versions[node] = (request.version, request.schema_version)
        self.forecasts.record(load)
        for group in load.leads:
            if group in self.metadata.groups:  # only groups that exist: leaders stays within storage_groups_max
                self.leaders[group] = node
        if request.assignment_version == self.metadata.version:  # nothing changed: spare 10,000 groups
            return Assignment(self.metadata.version, [], [], unchanged=True)
        return self.metadata.assignment(node)

    def node_state(self, node: int) -> tuple[str, int]:
        """(up | suspect | down | unknown, heartbeat age in ms or -1), as this leader has seen it."""
        heard = self.heartbeats.get(node)
        if heard is None:
            return "unknown", -1
        age_s = trio.current_time() - heard[0]
        state = "up" if age_s < limits.node_suspect_s else "suspect" if age_s < limits.node_down_s else "down"
        return state, int(age_s * 1000)

    def loads(self) -> list[NodeLoad]:
        """The storage nodes as replica placement sees them: available when up, not draining and not degraded. A
        degraded node still counts as available when the others are too few for a group's replicas (better a slow
        replica than a missing one). Its replicas stay where they are until it has been degraded for
        health_move_after_s (leaving)."""
        loads, degraded = [], self.health.degraded()
        for node in self.metadata.storage_nodes():
            load = self.heartbeats.get(node.id, (0.0, NO_LOAD))[1]
            loads.append(NodeLoad(node.id, self.metadata.replicas(node.id), len(load.leads), load.bytes,
                                  load.free_disk_bytes, self.node_state(node.id)[0] == "up" and node.state == "up"))
        if sum(load.available and load.node not in degraded for load in loads) >= self.config.replication:
            for load in loads:
                load.available = load.available and load.node not in degraded
        return loads

    def degraded(self) -> set[int]:
        return self.health.degraded()

    def leaving(self, node: int) -> bool:
        """Down, draining, or degraded for health_move_after_s: its replicas go elsewhere (where there is room)."""
        info, degraded_s = self.metadata.nodes.get(node), self.health.degraded_for_s(node)
        return (self.node_state(node)[0] == "down" or (info is not None and info.state == "draining")
                or (degraded_s is not None and degraded_s >= self.config.health_move_after_s))

    def unfit_master(self, node: int) -> bool:
        """A controller-mode master on this node hands its groups over: it drains, is degraded, or is leaving."""
        return node in self.health.degraded() or self.leaving(node)

    # ---- replica moves -------------------------------------------------------------------------------

    async def _plan_moves(self, nursery: trio.Nursery) -> None:
        """Resume recorded moves, replace replicas on down, draining or long-degraded nodes, then even out the load.
        A controller-mode group's replica is replaced too (_hand_off), but its groups are not moved to even out the
        load.

        At most limits.replica_moves_max moves run at once, and the load is evened out (a replica from the node
        holding the most to the one holding the fewest: a new node fills up) only while none runs, within the
        planner's move budget (rebalance_moves_per_hour). A move is recorded in the metadata first (move_start: the
        new replica joins as a learner), then carried out on the group's leader (_move: add learner, promote once
        caught up, remove the old replica), then recorded as done (move_done); a new nameserver leader resumes the
        moves it finds recorded."""
        for group, members in list(self.metadata.groups.items()):
            if len(self.moving) >= limits.replica_moves_max:
                return
            if group in self.moving:
                continue
            if not members.learners:
                leaving = [voter for voter in members.voters if self.leaving(voter)]
                if not leaving:
                    continue
                loads = [load for load in self.loads() if load.node not in self.metadata.members_of(group)]
                if not any(load.available for load in loads):
                    continue  # nowhere to go: the group stays short of a replica until a node comes
                target = self.placement.place(1, 1, loads)[0][0]
                await self._propose({"op": "move_start", "group": group, "add": target, "remove": leaving[0]})
            self._start_move(nursery, group)
        if self.moving:
            return
        available = [load for load in self.loads() if load.available]
        if len(available) < 2:
            return
        low = min(available, key=lambda load: (load.replicas, load.node))
        high = max(available, key=lambda load: (load.replicas, -load.node))
        if high.replicas - low.replicas <= 1:
            return
        for group, members in self.metadata.groups.items():
            if (high.node in members.voters and low.node not in self.metadata.members_of(group)
                    and not members.learners and members.control is None):
                if not self.queue_placement.planner.budget.take(trio.current_time()):
                    return  # the planner's balancing moves of the hour are spent
                await self._propose({"op": "move_start", "group": group, "add": low.node, "remove": high.node})
                self._start_move(nursery, group)
                return

    def _start_move(self, nursery: trio.Nursery, group: int) -> None:
        self.moving.add(group)
        nursery.start_soon(self._move, group)

    async def _move(self, group: int) -> None:
        members = self.metadata.groups[group]
        added, removed = members.learners[0], members.leaving
        try:
            if members.control is not None:  # the new replica may join the set, the old one may not rejoin it
                await self.controller.members(group, members.electable(), removed)
            await self._change_members(group, "add_learner", added)
            await self._change_members(group, "promote", added)
            if removed and members.control is not None:
                await self._hand_off(group, added, removed)
            if removed:
                await self._change_members(group, "remove", removed)
            await self._propose({"op": "move_done", "group": group})
            if members.control is not None:
                await self.controller.members(group, self.metadata.groups[group].electable(), 0)
            log.info("group %d: replica moved from node %d to node %d", group, removed, added)
        except RocketError as error:
            log.warning("group %d: moving a replica to node %d: %s; trying again later", group, added, error)
        finally:
            self.moving.discard(group)

    async def _hand_off(self, group: int, added: int, removed: int) -> None:
        """A controller-mode group's replica replaced: once the new one is in the SyncStateSet (the master asked the
        controller to let it in: it holds everything acknowledged), the old one hands its mastership over to it if it
        has it, and the controller drops it from the set (Controller.drop). Only then may the master remove it
        (ControlledCore.propose_conf_change). With a standalone controller, the metadata's word is its mirror."""
        await self._until(lambda control: added in control.sync_state_set, group,
                          f"node {added} did not join group {group}'s SyncStateSet")
        if self.metadata.control(group)[1].master == removed:
            await self.controller.handover(HandoverRequest(group, added))
        await self.controller.drop(group, removed)
        await self._until(lambda control: removed not in control.sync_state_set, group,
                          f"node {removed} is still in group {group}'s SyncStateSet")

    async def _until(self, holds: Callable[[Control], bool], group: int, otherwise: str) -> None:
        """Wait until the controller's word on the group, as the metadata holds it, satisfies holds (UNAVAILABLE,
        saying otherwise, after limits.member_change_s_max)."""
        with trio.move_on_after(limits.member_change_s_max):
            while not holds(self.metadata.control(group)[1]):
                await trio.sleep(limits.membership_poll_s)
            return
        raise RocketError(Code.UNAVAILABLE, f"{otherwise} within {limits.member_change_s_max:g} s: "
                          f"{sorted(self.metadata.control(group)[1].sync_state_set)}")

    async def _change_members(self, group: int, action: str, node: int) -> None:
        """Run one membership change on the group's leader, whichever voter that is now."""
        await self.call_group_leader(group, "StorageMembers", {"group": group, "action": action, "node": node})

    async def call_group_leader(self, group: int, method: str, request: dict,
                                wait_s: float = limits.member_change_s_max,
                                retry_s: float = limits.replica_move_retry_s) -> dict:
        """A call that a storage group's leader serves, whichever member leads now: the one that last reported
        leading it first, then the others not down, again every retry_s for up to wait_s."""
        failure = RocketError(Code.UNAVAILABLE, f"group {group} has no reachable leader")
        with trio.move_on_after(wait_s):
            while True:
                members = self.metadata.members_of(group)  # a promoted learner may lead already
                leader = self.leaders.get(group)
                for voter in sorted(members, key=lambda member: member != leader):
                    info = self.metadata.nodes.get(voter)
                    if info is None or self.node_state(voter)[0] == "down":
                        continue
                    try:
                        answer = await self.peers.call(Address.parse(info.address), method, request)
                        self.leaders[group] = voter
                        return answer
                    except RocketError as error:
                        if error.code not in RETRYABLE:
                            raise
                        failure = error
                await trio.sleep(retry_s)
        raise failure

    async def drain_node(self, request: DrainNodeRequest) -> Empty:
        return await self._on_leader("DrainNode", request, self._drain_here)

    async def _drain_here(self, request: DrainNodeRequest) -> Empty:
        await self._propose({"op": "node_state", "node": request.node,
                             "state": "draining" if request.draining else "up"})
        return Empty()

    # ---- topics and routes ---------------------------------------------------------------------------

    async def create_topic(self, request: CreateTopicRequest) -> TopicInfo:
        check_user_topic_name(request.topic)
        check_message_type(request.message_type)
        check_name("storage class", request.storage_class, limits.storage_class_name_bytes_max)
        check_retention_s("retention_s", request.retention_s)
        check_retention_s("local_retention_s", request.local_retention_s)
        check_request_id(request.request_id)
        check_read_replicas(self.metadata, request.storage_class, request.read_replicas)
        if not 1 <= request.queues <= limits.queues_per_topic_max:
            raise RocketError(Code.BAD_REQUEST, f"queues must be 1..{limits.queues_per_topic_max}, "
                              f"got {request.queues}")
        return await self._on_leader("MetaCreateTopic", request, self._create_topic_here)

    async def create_bucket(self, request: CreateBucketRequest) -> TopicInfo:
        """A KV bucket is kept as a topic of type "kv" (bucket_topic), its shards the topic's queues: placed,
        routed and moved as queues are."""
        check_name("bucket", request.bucket, limits.topic_name_bytes_max - len(KV_PREFIX))
        for field, value, low, high in (("shards", request.shards, 1, limits.kv_shards_max),
                                        ("history", request.history, 1, limits.kv_history_max),
                                        ("ttl_ms", request.ttl_ms, 0, limits.kv_ttl_s_max * 1000)):
            if not low <= value <= high:
                raise RocketError(Code.BAD_REQUEST, f"{field} must be {low}..{high}, got {value}")
        check_name("storage class", request.storage_class, limits.storage_class_name_bytes_max)
        topic = CreateTopicRequest(bucket_topic(request.bucket), request.shards, "kv", request.storage_class)
        return await self._on_leader("MetaCreateBucket", request,
                                     lambda _: self._create_topic_here(topic, request.history, request.ttl_ms))

    async def delete_bucket(self, request: BucketRequest) -> Empty:
        """Forget a bucket (its keys were deleted first, by the broker); its shards' revisions go on if a bucket of
        the same name comes again, so that no revision is ever reused."""
        return await self._on_leader("MetaDeleteBucket", request, self._delete_bucket_here)

    async def _delete_bucket_here(self, request: BucketRequest) -> Empty:
        name = bucket_topic(request.bucket)
        self.metadata.topic(name)
        await self._propose({"op": "delete_topic", "name": name})
        return Empty()

    async def _create_topic_here(self, request: CreateTopicRequest, history: int = 1, ttl_ms: int = 0) -> TopicInfo:
        """The queues go to the groups of the topic's storage class: for the default one, the Raft groups, made here
        while there are fewer than the pool size; another class's were made with it. history and ttl_ms: a KV
        bucket's."""
        name = request.topic
        storage_class = request.storage_class
        async with self.creating:
            if self.metadata.created_by(request.request_id, "topic") == name and name in self.metadata.topics:
                return topic_info(self.metadata.topic(name))  # a retry of a create that was applied
            if name in self.metadata.topics:
                raise exists(name)
            self.metadata.check_not_deleted(name)
            created_ms = self.clock.wall_ms()
            reopened = name in self.metadata.tombstones
            if reopened:
                await self.deletes.reopen(name, created_ms)
            pool = self.metadata.class_groups(storage_class)
            new_groups = []
            loads = self.loads()
            missing = self._pool_size(loads) - len(pool) if storage_class == DEFAULT_CLASS else 0
            if missing > 0:
                available = sum(load.available for load in loads)
                if not available:
                    raise RocketError(Code.UNAVAILABLE, "no storage node is up yet; retry")
                replicas = min(self.config.replication, available)
                if replicas < self.config.replication:
                    report = log.warning if self.config.nameservers else log.info  # dev mode is one node
                    report("placing %d storage groups on %d replicas: only %d storage nodes are up", missing,
                           replicas, available)
                new_groups = self.new_groups(missing, replicas, loads)
            groups = pool + [group["id"] for group in new_groups]
            voters = {group: self.metadata.groups[group].voters for group in pool}
            voters.update({group["id"]: tuple(group["voters"]) for group in new_groups})
            choices = self.queue_placement.place(None, name, 0, request.queues, voters)
            queue_groups = [choice.group for choice in choices]
            command = {"op": "create_topic", "name": name, "queues": request.queues,
                       "message_type": request.message_type,
                       "created_ms": created_ms, "new_groups": new_groups, "groups": groups,
                       "queue_groups": queue_groups, "storage_class": storage_class,
                       "history": history, "ttl_ms": ttl_ms, "retention_s": float(request.retention_s),
                       "local_retention_s": float(request.local_retention_s), "request_id": request.request_id,
                       "reopened": reopened, "read_replicas": request.read_replicas}
            await self._propose(command)
        return topic_info(self.metadata.topic(name))

    def _pool_size(self, loads: list[NodeLoad]) -> int:
        """The Raft groups (the default class's) the cluster should have: `storage_groups` per `replication` storage
        nodes up (at least `storage_groups`), so that each node holds about as many replicas however many nodes
        there are."""
        available = sum(load.available for load in loads)
        wanted = -(-self.config.storage_groups * available // self.config.replication)
        return min(max(self.config.storage_groups, wanted), limits.storage_groups_max)

    def new_groups(self, count: int, replicas: int, loads: list[NodeLoad]) -> list[dict]:
        first = self.metadata.next_group_id()
        return [{"id": first + number, "voters": list(voters)}
                for number, voters in enumerate(self.placement.place(count, replicas, loads))]

    async def _grow_pool(self) -> None:
        """Storage nodes joined: create groups for new queues on them (their replicas go to the nodes holding the
        fewest). Only once the first topic made the pool, and with every group fully replicated."""
        pool = self.metadata.raft_groups()
        if not pool:
            return
        loads = self.loads()
        missing = self._pool_size(loads) - len(pool)
        if missing <= 0 or sum(load.available for load in loads) < self.config.replication:
            return
        async with self.creating:
            new_groups = self.new_groups(missing, self.config.replication, loads)
            await self._propose({"op": "create_groups", "new_groups": new_groups})
        log.info("%d storage nodes up: created storage groups %s", sum(load.available for load in loads),
                 ", ".join(str(group["id"]) for group in new_groups))

    async def update_topic(self, request: UpdateTopicRequest) -> TopicInfo:
        """Change a topic's retention settings in whole seconds or its read replicas, add queues (-2 leaves one as it
        is), or start its move to another storage class (class_moves.py; the answer names the class it is in until it
        moved). Read replicas are added and removed after the answer (readers.py), within a few heartbeats."""
        check_user_topic_name(request.topic)
        for field, value in (("retention_s", request.retention_s), ("local_retention_s", request.local_retention_s)):
            if value != -2:
                check_retention_s(field, value)
        return await self._on_leader("MetaUpdateTopic", request, self._update_topic_here)

    async def _update_topic_here(self, request: UpdateTopicRequest) -> TopicInfo:
        spec = self.metadata.topic(request.topic)
        adding = request.queues != -2
        if adding:
            async with self.creating:  # placed one at a time, as creations are
                await self.queue_placement.add_queues(self.metadata.topic(spec.name), request.queues)
        if (not adding and not request.storage_class or request.retention_s != -2 or request.local_retention_s != -2
                or request.read_replicas != -2):
            spec = self.metadata.topic(spec.name)
            retention_s = spec.retention_s if request.retention_s == -2 else request.retention_s
            local_s = spec.local_retention_s if request.local_retention_s == -2 else request.local_retention_s
            readers = spec.read_replicas if request.read_replicas == -2 else request.read_replicas
            check_read_replicas(self.metadata, spec.storage_class, readers)
            await self._propose({"op": "update_topic", "name": spec.name, "retention_s": float(retention_s),
                                 "local_retention_s": float(local_s), "read_replicas": readers})
        if request.storage_class:
            async with self.creating:  # placed one at a time, as creations are
                await self.class_moves.start(self.metadata.topic(spec.name), request.storage_class)
        return topic_info(self.metadata.topic(spec.name))

    async def _read(self, method: str, request: Any, here, locally: bool = True):
        return await self.meta.read(method, request, here, locally)

    async def list_topics(self, request: Empty) -> ListTopicsResponse:
        return await self._read("MetaListTopics", request, self._topics_here)

    async def _topics_here(self, request: Empty) -> ListTopicsResponse:
        topics = self.metadata.topics
        return ListTopicsResponse([topic_info(topics[name]) for name in sorted(topics)])

    async def get_route(self, request: TopicRequest) -> Route:
        """From this nameserver's state when it is in sync and knows the topic, else from the leader's
        (a topic just created may not have reached this one yet)."""
        return await self._read("GetRoute", request, self._route_here, locally=request.topic in self.metadata.topics)

    async def _route_here(self, request: TopicRequest) -> Route:
        return self.metadata.route(request.topic, self.leaders)

    # ---- status --------------------------------------------------------------------------------------

    async def cluster_status(self, request: Empty) -> ClusterStatusResponse:
        return await self._on_leader("ClusterStatus", request, self._status_here)

    async def _status_here(self, request: Empty) -> ClusterStatusResponse:
        lagging: dict[int, list[ReplicaLag]] = {}  # as each group's leader reported it
        for group, leader in self.leaders.items():
            for lag in self.heartbeats.get(leader, (0.0, NO_LOAD))[1].lagging:
                if lag.group == group:
                    lagging.setdefault(group, []).append(lag)
        nodes = []
        for node in sorted(self.metadata.nodes.values(), key=lambda node: node.id):
            liveness, age_ms = self.node_state(node.id)
            health, reason = self.health.health_of(node.id)
            version, schema_version = self._versions.get(node.id, ("", 1))
            nodes.append(NodeStatus(id=node.id, address=node.address, roles=list(node.roles),
                                    state=liveness if node.state == "up" else node.state, heartbeat_age_ms=age_ms,
                                    load=self.heartbeats.get(node.id, (0.0, NO_LOAD))[1], health=health,
                                    health_reason=reason, version=version, schema_version=schema_version))
        return ClusterStatusResponse(
            version=self.metadata.version, nameserver_leader=self.host.leader_of(META_GROUP),
            nameservers=sorted(self.members), nodes=nodes,
            groups=[self.metadata.group_info(group, self.leaders, lagging.get(group))
                    for group in sorted(self.metadata.groups)],
            topics=len(self.metadata.topics), moving=len(self.moving),
            placement=f"{with_training(self.forecasts.model_state, self.forecasts.training)}; "
                      f"{self.queue_placement.planner.describe(trio.current_time())}",
            load_series=len(self.forecasts.history))
