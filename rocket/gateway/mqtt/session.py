"""MQTT sessions as the storage groups keep them, for any broker to read: a persistent session's subscriptions and
unfinished QoS 2 exchanges in the KV bucket mqtt.sessions (expiring with the session), retained messages in
mqtt.retained."""

from __future__ import annotations

import dataclasses

import orjson

from rocket.gateway.buckets import Buckets
from rocket.gateway.mqtt.mapping import Filter, parse_filter
from rocket.gateway.mqtt.packets import Subscription
from rocket.model import Message, in_namespace
from rocket.serde import batch as batch_codec

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
    stored: bool = False  # the bucket may hold a record of it: it was loaded, or saved since its CONNECT

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
    def from_record(cls, client_id: str, record: bytes, namespace: str = "", one_topic: str = "") -> Session:
        wire = orjson.loads(record)
        session = cls(client_id, wire["expiry_s"], received=dict.fromkeys(wire["received"]),
                      released=dict.fromkeys(wire["released"]), unreleased=wire.get("unreleased", {}))
        for text, qos, no_local, as_published, handling in wire["subscriptions"]:
            subscription = Subscription(text, qos, no_local, as_published, handling)
            session.subscriptions[text] = (parse_filter(text, namespace, one_topic), subscription)
        return session


class Sessions:
    """Persistent sessions' records: read at CONNECT, written at each change of subscriptions and at the end of a
    connection, when the record's TTL starts counting the session's expiry. The bucket lies in the gateway's
    namespace."""

    def __init__(self, buckets: Buckets, namespace: str = "", one_topic: str = ""):
        self.buckets = buckets
        self.namespace = namespace
        self.one_topic = one_topic
        self.bucket = in_namespace(namespace, SESSIONS_BUCKET)

    async def load(self, client_id: str) -> Session | None:
        record = await self.buckets.get(self.bucket, client_id)
        if record is None:
            return None
        session = Session.from_record(client_id, record, self.namespace, self.one_topic)
        session.stored = True
        return session

    async def save(self, session: Session, ended: bool = False) -> None:
        """Keep the session; ended: its connection ended, and it expires after its interval unless one resumes it."""
        ttl_ms = session.expiry_s * 1000 if ended and session.expiry_s != NEVER_EXPIRES else 0
        session.stored = True  # before the put: one that fails may have been stored all the same
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

    async def under(self, literal: str, limit: int) -> list[Message]:
        """The retained messages of an MQTT topic and those under it (a filter's levels before its first wildcard:
        Filter.literal; "": every topic's), limit at most."""
        exact = await self.buckets.get(self.bucket, literal) if literal else None
        found = [value for _, value in await self.buckets.scan(self.bucket, literal + "/" if literal else "", limit)]
        return [batch_codec.decode(value, 0, -1)[0] for value in ([exact] if exact is not None else []) + found][:limit]
