"""Namespaces: names within one, as stored (NS%name, system names wrapping theirs as RocketMQ's clients wrap them) and
as seen from within it again; a dead-letter topic's parts; the client's NamespacedChannel; namespaced policies and
quotas; the gRPC gateway's Resource rewriting."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rocket.access import check_resource
from rocket.client.namespaced import NamespacedChannel
from rocket.errors import Code, RocketError
from rocket.model import (check_namespace, dead_letter_parts, dead_letter_topic, in_namespace, outside_namespace,
                          timer_topic)
from rocket.quotas import Quotas, check_entity
from rocket.transport.grpc_wire import GrpcError, GrpcStatus
from rocket.transport.local import MockChannel

plain = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789-_.", min_size=1, max_size=12)


@given(namespace=plain, group=plain, topic=plain)
def test_names_go_into_a_namespace_and_come_back_out(namespace, group, topic):
    for name in (topic, dead_letter_topic(group, topic), "%RETRY%" + group, timer_topic(topic), "%KV%" + topic):
        stored = in_namespace(namespace, name)
        assert outside_namespace(namespace, stored) == name
        assert in_namespace(namespace, stored) == stored  # wrapped once only
        assert outside_namespace(namespace + "x", stored) is None  # another namespace does not see it
    assert dead_letter_parts(in_namespace(namespace, dead_letter_topic(group, topic))) == (
        f"{namespace}%{group}", f"{namespace}%{topic}")
    assert in_namespace("", topic) == outside_namespace("", topic) == topic  # the default namespace keeps names


def test_a_namespace_is_a_plain_name():
    assert check_namespace("payments") == "payments" and check_namespace("") == ""
    for bad in ("a%b", "%x", "a b", "x" * 65):
        with pytest.raises(RocketError) as refused:
            check_namespace(bad)
        assert refused.value.code == Code.BAD_REQUEST


async def test_a_namespaced_channel_names_and_lists_within_its_namespace():
    channel = MockChannel({
        "DescribeTopic": lambda message: {"topic": {"name": message["topic"], "queues": 1}, "queues": []},
        "ListTopics": lambda message: {"topics": [{"name": "a%orders"}, {"name": "b%orders"}, {"name": "orders"}]},
        "Produce": lambda message: {"queue": 0, "base_offset": 0, "count": 1},
        "Handover": lambda message: {"master": message["to"], "master_epoch": 1, "sync_state_set": [],
                                     "sync_state_set_epoch": 1},
    })
    within = NamespacedChannel(channel, "a")
    assert (await within.call("DescribeTopic", {"topic": "orders"}))["topic"]["name"] == "orders"
    assert channel.messages("DescribeTopic") == [{"topic": "a%orders"}]
    assert [topic["name"] for topic in (await within.call("ListTopics", {}))["topics"]] == ["orders"]
    await within.call("Produce", {"topic": "orders", "queue": 0, "batch": b""})
    assert channel.messages("Produce")[0]["topic"] == "a%orders"
    await within.call("Handover", {"group": 5, "to": 2})  # a storage group's number is not a name
    assert channel.messages("Handover") == [{"group": 5, "to": 2}]


async def test_an_error_names_what_it_names_as_seen_from_within_the_namespace():
    def missing(message: dict) -> dict:
        raise RocketError(Code.UNKNOWN_TOPIC, f"topic {message['topic']!r} does not exist")

    within = NamespacedChannel(MockChannel({"DescribeTopic": missing}), "a")
    with pytest.raises(RocketError) as refused:
        await within.call("DescribeTopic", {"topic": "orders"})
    assert (refused.value.code, refused.value.message) == (Code.UNKNOWN_TOPIC, "topic 'orders' does not exist")


def test_policies_and_quotas_may_name_a_namespace():
    assert check_resource("namespace:payments/topic:orders-*") == "topic:payments%orders-*"
    assert check_resource("namespace:payments/group:billing") == "group:payments%billing"
    assert check_entity("namespace:payments/topic:orders") == "topic:payments%orders"
    assert check_entity("namespace:payments") == "namespace:payments"
    for bad in ("namespace:payments", "namespace:a%b/topic:x", "namespace:/topic:x"):
        with pytest.raises(RocketError):
            check_resource(bad)
    now = [0.0]
    quotas = Quotas(lambda: now[0])
    quotas.update([{"entity": "namespace:payments", "produce_bytes_per_s": 1000, "consume_bytes_per_s": 0,
                    "requests_per_s": 0}])
    assert quotas.charge(None, "payments%orders", produced=1000) == 0  # the burst
    assert quotas.charge(None, "payments%refunds", produced=1000) > 0  # one bucket for the whole namespace
    assert quotas.charge(None, "orders", produced=10_000) == 0  # the default namespace is not in it


def test_the_grpc_gateway_rewrites_every_resource_of_a_request_and_its_answer():
    from rocket.gateway.rocketmq.namespace import into_namespace, out_of_namespace
    from rocket.gateway.rocketmq.protocol import load_protocol
    loaded = load_protocol()
    if loaded is None:
        pytest.skip("needs rocketmq-python-client's protocol (pip install -e '.[test]')")
    definition, service = loaded
    request = service.QueryRouteRequest(topic=definition.Resource(name="orders"))
    into_namespace(request, "a")
    assert request.topic.name == "a%orders"
    answer = service.QueryRouteResponse(message_queues=[definition.MessageQueue(
        topic=definition.Resource(name="a%orders"))])
    out_of_namespace(answer, "a")
    assert (answer.message_queues[0].topic.name, answer.message_queues[0].topic.resource_namespace) == ("orders", "a")
    failed = service.QueryRouteResponse(status=definition.Status(code=40402, message="topic 'a%orders' does not exist"))
    out_of_namespace(failed, "a")
    assert failed.status.message == "topic 'orders' does not exist"
    with pytest.raises(GrpcError) as refused:
        into_namespace(service.QueryRouteRequest(topic=definition.Resource(name="x", resource_namespace="a%b")), "")
    assert refused.value.status == GrpcStatus.INVALID_ARGUMENT and "namespace" in str(refused.value)
