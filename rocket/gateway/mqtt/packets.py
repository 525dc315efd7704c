"""MQTT 3.1.1 and 5.0 packets as values: their types, MQTT 5's reason codes and properties, and MqttError for input
that breaks the protocol. codec.py reads and writes them."""

from __future__ import annotations

import dataclasses
import enum
from typing import Any

V311 = 4  # the protocol level of MQTT 3.1.1 in CONNECT
V5 = 5


class PacketType(enum.IntEnum):
    CONNECT = 1
    CONNACK = 2
    PUBLISH = 3
    PUBACK = 4
    PUBREC = 5
    PUBREL = 6
    PUBCOMP = 7
    SUBSCRIBE = 8
    SUBACK = 9
    UNSUBSCRIBE = 10
    UNSUBACK = 11
    PINGREQ = 12
    PINGRESP = 13
    DISCONNECT = 14
    AUTH = 15


class Reason(enum.IntEnum):
    """MQTT 5's reason codes (section 2.4), those rocket sends or checks."""
    SUCCESS = 0x00
    GRANTED_QOS_1 = 0x01
    GRANTED_QOS_2 = 0x02
    DISCONNECT_WITH_WILL = 0x04
    NO_MATCHING_SUBSCRIBERS = 0x10
    NO_SUBSCRIPTION_EXISTED = 0x11
    UNSPECIFIED_ERROR = 0x80
    MALFORMED_PACKET = 0x81
    PROTOCOL_ERROR = 0x82
    IMPLEMENTATION_SPECIFIC_ERROR = 0x83
    UNSUPPORTED_PROTOCOL_VERSION = 0x84
    CLIENT_IDENTIFIER_NOT_VALID = 0x85
    BAD_USER_NAME_OR_PASSWORD = 0x86
    NOT_AUTHORIZED = 0x87
    SERVER_UNAVAILABLE = 0x88
    SERVER_BUSY = 0x89
    SERVER_SHUTTING_DOWN = 0x8B
    BAD_AUTHENTICATION_METHOD = 0x8C
    KEEP_ALIVE_TIMEOUT = 0x8D
    SESSION_TAKEN_OVER = 0x8E
    TOPIC_FILTER_INVALID = 0x8F
    TOPIC_NAME_INVALID = 0x90
    PACKET_IDENTIFIER_IN_USE = 0x91
    PACKET_IDENTIFIER_NOT_FOUND = 0x92
    RECEIVE_MAXIMUM_EXCEEDED = 0x93
    TOPIC_ALIAS_INVALID = 0x94
    PACKET_TOO_LARGE = 0x95
    QUOTA_EXCEEDED = 0x97
    PAYLOAD_FORMAT_INVALID = 0x99
    RETAIN_NOT_SUPPORTED = 0x9A
    QOS_NOT_SUPPORTED = 0x9B
    SHARED_SUBSCRIPTIONS_NOT_SUPPORTED = 0x9E
    SUBSCRIPTION_IDENTIFIERS_NOT_SUPPORTED = 0xA1
    WILDCARD_SUBSCRIPTIONS_NOT_SUPPORTED = 0xA2


class MqttError(Exception):
    """Input that breaks the protocol: the reason code to answer with, and a one-line message."""

    def __init__(self, reason: Reason, message: str):
        super().__init__(f"{reason.name}: {message}")
        self.reason = reason
        self.message = message


def keep_alive_ran_out() -> MqttError:
    """What ends a connection silent past 1.5 times its keep-alive, whether served or parked (a new one each time: an
    exception is raised in one task only)."""
    return MqttError(Reason.KEEP_ALIVE_TIMEOUT, "no packet within 1.5 times the keep-alive")


def shutting_down() -> MqttError:
    return MqttError(Reason.SERVER_SHUTTING_DOWN, "the broker is shutting down")


# Properties (MQTT 5, section 2.2.2.2): identifier -> (name, kind). Kinds: byte, u16, u32, varint, str, bin, pair.
PROPERTIES: dict[int, tuple[str, str]] = {
    0x01: ("payload_format_indicator", "byte"), 0x02: ("message_expiry_interval", "u32"),
    0x03: ("content_type", "str"), 0x08: ("response_topic", "str"), 0x09: ("correlation_data", "bin"),
    0x0B: ("subscription_identifier", "varint"), 0x11: ("session_expiry_interval", "u32"),
    0x12: ("assigned_client_identifier", "str"), 0x13: ("server_keep_alive", "u16"),
    0x15: ("authentication_method", "str"), 0x16: ("authentication_data", "bin"),
    0x17: ("request_problem_information", "byte"), 0x18: ("will_delay_interval", "u32"),
    0x19: ("request_response_information", "byte"), 0x1A: ("response_information", "str"),
    0x1C: ("server_reference", "str"), 0x1F: ("reason_string", "str"), 0x21: ("receive_maximum", "u16"),
    0x22: ("topic_alias_maximum", "u16"), 0x23: ("topic_alias", "u16"), 0x24: ("maximum_qos", "byte"),
    0x25: ("retain_available", "byte"), 0x26: ("user_property", "pair"), 0x27: ("maximum_packet_size", "u32"),
    0x28: ("wildcard_subscription_available", "byte"), 0x29: ("subscription_identifier_available", "byte"),
    0x2A: ("shared_subscription_available", "byte"),
}
REPEATABLE = {"user_property", "subscription_identifier"}  # kept as lists; any other property twice is an error


@dataclasses.dataclass(slots=True)
class Will:
    topic: str
    payload: bytes
    qos: int = 0
    retain: bool = False
    properties: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(slots=True)
class Connect:
    client_id: str
    protocol_level: int = V5
    clean_start: bool = True
    keep_alive: int = 60
    username: str | None = None
    password: bytes | None = None
    will: Will | None = None
    properties: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(slots=True)
class ConnAck:
    reason: int = Reason.SUCCESS  # 3.1.1's return codes (0-5) where the protocol level is 4
    session_present: bool = False
    properties: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(slots=True)
class Publish:
    topic: str
    payload: bytes
    qos: int = 0
    retain: bool = False
    dup: bool = False
    packet_id: int = 0  # 0 at QoS 0, 1-65535 above
    properties: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(slots=True)
class Ack:
    """PUBACK, PUBREC, PUBREL or PUBCOMP."""
    kind: PacketType
    packet_id: int
    reason: int = Reason.SUCCESS
    properties: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(slots=True)
class Subscription:
    topic_filter: str
    qos: int = 0
    no_local: bool = False
    retain_as_published: bool = False
    retain_handling: int = 0


@dataclasses.dataclass(slots=True)
class Subscribe:
    packet_id: int
    subscriptions: list[Subscription]
    properties: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(slots=True)
class SubAck:
    packet_id: int
    reasons: list[int]  # per subscription: the granted QoS, or a failure (0x80 and up)
    properties: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(slots=True)
class Unsubscribe:
    packet_id: int
    topic_filters: list[str]
    properties: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(slots=True)
class UnsubAck:
    packet_id: int
    reasons: list[int] = dataclasses.field(default_factory=list)  # none in 3.1.1
    properties: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(slots=True)
class PingReq:
    pass


@dataclasses.dataclass(slots=True)
class PingResp:
    pass


@dataclasses.dataclass(slots=True)
class Disconnect:
    reason: int = Reason.SUCCESS
    properties: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(slots=True)
class Auth:
    reason: int = Reason.SUCCESS
    properties: dict[str, Any] = dataclasses.field(default_factory=dict)


Packet = (Connect | ConnAck | Publish | Ack | Subscribe | SubAck | Unsubscribe | UnsubAck | PingReq | PingResp
          | Disconnect | Auth)


def malformed(message: str) -> MqttError:
    return MqttError(Reason.MALFORMED_PACKET, message)


def protocol_error(message: str) -> MqttError:
    return MqttError(Reason.PROTOCOL_ERROR, message)
