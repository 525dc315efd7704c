"""The method table: each of rocket's RPC methods, declared once (METHODS), with its request and response types
and how its bytes may travel outside the serde; what quotas count of each; and the framing helpers both sides share.
"""

from __future__ import annotations

import dataclasses
from types import ModuleType

from rocket.errors import Code, RocketError
from rocket.serde import SERDE_IDS


@dataclasses.dataclass(frozen=True, slots=True)
class MethodSpec:
    name: str
    request_type: str
    response_type: str
    streaming: bool = False
    attachment_field: str | None = None  # a bytes field TCP may carry outside the serde, uncopied
    # (list field, bytes field of its items): bytes of a response that TCP carries outside the serde, uncopied
    response_attachments: tuple[str, str] | None = None
    response_attachment: str | None = None  # or a response's one bytes field, carried the same way
    # A write that a resend could apply twice (KV): a client does not resend it once it went out unanswered.
    at_most_once: bool = False
    # Between nodes only: with a cluster secret, served only on connections that said PeerHello (peer_auth.py).
    internal: bool = False
    # TCP serves it in the connection's read loop, in order, with no task and no in-flight slot: per message, that
    # cost is most of a small call's. Only for a handler that never waits (no I/O, no lock, no sleep): one that waits
    # stalls every request behind it on the connection. The checks (peers, access) and the answer stay as for any call.
    inline: bool = False

    def __post_init__(self) -> None:
        if self.inline and self.streaming:
            raise ValueError(f"{self.name}: a stream cannot be served inline")


METHODS: dict[str, MethodSpec] = {
    spec.name: spec
    for spec in [
        MethodSpec("Ping", "Empty", "ServerInfo", inline=True),  # its handler answers from what it holds
        # A client's first call on a connection: the schema versions (serde/versions.py). The dispatcher answers it.
        MethodSpec("Hello", "Hello", "Hello"),
        MethodSpec("PeerHello", "PeerHelloRequest", "Empty"),
        MethodSpec("Authenticate", "AuthenticateRequest", "Empty"),
        MethodSpec("AclWhoAmI", "Empty", "AclUser"),
        MethodSpec("AclCreateUser", "AclCreateUserRequest", "AclUser"),
        MethodSpec("AclDeleteUser", "AclUserRequest", "Empty"),
        MethodSpec("AclUsers", "Empty", "AclUsersResponse"),
        MethodSpec("AclGrant", "AclPolicy", "AclPolicy"),
        MethodSpec("AclRevoke", "AclPolicy", "Empty"),
        MethodSpec("AclPolicies", "AclUserRequest", "AclPoliciesResponse"),
        MethodSpec("AclSetQuota", "AclQuota", "AclQuota"),
        MethodSpec("AclQuotas", "AclQuotasRequest", "AclQuotasResponse"),
        MethodSpec("CreateTopic", "CreateTopicRequest", "TopicInfo"),
        MethodSpec("ListTopics", "Empty", "ListTopicsResponse"),
        MethodSpec("DescribeTopic", "TopicRequest", "DescribeTopicResponse"),
        MethodSpec("DeleteTopic", "DeleteTopicRequest", "Empty"),
        MethodSpec("DeleteGroup", "DeleteGroupRequest", "Empty"),
        MethodSpec("Produce", "ProduceRequest", "ProduceResponse", attachment_field="batch"),
        MethodSpec("Pull", "PullRequest", "PullResponse", response_attachments=("batches", "batch")),
        MethodSpec("Subscribe", "PullRequest", "PullResponse", streaming=True),
        MethodSpec("CommitOffsets", "CommitOffsetsRequest", "Empty"),
        MethodSpec("FetchOffsets", "FetchOffsetsRequest", "OffsetsResponse"),
        MethodSpec("SearchOffset", "SearchOffsetRequest", "OffsetsResponse"),
        MethodSpec("FindMessages", "FindMessagesRequest", "FindMessagesResponse",
                   response_attachments=("batches", "batch")),
        MethodSpec("CancelTimer", "TimerRequest", "Empty"),
        MethodSpec("EndTransaction", "EndTransactionRequest", "Empty"),
        MethodSpec("TransactionChecks", "TransactionChecksRequest", "TransactionChecksResponse", streaming=True),
        MethodSpec("DescribeGroup", "GroupInfoRequest", "GroupInfoResponse"),
        MethodSpec("GroupHeartbeat", "GroupHeartbeatRequest", "GroupHeartbeatResponse"),
        MethodSpec("LockQueues", "LockQueuesRequest", "LockQueuesResponse"),
        MethodSpec("ResetGroup", "ResetGroupRequest", "GroupInfoResponse"),
        MethodSpec("Receive", "ReceiveRequest", "ReceiveResponse"),
        MethodSpec("Ack", "ReceiptRequest", "ReceiptResponse"),
        MethodSpec("ChangeInvisible", "ReceiptRequest", "ReceiptResponse"),
        MethodSpec("DeadLetter", "ReceiptRequest", "ReceiptResponse"),
        MethodSpec("Bury", "BuryRequest", "Empty", attachment_field="batch"),
        MethodSpec("RaftStep", "RaftStepRequest", "Empty", attachment_field="payload", internal=True,
                   inline=True),  # its handler hands the payload to RaftHost.receive, which does not wait
        MethodSpec("RaftSnapshotChunk", "RaftSnapshotChunkRequest", "RaftSnapshotChunkResponse",
                   response_attachment="data", internal=True),
        MethodSpec("ClusterStatus", "Empty", "ClusterStatusResponse"),
        MethodSpec("DrainNode", "DrainNodeRequest", "Empty"),
        MethodSpec("Handover", "HandoverRequest", "ControlState"),
        MethodSpec("PlacementExplain", "TopicRequest", "PlacementExplainResponse"),
        MethodSpec("NodeHealth", "NodeHealthRequest", "NodeHealthResponse"),
        MethodSpec("PinNodeHealth", "PinNodeHealthRequest", "Empty"),
        MethodSpec("MetaLoadShare", "LoadShareRequest", "Empty", internal=True),
        MethodSpec("CreateStorageClass", "CreateStorageClassRequest", "StorageClassInfo"),
        MethodSpec("StorageClasses", "StorageClassesRequest", "StorageClassesResponse"),
        MethodSpec("CreateConsumerGroup", "CreateConsumerGroupRequest", "ConsumerGroupInfo"),
        MethodSpec("UpdateConsumerGroup", "UpdateConsumerGroupRequest", "ConsumerGroupInfo"),
        MethodSpec("ConsumerGroups", "ConsumerGroupsRequest", "ConsumerGroupsResponse"),
        # A group's settings as the broker applies them (cached a few seconds; max_attempts 0 when none is set).
        MethodSpec("GroupSettings", "ConsumerGroupsRequest", "ConsumerGroupInfo"),
        MethodSpec("UpdateTopic", "UpdateTopicRequest", "TopicInfo"),
        MethodSpec("TierStatus", "TierStatusRequest", "TierStatusResponse"),
        MethodSpec("KvCreateBucket", "CreateBucketRequest", "BucketInfo"),
        MethodSpec("KvListBuckets", "Empty", "ListBucketsResponse"),
        MethodSpec("KvDescribeBucket", "BucketRequest", "DescribeBucketResponse"),
        MethodSpec("KvDeleteBucket", "BucketRequest", "Empty"),
        MethodSpec("KvPut", "KvPutRequest", "KvRevision", attachment_field="value", at_most_once=True),
        MethodSpec("KvGet", "KvGetRequest", "KvEntries", response_attachments=("entries", "value")),
        MethodSpec("KvDelete", "KvDeleteRequest", "KvRevision", at_most_once=True),
        MethodSpec("KvRange", "KvRangeRequest", "KvEntries", response_attachments=("entries", "value")),
        MethodSpec("KvTxn", "KvTxnRequest", "KvTxnResponse", at_most_once=True),
        MethodSpec("KvWatch", "KvWatchRequest", "KvEvents", streaming=True),
        MethodSpec("KvExport", "BucketRequest", "KvExportPage", streaming=True),
        # Between nodes: brokers and storage nodes to the nameservers,
        MethodSpec("NodeHeartbeat", "NodeHeartbeatRequest", "Assignment", internal=True),
        MethodSpec("ControllerAlterSyncStateSet", "AlterSyncStateSetRequest", "ControlState", internal=True),
        # storage nodes and nameservers to a standalone controller (`rocket run --role controller`),
        MethodSpec("ControllerHeartbeat", "ControllerHeartbeatRequest", "ControllerGroupsResponse", internal=True),
        MethodSpec("ControllerGroups", "Empty", "ControllerGroupsResponse", internal=True),
        MethodSpec("ControllerHandover", "HandoverRequest", "ControlState", internal=True),
        MethodSpec("ControllerHandOverFrom", "HandOverFromRequest", "Empty", internal=True),
        MethodSpec("ControllerMembers", "ControllerMembersRequest", "ControlledGroup", internal=True),
        MethodSpec("GetRoute", "TopicRequest", "Route", internal=True),
        MethodSpec("MetaCreateTopic", "CreateTopicRequest", "TopicInfo", internal=True),
        MethodSpec("MetaListTopics", "Empty", "ListTopicsResponse", internal=True),
        MethodSpec("MetaUpdateTopic", "UpdateTopicRequest", "TopicInfo", internal=True),
        MethodSpec("MetaDeleteTopic", "DeleteTopicRequest", "Empty", internal=True),
        MethodSpec("MetaCreateBucket", "CreateBucketRequest", "TopicInfo", internal=True),
        MethodSpec("MetaDeleteBucket", "BucketRequest", "Empty", internal=True),
        MethodSpec("MetaCreateStorageClass", "CreateStorageClassRequest", "StorageClassInfo", internal=True),
        MethodSpec("MetaStorageClasses", "StorageClassesRequest", "StorageClassesResponse", internal=True),
        MethodSpec("MetaCreateConsumerGroup", "CreateConsumerGroupRequest", "ConsumerGroupInfo", internal=True),
        MethodSpec("MetaUpdateConsumerGroup", "UpdateConsumerGroupRequest", "ConsumerGroupInfo", internal=True),
        MethodSpec("MetaConsumerGroups", "ConsumerGroupsRequest", "ConsumerGroupsResponse", internal=True),
        MethodSpec("MetaDeleteConsumerGroup", "ConsumerGroupsRequest", "Empty", internal=True),
        # Users (their secrets sealed) and policies, for nodes to enforce: unchanged since `version`, none are sent.
        MethodSpec("MetaAclState", "AclStateRequest", "AclState", internal=True),
        # and brokers to storage nodes.
        MethodSpec("StorageAppend", "StorageAppendRequest", "ProduceResponse", attachment_field="batch", internal=True),
        MethodSpec("StorageRead", "StorageReadRequest", "PullResponse", response_attachments=("batches", "batch"),
                   internal=True),
        MethodSpec("StorageCommitOffsets", "StorageOffsetsRequest", "Empty", internal=True),
        MethodSpec("StorageQueues", "StorageQueuesRequest", "StorageQueuesResponse", internal=True),
        MethodSpec("StorageImport", "StorageImportRequest", "QueueOffset", internal=True),
        MethodSpec("StorageMembers", "StorageMembersRequest", "Empty", internal=True),
        MethodSpec("StorageCancelTimer", "StorageTimerRequest", "Empty", internal=True),
        MethodSpec("StoragePop", "StoragePopRequest", "ReceiveResponse", internal=True),
        MethodSpec("StorageGroupHeartbeat", "StorageGroupHeartbeatRequest", "GroupHeartbeatResponse", internal=True),
        MethodSpec("StorageEndTransaction", "StorageEndTransactionRequest", "Empty", internal=True),
        MethodSpec("StorageTransactionChecks", "StorageTransactionChecksRequest", "TransactionChecksResponse",
                   internal=True),
        MethodSpec("StorageReceipt", "StorageReceiptRequest", "ReceiptResponse", internal=True),
        MethodSpec("StorageBury", "StorageBuryRequest", "Empty", attachment_field="batch", internal=True),
        MethodSpec("StorageTier", "StorageTierRequest", "StorageTierResponse", internal=True),
        MethodSpec("StorageKvTxn", "StorageKvTxnRequest", "StorageKvTxnResponse", internal=True),
        MethodSpec("StorageKvRead", "StorageKvReadRequest", "StorageKvReadResponse",
                   response_attachments=("entries", "value"), internal=True),
        MethodSpec("StorageKvWatch", "StorageKvWatchRequest", "StorageKvWatchResponse", internal=True),
        # and nameservers and brokers to storage nodes: a deleted topic's or consumer group's state dropped.
        MethodSpec("StorageDrop", "StorageDropRequest", "Empty", internal=True),
        MethodSpec("StorageLock", "StorageLockRequest", "LockQueuesResponse", internal=True),
        MethodSpec("StorageFindKey", "StorageFindKeyRequest", "StorageFindKeyResponse",
                   response_attachments=("batches", "batch"), internal=True),
    ]
}

# Client quotas (rocket/quotas.py): the methods whose request bytes count as produced and whose answer's bytes as
# consumed, and those whose answer says how long the client is throttled for (every call counts one request).
PRODUCING = frozenset({"Produce"})
CONSUMING = frozenset({"Pull", "Subscribe", "Receive"})
TELLS_THROTTLE = frozenset({"Produce", "Pull", "Receive"})  # their responses have throttle_ms


def method_spec(name: str) -> MethodSpec:
    spec = METHODS.get(name)
    if spec is None:
        raise RocketError(Code.UNKNOWN_METHOD, f"unknown method {name!r}")
    return spec


def serde_for_id(serde_id: int) -> ModuleType:
    serde = SERDE_IDS.get(serde_id)
    if serde is None:
        raise RocketError(Code.UNSUPPORTED_SERDE, f"serde id {serde_id} is not one of {sorted(SERDE_IDS)}")
    return serde


def detach(spec: MethodSpec, response: dict) -> tuple[dict, list | None]:
    """The response without its attachable bytes, and those bytes in order (None if it has none)."""
    if spec.response_attachment is not None:
        return {**response, spec.response_attachment: b""}, [response[spec.response_attachment]]
    if spec.response_attachments is None:
        return response, None
    items_field, bytes_field = spec.response_attachments
    items = response[items_field]
    attachments = [item[bytes_field] for item in items]
    return {**response, items_field: [{**item, bytes_field: b""} for item in items]}, attachments


def attach(spec: MethodSpec, response: dict, attachments: list) -> dict:
    """Put detached bytes back into the response they were taken from."""
    if spec.response_attachment is not None and len(attachments) == 1:
        response[spec.response_attachment] = attachments[0]
        return response
    if spec.response_attachments is None:
        items, bytes_field = (), ""
    else:
        items_field, bytes_field = spec.response_attachments
        items = response[items_field]
    if len(items) != len(attachments):
        raise RocketError(Code.UNDECODABLE, f"{spec.name} response has {len(items)} items and "
                          f"{len(attachments)} attachments")
    for item, attachment in zip(items, attachments):
        item[bytes_field] = attachment
    return response


def encode_error(serde: ModuleType, error: RocketError) -> bytes:
    return serde.encode("Error", error.to_wire())
