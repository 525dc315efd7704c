"""Typed messages: msgspec Structs for control-plane requests and answers, field for field the .avsc records of the
same name (tests/unit/test_typed_messages.py keeps them in step). A handler registered with Dispatcher.handle_typed
takes and returns them; the serdes speak their plain form (convert, plain)."""

from __future__ import annotations

from typing import Any, TypeVar

import msgspec

from rocket.errors import Code, RocketError
from rocket.model import TopicSpec

T = TypeVar("T", bound=msgspec.Struct)


class Empty(msgspec.Struct):
    pass


# ---- users, policies and quotas (rocket/access.py, rocket/quotas.py) ------------------------------------------

class AclCreateUserRequest(msgspec.Struct):
    user: str
    secret: str = ""  # empty: the nameserver makes one
    super: bool = False


class AclUser(msgspec.Struct):
    user: str
    secret: str = ""  # only in the answer that created it
    super: bool = False
    created_ms: int = 0


class AclUserRequest(msgspec.Struct):
    user: str = ""  # empty: every user's


class AclUsersResponse(msgspec.Struct):
    users: list[AclUser]


class AclPolicy(msgspec.Struct):
    user: str
    resource: str
    actions: list[str] = []
    effect: str = "allow"
    cidrs: list[str] = []


class AclPoliciesResponse(msgspec.Struct):
    policies: list[AclPolicy]


class AclQuota(msgspec.Struct):
    entity: str
    produce_bytes_per_s: int = 0
    consume_bytes_per_s: int = 0
    requests_per_s: float = 0.0
    delete: bool = False


class AclQuotasRequest(msgspec.Struct):
    entity: str = ""  # empty: every entity's


class AclQuotasResponse(msgspec.Struct):
    quotas: list[AclQuota]


class AclSealedUser(msgspec.Struct):
    user: str
    sealed: str
    super: bool = False
    created_ms: int = 0


class AclStateRequest(msgspec.Struct):
    version: int


class AclState(msgspec.Struct):
    version: int
    changed: bool
    users: list[AclSealedUser]
    policies: list[AclPolicy]
    quotas: list[AclQuota] = []


# ---- consumer groups' settings (roles/nameserver/consumer_groups.py) --------------------------------------------

class CreateConsumerGroupRequest(msgspec.Struct):
    group: str
    max_attempts: int = 0  # 0: the node's default
    retry_backoff_s: list[float] = []  # empty: rocket's default
    consume_mode: str = "clustering"
    fifo: bool = False


class UpdateConsumerGroupRequest(msgspec.Struct):
    group: str
    max_attempts: int = 0
    retry_backoff_s: list[float] = []
    consume_mode: str = "clustering"
    fifo: bool = False
    fields: list[str] = []  # the settings that change: only these


class ConsumerGroupInfo(msgspec.Struct):
    group: str
    max_attempts: int = 0
    retry_backoff_s: list[float] = []
    consume_mode: str = "clustering"
    fifo: bool = False


class ConsumerGroupsRequest(msgspec.Struct):
    group: str = ""  # empty: every group with settings


class ConsumerGroupsResponse(msgspec.Struct):
    groups: list[ConsumerGroupInfo]


# ---- storage classes (roles/nameserver/classes.py) ------------------------------------------------------------

class ReplicaLag(msgspec.Struct):
    group: int
    node: int
    entries: int


class GroupInfo(msgspec.Struct):
    id: int
    voters: list[int]
    learners: list[int] = []
    leader: int = 0
    lagging: list[ReplicaLag] = []
    storage_class: str = "raft"
    mode: str = "raft"
    master: int = 0
    master_epoch: int = 0
    sync_state_set: list[int] = []
    sync_state_set_epoch: int = 0
    min_in_sync_replicas: int = 0
    ha_max_lag_s: float = 0.0
    unclean_election: bool = False
    readers: list[int] = []  # read replicas: learners that stay (also in learners)


class ElectionRecord(msgspec.Struct):
    group: int
    master_epoch: int
    master: int
    previous: int
    unclean: bool = False
    at_ms: int = 0
    previous_last_index: int = 0
    master_last_index: int = 0


class CreateStorageClassRequest(msgspec.Struct):
    name: str
    mode: str
    replicas: int
    groups: int = 0  # 0: the nameservers' storage_groups
    min_in_sync_replicas: int = 1
    unclean_election: bool = False
    ha_max_lag_s: float = 5.0
    request_id: str = ""  # a retry of an applied create with the same id gets its answer


class StorageClassInfo(msgspec.Struct):
    name: str
    mode: str
    replicas: int
    min_in_sync_replicas: int = 1
    unclean_election: bool = False
    ha_max_lag_s: float = 5.0
    groups: list[GroupInfo] = []
    elections: list[ElectionRecord] = []


class StorageClassesRequest(msgspec.Struct):
    name: str = ""  # empty: every class


class StorageClassesResponse(msgspec.Struct):
    classes: list[StorageClassInfo]


# ---- topics and KV buckets (roles/nameserver/role.py) -----------------------------------------------------------

class CreateTopicRequest(msgspec.Struct):
    topic: str
    queues: int = 8
    message_type: str = "normal"
    storage_class: str = "raft"
    retention_s: int = -1  # 0: for ever; -1: the node's default
    local_retention_s: int = -1
    request_id: str = ""  # a retry of an applied create with the same id gets its answer
    read_replicas: int = 0  # learners its groups keep to serve reads


class DeleteTopicRequest(msgspec.Struct):
    topic: str
    force: bool = False  # even while a consumer group has messages left to consume


class DeleteGroupRequest(msgspec.Struct):
    topic: str
    group: str


class TopicInfo(msgspec.Struct):
    name: str
    queues: int
    created_ms: int = 0
    message_type: str = "normal"
    retention_s: int = -1  # 0: for ever; -1: the node's default
    local_retention_s: int = -1
    history: int = 1  # a KV bucket's revisions kept per key
    ttl_ms: int = 0  # a KV bucket's keys' default TTL (0: none)
    storage_class: str = "raft"
    read_replicas: int = 0  # learners its groups keep to serve reads


def topic_info(spec: TopicSpec) -> TopicInfo:
    """A topic as answers carry it (the fields of TopicSpec.to_wire)."""
    return TopicInfo(spec.name, spec.queues, spec.created_ms, spec.message_type, int(spec.retention_s),
                     int(spec.local_retention_s), spec.history, spec.ttl_ms, spec.storage_class,
                     spec.read_replicas)


class ListTopicsResponse(msgspec.Struct):
    topics: list[TopicInfo]


class UpdateTopicRequest(msgspec.Struct):
    topic: str
    retention_s: int = -2  # -2: as it is
    local_retention_s: int = -2
    queues: int = -2
    storage_class: str = ""  # move the topic to this class ("": it stays)
    read_replicas: int = -2  # learners its groups keep to serve reads


class CreateBucketRequest(msgspec.Struct):
    bucket: str
    shards: int = 1
    history: int = 1
    ttl_ms: int = 0
    storage_class: str = "raft"


class BucketRequest(msgspec.Struct):
    bucket: str


# ---- the broker's topic, tier and KV bucket answers (roles/broker/admin.py, kv.py) ------------------------------

class QueueInfo(msgspec.Struct):
    queue: int
    min_offset: int
    next_offset: int
    bytes: int


class QueueOffset(msgspec.Struct):
    queue: int
    offset: int


class PopInfo(msgspec.Struct):
    queue: int
    cursor: int
    done_before: int
    in_flight: int


class GroupOffset(msgspec.Struct):
    consumer_group: str
    queue: int
    offset: int
    pop: bool = False  # pop consumption: offset is where its done messages end


class ProducerAnswer(msgspec.Struct):
    queue: int
    producer: int
    sequence: int
    base_offset: int
    count: int


class QueueLock(msgspec.Struct):
    consumer_group: str
    queue: int
    client: str


class StorageQueuesResponse(msgspec.Struct):
    queues: list[QueueInfo]
    offsets: list[QueueOffset]
    time_offsets: list[QueueOffset]
    pops: list[PopInfo] = []
    lagging: list[str] = []  # asked for: the consumer groups with messages of the queues left to consume
    committed: list[GroupOffset] = []  # asked for (consumed): every consumer group's offsets on the queues
    dead_letters: list[str] = []  # asked for (consumed): the dead-letter topics beside the queues
    producers: list[ProducerAnswer] = []  # asked for (consumed): the answers remembered of the queues' producers
    locks: list[QueueLock] = []  # asked for (consumed): the orderly consumers' locks of the queues


class DescribeTopicResponse(msgspec.Struct):
    topic: TopicInfo
    queues: list[QueueInfo]


class TierStatusRequest(msgspec.Struct):
    topic: str = ""  # empty: every topic


class TierQueue(msgspec.Struct):
    queue: int
    first_offset: int
    local_offset: int
    tiered_offset: int
    next_offset: int
    local_bytes: int
    tiered_bytes: int
    pending_bytes: int
    pieces: int


class StorageTierResponse(msgspec.Struct):
    queues: list[TierQueue]


class TierTopic(msgspec.Struct):
    topic: TopicInfo
    queues: list[TierQueue]


class TierStatusResponse(msgspec.Struct):
    topics: list[TierTopic]


class BucketInfo(msgspec.Struct):
    name: str
    shards: int
    history: int
    ttl_ms: int
    created_ms: int


class ListBucketsResponse(msgspec.Struct):
    buckets: list[BucketInfo]


class KvShardInfo(msgspec.Struct):
    shard: int
    group: int
    leader: int
    revision: int
    keys: int
    bytes: int
    digest: str


class DescribeBucketResponse(msgspec.Struct):
    bucket: BucketInfo
    shards: list[KvShardInfo]


# ---- storage nodes' drains and health (roles/nameserver/role.py, health.py) -------------------------------------

class DrainNodeRequest(msgspec.Struct):
    node: int
    draining: bool = True  # false: up again


class NodeHealthRequest(msgspec.Struct):
    node: int = 0  # 0: every storage node


class PinNodeHealthRequest(msgspec.Struct):
    node: int
    pin: str


class HealthFeature(msgspec.Struct):  # a record defined inside NodeHealthResponse.avsc, as NodeHealthInfo is
    name: str
    value: float


# kw_only: their .avsc records have required fields after defaulted ones, in an order the Structs keep
class NodeHealthInfo(msgspec.Struct, kw_only=True):
    node: int
    state: str
    reason: str
    pin: str
    unhealthy_windows: int
    healthy_windows: int
    fsyncs: int
    calls: int
    call_errors: int
    fsync_p99_s: float = -1.0  # -1: too few fsyncs to say
    call_p99_s: float = -1.0  # -1: too few calls to say
    cpu_starved_s: float = 0.0
    raft_lag_entries: int = 0
    unhealthy: bool
    score: float
    verdict: str
    features: list[HealthFeature]


class NodeHealthResponse(msgspec.Struct, kw_only=True):
    scorer: str
    model: str = ""
    window_s: float
    windows_judged: int
    degrade_windows: int
    recover_windows: int
    nodes: list[NodeHealthInfo]


# ---- nodes: heartbeats, assignments, routes and the cluster's status (roles/nameserver/role.py) -----------------

class GroupBytes(msgspec.Struct):  # this and the next three: records defined inside NodeLoad.avsc
    group: int
    bytes: int


class TopicBytes(msgspec.Struct):
    topic: str
    bytes: int


class PeerCalls(msgspec.Struct):
    peer: str
    calls: int
    errors: int
    buckets: list[int] = []  # cumulative per bucket of RPC_BUCKETS


class ControlledReplica(msgspec.Struct):
    group: int
    epoch: int
    last_index: int


class NodeLoad(msgspec.Struct):
    groups: int = 0
    leads: list[int] = []
    bytes: int = 0
    free_disk_bytes: int = 0
    lagging: list[ReplicaLag] = []
    group_bytes_in: list[GroupBytes] = []
    topic_bytes_in: list[TopicBytes] = []
    fsync_buckets: list[int] = []  # cumulative per bucket of FSYNC_BUCKETS
    peer_calls: list[PeerCalls] = []
    cpu_starved_s: float = 0.0
    controlled: list[ControlledReplica] = []


class NodeHeartbeatRequest(msgspec.Struct):
    node: int
    address: str
    roles: list[str]
    load: NodeLoad
    assignment_version: int = -1  # -1: it holds none
    version: str = ""
    schema_version: int = 1


class NodeAddress(msgspec.Struct):
    id: int
    address: str


class Assignment(msgspec.Struct):
    version: int
    groups: list[GroupInfo]
    nodes: list[NodeAddress]
    unchanged: bool = False  # the node's assignment of version holds: groups and nodes are empty


class TopicRequest(msgspec.Struct):
    topic: str


class Route(msgspec.Struct):
    version: int
    topic: TopicInfo
    queue_groups: list[int]  # queue -> its group
    groups: list[GroupInfo]
    nodes: list[NodeAddress]


class NodeStatus(msgspec.Struct, kw_only=True):  # kw_only: load is required after defaulted fields
    id: int
    address: str
    roles: list[str]
    state: str
    heartbeat_age_ms: int = -1
    load: NodeLoad
    health: str = ""
    health_reason: str = ""
    version: str = ""
    schema_version: int = 1


class ClusterStatusResponse(msgspec.Struct):
    version: int
    nameserver_leader: int
    nameservers: list[int]
    nodes: list[NodeStatus]
    groups: list[GroupInfo]
    topics: int = 0
    moving: int = 0
    placement: str = ""
    load_series: int = 0


# ---- queue placement and its load history (roles/nameserver/queues.py, forecasts.py) ---------------------------

class QueuePlacement(msgspec.Struct):  # a record defined inside PlacementExplainResponse.avsc
    queue: int
    group: int
    node: int
    predicted: float  # -1: not recorded
    score: float
    runner_up: int
    runner_up_score: float


class PlacementExplainResponse(msgspec.Struct):
    topic: str
    predictor: str
    model: str
    placed_ms: int
    queues: list[QueuePlacement]
    note: str = ""


class SeriesStep(msgspec.Struct, kw_only=True):  # defined inside LoadShareRequest.avsc; kw_only as NodeHealthInfo
    kind: str  # group or topic
    group: int = 0
    topic: str = ""
    step: int  # ms since the epoch // 60,000
    bytes: int


class LoadShareRequest(msgspec.Struct):
    steps: list[SeriesStep]


# ---- the controller (roles/nameserver/controller.py) ------------------------------------------------------------

class AlterSyncStateSetRequest(msgspec.Struct):
    group: int
    master: int
    master_epoch: int
    sync_state_set_epoch: int
    sync_state_set: list[int]


class HandoverRequest(msgspec.Struct):
    group: int
    to: int


class ControlState(msgspec.Struct):
    master: int
    master_epoch: int
    sync_state_set: list[int]
    sync_state_set_epoch: int


class ControlledGroup(msgspec.Struct):
    group: int
    voters: list[int]
    master: int
    master_epoch: int
    sync_state_set: list[int]
    sync_state_set_epoch: int
    unclean_election: bool = False


class ControllerHeartbeatRequest(msgspec.Struct):
    node: int
    replicas: list[ControlledReplica] = []
    register: list[ControlledGroup] = []


class ControllerGroupsResponse(msgspec.Struct):
    groups: list[ControlledGroup] = []
    unknown: list[int] = []
    elections: list[ElectionRecord] = []


class HandOverFromRequest(msgspec.Struct):
    nodes: list[int]


class ControllerMembersRequest(msgspec.Struct):
    group: int
    replicas: list[int]
    leaving: int = 0
    drop: int = 0


# ---- consumer groups on the broker (rocket/roles/broker/groups.py) ----------------------------------------------

class GroupInfoRequest(msgspec.Struct):
    topic: str
    group: str


class GroupQueue(msgspec.Struct):
    queue: int
    min_offset: int
    next_offset: int
    committed: int  # -1: none committed
    pop_cursor: int
    pop_done_before: int
    in_flight: int
    lag: int
    dead_letters: int
    member: str = ""  # the live pull member reading it


class GroupInfoResponse(msgspec.Struct):
    topic: str
    group: str
    queues: list[GroupQueue]


class GroupHeartbeatRequest(msgspec.Struct):
    group: str
    topic: str
    member: str
    leave: bool = False


class GroupHeartbeatResponse(msgspec.Struct):
    members: list[str]
    queues: list[int]


class ResetGroupRequest(msgspec.Struct):
    topic: str
    group: str
    to: str  # earliest, latest, time or offset
    timestamp_ms: int = 0
    queue: int = -1  # -1: every queue
    offset: int = 0


STRUCTS: dict[str, type[msgspec.Struct]] = {struct.__name__: struct for struct in (
    Empty, AclCreateUserRequest, AclUser, AclUserRequest, AclUsersResponse, AclPolicy, AclPoliciesResponse, AclQuota,
    AclQuotasRequest, AclQuotasResponse, AclSealedUser, AclStateRequest, AclState, CreateConsumerGroupRequest,
    UpdateConsumerGroupRequest, ConsumerGroupInfo, ConsumerGroupsRequest, ConsumerGroupsResponse, ReplicaLag, GroupInfo,
    ElectionRecord, CreateStorageClassRequest, StorageClassInfo, StorageClassesRequest, StorageClassesResponse,
    CreateTopicRequest, DeleteTopicRequest, DeleteGroupRequest, TopicInfo, ListTopicsResponse, UpdateTopicRequest, CreateBucketRequest, BucketRequest,
    DrainNodeRequest, NodeHealthRequest, PinNodeHealthRequest, HealthFeature, NodeHealthInfo, NodeHealthResponse,
    GroupBytes, TopicBytes, PeerCalls, ControlledReplica, NodeLoad, NodeHeartbeatRequest, NodeAddress, Assignment,
    TopicRequest, Route, NodeStatus, ClusterStatusResponse, QueuePlacement, PlacementExplainResponse, SeriesStep,
    LoadShareRequest, AlterSyncStateSetRequest, HandoverRequest, ControlState, ControlledGroup,
    ControllerHeartbeatRequest, ControllerGroupsResponse, HandOverFromRequest, ControllerMembersRequest, QueueInfo,
    QueueOffset, PopInfo, GroupOffset, ProducerAnswer, QueueLock, StorageQueuesResponse, DescribeTopicResponse, TierStatusRequest,
    TierQueue, StorageTierResponse, TierTopic, TierStatusResponse, BucketInfo, ListBucketsResponse, KvShardInfo,
    DescribeBucketResponse, GroupInfoRequest, GroupQueue, GroupInfoResponse, GroupHeartbeatRequest,
    GroupHeartbeatResponse, ResetGroupRequest)}


def convert(value: Any, struct: type[T]) -> T:
    """A message in its plain form (a decoded request, an answer from another node) as the Struct; BAD_REQUEST
    naming the field when it does not fit."""
    try:
        return msgspec.convert(value, struct)
    except msgspec.ValidationError as error:
        raise RocketError(Code.BAD_REQUEST, f"{struct.__name__}: {error}") from None


def plain(message: msgspec.Struct) -> dict[str, Any]:
    """The message as the serdes take it: dicts and lists, bytes kept as they are."""
    return msgspec.to_builtins(message, builtin_types=(bytes, bytearray, memoryview))
