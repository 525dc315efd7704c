"""Shared domain types: one Message, one TopicSpec, Address, ReadBudget, and the names and checks they share."""

from __future__ import annotations

import dataclasses
import functools
import re
import zlib
from typing import Annotated, NamedTuple

import msgspec

from rocket import limits
from rocket.errors import Code, RocketError

_name_pattern = re.compile(r"^[A-Za-z0-9._%-]+$")


_epoch_ms = msgspec.Meta(ge=0, le=2**63 - 1)  # checked where a batch is decoded, not where a Message is made


class Message(msgspec.Struct, gc=False, array_like=True):
    """One message as a user sees it. queue and offset are set once it is stored.

    A C struct (msgspec) rather than a dataclass: a consumer makes one per message received, and this
    one costs a quarter as much to make and nothing to the garbage collector (gc=False: it holds only
    bytes, str, int and a dict of str, so it is never part of a reference cycle). array_like: a record
    of a batch is the message's fields in this order, up to deliver_at_ms, which msgspec decodes in C."""

    body: bytes
    key: str = ""
    tag: str = ""
    properties: dict[str, str] = {}  # an empty default is copied per message
    timestamp_ms: Annotated[int, _epoch_ms] = 0
    queue: int = -1
    offset: int = -1
    deliver_at_ms: Annotated[int, _epoch_ms] = 0  # a delayed (timer) message: when it becomes visible; 0 at once
    receipt: str = ""  # pop consumption: "QUEUE.OFFSET.ATTEMPT", what ack and change_invisible name
    attempt: int = 0  # pop consumption: which delivery of the message this is, from 1


# Kept by both RocketMQ gateways, and indexed by the stores' key index (serde/batch.py's key_terms):
KEYS_PROPERTY = "__rmq.keys"  # a message's RocketMQ keys, space-separated, when rocket's one key cannot hold them
ID_PROPERTY = "__rmq.id"  # the message id the client gave (gRPC's message_id, remoting's UNIQ_KEY)

MESSAGE_TYPES = ("normal", "fifo", "delay", "transaction")  # RocketMQ 5's TopicMessageType
DEFAULT_STORAGE_CLASS = "raft"  # the implicit storage class: the Raft groups the nameservers make as nodes join


@dataclasses.dataclass(slots=True, frozen=True)
class TopicSpec:
    name: str
    queues: int
    created_ms: int = 0
    groups: tuple[int, ...] = ()  # the storage groups its queues are spread over, fixed at creation
    message_type: str = "normal"  # one of MESSAGE_TYPES: which sends the topic accepts
    retention_s: float = -1.0  # total retention (data older is deleted from the tier); 0 for ever, -1 the default
    local_retention_s: float = -1.0  # hot retention (local data older goes once offloaded); 0 for ever, -1 default
    history: int = 1  # a KV bucket's revisions kept per key (a bucket is a topic of type "kv", its shards the queues)
    ttl_ms: int = 0  # a KV bucket's default TTL of its keys (0: none)
    # The group of each queue, as placement chose it (issue 30); empty for a topic placed before that, whose queues
    # hash onto its groups. A queue never changes group: its group's replicas move instead, with its log.
    queue_groups: tuple[int, ...] = ()
    storage_class: str = DEFAULT_STORAGE_CLASS  # the class whose groups hold its queues (issue 32), fixed at creation
    read_replicas: int = 0  # learners each of its groups keeps to serve reads of it (issue 53)

    @property
    def bucket(self) -> str:
        """A KV bucket's own name (its topic is bucket_topic(name))."""
        return self.name[len(KV_PREFIX):]

    def group_of(self, queue: int) -> int:
        """The storage group of a queue: the one placement chose, or for a topic placed before placement
        chose, a hash onto the topic's groups, offset per topic so that many small topics spread over all groups."""
        if self.queue_groups:
            return self.queue_groups[queue]
        return self.groups[(zlib.crc32(self.name.encode()) + queue) % len(self.groups)]

    def to_wire(self) -> dict:
        return {"name": self.name, "queues": self.queues, "created_ms": self.created_ms,
                "message_type": self.message_type, "retention_s": int(self.retention_s),
                "local_retention_s": int(self.local_retention_s), "history": self.history, "ttl_ms": self.ttl_ms,
                "storage_class": self.storage_class, "read_replicas": self.read_replicas}

    @classmethod
    def from_wire(cls, payload: dict) -> "TopicSpec":
        return cls(payload["name"], int(payload["queues"]), int(payload.get("created_ms", 0)),
                   message_type=payload.get("message_type", "normal"),
                   retention_s=float(payload.get("retention_s", -1.0)),
                   local_retention_s=float(payload.get("local_retention_s", -1.0)),
                   history=int(payload.get("history", 1)), ttl_ms=int(payload.get("ttl_ms", 0)),
                   storage_class=payload.get("storage_class", DEFAULT_STORAGE_CLASS),
                   read_replicas=int(payload.get("read_replicas", 0)))


def check_retention_s(name: str, value: float) -> float:
    """A retention in seconds: 0 keeps data for ever, -1 takes the node's default."""
    if not (value == -1 or 0 <= value <= limits.retention_s_max):
        raise RocketError(Code.BAD_REQUEST, f"{name} must be -1 (the default), 0 (for ever) or up to "
                          f"{limits.retention_s_max // 86_400} days in seconds, got {value}")
    return float(value)


def check_request_id(request_id: str) -> str:
    """A create's request id (empty: none), kept by the metadata so that a retry gets the first answer."""
    if len(request_id.encode()) > limits.request_id_bytes_max:
        raise RocketError(Code.BAD_REQUEST, f"a request id is at most {limits.request_id_bytes_max} bytes")
    return request_id


def check_name(kind: str, name: str, bytes_max: int) -> str:
    """Topic and group names become key prefixes and file names, so they are kept plain."""
    if not name or len(name.encode()) > bytes_max or not _name_pattern.match(name):
        raise RocketError(
            Code.BAD_REQUEST,
            f"{kind} name {name!r} must be 1-{bytes_max} characters of letters, digits, '.', '_', '%' or '-'",
        )
    return name


def check_message_type(message_type: str) -> str:
    if message_type not in MESSAGE_TYPES:
        raise RocketError(Code.BAD_REQUEST, f"message type {message_type!r} is not one of {', '.join(MESSAGE_TYPES)}")
    return message_type


class Address(NamedTuple):
    """A node's or a server's HOST:PORT. A tuple, so it unpacks and keys a dict as (host, port) does."""

    host: str
    port: int

    def __str__(self) -> str:
        return f"{self.host}:{self.port}"

    @classmethod
    def parse(cls, text: str) -> "Address":
        """HOST:PORT (an IPv6 host in brackets); ValueError saying what is wrong."""
        text = text.strip()
        host, separator, port_text = text.rpartition(":")
        if not separator or not host or not port_text.isdigit() or not 0 <= int(port_text) <= 65535:
            raise ValueError(f"expected HOST:PORT with a port of 0-65535, got {text!r}")
        return cls(host.strip("[]"), int(port_text))


ALL_TAGS = 2**64 - 1  # the tag summary of a batch that may hold any tag (one indexed without a summary)
SYSTEM_PREFIX = "%"  # names of system topics (timers, retries, dead letters) start with it, as in RocketMQ


def timer_topic(topic: str) -> str:
    """The system queue where a delay topic's messages wait for their time, queue for queue, in the
    same storage group as the queue they are delivered to."""
    return SYSTEM_PREFIX + "TIMER%" + topic


def half_topic(topic: str) -> str:
    """The system queue where a transaction topic's half messages wait for their commit or rollback."""
    return SYSTEM_PREFIX + "HALF%" + topic


def unresolved_topic(topic: str) -> str:
    """Where half messages go that were neither committed nor rolled back after every check-back."""
    return SYSTEM_PREFIX + "TXN_UNRESOLVED%" + topic


_DEAD_LETTERS = SYSTEM_PREFIX + "DLQ%"


def dead_letter_topic(consumer_group: str, topic: str) -> str:
    """The system queues where a consumer group's messages of a topic go once they used up their delivery
    attempts, queue for queue beside the topic's (RocketMQ's %DLQ%group, per topic)."""
    return f"{SYSTEM_PREFIX}DLQ%{consumer_group}%{topic}"


def dead_letter_parts(topic: str) -> tuple[str, str] | None:
    """(consumer group, topic) of a dead-letter topic's name, else None. Within a namespace both are NS%name, as
    RocketMQ's clients wrap them: %DLQ%NS%group%NS%topic."""
    if not topic.startswith(_DEAD_LETTERS):
        return None
    parts = topic[len(_DEAD_LETTERS):].split("%")
    if len(parts) == 4 and parts[0] == parts[2]:
        return f"{parts[0]}%{parts[1]}", f"{parts[2]}%{parts[3]}"
    group, separator, base = topic[len(_DEAD_LETTERS):].partition("%")
    return (group, base) if separator and group and base else None


KV_PREFIX = SYSTEM_PREFIX + "KV%"
RETRY_PREFIX = SYSTEM_PREFIX + "RETRY%"  # %RETRY%group: a remoting consumer group's retries, a delay topic of its own


def bucket_topic(bucket: str) -> str:
    """The topic a KV bucket is kept as in the metadata: its shards are the topic's queues, placed and routed as
    queues are."""
    return KV_PREFIX + bucket


# ---- namespaces --------------------------------------------------------------------------------------------------
# A namespace scopes topics, consumer groups and KV buckets: within namespace NS, `orders` is stored as `NS%orders`,
# as RocketMQ's clients wrap a resource (NamespaceUtil), so that 4.x remoting clients that prefix `NS%` themselves
# meet the same names. A system name wraps the names it is made of. The default namespace ("") keeps names as they are.
NAMESPACE_SEPARATOR = "%"
_WRAPPING = (RETRY_PREFIX, SYSTEM_PREFIX + "TIMER%", SYSTEM_PREFIX + "HALF%", KV_PREFIX)  # + one name each


def check_namespace(namespace: str) -> str:
    """A namespace: "" (the default), or a plain name without the separator."""
    if namespace and (NAMESPACE_SEPARATOR in namespace or namespace.startswith(SYSTEM_PREFIX)):
        raise RocketError(Code.BAD_REQUEST, f"namespace {namespace!r} may not contain {NAMESPACE_SEPARATOR!r}")
    return check_name("namespace", namespace, limits.namespace_bytes_max) if namespace else namespace


def in_namespace(namespace: str, name: str) -> str:
    """name as it is stored within namespace: NAMESPACE%name (already so: unchanged); %RETRY%NAMESPACE%group,
    %DLQ%NAMESPACE%group%NAMESPACE%topic for system names."""
    if not namespace or not name:
        return name
    parts = dead_letter_parts(name)
    if parts is not None:
        return dead_letter_topic(in_namespace(namespace, parts[0]), in_namespace(namespace, parts[1]))
    for prefix in _WRAPPING:
        if name.startswith(prefix):
            return prefix + in_namespace(namespace, name[len(prefix):])
    wrapped = namespace + NAMESPACE_SEPARATOR
    return name if name.startswith(wrapped) else wrapped + name


def outside_namespace(namespace: str, name: str) -> str | None:
    """name as it is seen within namespace (in_namespace undone), or None for a name of another namespace."""
    if not namespace:
        return name
    wrapped = namespace + NAMESPACE_SEPARATOR
    parts = dead_letter_parts(name)
    if parts is not None:
        group, topic = (outside_namespace(namespace, part) for part in parts)
        return dead_letter_topic(group, topic) if group is not None and topic is not None else None
    for prefix in _WRAPPING:
        if name.startswith(prefix):
            inner = outside_namespace(namespace, name[len(prefix):])
            return None if inner is None else prefix + inner
    return name[len(wrapped):] if name.startswith(wrapped) else None


def hash_tag(key: str) -> str:
    """The part of a key that chooses its shard: the text between the first '{' and the next '}' when it is not
    empty (Redis Cluster's rule), else the whole key."""
    start = key.find("{")
    if start >= 0:
        end = key.find("}", start + 1)
        if end > start + 1:
            return key[start + 1:end]
    return key


def shard_of(key: str, shards: int) -> int:
    return zlib.crc32(hash_tag(key).encode()) % shards


def check_user_topic_name(name: str) -> str:
    """A topic a user creates: a plain name that does not claim the system prefix (a consumer group's retry
    topic, %RETRY%group, is one a RocketMQ client or mqadmin may make)."""
    check_topic_name(name)
    if name.startswith(SYSTEM_PREFIX) and not name.startswith(RETRY_PREFIX):
        raise RocketError(Code.BAD_REQUEST, f"topic names starting with {SYSTEM_PREFIX!r} are reserved for the system")
    return name


@functools.lru_cache(maxsize=4096)
def check_topic_name(name: str) -> str:
    """Checked once per name: every storage append checks its topic's, on the hot path (a refused one is not kept)."""
    return check_name("topic", name, limits.topic_name_bytes_max)


def check_group_name(name: str) -> str:
    return check_name("group", name, limits.group_name_bytes_max)


_duration_units_s = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86_400}
_duration_pattern = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")


def parse_iso_ms(text: str, what: str) -> int:
    """An ISO 8601 time (UTC unless it names its zone) as epoch ms; BAD_REQUEST naming what, as "what: ...", if not."""
    import datetime

    try:
        moment = datetime.datetime.fromisoformat(text)
    except ValueError:
        raise RocketError(Code.BAD_REQUEST, f"{what}: expected an ISO 8601 time, such as 2030-01-31T09:00") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=datetime.timezone.utc)
    return int(moment.timestamp() * 1000)


def parse_duration_s(text: str) -> float:
    """'90s', '5m', '1h30m', '365d', '250ms' -> seconds."""
    parts = _duration_pattern.findall(text.strip())
    if not parts or "".join(number + unit for number, unit in parts) != text.strip():
        raise RocketError(Code.BAD_REQUEST, f"duration {text!r}: expected a number and a unit (ms, s, m, h, d), "
                          "e.g. 90s, 1h30m or 365d")
    return sum(float(number) * _duration_units_s[unit] for number, unit in parts)


def read_charge(batch_bytes: int) -> int:
    """What a stored batch costs a read's max_bytes: its bytes, and limits.read_batch_overhead_bytes for its queue,
    offset and length in the response. Servers stop a read by it, and a consumer reads a full pull by it."""
    return batch_bytes + limits.read_batch_overhead_bytes


class ReadBudget:
    """A read's byte budget, the one rule of every read path (the index, the tier, storage, the broker): batches are
    taken while their read_charge fits in max_bytes, and the first one whatever its size if at_least_one, so that a
    read gets past a batch bigger than its budget. Past the first batch the budget is strict, so a response never
    exceeds a frame."""

    __slots__ = ("bytes_left", "at_least_one", "taken")

    def __init__(self, max_bytes: int, at_least_one: bool = True):
        self.bytes_left = max_bytes
        self.at_least_one = at_least_one
        self.taken = 0

    @property
    def first(self) -> bool:
        """Whether the next batch is taken whatever its size."""
        return self.at_least_one and not self.taken

    @property
    def spent(self) -> bool:
        """Whether no further batch can be taken."""
        return self.bytes_left <= 0 and not self.first

    def take(self, batch_bytes: int) -> bool:
        """Take a batch if it fits (or is the first); False, changing nothing, if it does not."""
        cost = read_charge(batch_bytes)
        if cost > self.bytes_left and not self.first:
            return False
        self.bytes_left -= cost
        self.taken += 1
        return True


def tag_bit(tag: str) -> int:
    """The bit a tag sets in a batch's 64-bit tag summary (a one-hash Bloom filter)."""
    return 1 << (zlib.crc32(tag.encode()) & 63)


def queue_for_key(key: str, queues: int) -> int:
    """Stable key -> queue mapping shared by every client (crc32 is the same everywhere)."""
    return zlib.crc32(key.encode()) % queues
