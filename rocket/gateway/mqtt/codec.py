"""MQTT 3.1.1 and 5.0 packets (packets.py), sans I/O: a Decoder takes bytes in and gives whole packets out, encode()
gives a packet's bytes. Malformed input is MqttError carrying the MQTT 5 reason code for it (Malformed Packet, Protocol
Error, Packet Too Large, Unsupported Protocol Version), which a server answers with before it disconnects."""

from __future__ import annotations

import struct
from typing import Any

from rocket import limits
from rocket.gateway.mqtt.packets import (PROPERTIES, REPEATABLE, V5, V311, Ack, Auth, ConnAck, Connect, Disconnect,
                                         MqttError, Packet, PacketType, PingReq, PingResp, Publish, Reason, SubAck,
                                         Subscribe, Subscription, UnsubAck, Unsubscribe, Will, malformed,
                                         protocol_error)

__all__ = ["Ack", "Auth", "ConnAck", "Connect", "Decoder", "Disconnect", "MqttError", "Packet", "PacketType", "PingReq",
           "PingResp", "Publish", "Reason", "SubAck", "Subscribe", "Subscription", "UnsubAck", "Unsubscribe", "V311",
           "V5", "Will", "decode", "encode", "matches", "read_varint", "valid_topic_filter", "valid_topic_name",
           "write_varint"]

_u16 = struct.Struct(">H")
_u32 = struct.Struct(">I")
_PUBLISH_HEAD = int(PacketType.PUBLISH) << 4  # a fixed header's type bits, as a plain int
_PROPERTY_IDS = {name: (identifier, kind) for identifier, (name, kind) in PROPERTIES.items()}


# ---- reading


class _Reader:
    """A packet's variable header and payload, read in order; reading past its end is a Malformed Packet."""

    __slots__ = ("data", "at")

    def __init__(self, data: bytes):
        self.data = data
        self.at = 0

    @property
    def left(self) -> int:
        return len(self.data) - self.at

    def take(self, count: int, what: str) -> bytes:
        if count > self.left:
            raise malformed(f"{what} runs past the packet's end")
        chunk = self.data[self.at:self.at + count]
        self.at += count
        return chunk

    def byte(self, what: str) -> int:
        return self.take(1, what)[0]

    def u16(self, what: str) -> int:
        return _u16.unpack(self.take(2, what))[0]

    def u32(self, what: str) -> int:
        return _u32.unpack(self.take(4, what))[0]

    def varint(self, what: str) -> int:
        value, self.at = read_varint(self.data, self.at, what)
        return value

    def binary(self, what: str) -> bytes:
        return self.take(self.u16(what), what)

    def string(self, what: str) -> str:
        raw = self.binary(what)
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise malformed(f"{what} is not valid UTF-8") from None
        if "\x00" in text:
            raise malformed(f"{what} holds the null character")
        return text

    def properties(self, what: str) -> dict[str, Any]:
        length = self.varint(f"{what}'s property length")
        end = self.at + length
        if end > len(self.data):
            raise malformed(f"{what}'s properties run past the packet's end")
        found: dict[str, Any] = {}
        while self.at < end:
            identifier = self.varint(f"a property identifier of {what}")
            if identifier not in PROPERTIES:
                raise malformed(f"{what} has an unknown property 0x{identifier:02x}")
            name, kind = PROPERTIES[identifier]
            value: Any
            if kind == "byte":
                value = self.byte(name)
            elif kind == "u16":
                value = self.u16(name)
            elif kind == "u32":
                value = self.u32(name)
            elif kind == "varint":
                value = self.varint(name)
            elif kind == "str":
                value = self.string(name)
            elif kind == "bin":
                value = self.binary(name)
            else:
                value = (self.string(f"{name} name"), self.string(f"{name} value"))
            if name in REPEATABLE:
                found.setdefault(name, []).append(value)
            elif name in found:
                raise protocol_error(f"{what} has property {name} twice")
            else:
                found[name] = value
        if self.at != end:
            raise malformed(f"{what}'s last property runs past its property length")
        return found

    def done(self, what: str) -> None:
        if self.left:
            raise malformed(f"{what} has {self.left} bytes after its end")


def read_varint(data: bytes | bytearray, at: int, what: str) -> tuple[int, int]:
    """A Variable Byte Integer (1 to 4 bytes) at data[at:]: (value, the offset after it). Too short: IndexError."""
    value = 0
    for shift in (0, 7, 14, 21):
        if at >= len(data):
            raise malformed(f"{what} runs past the packet's end")
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, at
    raise malformed(f"{what} is a variable byte integer longer than 4 bytes")


def _packet_id(reader: _Reader, what: str) -> int:
    packet_id = reader.u16(f"{what}'s packet identifier")
    if packet_id == 0:
        raise protocol_error(f"{what} has packet identifier 0")
    return packet_id


def _check_qos(qos: int, what: str) -> int:
    if qos > 2:
        raise malformed(f"{what} has QoS {qos}")
    return qos


FIXED_FLAGS = {PacketType.PUBREL: 0b0010, PacketType.SUBSCRIBE: 0b0010, PacketType.UNSUBSCRIBE: 0b0010}


def decode(kind: int, flags: int, body: bytes, version: int | None) -> Packet:
    """One packet from its fixed header's type and flags and the rest of it. version: the protocol level of the
    connection's CONNECT (None before it: only a CONNECT decodes then)."""
    if kind == PacketType.PUBLISH and version is not None:
        return _publish(flags, body, 0, len(body), version == V5)
    if kind == 0:
        raise malformed("packet type 0 is reserved")
    kind = PacketType(kind)
    if kind != PacketType.PUBLISH and flags != FIXED_FLAGS.get(kind, 0):
        raise malformed(f"{kind.name} has fixed header flags {flags:04b}")
    if kind == PacketType.CONNECT:
        return _connect(_Reader(body))
    if version is None:
        raise protocol_error(f"{kind.name} before CONNECT")
    five = version == V5
    reader = _Reader(body)
    packet: Packet
    if kind in (PacketType.PUBACK, PacketType.PUBREC, PacketType.PUBREL, PacketType.PUBCOMP):
        packet_id = _packet_id(reader, kind.name)
        reason = reader.byte(f"{kind.name}'s reason code") if five and reader.left else Reason.SUCCESS
        properties = reader.properties(kind.name) if five and reader.left else {}
        packet = Ack(kind, packet_id, reason, properties)
    elif kind == PacketType.SUBSCRIBE:
        packet_id = _packet_id(reader, "SUBSCRIBE")
        properties = reader.properties("SUBSCRIBE") if five else {}
        subscriptions = []
        while reader.left:
            topic_filter = reader.string("SUBSCRIBE's topic filter")
            options = reader.byte("SUBSCRIBE's options")
            if options & (0b11000000 if five else 0b11111100):
                raise malformed(f"SUBSCRIBE's options {options:08b} set reserved bits")
            if (options >> 4) & 0b11 == 3:
                raise protocol_error("SUBSCRIBE's retain handling is 3")
            subscriptions.append(Subscription(topic_filter, _check_qos(options & 0b11, "SUBSCRIBE"),
                                              bool(options & 0b100), bool(options & 0b1000), (options >> 4) & 0b11))
        if not subscriptions:
            raise protocol_error("SUBSCRIBE without a topic filter")
        packet = Subscribe(packet_id, subscriptions, properties)
    elif kind == PacketType.UNSUBSCRIBE:
        packet_id = _packet_id(reader, "UNSUBSCRIBE")
        properties = reader.properties("UNSUBSCRIBE") if five else {}
        filters = []
        while reader.left:
            filters.append(reader.string("UNSUBSCRIBE's topic filter"))
        if not filters:
            raise protocol_error("UNSUBSCRIBE without a topic filter")
        packet = Unsubscribe(packet_id, filters, properties)
    elif kind in (PacketType.SUBACK, PacketType.UNSUBACK):
        packet_id = _packet_id(reader, kind.name)
        properties = reader.properties(kind.name) if five else {}
        reasons = list(reader.take(reader.left, "reason codes"))
        packet = (SubAck if kind == PacketType.SUBACK else UnsubAck)(packet_id, reasons, properties)
    elif kind == PacketType.CONNACK:
        acknowledge = reader.byte("CONNACK's flags")
        if acknowledge & 0xFE:
            raise malformed(f"CONNACK's flags {acknowledge:08b} set reserved bits")
        reason = reader.byte("CONNACK's reason code")
        packet = ConnAck(reason, bool(acknowledge & 1), reader.properties("CONNACK") if five else {})
    elif kind == PacketType.PINGREQ:
        packet = PingReq()
    elif kind == PacketType.PINGRESP:
        packet = PingResp()
    elif kind == PacketType.DISCONNECT:
        reason = reader.byte("DISCONNECT's reason code") if five and reader.left else Reason.SUCCESS
        packet = Disconnect(reason, reader.properties("DISCONNECT") if five and reader.left else {})
    else:
        if not five:
            raise protocol_error("AUTH in MQTT 3.1.1")
        reason = reader.byte("AUTH's reason code") if reader.left else Reason.SUCCESS
        packet = Auth(reason, reader.properties("AUTH") if reader.left else {})
    reader.done(kind.name)
    return packet


def _publish(flags: int, data: bytes | bytearray, at: int, end: int, five: bool) -> Publish:
    """PUBLISH, a device's every message, from data[at:end] (the decoder's buffer): read in place, without a _Reader's
    calls unless it has properties."""
    qos = _check_qos((flags >> 1) & 0b11, "PUBLISH")
    if qos == 0 and flags & 0b1000:
        raise malformed("PUBLISH at QoS 0 has its DUP flag set")
    topic_end = at + 2 + (data[at] << 8 | data[at + 1]) if end - at >= 2 else end + 1
    if topic_end > end:
        raise malformed("PUBLISH's topic name runs past the packet's end")
    try:
        topic = data[at + 2:topic_end].decode("utf-8")
    except UnicodeDecodeError:
        raise malformed("PUBLISH's topic name is not valid UTF-8") from None
    if "\x00" in topic:
        raise malformed("PUBLISH's topic name holds the null character")
    at = topic_end
    packet_id = 0
    if qos:
        if at + 2 > end:
            raise malformed("PUBLISH's packet identifier runs past the packet's end")
        packet_id = data[at] << 8 | data[at + 1]
        if not packet_id:
            raise protocol_error("PUBLISH has packet identifier 0")
        at += 2
    properties: dict[str, Any] = {}
    if five:
        if at < end and data[at] == 0:  # no properties: most publishes
            at += 1
        else:
            reader = _Reader(bytes(data[at:end]))
            properties = reader.properties("PUBLISH")
            at += reader.at
    return Publish(topic, bytes(data[at:end]), qos, flags & 1 == 1, flags & 0b1000 != 0, packet_id, properties)


def _connect(reader: _Reader) -> Connect:
    name = reader.string("CONNECT's protocol name")
    level = reader.byte("CONNECT's protocol level")
    if name != "MQTT" or level not in (V311, V5):
        raise MqttError(Reason.UNSUPPORTED_PROTOCOL_VERSION, f"protocol {name!r} level {level}: rocket speaks MQTT "
                                                             "3.1.1 (level 4) and 5.0 (level 5)")
    flags = reader.byte("CONNECT's flags")
    if flags & 1:
        raise malformed("CONNECT's reserved flag is set")
    will_flag, will_qos, will_retain = bool(flags & 0b100), (flags >> 3) & 0b11, bool(flags & 0b100000)
    if not will_flag and (will_qos or will_retain):
        raise malformed("CONNECT has a will QoS or retain without a will")
    _check_qos(will_qos, "CONNECT's will")
    has_username, has_password = bool(flags & 0x80), bool(flags & 0x40)
    if level == V311 and has_password and not has_username:
        raise malformed("CONNECT has a password without a user name")
    keep_alive = reader.u16("CONNECT's keep alive")
    properties = reader.properties("CONNECT") if level == V5 else {}
    client_id = reader.string("CONNECT's client identifier")
    will = None
    if will_flag:
        will_properties = reader.properties("CONNECT's will") if level == V5 else {}
        will = Will(reader.string("CONNECT's will topic"), reader.binary("CONNECT's will payload"), will_qos,
                    will_retain, will_properties)
    username = reader.string("CONNECT's user name") if has_username else None
    password = reader.binary("CONNECT's password") if has_password else None
    reader.done("CONNECT")
    return Connect(client_id, level, bool(flags & 0b10), keep_alive, username, password, will, properties)


class Decoder:
    """Bytes in (feed), whole packets out (packets). A packet longer than packet_bytes_max is PACKET_TOO_LARGE as
    soon as its length is read, before its body arrives, so memory follows what arrived of one packet at most."""

    def __init__(self, packet_bytes_max: int = limits.mqtt_packet_bytes_max, version: int | None = None):
        self.packet_bytes_max = packet_bytes_max
        self.version = version  # the protocol level, from the CONNECT decoded (or given, on a client)
        self._buffer = bytearray()

    @property
    def buffered_bytes(self) -> int:
        return len(self._buffer)

    def feed(self, data: bytes | bytearray) -> list[Packet]:
        buffer = self._buffer
        buffer += data
        found: list[Packet] = []
        start, end = 0, len(buffer)
        short = self.packet_bytes_max > 129  # then a length of one byte is within the limit
        version = self.version
        five = version == V5
        try:
            while start + 1 < end:
                if buffer[start + 1] < 0x80 and short:  # a length of one byte: most packets
                    length, at = buffer[start + 1], start + 2
                else:
                    length, at = self._length(start)
                    if length is None:
                        break
                if end < at + length:
                    break
                first = buffer[start]
                if first & 0xF0 == _PUBLISH_HEAD and version is not None:  # most packets: read in place
                    found.append(_publish(first & 0x0F, buffer, at, at + length, five))
                    start = at + length
                    continue
                packet = decode(first >> 4, first & 0x0F, bytes(buffer[at:at + length]), version)
                start = at + length
                if isinstance(packet, Connect):
                    if version is not None:
                        raise protocol_error("a second CONNECT")
                    self.version = version = packet.protocol_level
                    five = version == V5
                found.append(packet)
        finally:
            del buffer[:start]
        return found

    def _length(self, start: int) -> tuple[int | None, int]:
        """The remaining length of the packet at start and where its body starts, or (None, 0) while the length is
        not all here."""
        try:
            length, at = read_varint(self._buffer, start + 1, "the remaining length")
        except MqttError:
            if len(self._buffer) - start < 5 and all(byte & 0x80 for byte in self._buffer[start + 1:]):
                return None, 0  # more bytes of the length to come
            raise
        if at - start + length > self.packet_bytes_max:
            raise MqttError(Reason.PACKET_TOO_LARGE, f"a packet of {at - start + length} bytes is more than the "
                                                     f"{self.packet_bytes_max} allowed")
        return length, at


# ---- writing


def write_varint(value: int) -> bytes:
    if not 0 <= value <= 268_435_455:
        raise ValueError(f"{value} does not fit a variable byte integer")
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _binary(data: bytes) -> bytes:
    if len(data) > 0xFFFF:
        raise ValueError(f"{len(data)} bytes do not fit a length-prefixed field")
    return _u16.pack(len(data)) + data


def _string(text: str) -> bytes:
    return _binary(text.encode("utf-8"))


def _properties(properties: dict[str, Any]) -> bytes:
    out = bytearray()
    for name, value in properties.items():
        identifier, kind = _PROPERTY_IDS[name]
        for each in (value if name in REPEATABLE else [value]):
            out += write_varint(identifier)
            if kind == "byte":
                out.append(each)
            elif kind == "u16":
                out += _u16.pack(each)
            elif kind == "u32":
                out += _u32.pack(each)
            elif kind == "varint":
                out += write_varint(each)
            elif kind == "str":
                out += _string(each)
            elif kind == "bin":
                out += _binary(each)
            else:
                out += _string(each[0]) + _string(each[1])
    return write_varint(len(out)) + bytes(out)


def encode(packet: Packet, version: int = V5) -> bytes:
    """The packet's bytes, for a connection at protocol level version (a CONNECT's own level wins)."""
    five = version == V5
    flags = 0
    body: bytes
    if isinstance(packet, Connect):
        five = packet.protocol_level == V5
        will = packet.will
        connect_flags = ((0b10 if packet.clean_start else 0) | (0x80 if packet.username is not None else 0)
                         | (0x40 if packet.password is not None else 0))
        if will is not None:
            connect_flags |= 0b100 | (will.qos << 3) | (0b100000 if will.retain else 0)
        parts = [_string("MQTT"), bytes([packet.protocol_level, connect_flags]), _u16.pack(packet.keep_alive)]
        if five:
            parts.append(_properties(packet.properties))
        parts.append(_string(packet.client_id))
        if will is not None:
            parts += [_properties(will.properties)] if five else []
            parts += [_string(will.topic), _binary(will.payload)]
        if packet.username is not None:
            parts.append(_string(packet.username))
        if packet.password is not None:
            parts.append(_binary(packet.password))
        kind, body = PacketType.CONNECT, b"".join(parts)
    elif isinstance(packet, ConnAck):
        body = bytes([1 if packet.session_present else 0, packet.reason])
        kind, body = PacketType.CONNACK, body + (_properties(packet.properties) if five else b"")
    elif isinstance(packet, Publish):
        flags = (0b1000 if packet.dup else 0) | (packet.qos << 1) | (1 if packet.retain else 0)
        head = _string(packet.topic) + (_u16.pack(packet.packet_id) if packet.qos else b"")
        kind, body = PacketType.PUBLISH, head + (_properties(packet.properties) if five else b"") + packet.payload
    elif isinstance(packet, Ack):
        kind, flags = packet.kind, FIXED_FLAGS.get(packet.kind, 0)
        body = _u16.pack(packet.packet_id)
        if five and (packet.reason != Reason.SUCCESS or packet.properties):
            body += bytes([packet.reason]) + (_properties(packet.properties) if packet.properties else b"")
    elif isinstance(packet, Subscribe):
        kind, flags = PacketType.SUBSCRIBE, FIXED_FLAGS[PacketType.SUBSCRIBE]
        body = _u16.pack(packet.packet_id) + (_properties(packet.properties) if five else b"") + b"".join(
            _string(each.topic_filter) + bytes([each.qos | (0b100 if each.no_local else 0)
                                                | (0b1000 if each.retain_as_published else 0)
                                                | (each.retain_handling << 4)])
            for each in packet.subscriptions)
    elif isinstance(packet, Unsubscribe):
        kind, flags = PacketType.UNSUBSCRIBE, FIXED_FLAGS[PacketType.UNSUBSCRIBE]
        body = _u16.pack(packet.packet_id) + (_properties(packet.properties) if five else b"") + b"".join(
            _string(each) for each in packet.topic_filters)
    elif isinstance(packet, (SubAck, UnsubAck)):
        kind = PacketType.SUBACK if isinstance(packet, SubAck) else PacketType.UNSUBACK
        reasons = packet.reasons if five or kind == PacketType.SUBACK else []
        body = _u16.pack(packet.packet_id) + (_properties(packet.properties) if five else b"") + bytes(reasons)
    elif isinstance(packet, (PingReq, PingResp)):
        kind, body = (PacketType.PINGREQ if isinstance(packet, PingReq) else PacketType.PINGRESP), b""
    elif isinstance(packet, Disconnect):
        kind = PacketType.DISCONNECT
        body = b""
        if five and (packet.reason != Reason.SUCCESS or packet.properties):
            body = bytes([packet.reason]) + _properties(packet.properties)
    else:
        kind = PacketType.AUTH
        body = b""
        if packet.reason != Reason.SUCCESS or packet.properties:
            body = bytes([packet.reason]) + _properties(packet.properties)
    return bytes([(kind << 4) | flags]) + write_varint(len(body)) + body


def valid_topic_name(name: str) -> bool:
    """A PUBLISH's topic: not empty, no wildcard (MQTT 4.7.3)."""
    return bool(name) and "+" not in name and "#" not in name


def valid_topic_filter(topic_filter: str) -> bool:
    """A SUBSCRIBE's filter: '#' alone in the last level, '+' alone in a level (MQTT 4.7.1)."""
    if not topic_filter:
        return False
    levels = topic_filter.split("/")
    for index, level in enumerate(levels):
        if "#" in level and (level != "#" or index != len(levels) - 1):
            return False
        if "+" in level and level != "+":
            return False
    return True


def matches(topic_filter: str, topic: str) -> bool:
    """Whether a topic name matches a (valid) filter; topics starting with '$' match no filter starting with a
    wildcard (MQTT 4.7.2)."""
    filter_levels, topic_levels = topic_filter.split("/"), topic.split("/")
    if topic.startswith("$") and filter_levels[0] in ("+", "#"):
        return False
    for index, level in enumerate(filter_levels):
        if level == "#":
            return True
        if index >= len(topic_levels) or (level != "+" and level != topic_levels[index]):
            return False
    return len(filter_levels) == len(topic_levels)
