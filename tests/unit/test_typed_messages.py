"""The typed messages (rocket/serde/typed.py) are the .avsc records of the same name, field for field: names in
order, types and defaults; and a typed handler converts its request and answer both ways."""

from __future__ import annotations

import functools

import msgspec
import pytest

from rocket.clock import Clock
from rocket.errors import Code, RocketError
from rocket.model import TopicSpec, bucket_topic
from rocket.roles.broker.role import Broker
from rocket.serde import schema, typed
from rocket.transport.rpc import Dispatcher

AVRO_TYPES = {"string": str, "boolean": bool, "int": int, "long": int, "float": float, "double": float, "bytes": bytes}


def python_type(avro) -> object:
    """The Python type a Struct field has for an Avro field type."""
    if isinstance(avro, list):  # a union: ["null", X] is X | None
        members = [python_type(member) for member in avro if member != "null"]
        assert len(members) == 1, avro
        return members[0] | None if "null" in avro else members[0]
    if isinstance(avro, dict):
        if avro["type"] == "array":
            return list[python_type(avro["items"])]
        if avro["type"] == "record":  # defined inline, in another record's .avsc: its Struct
            return typed.STRUCTS[avro["name"]]
        return python_type(avro["type"])
    if avro in AVRO_TYPES:
        return AVRO_TYPES[avro]
    return typed.STRUCTS[avro.rpartition(".")[2]]  # a named record: its Struct


@functools.cache
def records() -> dict[str, dict]:
    """Every record by its full name: each .avsc file's, and those defined inline in it (in its namespace)."""
    found: dict[str, dict] = {}

    def walk(avro, namespace: str) -> None:
        if isinstance(avro, list):
            for member in avro:
                walk(member, namespace)
        elif isinstance(avro, dict) and avro["type"] == "record":
            namespace = avro.get("namespace", namespace)
            assert f"{namespace}.{avro['name']}" not in found, avro["name"]  # a name means one record
            found[f"{namespace}.{avro['name']}"] = avro
            for field in avro["fields"]:
                walk(field["type"], namespace)
        elif isinstance(avro, dict) and avro["type"] == "array":
            walk(avro["items"], namespace)
    for definition in schema.raw_definitions().values():
        walk(definition, schema.NAMESPACE)
    return found


def default_of(field: msgspec.structs.FieldInfo) -> object:
    if field.default is not msgspec.NODEFAULT:
        return field.default
    if field.default_factory is not msgspec.NODEFAULT:
        return field.default_factory()
    return "-"


@pytest.mark.parametrize("name", sorted(typed.STRUCTS))
def test_each_struct_is_its_avsc_record_field_for_field(name):
    record = records()[f"{schema.NAMESPACE}.{name}"]
    fields = msgspec.structs.fields(typed.STRUCTS[name])
    assert [field.name for field in fields] == [field["name"] for field in record["fields"]]
    for field, avro in zip(fields, record["fields"]):
        assert field.type == python_type(avro["type"]), (name, field.name)
        assert default_of(field) == avro.get("default", "-"), (name, field.name)


async def test_a_typed_handler_takes_and_answers_the_plain_form():
    dispatcher, seen = Dispatcher(), []

    async def grant(request: typed.AclPolicy) -> typed.AclPolicy:
        seen.append(request)
        return typed.AclPolicy(request.user, request.resource, ["pub"])
    dispatcher.handle_typed("AclGrant", grant)
    answer = await dispatcher.local("AclGrant", {"user": "alice", "resource": "topic:orders", "actions": ["sub"],
                                                 "effect": "allow", "cidrs": []})
    assert seen == [typed.AclPolicy("alice", "topic:orders", ["sub"])]
    assert answer == {"user": "alice", "resource": "topic:orders", "actions": ["pub"], "effect": "allow", "cidrs": []}
    with pytest.raises(RocketError) as refused:
        await dispatcher.local("AclGrant", {"user": 7, "resource": "topic:orders"})
    assert refused.value.code == Code.BAD_REQUEST and "$.user" in refused.value.message
    with pytest.raises(KeyError):  # a method whose messages have no Struct cannot be typed
        dispatcher.handle_typed("Produce", grant)


class Nameservers:
    """A broker's peers: the nameservers' answers, in the plain form, as over the wire."""

    def __init__(self):
        self.asked: list[tuple[str, dict]] = []

    async def nameserver(self, method: str, request: dict, timeout_s: float = 0.0) -> dict:
        self.asked.append((method, request))
        if method == "MetaCreateTopic":
            return TopicSpec(request["topic"], request["queues"], 7).to_wire()
        if method == "MetaListTopics":
            return {"topics": [TopicSpec("orders", 2, 5).to_wire(),
                               TopicSpec(bucket_topic("cfg"), 1, 6, message_type="kv", history=3).to_wire()]}
        raise RocketError(Code.UNKNOWN_GROUP, "no settings")


async def test_the_brokers_typed_admin_calls_answer_local_callers_in_the_plain_form():
    """A gateway or the console calls the broker's admin methods in the plain form and gets it back; the nameservers
    are asked in it too, every field given."""
    dispatcher, nameservers = Dispatcher(), Nameservers()
    Broker(nameservers, ("broker",), Clock()).register(dispatcher, forward_status=False)
    orders = TopicSpec("orders", 2, 5).to_wire()
    assert await dispatcher.local("CreateTopic", {"topic": "jobs", "queues": 3}) == TopicSpec("jobs", 3, 7).to_wire()
    assert await dispatcher.local("ListTopics", {}) == {"topics": [orders]}  # not the KV bucket's
    assert await dispatcher.local("KvListBuckets", {}) == {
        "buckets": [{"name": "cfg", "shards": 1, "history": 3, "ttl_ms": 0, "created_ms": 6}]}
    assert await dispatcher.local("GroupSettings", {"group": "billing"}) == {
        "group": "billing", "max_attempts": 0, "retry_backoff_s": [], "consume_mode": "clustering", "fifo": False}
    assert nameservers.asked == [
        ("MetaCreateTopic", {"topic": "jobs", "queues": 3, "message_type": "normal", "storage_class": "raft",
                             "retention_s": -1, "local_retention_s": -1, "request_id": "", "read_replicas": 0}),
        ("MetaListTopics", {}), ("MetaListTopics", {}), ("MetaConsumerGroups", {"group": "billing"})]
    with pytest.raises(RocketError) as refused:
        await dispatcher.local("CreateTopic", {"queues": 3})
    assert refused.value.code == Code.BAD_REQUEST and len(nameservers.asked) == 4
