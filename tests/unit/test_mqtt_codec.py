"""The MQTT codec (rocket/gateway/mqtt/codec.py): every packet of both protocol levels round-trips, bytes split
anywhere decode the same, hostile bytes are an MqttError with a reason code and nothing else, a length past the limit
is refused before its body arrives, and topic filters match as MQTT 4.7 says."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rocket.gateway.mqtt.codec import (V5, V311, Ack, Auth, ConnAck, Connect, Decoder, Disconnect, MqttError,
                                       PacketType, PingReq, PingResp, Publish, Reason, SubAck, Subscribe,
                                       Subscription, UnsubAck, Unsubscribe, Will, encode, matches, valid_topic_filter,
                                       write_varint)

texts = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=20)
packet_ids = st.integers(1, 65535)
payloads = st.binary(max_size=300)


def properties_for(version: int, *names_and_strategies):
    """A properties strategy: empty in 3.1.1; in 5.0 some of the named properties."""
    if version != V5:
        return st.just({})
    return st.fixed_dictionaries({}, optional=dict(names_and_strategies))


def packets(version: int):
    user = ("user_property", st.lists(st.tuples(texts, texts), min_size=1, max_size=3))
    reason = ("reason_string", texts)
    will = st.builds(Will, texts.filter(bool), payloads, st.integers(0, 2), st.booleans(),
                     properties_for(version, ("will_delay_interval", st.integers(0, 2**32 - 1)), user))
    return st.one_of(
        st.builds(Connect, texts, st.just(version), st.booleans(), st.integers(0, 65535),
                  st.none() | texts, st.none() | st.binary(max_size=20), st.none() | will,
                  properties_for(version, ("session_expiry_interval", st.integers(0, 2**32 - 1)),
                                 ("receive_maximum", st.integers(1, 65535)), user)).filter(
            lambda connect: version == V5 or connect.password is None or connect.username is not None),
        st.builds(ConnAck, st.integers(0, 5) if version == V311 else st.sampled_from(list(Reason)), st.booleans(),
                  properties_for(version, ("assigned_client_identifier", texts), ("topic_alias_maximum",
                                                                                   st.integers(0, 65535)), reason)),
        st.builds(lambda topic, payload, qos, retain, dup, packet_id, properties: Publish(
            topic, payload, qos, retain, dup and qos > 0, packet_id if qos else 0, properties),
            texts.filter(bool), payloads, st.integers(0, 2), st.booleans(), st.booleans(), packet_ids,
            properties_for(version, ("message_expiry_interval", st.integers(0, 2**32 - 1)),
                           ("topic_alias", st.integers(1, 65535)), ("correlation_data", st.binary(max_size=10)),
                           ("subscription_identifier", st.lists(st.integers(1, 268_435_455), min_size=1,
                                                                max_size=2)), user)),
        st.builds(lambda kind, packet_id, reason, properties: Ack(kind, packet_id, reason if version == V5 else 0,
                                                                  properties),
                  st.sampled_from([PacketType.PUBACK, PacketType.PUBREC, PacketType.PUBREL, PacketType.PUBCOMP]),
                  packet_ids, st.sampled_from([0, 0x10, 0x80, 0x92]), properties_for(version, reason)),
        st.builds(Subscribe, packet_ids, st.lists(st.builds(
            Subscription, texts, st.integers(0, 2), *(
                [st.booleans(), st.booleans(), st.integers(0, 2)] if version == V5 else
                [st.just(False), st.just(False), st.just(0)])), min_size=1, max_size=4),
            properties_for(version, ("subscription_identifier", st.lists(st.integers(1, 1000), min_size=1,
                                                                         max_size=1)), user)),
        st.builds(SubAck, packet_ids, st.lists(st.sampled_from([0, 1, 2, 0x80]), min_size=1, max_size=4),
                  properties_for(version, reason)),
        st.builds(Unsubscribe, packet_ids, st.lists(texts, min_size=1, max_size=4), properties_for(version, user)),
        st.builds(UnsubAck, packet_ids, st.lists(st.sampled_from([0, 0x11]), min_size=1, max_size=4)
                  if version == V5 else st.just([]), properties_for(version, reason)),
        st.builds(PingReq), st.builds(PingResp),
        st.builds(Disconnect, st.sampled_from([0, 4, 0x8E]) if version == V5 else st.just(0),
                  properties_for(version, reason)),
        *([st.builds(Auth, st.sampled_from([0, 0x18, 0x19]), properties_for(version, ("authentication_method",
                                                                                       texts)))]
          if version == V5 else []))


def connected(version: int) -> Decoder:
    return Decoder(version=version)


@settings(max_examples=300)
@given(st.sampled_from([V311, V5]).flatmap(lambda version: st.tuples(st.just(version), packets(version))))
def test_every_packet_round_trips(case):
    version, packet = case
    decoder = Decoder() if isinstance(packet, Connect) else connected(version)
    assert decoder.feed(encode(packet, version)) == [packet]


@settings(max_examples=100)
@given(st.sampled_from([V311, V5]).flatmap(
    lambda version: st.tuples(st.just(version), st.lists(packets(version).filter(
        lambda packet: not isinstance(packet, Connect)), min_size=1, max_size=5))), st.data())
def test_bytes_split_anywhere_decode_the_same(case, data):
    version, sent = case
    stream = b"".join(encode(packet, version) for packet in sent)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=6)))
    decoder = connected(version)
    received = []
    for start, end in zip([0, *cuts], [*cuts, len(stream)]):
        received += decoder.feed(stream[start:end])
    assert received == sent and decoder.buffered_bytes == 0


@settings(max_examples=500)
@given(st.sampled_from([None, V311, V5]), st.binary(max_size=200))
def test_hostile_bytes_are_an_mqtt_error_or_packets(version, data):
    decoder = Decoder(packet_bytes_max=1000, version=version)
    try:
        decoder.feed(data)
    except MqttError as error:
        assert isinstance(error.reason, Reason) and error.message and "\n" not in error.message
    assert decoder.buffered_bytes <= len(data)


def test_a_length_past_the_limit_is_refused_before_its_body():
    decoder = Decoder(packet_bytes_max=1000, version=V5)
    header = bytes([PacketType.PUBLISH << 4]) + write_varint(10_000)
    with pytest.raises(MqttError) as caught:
        decoder.feed(header)
    assert caught.value.reason == Reason.PACKET_TOO_LARGE


@pytest.mark.parametrize("data, reason", [
    (bytes([0x10, 0x05]) + b"\x00\x03MQT", Reason.MALFORMED_PACKET),  # CONNECT cut inside its protocol name
    (bytes([0x10, 0x07]) + b"\x00\x04MQTT\x03", Reason.UNSUPPORTED_PROTOCOL_VERSION),  # MQTT 3.1's level
    (bytes([0x30, 0x02]) + b"\x00\x00", Reason.PROTOCOL_ERROR),  # PUBLISH before CONNECT
    (bytes([0x00, 0x00]), Reason.MALFORMED_PACKET),  # reserved packet type 0
    (bytes([0x10, 0xFF, 0xFF, 0xFF, 0xFF, 0x7F]), Reason.MALFORMED_PACKET),  # a 5-byte remaining length
])
def test_malformed_input_names_its_reason(data, reason):
    with pytest.raises(MqttError) as caught:
        Decoder().feed(data)
    assert caught.value.reason == reason, caught.value


def test_a_second_connect_and_bad_fields_are_refused():
    decoder = Decoder()
    decoder.feed(encode(Connect("a", V311)))
    with pytest.raises(MqttError) as caught:
        decoder.feed(encode(Connect("a", V311)))
    assert caught.value.reason == Reason.PROTOCOL_ERROR
    with pytest.raises(MqttError) as caught:  # QoS 3
        connected(V311).feed(bytes([0x36, 0x05]) + b"\x00\x01a\x00\x01")
    assert caught.value.reason == Reason.MALFORMED_PACKET
    with pytest.raises(MqttError) as caught:  # packet identifier 0
        connected(V311).feed(encode(Ack(PacketType.PUBACK, 1))[:2] + b"\x00\x00")
    assert caught.value.reason == Reason.PROTOCOL_ERROR
    with pytest.raises(MqttError) as caught:  # SUBSCRIBE with flags 0000
        connected(V311).feed(bytes([0x80]) + encode(Subscribe(1, [Subscription("a")]), V311)[1:])
    assert caught.value.reason == Reason.MALFORMED_PACKET
    with pytest.raises(MqttError) as caught:  # message expiry twice
        connected(V5).feed(bytes([0x30, 0x0E]) + b"\x00\x01a" + b"\x0a" + b"\x02\x00\x00\x00\x01" * 2)
    assert caught.value.reason == Reason.PROTOCOL_ERROR
    with pytest.raises(MqttError) as caught:  # a property past the property length
        connected(V5).feed(bytes([0x30, 0x08]) + b"\x00\x01a" + b"\x02" + b"\x23\x00\x01" + b"x")
    assert caught.value.reason == Reason.MALFORMED_PACKET


@pytest.mark.parametrize("topic_filter, topic, expected", [
    ("sport/tennis/#", "sport/tennis/player1/ranking", True), ("sport/tennis/#", "sport/tennis", True),
    ("sport/#", "sport", True), ("#", "anything/at/all", True), ("sport/+/player1", "sport/tennis/player1", True),
    ("sport/+", "sport/", True), ("+/+", "/finance", True), ("+", "/finance", False),
    ("sport/+", "sport/tennis/x", False), ("#", "$SYS/broker", False), ("+/monitor", "$SYS/monitor", False),
    ("$SYS/#", "$SYS/broker", True), ("a/b", "a/b", True), ("a/b", "a/c", False),
])
def test_filters_match_as_mqtt_says(topic_filter, topic, expected):
    assert valid_topic_filter(topic_filter)
    assert matches(topic_filter, topic) == expected


@pytest.mark.parametrize("topic_filter", ["", "sport/tennis#", "sport/#/ranking", "sport+", "a/b+/c"])
def test_invalid_filters(topic_filter):
    assert not valid_topic_filter(topic_filter)
