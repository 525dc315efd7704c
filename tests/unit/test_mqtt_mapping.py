"""The MQTT gateway's mapping (issue 57): topics to a rocket topic and tag, filters to a topic and consumer group,
messages both ways with MQTT 5's properties, and a persistent session's record."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rocket.gateway.mqtt.codec import matches
from rocket.gateway.mqtt.mapping import (MQTT_TOPIC, mqtt_topic, parse_filter, published_qos, queue_of, rocket_topic,
                                         session_group, to_message, to_publish)
from rocket.gateway.mqtt.packets import V5, V311, MqttError, Publish, Reason, Subscription
from rocket.gateway.mqtt.session import Session
from rocket.model import Message, check_group_name
from rocket.serde import batch as batch_codec

NOW_MS = 1_800_000_000_000
level = st.text(st.characters(blacklist_characters="/+#\0", blacklist_categories=("Cs",)), min_size=1, max_size=12)
topic_names = st.builds(lambda first, rest: "/".join([first, *rest]), st.from_regex(r"[a-z][a-z0-9._-]{0,10}",
                                                                                    fullmatch=True),
                        st.lists(level, max_size=4))


def test_the_first_level_names_the_rocket_topic_and_the_rest_is_the_tag():
    message = to_message(Publish("sensors/room1/temp", b"21.5", 1), "dev-1", NOW_MS)
    assert rocket_topic("sensors/room1/temp") == "sensors"
    assert (message.tag, message.properties) == ("room1/temp", {"mqtt.client": "dev-1"})  # the tag tells the topic
    for topic in ("sensors/", "sensors/" + "x" * 300):
        assert to_message(Publish(topic, b""), "dev-1", NOW_MS).properties[MQTT_TOPIC] == topic
    assert mqtt_topic(Message(b"x", tag="room2/temp"), "sensors") == "sensors/room2/temp"
    assert mqtt_topic(Message(b"x"), "sensors") == "sensors"
    with pytest.raises(MqttError) as refused:
        rocket_topic("bad topic/x")
    assert refused.value.reason == Reason.TOPIC_NAME_INVALID


@given(topic_names, st.binary(max_size=64), st.integers(0, 2),
       st.lists(st.tuples(st.from_regex(r"[a-z]{1,8}", fullmatch=True),
                          st.text(st.characters(blacklist_characters="\0", blacklist_categories=("Cs",)), max_size=8)),
                max_size=3))  # the codec refuses NUL in any string
def test_a_message_published_comes_back_as_published(topic, payload, qos, users):
    publish = Publish(topic, payload, qos, properties={"user_property": users, "content_type": "text/plain",
                                                      "correlation_data": b"\x00\xffid"})
    stored = batch_codec.decode(batch_codec.encode([to_message(publish, "c", NOW_MS)], NOW_MS), 0, 0)[0]
    back = to_publish(stored, rocket_topic(topic), qos, V5, NOW_MS)
    assert back is not None
    assert (back.topic, back.payload, back.qos) == (topic, payload, qos)
    assert back.properties.get("user_property", []) == list(dict(users).items())
    assert back.properties["content_type"] == "text/plain" and back.properties["correlation_data"] == b"\x00\xffid"
    assert published_qos(stored) == qos
    assert to_publish(stored, rocket_topic(topic), qos, V311, NOW_MS).properties == {}  # none in 3.1.1


@given(st.lists(st.tuples(st.one_of(topic_names, topic_names.map(lambda name: name + "/"),
                                   topic_names.map(lambda name: name + "/" + "x" * 300)),
                         st.integers(0, 2), st.booleans(), st.booleans()), min_size=1, max_size=8))
def test_messages_sharing_one_properties_dict_are_stored_as_each_with_its_own(publishes):
    """to_message's shared dict (the gateway's, for a turn's publishes) changes nothing stored, and a batch's
    encoder, which checks a dict once for all the messages holding it, refuses nothing it took before."""
    made = [Publish(topic, b"x", qos, retain, properties={"content_type": "t"} if typed else {})
            for topic, qos, retain, typed in publishes]
    shared = {"mqtt.client": "dev-1"}
    alone = [to_message(publish, "dev-1", NOW_MS) for publish in made]
    together = [to_message(publish, "dev-1", NOW_MS, shared) for publish in made]
    assert together == alone
    assert batch_codec.decode(batch_codec.encode(together, NOW_MS), 0, 0) == \
        batch_codec.decode(batch_codec.encode(alone, NOW_MS), 0, 0)


def test_one_topic_for_all_takes_every_mqtt_topic_whole_as_its_tag():
    """mqtt_topic: every MQTT topic lies in the one rocket topic, whole as its tag, and any filter names that topic,
    wildcards in its first level too; a message sent over rocket's API with tag T arrives on T."""
    message = to_message(Publish("dev-1/room1/temp", b"21.5", 1), "dev-1", NOW_MS, whole=True)
    assert (message.tag, message.properties) == ("dev-1/room1/temp", {"mqtt.client": "dev-1"})
    assert rocket_topic("dev-1/room1/temp", "iot", "devices") == "iot%devices"
    assert mqtt_topic(message, "devices", whole=True) == "dev-1/room1/temp"
    assert mqtt_topic(Message(b"x", tag="dev-2/temp"), "devices", whole=True) == "dev-2/temp"
    assert mqtt_topic(Message(b"x"), "devices", whole=True) == "devices"
    long = "dev-1/" + "x" * 300
    assert to_message(Publish(long, b""), "dev-1", NOW_MS, whole=True).properties[MQTT_TOPIC] == long
    for text in ("+/temp", "#", "$share/crew/+/temp"):
        found = parse_filter(text, "iot", "devices")
        assert (found.topic, found.first) == ("iot%devices", "devices")
    assert parse_filter("+/temp", "", "devices").literal == "" and parse_filter("a/b/+/c").literal == "a/b"
    with pytest.raises(MqttError) as refused:
        parse_filter("+/temp")  # without one topic, the first level names the topic
    assert refused.value.reason == Reason.WILDCARD_SUBSCRIPTIONS_NOT_SUPPORTED


@given(topic_names, st.binary(max_size=16), st.integers(0, 2))
def test_with_one_topic_a_message_published_comes_back_on_its_topic(topic, payload, qos):
    publish = Publish(topic, payload, qos)
    stored = batch_codec.decode(batch_codec.encode([to_message(publish, "c", NOW_MS, whole=True)], NOW_MS), 0, 0)[0]
    back = to_publish(stored, "devices", qos, V5, NOW_MS, whole=True)
    assert back is not None and (back.topic, back.payload, back.qos) == (topic, payload, qos)


def test_expired_messages_are_not_delivered_and_the_rest_carry_what_is_left():
    message = to_message(Publish("s/x", b"", 1, properties={"message_expiry_interval": 10}), "c", NOW_MS)
    assert to_publish(message, "s", 1, V5, NOW_MS + 4_000).properties["message_expiry_interval"] == 6
    assert to_publish(message, "s", 1, V5, NOW_MS + 10_000) is None


def test_user_properties_may_not_take_rockets_names():
    for name in ("mqtt.topic", "__rmq.keys", ""):
        with pytest.raises(MqttError):
            to_message(Publish("s/x", b"", properties={"user_property": [(name, "v")]}), "c", NOW_MS)


def test_filters_map_to_a_topic_and_a_group():
    plain = parse_filter("sensors/+/temp")
    assert (plain.topic, plain.share, plain.group("dev-1")) == ("sensors", "", "mqtt-dev-1")
    shared = parse_filter("$share/workers/sensors/#")
    assert (shared.topic_filter, shared.topic, shared.group("dev-1")) == ("sensors/#", "sensors", "workers")
    wildcard = Reason.WILDCARD_SUBSCRIPTIONS_NOT_SUPPORTED
    for text, reason in (("#", wildcard), ("+/x", wildcard), ("$share/bad name/s/x", Reason.TOPIC_FILTER_INVALID),
                         ("no topic/x", Reason.TOPIC_NAME_INVALID)):
        with pytest.raises(MqttError) as refused:
            parse_filter(text)
        assert refused.value.reason == reason, text


@given(st.text(min_size=1, max_size=300))
def test_every_client_id_has_a_valid_group_of_its_own(client_id):
    group = session_group(client_id)
    assert check_group_name(group) == group
    assert session_group(client_id) == group


@given(st.text(max_size=40), topic_names)
def test_one_client_always_publishes_to_one_queue(client_id, topic):
    assert queue_of(client_id, 8) == queue_of(client_id, 8) and 0 <= queue_of(client_id, 8) < 8
    assert matches(topic, topic)


def test_a_session_record_round_trips():
    session = Session("dev-1", 3600, received=dict.fromkeys((3, 9)), released={4: None}, unreleased={"sensors mqtt-dev-1 0 17": 5})
    for text, qos in (("sensors/#", 1), ("$share/g/plant/+", 2)):
        session.subscriptions[text] = (parse_filter(text), Subscription(text, qos, retain_handling=1))
    again = Session.from_record("dev-1", session.to_record())
    assert again == session
