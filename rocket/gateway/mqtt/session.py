"""MQTT sessions as the storage groups keep them, for any broker to read: a persistent session's subscriptions and
unfinished QoS 2 exchanges in the KV bucket mqtt.sessions (expiring with the session), retained messages in
mqtt.retained."""

from __future__ import annotations

import dataclasses

import orjson

from rocket.errors import Code, RocketError
from rocket.gateway.mqtt.mapping import Filter, parse_filter
from rocket.gateway.mqtt.packets import Subscription
from rocket.model import Message, in_namespace
from rocket.serde import batch as batch_codec
from rocket.transport.rpc import Dispatcher

SESSIONS_BUCKET = "mqtt.sessions"  # key: client id
RETAINED_BUCKET = "mqtt.retained"  # key: MQTT topic; value: the message, as a batch of one
NEVER_EXPIRES = 0xFFFFFFFF  # MQTT 5's session expiry interval that never ends (and MQTT 3.1.1's persistent sessions)


@dataclasses.dataclass(slots=True)
class Session:
    """What outlives a connection of a persistent session: its subscriptions, the QoS 2 publishes received and not
    yet released (their packet ids), the QoS 2 deliveries sent and not yet received (their ids by message), and those
    released and not yet completed. Every connected device has one, so its sets of packet ids are dicts (of None):
    an empty dict is a quarter of an empty set's size."""
    client_id: str
    expiry_s: int = 0  # 0: the session ends with its connection
    subscriptions: dict[str, tuple[Filter, Subscription]] = dataclasses.field(default_factory=dict)
    received: dict[int, None] = dataclasses.field(default_factory=dict)  # QoS 2 in: PUBREC sent, PUBREL not yet come
    released: dict[int, None] = dataclasses.field(default_factory=dict)  # QoS 2 out: PUBREL sent, no PUBCOMP yet
    # QoS 2 out, sent and no PUBREC yet: "TOPIC GROUP QUEUE OFFSET" -> the packet id it went with
    unreleased: dict[str, int] = dataclasses.field(default_factory=dict)

    @property
    def persistent(self) -> bool:
        return self.expiry_s > 0

    def to_record(self) -> bytes:
        return orjson.dumps({
            "expiry_s": self.expiry_s, "received": sorted(self.received), "released": sorted(self.released),
            "unreleased": self.unreleased,
            "subscriptions": [[subscription.topic_filter, subscription.qos, subscription.no_local,
                               subscription.retain_as_published, subscription.retain_handling]
                              for _, subscription in self.subscriptions.values()]})

    @classmethod
    def from_record(cls, client_id: str, record: bytes, namespace: str = "") -> Session:
        wire = orjson.loads(record)
        session = cls(client_id, wire["expiry_s"], received=dict.fromkeys(wire["received"]),
                      released=dict.fromkeys(wire["released"]), unreleased=wire.get("unreleased", {}))
        for text, qos, no_local, as_published, handling in wire["subscriptions"]:
            subscription = Subscription(text, qos, no_local, as_published, handling)
            session.subscriptions[text] = (parse_filter(text, namespace), subscription)
        return session


class Buckets:
    """The gateway's own KV reads and writes (as the node: what a client may do was checked before), making its
    buckets at their first write."""

    def __init__(self, dispatcher: Dispatcher):
        self.dispatcher = dispatcher

    async def get(self, bucket: str, key: str) -> bytes | None:
        try:
            found = await self.dispatcher.local("KvGet", {"bucket": bucket, "key": key, "revision": 0,
                                                                "serializable": False})
        except RocketError as error:
            if error.code in (Code.UNKNOWN_BUCKET, Code.NOT_FOUND):
                return None
            raise
        return found["entries"][0]["value"] if found["entries"] else None

    async def put(self, bucket: str, key: str, value: bytes, ttl_ms: int = 0) -> None:
        request = {"bucket": bucket, "key": key, "value": value, "ttl_ms": ttl_ms, "if_revision": -1,
                   "if_absent": False}
        try:
            await self.dispatcher.local("KvPut", request)
        except RocketError as error:
            if error.code != Code.UNKNOWN_BUCKET:
                raise
            try:
                await self.dispatcher.local("KvCreateBucket", {"bucket": bucket, "shards": 1, "history": 1,
                                                               "ttl_ms": 0, "storage_class": "raft"})
            except RocketError as made:
                if made.code != Code.BUCKET_EXISTS:
                    raise
            await self.dispatcher.local("KvPut", request)

    async def delete(self, bucket: str, key: str) -> None:
        try:
            await self.dispatcher.local("KvDelete", {"bucket": bucket, "key": key, "prefix": False,
                                                         "if_revision": -1})
        except RocketError as error:
            if error.code != Code.UNKNOWN_BUCKET:
                raise

    async def scan(self, bucket: str, prefix: str, limit: int) -> list[tuple[str, bytes]]:
        """Up to limit entries whose keys start with prefix, in key order."""
        entries: list[tuple[str, bytes]] = []
        after = ""
        while len(entries) < limit:
            try:
                page = await self.dispatcher.local("KvRange", {
                    "bucket": bucket, "prefix": prefix, "start": "", "end": "", "after": after,
                    "limit": limit - len(entries), "keys_only": False, "count_only": False, "serializable": False})
            except RocketError as error:
                if error.code == Code.UNKNOWN_BUCKET:
                    return entries
                raise
            entries += [(entry["key"], entry["value"]) for entry in page["entries"]]
            if not page["more"] or not page["entries"]:
                break
            after = page["entries"][-1]["key"]
        return entries


class Sessions:
    """Persistent sessions' records: read at CONNECT, written at each change of subscriptions and at the end of a
    connection, when the record's TTL starts counting the session's expiry. The bucket lies in the gateway's
    namespace."""

    def __init__(self, buckets: Buckets, namespace: str = ""):
        self.buckets = buckets
        self.namespace = namespace
        self.bucket = in_namespace(namespace, SESSIONS_BUCKET)

    async def load(self, client_id: str) -> Session | None:
        record = await self.buckets.get(self.bucket, client_id)
        return Session.from_record(client_id, record, self.namespace) if record is not None else None

    async def save(self, session: Session, ended: bool = False) -> None:
        """Keep the session; ended: its connection ended, and it expires after its interval unless one resumes it."""
        ttl_ms = session.expiry_s * 1000 if ended and session.expiry_s != NEVER_EXPIRES else 0
        await self.buckets.put(self.bucket, session.client_id, session.to_record(), ttl_ms)

    async def forget(self, client_id: str) -> None:
        await self.buckets.delete(self.bucket, client_id)


class Retained:
    """Each MQTT topic's retained message, as a batch of one message, in a bucket in the gateway's namespace."""

    def __init__(self, buckets: Buckets, namespace: str = ""):
        self.buckets = buckets
        self.bucket = in_namespace(namespace, RETAINED_BUCKET)

    async def keep(self, topic: str, message: Message) -> None:
        """A retained message replaces the topic's last; an empty one deletes it."""
        if message.body:
            await self.buckets.put(self.bucket, topic, batch_codec.encode([message], message.timestamp_ms))
        else:
            await self.buckets.delete(self.bucket, topic)

    async def under(self, first: str, limit: int) -> list[Message]:
        """The retained messages of the MQTT topics under a first level, limit at most."""
        exact = await self.buckets.get(self.bucket, first)
        found = [value for _, value in await self.buckets.scan(self.bucket, first + "/", limit)]
        return [batch_codec.decode(value, 0, -1)[0] for value in ([exact] if exact is not None else []) + found][:limit]
