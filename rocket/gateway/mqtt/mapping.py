"""How MQTT maps onto rocket: a topic's first level names the rocket topic and the rest is the message's tag, a filter
becomes a topic and a tag filter, and messages convert both ways (MQTT 5's properties as message properties)."""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import re
import zlib

from rocket import limits
from rocket.errors import Code, RocketError
from rocket.gateway.mqtt.packets import V5, MqttError, Publish, Reason
from rocket.model import Message, check_group_name, check_topic_name, in_namespace, outside_namespace

MQTT_TOPIC = "mqtt.topic"  # the MQTT topic a message was published on, where its topic and tag do not tell it
MQTT_CLIENT = "mqtt.client"  # the client id of its publisher (what MQTT 5's No Local compares)
MQTT_RETAIN = "mqtt.retain"  # "1" on a message published retained (what Retain As Published passes on)
MQTT_QOS = "mqtt.qos"  # the QoS it was published with, where not 1 (a message from another protocol counts as 1)
EXPIRES_MS = "mqtt.expires_ms"  # MQTT 5's message expiry, as the wall time it expires at
# MQTT 5 properties kept as message properties, named so; binary ones base64
CARRIED = {"content_type": "mqtt.content_type", "response_topic": "mqtt.response_topic",
           "correlation_data": "mqtt.correlation_data", "payload_format_indicator": "mqtt.payload_format"}
RESERVED = ("mqtt.", "__")  # property names a user property may not take: rocket's and the gateway's own
SHARE_PREFIX = "$share/"
GROUP_PREFIX = "mqtt-"  # a session's consumer group: this and its client id (or the id's digest)
_plain_name = re.compile(r"^[A-Za-z0-9._%-]+$")


REASON_OF_CODE = {  # rocket's error codes -> MQTT 5's reason codes (PUBACK, SUBACK and CONNACK take these)
    Code.UNKNOWN_TOPIC: Reason.TOPIC_NAME_INVALID, Code.PERMISSION_DENIED: Reason.NOT_AUTHORIZED,
    Code.UNAUTHENTICATED: Reason.NOT_AUTHORIZED, Code.OVERLOADED: Reason.QUOTA_EXCEEDED,
    Code.BAD_REQUEST: Reason.IMPLEMENTATION_SPECIFIC_ERROR, Code.BAD_FILTER: Reason.TOPIC_FILTER_INVALID,
    Code.WRONG_MESSAGE_TYPE: Reason.IMPLEMENTATION_SPECIFIC_ERROR,
}


def reason_of(error: RocketError, connecting: bool = False) -> Reason:
    if connecting and error.code in (Code.UNAVAILABLE, Code.TIMEOUT, Code.OVERLOADED, Code.DISK_FULL):
        return Reason.SERVER_UNAVAILABLE
    return REASON_OF_CODE.get(error.code, Reason.UNSPECIFIED_ERROR)


def rocket_topic(mqtt_topic: str, namespace: str = "", one_topic: str = "") -> str:
    """The rocket topic an MQTT topic name (or a filter without a wildcard in its first level) lies in, within the
    gateway's namespace: one_topic, the gateway's one topic for all (mqtt_topic), else the MQTT topic's first level;
    TOPIC_NAME_INVALID when that is no rocket topic name."""
    first = one_topic or mqtt_topic.split("/", 1)[0]
    try:
        return check_topic_name(in_namespace(namespace, first) if namespace and first else first)
    except RocketError:
        raise MqttError(Reason.TOPIC_NAME_INVALID, f"the first level {first[:64]!r} of an MQTT topic names a rocket "
                                                   "topic: letters, digits, '.', '_', '%' or '-'") from None


def mqtt_topic(message: Message, topic: str, whole: bool = False) -> str:
    """The MQTT topic a stored message is delivered on: the one it was published on, else the rocket topic and its
    tag as the levels after (a message sent over rocket's API with tag T to topic S arrives on S/T); whole (the
    gateway maps every MQTT topic to one rocket topic, the whole MQTT topic its tag): the tag alone (T), or S without
    one."""
    published = message.properties.get(MQTT_TOPIC)
    if published:
        return published
    if whole:
        return message.tag or topic
    return f"{topic}/{message.tag}" if message.tag else topic


def queue_of(client_id: str, queues: int) -> int:
    """The queue a client's publishes go to: always the same one, so what it publishes stays in order (MQTT orders
    each client's messages), and a read of its publishes is one batch per rocket topic."""
    return zlib.crc32(client_id.encode()) % queues


def to_message(publish: Publish, client_id: str, now_ms: int, shared: dict[str, str] | None = None,
               whole: bool = False) -> Message:
    """A PUBLISH as the message rocket stores: the levels after the first as its tag (the whole topic, with whole),
    when they fit one; the client, and where needed the topic and QoS, and MQTT 5 properties as message properties,
    user properties as themselves. shared: {MQTT_CLIENT: client_id}, from a caller converting many, as the properties
    of every message that needs no others (one dict for them all: a batch's encoder checks it once)."""
    _, level, rest = ("", "", publish.topic) if whole else publish.topic.partition("/")
    tag = rest if len(rest) * 4 <= limits.tag_bytes_max or len(rest.encode()) <= limits.tag_bytes_max else ""
    given = publish.properties
    plain = tag == rest and (bool(rest) or not level)  # not "S/", nor levels longer than a tag
    if plain and shared is not None and publish.qos == 1 and not publish.retain and not given:
        return Message(publish.payload, tag=tag, properties=shared, timestamp_ms=now_ms)
    properties = {MQTT_CLIENT: client_id}
    if not plain:
        properties[MQTT_TOPIC] = publish.topic
    if publish.qos != 1:
        properties[MQTT_QOS] = str(publish.qos)
    if publish.retain:
        properties[MQTT_RETAIN] = "1"
    if not given and len(publish.topic) <= limits.properties_bytes_max // 16:  # MQTT 3.1.1's, and most of 5.0's
        # (a client id and a topic this long are within the properties' bound)
        return Message(publish.payload, tag=tag, properties=properties, timestamp_ms=now_ms)
    for name, value in given.get("user_property", ()):
        if not name or name.startswith(RESERVED):
            raise MqttError(Reason.IMPLEMENTATION_SPECIFIC_ERROR, f"user property {name[:64]!r}: a name is not "
                                                                  f"empty, nor starts with {' or '.join(RESERVED)}")
        properties[name] = value
    for name, carried in CARRIED.items():
        if name in given:
            value = given[name]
            properties[carried] = base64.b64encode(value).decode() if isinstance(value, bytes) else str(value)
    if "message_expiry_interval" in given:
        properties[EXPIRES_MS] = str(now_ms + given["message_expiry_interval"] * 1000)
    if sum(len(name) + len(value) for name, value in properties.items()) * 4 > limits.properties_bytes_max and \
            sum(len(name.encode()) + len(value.encode()) + 2 for name, value in properties.items()) > \
            limits.properties_bytes_max:
        raise MqttError(Reason.IMPLEMENTATION_SPECIFIC_ERROR, f"the message's properties are more than "
                                                              f"{limits.properties_bytes_max} bytes")
    return Message(publish.payload, tag=tag, properties=properties, timestamp_ms=now_ms)


def to_publish(message: Message, topic: str, qos: int, version: int, now_ms: int, whole: bool = False
               ) -> Publish | None:
    """A stored message of a rocket topic (as MQTT names it: outside the gateway's namespace) as the PUBLISH a
    subscriber gets at qos, or None when it expired. Its message properties other than rocket's and the gateway's
    become user properties (MQTT 5)."""
    expires = message.properties.get(EXPIRES_MS)
    properties: dict = {}
    if expires is not None and expires.isdigit():
        left_ms = int(expires) - now_ms
        if left_ms <= 0:
            return None
        properties["message_expiry_interval"] = (left_ms + 999) // 1000
    if version == V5:
        users = [(name, value) for name, value in message.properties.items() if not name.startswith(RESERVED)]
        if users:
            properties["user_property"] = users
        for name, carried in CARRIED.items():
            value = message.properties.get(carried)
            if value is not None:
                properties[name] = _carried_value(name, value)
    else:
        properties = {}
    return Publish(mqtt_topic(message, topic, whole), message.body, qos, dup=message.attempt > 1,
                   properties=properties)


def _carried_value(name: str, value: str):
    if name == "correlation_data":
        try:
            return base64.b64decode(value)
        except ValueError:
            return value.encode()
    if name == "payload_format_indicator":
        return 1 if value == "1" else 0
    return value


def published_qos(message: Message) -> int:
    value = message.properties.get(MQTT_QOS, "1")
    return int(value) if value in ("0", "1", "2") else 1


@dataclasses.dataclass(frozen=True, slots=True)
class Filter:
    """A SUBSCRIBE's filter as rocket reads it: the rocket topic, and the consumer group (the session's, or the share
    name's, within the gateway's namespace) whose receives the gateway matches against the filter."""
    text: str  # as subscribed, $share/ and all: what UNSUBSCRIBE names
    topic_filter: str  # without $share/NAME/
    topic: str  # the rocket topic, within the namespace
    share: str  # the share name's group, within the namespace; "" when not shared
    namespace: str = ""

    def group(self, client_id: str) -> str:
        return self.share or in_namespace(self.namespace, session_group(client_id))

    @property
    def first(self) -> str:
        """The rocket topic as MQTT names it (outside the namespace): the filter's first level, or the gateway's one
        topic."""
        return outside_namespace(self.namespace, self.topic) or self.topic

    @property
    def literal(self) -> str:
        """The filter's levels before its first wildcard: the MQTT topics it matches are this one, or under it."""
        levels = self.topic_filter.split("/")
        wild = next((at for at, level in enumerate(levels) if level in ("+", "#")), len(levels))
        return "/".join(levels[:wild])


def parse_filter(text: str, namespace: str = "", one_topic: str = "") -> Filter:
    """A filter of SUBSCRIBE, or MqttError with the reason code for it: a wildcard in the first level cannot name a
    rocket topic (Wildcard Subscriptions Not Supported), nor can a first level that is no topic name; with one_topic
    (the gateway's one rocket topic for all MQTT topics) any filter names it."""
    share, topic_filter = "", text
    if text.startswith(SHARE_PREFIX):
        share, _, topic_filter = text[len(SHARE_PREFIX):].partition("/")
        try:
            check_group_name(share)
        except RocketError:
            raise MqttError(Reason.TOPIC_FILTER_INVALID, f"share name {share[:64]!r}: it names a rocket consumer "
                                                         "group: letters, digits, '.', '_', '%' or '-'") from None
    first = topic_filter.partition("/")[0]
    if first in ("+", "#") and not one_topic:
        raise MqttError(Reason.WILDCARD_SUBSCRIPTIONS_NOT_SUPPORTED, f"filter {text[:64]!r}: its first level names "
                                                                     "the rocket topic, so it cannot be a wildcard")
    return Filter(text, topic_filter, rocket_topic(topic_filter, namespace, one_topic), in_namespace(namespace, share),
                  namespace)


def session_group(client_id: str) -> str:
    """The consumer group a session's own subscriptions read in: mqtt-CLIENT, or the client id's digest when it is
    no group name."""
    name = GROUP_PREFIX + client_id
    if _plain_name.match(client_id) and len(name.encode()) <= limits.group_name_bytes_max:
        return name
    return GROUP_PREFIX + hashlib.sha256(client_id.encode()).hexdigest()[:40]
