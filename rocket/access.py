"""Who may do what (issue 34): users, policies, what each of rocket's methods needs (needs_of), and the decision on
each call (pure; the clock is passed in). The model is RocketMQ 5's ACL 2.0 and Kafka's ACLs. `Access` is what a node
enforces; the dispatcher and the gateways call it.
"""

from __future__ import annotations

import base64
import collections
import dataclasses
import fnmatch
import hashlib
import hmac
import ipaddress
import logging
import secrets
from collections.abc import Callable, Iterable

from rocket import limits
from rocket.errors import Code, RocketError

log = logging.getLogger("rocket.access")

ACTIONS = ("pub", "sub", "admin", "kv-read", "kv-write")
KINDS = ("topic", "group", "bucket")  # and "cluster", which names no object
NAMESPACE = "namespace:"  # namespace:NS/KIND:NAME names KIND:NAME within namespace NS
EFFECTS = ("allow", "deny")

# ---- what each of rocket's methods needs -------------------------------------------------------------------------

OPEN = frozenset({"Ping", "Hello", "PeerHello", "Authenticate"})  # before signing in
SIGNED_IN = frozenset({  # reads of the cluster's shape: any signed-in user (as Kafka's Describe on a cluster)
    "ListTopics", "DescribeTopic", "ClusterStatus", "PlacementExplain", "NodeHealth", "StorageClasses",
    "ConsumerGroups", "GroupSettings", "TierStatus", "KvListBuckets", "AclWhoAmI"})
_TOPIC_GROUP = ("topic", "group")
_NEEDS: dict[str, tuple[str, tuple[str, ...]]] = {  # method -> (action, the request fields naming its resources)
    **{method: ("pub", ("topic",)) for method in ("Produce", "CancelTimer", "EndTransaction", "TransactionChecks")},
    **{method: ("sub", _TOPIC_GROUP) for method in (
        "Pull", "Subscribe", "SearchOffset", "FindMessages", "CommitOffsets", "FetchOffsets", "DescribeGroup",
        "GroupHeartbeat", "LockQueues", "Receive", "Ack", "ChangeInvisible", "DeadLetter", "Bury")},
    "ResetGroup": ("admin", ("group",)),
    "CreateTopic": ("admin", ("topic",)),
    "UpdateTopic": ("admin", ("topic",)),
    "DeleteTopic": ("admin", ("topic",)),
    "DeleteGroup": ("admin", _TOPIC_GROUP),
    "CreateConsumerGroup": ("admin", ("group",)),
    "UpdateConsumerGroup": ("admin", ("group",)),
    **{method: ("admin", ()) for method in (  # the cluster itself
        "DrainNode", "Handover", "PinNodeHealth", "CreateStorageClass", "AclCreateUser", "AclDeleteUser", "AclUsers",
        "AclGrant", "AclRevoke", "AclPolicies", "AclSetQuota", "AclQuotas")},
    **{method: ("kv-read", ("bucket",)) for method in ("KvGet", "KvRange", "KvWatch", "KvExport", "KvDescribeBucket")},
    **{method: ("kv-write", ("bucket",)) for method in ("KvPut", "KvDelete", "KvTxn")},
    **{method: ("admin", ("bucket",)) for method in ("KvCreateBucket", "KvDeleteBucket")},
}


def covers(method: str) -> bool:
    """Whether the table says what a method needs (tests check every client method is covered)."""
    return method in OPEN or method in SIGNED_IN or method in _NEEDS


def needs_of(method: str, request: dict) -> list[tuple[str, str]]:
    """The (action, resource) pairs a call needs; [] for a read any signed-in user may make."""
    if method in SIGNED_IN:
        return []
    found = _NEEDS.get(method)
    if found is None:  # not in the table: no one but super users and the cluster's nodes
        return [("admin", "cluster")]
    action, fields = found
    if not fields:
        return [(action, "cluster")]
    return [(action, f"{field}:{request[field]}") for field in fields if request.get(field)]


# ---- users and policies -----------------------------------------------------------------------------------------

def check_user_name(name: str) -> str:
    if not 1 <= len(name) <= limits.user_name_chars_max or not all(c.isalnum() or c in "-_." for c in name):
        raise RocketError(Code.BAD_REQUEST, f"user {name!r}: 1 to {limits.user_name_chars_max} letters, digits, "
                          "'-', '_' or '.'")
    return name


def in_namespace(text: str, what: str) -> str:
    """`namespace:NS/KIND:NAME` as it is kept, KIND:NS%NAME (within namespace NS a name is stored NS%name:
    model.in_namespace); any other text as it is."""
    if not text.startswith(NAMESPACE):
        return text
    namespace, slash, rest = text[len(NAMESPACE):].partition("/")
    kind, colon, name = rest.partition(":")
    if not slash or not colon or not namespace or "%" in namespace or not name:
        raise RocketError(Code.BAD_REQUEST, f"{what} {text!r}: expected namespace:NS/KIND:NAME "
                          "(e.g. namespace:payments/topic:orders-*)")
    return f"{kind}:{namespace}%{name}"


def check_resource(pattern: str) -> str:
    """`cluster`, or KIND:NAME where NAME may end in `*` (a prefix) or be `*` alone; `namespace:NS/KIND:NAME` is
    KIND:NS%NAME (in_namespace)."""
    if pattern == "cluster":
        return pattern
    pattern = in_namespace(pattern, "resource")
    kind, _, name = pattern.partition(":")
    if kind not in KINDS or not name or "*" in name[:-1]:
        raise RocketError(Code.BAD_REQUEST, f"resource {pattern!r}: expected cluster, or topic:, group: or "
                          "bucket: and a name, which may end in * (e.g. topic:orders-*)")
    return pattern


def check_actions(actions: Iterable[str]) -> tuple[str, ...]:
    actions = tuple(dict.fromkeys(actions))
    unknown = [action for action in actions if action not in ACTIONS]
    if not actions or unknown:
        raise RocketError(Code.BAD_REQUEST, f"actions {list(actions)}: each one of {', '.join(ACTIONS)}")
    return actions


def check_cidrs(cidrs: Iterable[str]) -> tuple[str, ...]:
    try:
        return tuple(str(ipaddress.ip_network(cidr, strict=False)) for cidr in cidrs)
    except ValueError as error:
        raise RocketError(Code.BAD_REQUEST, f"source network: {error}") from None


@dataclasses.dataclass(frozen=True, slots=True)
class Policy:
    """Gives a user actions (pub, sub, admin, kv-read, kv-write) on a resource pattern (`topic:orders`,
    `topic:orders-*`, `group:billing`, `bucket:cfg`, `cluster`), allowed or denied, optionally only from some source
    networks. A call needs each of its (action, resource) pairs allowed by some policy and denied by none: deny wins
    (denial)."""
    user: str
    resource: str  # a pattern (check_resource)
    actions: tuple[str, ...]
    effect: str = "allow"
    cidrs: tuple[str, ...] = ()  # the sources it applies to; none: every source

    def applies(self, action: str, resource: str, source: str) -> bool:
        if action not in self.actions or not fnmatch.fnmatchcase(resource, self.resource.replace("[", "[[]")):
            return False
        if not self.cidrs:
            return True
        try:
            address = ipaddress.ip_address(source)
        except ValueError:  # a source that is no IP address (a test's, an in-process call's) is in no network
            return False
        return any(address in ipaddress.ip_network(cidr) for cidr in self.cidrs)

    def to_wire(self) -> dict:
        return {"user": self.user, "resource": self.resource, "actions": list(self.actions), "effect": self.effect,
                "cidrs": list(self.cidrs)}

    @classmethod
    def from_wire(cls, wire: dict) -> Policy:
        return cls(wire["user"], wire["resource"], tuple(wire["actions"]), wire["effect"], tuple(wire["cidrs"]))


def denial(policies: Iterable[Policy], needs: list[tuple[str, str]], source: str) -> str | None:
    """Why a user with these policies may not make a call with these needs, or None if it may."""
    policies = list(policies)
    for action, resource in needs:
        if any(p.effect == "deny" and p.applies(action, resource, source) for p in policies):
            return f"{action} on {resource} is denied"
        if not any(p.effect == "allow" and p.applies(action, resource, source) for p in policies):
            return f"no policy allows {action} on {resource}" + (f" from {source}" if source else "")
    return None


# ---- secrets, sealed under the cluster key ----------------------------------------------------------------------

def cluster_key(cluster_secret: str) -> bytes:
    """The key user secrets are sealed under, derived from the cluster secret (HKDF-SHA256)."""
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.kdf.hkdf import HKDF
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=b"rocket user secrets").derive(
        cluster_secret.encode())


def seal(key: bytes, user: str, secret: str) -> str:
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM
    nonce = secrets.token_bytes(12)
    return base64.b64encode(nonce + AESGCM(key).encrypt(nonce, secret.encode(), user.encode())).decode()


def unseal(key: bytes, user: str, sealed: str) -> bytes:
    from cryptography.exceptions import InvalidTag
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM
    data = base64.b64decode(sealed)
    try:
        return AESGCM(key).decrypt(data[:12], data[12:], user.encode())
    except InvalidTag:
        raise RocketError(Code.UNAUTHENTICATED, f"user {user!r}: its secret was sealed under another cluster "
                          "secret") from None


def new_secret() -> str:
    return secrets.token_urlsafe(24)


# ---- signed hellos ----------------------------------------------------------------------------------------------

def hello_mac(secret: bytes, kind: str, who: str | int, time_ms: int, nonce: str) -> str:
    return hmac.new(secret, f"rocket-{kind}|{who}|{time_ms}|{nonce}".encode(), hashlib.sha256).hexdigest()


def signed_hello(secret: bytes, kind: str, who: str | int, time_ms: int) -> dict:
    """A hello for a new connection: who, the time, a fresh nonce and their MAC. A connection proves who it is with a
    signed hello (an HMAC-SHA256 under the secret of its user's time and a fresh nonce, refused when skewed or
    replayed: HelloCheck), once at connect (Authenticate); node-to-node connections do the same under the cluster
    secret (PeerHello, transport/peer_auth.py). The gateways verify RocketMQ's own per-request signatures against
    the same users."""
    nonce = secrets.token_hex(16)
    return {"time_ms": time_ms, "nonce": nonce, "mac": hello_mac(secret, kind, who, time_ms, nonce)}


class HelloCheck:
    """Checks signed hellos of one kind: the MAC, the time within the skew, and no nonce seen before."""

    def __init__(self, kind: str):
        self.kind = kind
        self._seen: collections.OrderedDict[str, int] = collections.OrderedDict()  # nonce -> its time, oldest first

    def check(self, secret: bytes, who: str | int, request: dict, now_ms: int) -> None:
        """Accept the hello or raise UNAUTHENTICATED saying why."""
        if not hmac.compare_digest(str(request["mac"]),
                                   hello_mac(secret, self.kind, who, request["time_ms"], request["nonce"])):
            raise RocketError(Code.UNAUTHENTICATED, f"{self.kind}: the signature does not match the secret")
        if abs(now_ms - request["time_ms"]) > limits.hello_skew_s * 1000:
            raise RocketError(Code.UNAUTHENTICATED, f"{self.kind}: its time is more than {limits.hello_skew_s:g} s "
                              "from this node's clock")
        while self._seen and (next(iter(self._seen.values())) < now_ms - 2 * limits.hello_skew_s * 1000
                              or len(self._seen) >= limits.hello_nonces_max):
            self._seen.popitem(last=False)
        if request["nonce"] in self._seen:
            raise RocketError(Code.UNAUTHENTICATED, f"{self.kind}: replayed (its nonce was seen before)")
        self._seen[request["nonce"]] = request["time_ms"]


@dataclasses.dataclass(frozen=True, slots=True)
class Credentials:
    """A client's: an access key and its secret."""
    user: str
    secret: str = dataclasses.field(repr=False)

    def hello(self, time_ms: int) -> tuple[str, dict]:
        """The Authenticate call a client makes first on each connection."""
        return "Authenticate", {"user": self.user, **signed_hello(self.secret.encode(), "auth", self.user, time_ms)}


# ---- a node's view: the users and policies it enforces ----------------------------------------------------------

@dataclasses.dataclass(frozen=True, slots=True)
class User:
    """An access key with a secret (and may be a super user, allowed everything). Secrets are kept in the metadata
    sealed (AES-GCM) under a key derived from the cluster secret (cluster_key), never in plain text on disk."""
    name: str
    secret: bytes = dataclasses.field(repr=False)
    super: bool = False


class Access:
    """What a node enforces when auth is on: the users and policies of the metadata (refreshed by the node), the
    check of each hello and call, and failures counted per source so that guessing is slow and logs stay short."""

    def __init__(self, key: bytes, wall_ms: Callable[[], int], monotonic: Callable[[], float]):
        self._key = key
        self._wall_ms = wall_ms
        self._monotonic = monotonic
        self.users: dict[str, User] = {}
        self.policies: dict[str, list[Policy]] = {}  # user -> theirs
        self.version = -1  # the metadata's ACL version these came from; -1: none yet
        self._hellos = HelloCheck("auth")
        self._failures: collections.OrderedDict[str, list] = collections.OrderedDict()  # source -> a minute's counts
        self.refusals: collections.Counter[str] = collections.Counter()  # code name -> refusals (the node's metrics)

    def update(self, state: dict) -> None:
        """Take an AclState answer (users with sealed secrets, policies) from the metadata."""
        users = {}
        for user in state["users"]:
            try:
                users[user["user"]] = User(user["user"], unseal(self._key, user["user"], user["sealed"]),
                                           user["super"])
            except RocketError as error:
                log.error("%s", error.message)
        policies: dict[str, list[Policy]] = {}
        for wire in state["policies"]:
            policies.setdefault(wire["user"], []).append(Policy.from_wire(wire))
        self.users, self.policies, self.version = users, policies, state["version"]

    def secret_of(self, user: str) -> bytes | None:
        found = self.users.get(user)
        return None if found is None else found.secret

    def authenticate(self, request: dict, source: str) -> str:
        """The user a hello proves, or UNAUTHENTICATED (counted against the source)."""
        self.refuse_if_guessing(source)
        user = self.users.get(request["user"])
        try:
            if user is None:
                raise RocketError(Code.UNAUTHENTICATED, f"no user {request['user']!r}")
            self._hellos.check(user.secret, user.name, request, self._wall_ms())
        except RocketError as error:
            raise self.failed(source, error) from None
        return user.name

    def check_secret(self, user: str, secret: bytes, source: str, what: str) -> str:
        """The user whose secret was given in the clear (the console's and MQTT's sign-ins), or UNAUTHENTICATED
        naming what refused, counted against the source."""
        self.refuse_if_guessing(source)
        known = self.secret_of(user)
        if known is None or not hmac.compare_digest(known, secret):
            raise self.failed(source, RocketError(Code.UNAUTHENTICATED, f"{what}: no user {user!r} with that secret"))
        return user

    def authorize(self, user: str, needs: list[tuple[str, str]], source: str, counted: bool = True) -> None:
        """Raise PERMISSION_DENIED unless the user may do all of needs from source; counted: against the source."""
        found = self.users.get(user)
        error = None
        if found is None:  # deleted since it signed in
            error = RocketError(Code.UNAUTHENTICATED, f"user {user!r} no longer exists")
        elif not found.super:
            reason = denial(self.policies.get(user, ()), needs, source)
            if reason is not None:
                error = RocketError(Code.PERMISSION_DENIED, f"user {user!r}: {reason}")
        if error is not None:
            raise self.failed(source, error) if counted else error

    def failed(self, source: str, error: RocketError) -> RocketError:
        """Count a refusal against its source and log it (the first few per source and minute); returns it."""
        self.refusals[error.code.name] += 1
        now = self._monotonic()
        window = self._failures.pop(source, None)
        if window is None or now - window[0] > 60:
            window = [now, 0, 0]  # since, refusals, of them failed sign-ins (what guessing makes)
        window[1] += 1
        window[2] += error.code == Code.UNAUTHENTICATED
        self._failures[source] = window
        while len(self._failures) > limits.auth_failure_sources_max:
            self._failures.popitem(last=False)
        if window[1] <= limits.auth_failures_logged_per_minute:
            log.warning("refused %s: %s: %s", source or "a caller", error.code.name, error.message)
        elif window[1] == limits.auth_failures_logged_per_minute + 1:
            log.warning("refused %s: more refusals this minute are not logged", source or "a caller")
        return error

    def refuse_if_guessing(self, source: str) -> None:
        """Raise UNAUTHENTICATED while a source has failed too often this minute (sign-ins and the console's checks)."""
        window = self._failures.get(source)
        if window is not None and self._monotonic() - window[0] <= 60 \
                and window[2] >= limits.auth_failures_per_minute_max:
            raise RocketError(Code.UNAUTHENTICATED, f"too many failed sign-ins from {source} this minute: wait")
