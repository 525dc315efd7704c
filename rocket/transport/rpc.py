"""One RPC dispatcher for both transports: the method table, decoding, handlers, encoding, errors.

Each method is declared once in METHODS; roles attach handlers; TCP and HTTP/2 only move bytes.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from types import ModuleType
from typing import Any, TypeGuard, cast

import trio

from rocket import __version__, access, quotas
from rocket.errors import Code, RocketError
from rocket.parked import Awaited, Slot, Unparked
from rocket.serde import SERDE_IDS
from rocket.serde.schema import SCHEMA_VERSION
from rocket.transport.peer_auth import PeerAuth

log = logging.getLogger("rocket.rpc")


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
        MethodSpec("Produce", "ProduceRequest", "ProduceResponse", attachment_field="batch"),
        MethodSpec("Pull", "PullRequest", "PullResponse", response_attachments=("batches", "batch")),
        MethodSpec("Subscribe", "PullRequest", "PullResponse", streaming=True),
        MethodSpec("CommitOffsets", "CommitOffsetsRequest", "Empty"),
        MethodSpec("FetchOffsets", "FetchOffsetsRequest", "OffsetsResponse"),
        MethodSpec("SearchOffset", "SearchOffsetRequest", "OffsetsResponse"),
        MethodSpec("CancelTimer", "TimerRequest", "Empty"),
        MethodSpec("EndTransaction", "EndTransactionRequest", "Empty"),
        MethodSpec("TransactionChecks", "TransactionChecksRequest", "TransactionChecksResponse", streaming=True),
        MethodSpec("DescribeGroup", "GroupInfoRequest", "GroupInfoResponse"),
        MethodSpec("GroupHeartbeat", "GroupHeartbeatRequest", "GroupHeartbeatResponse"),
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
        MethodSpec("GetRoute", "TopicRequest", "Route", internal=True),
        MethodSpec("MetaCreateTopic", "CreateTopicRequest", "TopicInfo", internal=True),
        MethodSpec("MetaListTopics", "Empty", "ListTopicsResponse", internal=True),
        MethodSpec("MetaUpdateTopic", "UpdateTopicRequest", "TopicInfo", internal=True),
        MethodSpec("MetaCreateBucket", "CreateBucketRequest", "TopicInfo", internal=True),
        MethodSpec("MetaDeleteBucket", "BucketRequest", "Empty", internal=True),
        MethodSpec("MetaCreateStorageClass", "CreateStorageClassRequest", "StorageClassInfo", internal=True),
        MethodSpec("MetaStorageClasses", "StorageClassesRequest", "StorageClassesResponse", internal=True),
        MethodSpec("MetaCreateConsumerGroup", "CreateConsumerGroupRequest", "ConsumerGroupInfo", internal=True),
        MethodSpec("MetaUpdateConsumerGroup", "UpdateConsumerGroupRequest", "ConsumerGroupInfo", internal=True),
        MethodSpec("MetaConsumerGroups", "ConsumerGroupsRequest", "ConsumerGroupsResponse", internal=True),
        # Users (their secrets sealed) and policies, for nodes to enforce: unchanged since `version`, none are sent.
        MethodSpec("MetaAclState", "AclStateRequest", "AclState", internal=True),
        # and brokers to storage nodes.
        MethodSpec("StorageAppend", "StorageAppendRequest", "ProduceResponse", attachment_field="batch", internal=True),
        MethodSpec("StorageRead", "StorageReadRequest", "PullResponse", response_attachments=("batches", "batch"),
                   internal=True),
        MethodSpec("StorageCommitOffsets", "StorageOffsetsRequest", "Empty", internal=True),
        MethodSpec("StorageQueues", "StorageQueuesRequest", "StorageQueuesResponse", internal=True),
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
    ]
}

# Client quotas (rocket/quotas.py): the methods whose request bytes count as produced and whose answer's bytes as
# consumed, and those whose answer says how long the client is throttled for (every call counts one request).
PRODUCING = frozenset({"Produce"})
CONSUMING = frozenset({"Pull", "Subscribe", "Receive"})
TELLS_THROTTLE = frozenset({"Produce", "Pull", "Receive"})  # their responses have throttle_ms

UnaryHandler = Callable[[dict], Awaitable[dict]]
StreamHandler = Callable[[dict], AsyncIterator[dict]]


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


def as_rocket_error(error: BaseException, method: str) -> RocketError:
    """Operating errors pass through; anything else is a bug, logged and answered as INTERNAL."""
    if isinstance(error, RocketError):
        return error
    log.exception("method %s failed", method, exc_info=error)
    return RocketError(Code.INTERNAL, f"{method} failed: {type(error).__name__}")


@dataclasses.dataclass(slots=True)
class Caller:
    """Who is at the other end of a connection, as far as it proved: calls from the wire carry one."""
    source: str = ""  # the IP address it connects from
    peer: bool = False  # a node of the cluster (PeerHello accepted): may call everything
    user: str | None = None  # signed in (Authenticate accepted)
    muted_until: float = 0.0  # over a quota: no call of this connection's is served before (trio's clock)


class Dispatcher:
    """Maps method names to handlers and turns request bytes into response bytes.

    It gives each connection its Caller and answers Hello (schema versions) itself. With auth on, every call from the
    wire, and every local call made as a user, is checked in one place (authorize) against rocket/access.py; on
    brokers, every client call is charged to the client quotas of rocket/quotas.py after it is served (charge). A
    method may have a parked handler besides its task handler (handle, park): Produce, KvPut and KvGet on brokers,
    StorageAppend, StorageKvTxn and StorageKvRead on storage nodes.

    To add a client RPC method: define it once in METHODS, write its handler in the broker part of its concern
    (rocket/roles/broker/) and route it in Broker.register, and add its Avro schemas under rocket/serde/schemas/. It
    is then served over TCP and HTTP/2 alike.
    """

    def __init__(self) -> None:
        self._handlers: dict[str, Callable] = {}
        self._parked: dict[str, Callable[[dict, Slot], None]] = {}  # the data plane's handlers (park)
        # Told of every call served from the wire: method, seconds, error code name or None (the node's metrics).
        self.on_call: Callable[[str, float, str | None], None] | None = None
        # With a cluster secret (or tls_ca): internal methods only for connections that said PeerHello (peer_auth.py)
        # or whose client certificate verified (tls.py).
        self.peers_only = False
        self.peer_auth: PeerAuth | None = None  # with a cluster secret, what checks a PeerHello
        # With auth on: every call from the wire by a signed-in user whom the policies allow (rocket/access.py).
        self.access: access.Access | None = None
        # On brokers: the client quotas, charged for every call from the wire that is not a node's (rocket/quotas.py).
        self.quotas: quotas.Quotas | None = None
        self._handlers["Hello"] = self._hello

    @staticmethod
    async def _hello(request: dict) -> dict:
        return {"schema_version": SCHEMA_VERSION, "version": __version__}

    def handle(self, name: str, handler: Callable, parked: Callable[[dict, Slot], None] | None = None) -> None:
        """handler serves the method as a task; parked, if given, serves it on the data plane (park)."""
        method_spec(name)
        self._handlers[name] = handler
        if parked is not None:
            self._parked[name] = parked

    def parks(self, name: str) -> bool:
        """Whether the method has a data-plane handler here (park)."""
        return name in self._parked

    def park(self, name: str, serde: ModuleType, body: bytes | memoryview,
             attachment: memoryview | list[memoryview] | None, caller: Caller, slot: Slot) -> None:
        """Serve a call from the wire on the data plane, in the caller's read loop: decoded, checked and authorized
        as call() does, then handed to the method's parked handler, which parks it. slot completes once with the
        encoded response and its attachments (call()'s result), or with a RocketError. Raises Unparked, having done
        nothing, when the call must be served by call() as a task instead (a throttled caller, or the handler's
        say: no cached route, no open channel to the leader); RocketError when it is refused at once. Over TCP the
        Raft round that applies the call's entry (or, for a get, the leader's lease) completes its slot, and the
        connection's writer sends that round's answers in one write."""
        if self.charged(caller):  # quotas hold a call as it waits: the task path's
            raise Unparked
        spec, handler = self._resolve(name, caller)
        request = serde.decode(spec.request_type, body)
        self.authorize(caller, name, request)
        if attachment is not None:
            if spec.attachment_field is None or isinstance(attachment, list):
                raise RocketError(Code.BAD_REQUEST, f"{name} takes no attachments" if spec.attachment_field is None
                                  else f"{name} takes one attachment")
            request[spec.attachment_field] = attachment
        started = trio.current_time()

        def answer(outcome: object) -> None:
            if isinstance(outcome, RocketError):
                self._observe(name, started, outcome.code.name)
                slot.complete(outcome)
                return
            self._observe(name, started, None)
            response, attachments = detach(spec, cast(dict, outcome))  # not an error: the handler's response
            slot.complete((serde.encode(spec.response_type, response), attachments))
        try:
            self._parked[name](request, Slot(answer))
        except Unparked as unparked:
            unparked.request = request  # decoded: call() takes it as it is
            raise
        except RocketError:
            raise
        except Exception as error:
            raise as_rocket_error(error, name) from None

    def park_local(self, name: str, request: dict, slot: Slot) -> None:
        """Hand a call from this process (one role to another) to the method's parked handler: no serde, no
        checks, as local() does. Raises Unparked or RocketError as park() does."""
        self._parked[name](request, slot)

    def _resolve(self, name: str, caller: Caller | None = None) -> tuple[MethodSpec, Callable[..., Any] | None]:
        """The method's spec and handler; no handler for the methods about the connection, answered here."""
        spec = method_spec(name)
        if caller is not None and not caller.peer:
            if spec.internal and self.peers_only:
                raise RocketError(Code.UNAUTHENTICATED, f"{name} is for the cluster's nodes: a node says PeerHello "
                                  "first")
            if self.access is not None and caller.user is None and name not in access.OPEN:
                raise self.access.failed(caller.source, RocketError(
                    Code.UNAUTHENTICATED, f"{name} needs credentials: sign in (--user and --secret, ROCKET_USER and "
                    "ROCKET_SECRET, or ~/.config/rocket/credentials)"))
        if name in ("PeerHello", "Authenticate", "AclWhoAmI"):  # about the connection: the dispatcher answers them
            return spec, None
        handler = self._handlers.get(name)
        if handler is None:
            raise RocketError(Code.UNKNOWN_METHOD, f"method {name!r} is not served by this node's roles")
        return spec, handler

    async def local(self, name: str, request: dict, caller: Caller | None = None) -> dict:
        """Call this node's own handler directly, without serde or socket: one role to another in the same process,
        or a gateway or the console on a user's behalf (caller: the user, authorized as a call from the wire is;
        None: the node itself, trusted). Raises RocketError like a remote call. A method with a parked handler is
        served by it, this task waiting for the slot (which completes exactly once: rocket/parked.py), unless it
        cannot park the call."""
        self.authorize(caller, name, request)
        parked = self._parked.get(name)
        if parked is not None:
            slot = Awaited()
            try:
                parked(request, slot)
            except Unparked:
                pass
            except Exception as error:
                raise as_rocket_error(error, name) from None
            else:
                await slot.event.wait()
                return cast(dict, slot.value())  # a method's response
        _, handler = self._resolve(name)
        try:
            return await cast(Callable, handler)(request)  # roles call roles' methods, never those without handler
        except Exception as error:
            raise as_rocket_error(error, name) from None

    def serves(self, name: str) -> bool:
        """Whether this node's roles serve the method."""
        return name in self._handlers

    def is_streaming(self, name: str) -> bool:
        return method_spec(name).streaming

    def authorize(self, caller: Caller | None, name: str, request: dict, counted: bool = True) -> None:
        """The node's one authorization point, for calls from the wire and for local calls made on a user's behalf
        alike: with auth on, a caller other than a node of the cluster needs a user whom the policies allow what the
        method needs of the request (access.needs_of). caller None: this process, trusted. Raises UNAUTHENTICATED
        or PERMISSION_DENIED, counted against the caller's source unless not counted (a page's own look)."""
        if caller is None or caller.peer or self.access is None or name in access.OPEN:
            return
        if caller.user is None:
            error = RocketError(Code.UNAUTHENTICATED, f"{name} needs a signed-in user")
            raise self.access.failed(caller.source, error) if counted else error
        self.access.authorize(caller.user, access.needs_of(name, request), caller.source, counted)

    def _about_connection(self, name: str, request: dict, caller: Caller) -> dict:
        if name == "AclWhoAmI":
            user = self.access.users.get(caller.user) if self.access is not None and caller.user else None
            return {"user": caller.user or "", "super": caller.peer or user is not None and user.super}
        if name == "PeerHello":  # without a cluster secret a hello proves nothing (and nothing needs proving by one)
            if self.peer_auth is not None:
                self.peer_auth.check(request)
                caller.peer = True
            return {}
        # Authenticate: with auth off any hello is welcome (a client with credentials works anywhere)
        caller.user = request["user"] if self.access is None else self.access.authenticate(request, caller.source)
        return {}

    async def call(self, name: str, serde: ModuleType, body: bytes | memoryview,
                   attachment: memoryview | list[memoryview] | None = None, detached: bool = False,
                   caller: Caller | None = None, decoded: dict | None = None,
                   answered: bool = True) -> tuple[bytes, list | None]:
        """Run a unary method: the encoded response and, if detached, its attachable bytes apart from it
        (see MethodSpec.response_attachments). caller: who called from the wire (None: this process, trusted).
        decoded: the request as park() decoded it, if it went there first. A call nobody hears the answer of (a POST
        frame's) is not answered: (b"", None), the response not encoded. Raises RocketError for every failure."""
        spec, handler = self._resolve(name, caller)
        if spec.streaming:
            raise RocketError(Code.BAD_REQUEST, f"{name} is a streaming method")
        charged = self.charged(caller)
        if charged:
            await self.held(caller)
        request = decoded if decoded is not None else serde.decode(spec.request_type, body)
        self.authorize(caller, name, request)
        if handler is None:
            return serde.encode(spec.response_type, self._about_connection(name, request, caller or Caller())), None
        if attachment is not None:
            if spec.attachment_field is None:
                raise RocketError(Code.BAD_REQUEST, f"{name} takes no attachments")
            if isinstance(attachment, list):
                raise RocketError(Code.BAD_REQUEST, f"{name} takes one attachment")
            request[spec.attachment_field] = attachment
        started = trio.current_time()
        try:
            response = await handler(request)
        except Exception as error:
            failure = as_rocket_error(error, name)
            self._observe(name, started, failure.code.name)
            if charged:
                self.charge(caller, request.get("topic") or "")
            raise failure from None
        self._observe(name, started, None)
        if not answered:
            return b"", None
        attachments = None
        if detached:
            response, attachments = detach(spec, response)
        encoded = serde.encode(spec.response_type, response)
        if charged:  # Kafka's way: served first, then the debt decides the throttle of the answer and what follows
            produced = len(body) + (len(attachment) if attachment is not None else 0) if name in PRODUCING else 0
            consumed = len(encoded) + sum(map(len, attachments or ())) if name in CONSUMING else 0
            throttle_s = self.charge(caller, request.get("topic") or "", produced, consumed)
            if throttle_s and name in TELLS_THROTTLE:
                encoded = serde.encode(spec.response_type, {**response, "throttle_ms": math.ceil(throttle_s * 1000)})
        return encoded, attachments

    def charged(self, caller: Caller | None) -> TypeGuard[Caller]:
        """Whether a call counts against the quotas: one from the wire, not a node's, while any quota is set."""
        return self.quotas is not None and caller is not None and not caller.peer and bool(self.quotas.entities)

    @staticmethod
    async def held(caller: Caller) -> None:
        """Wait while the caller's connection is throttled (Kafka mutes the channel): a client that ignores its
        throttle time is held all the same."""
        wait = caller.muted_until - trio.current_time()
        if wait > 0:
            await trio.sleep(wait)

    def charge(self, caller: Caller, topic: str, produced: int = 0, consumed: int = 0, requests: int = 1,
               user: str | None = None) -> float:
        """Charge a call served to its user's (with auth on: user, else the connection's) and its topic's quotas;
        returns its throttle in seconds, and mutes the caller's connection for that long. The gateways, whose
        protocols sign each request, call it with the request's user. A call is charged after it is served: its
        answer's throttle_ms (TELLS_THROTTLE) says the throttle, and held() holds the connection's next call."""
        user = (user or caller.user) if self.access is not None else None
        throttle_s = cast("quotas.Quotas", self.quotas).charge(user, topic, produced, consumed, requests)  # charged()
        if throttle_s:
            caller.muted_until = max(caller.muted_until, trio.current_time() + throttle_s)
        return throttle_s

    async def stream(self, name: str, serde: ModuleType, body: bytes | memoryview,
                     caller: Caller | None = None) -> AsyncGenerator[bytes, None]:
        """Run a streaming method, yielding encoded items; raises RocketError for every failure."""
        spec, handler = self._resolve(name, caller)
        if not spec.streaming:
            raise RocketError(Code.BAD_REQUEST, f"{name} is not a streaming method")
        request = serde.decode(spec.request_type, body)
        self.authorize(caller, name, request)
        charged = self.charged(caller)
        if charged:
            await self.held(caller)
            self.charge(caller, request.get("topic") or "")
        started = trio.current_time()
        try:
            async for item in cast(Callable, handler)(request):  # streaming: none of the methods without handler
                encoded = serde.encode(spec.response_type, item)
                yield encoded
                if charged and name in CONSUMING:  # a stream is held item by item
                    throttle_s = self.charge(caller, request.get("topic") or "", consumed=len(encoded), requests=0)
                    if throttle_s:
                        await trio.sleep(throttle_s)
        except Exception as error:
            failure = as_rocket_error(error, name)
            self._observe(name, started, failure.code.name)
            raise failure from None
        self._observe(name, started, None)

    def _observe(self, name: str, started: float, error: str | None) -> None:
        if self.on_call is not None:
            self.on_call(name, trio.current_time() - started, error)


class Traffic:
    """Bytes received and sent on some connections (a node's listeners share one: telemetry reads it)."""

    __slots__ = ("received_bytes", "sent_bytes")

    def __init__(self) -> None:
        self.received_bytes = 0
        self.sent_bytes = 0


class Lifecycle:
    """Shared by every listener: stops accepting and reading on drain, counts calls in flight, and the traffic."""

    def __init__(self) -> None:
        self.traffic = Traffic()
        self.draining = trio.Event()
        self._calls_in_flight = 0
        self._idle = trio.Event()
        self._idle.set()

    def call_started(self) -> None:
        if self._calls_in_flight == 0:
            self._idle = trio.Event()
        self._calls_in_flight += 1

    def call_finished(self) -> None:
        self._calls_in_flight -= 1
        if self._calls_in_flight == 0:
            self._idle.set()

    @property
    def calls_in_flight(self) -> int:
        return self._calls_in_flight

    def drain(self) -> None:
        self.draining.set()

    async def wait_idle(self) -> None:
        while self._calls_in_flight:
            await self._idle.wait()
