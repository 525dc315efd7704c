"""The lane (rocket/serde/lane.py): its layouts read back what Avro reads back, for every lane type and any message
that fits; garbage gets a stable code; an older peer's layouts are read into this version's messages."""

import math
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rocket.errors import Code, RocketError
from rocket.serde import SERDE_IDS, avro_codec, json_codec, lane, schema
from rocket.serde.versions import for_peer, spoken

_simple = {"int": st.integers(-(2**31), 2**31 - 1), "long": st.integers(-(2**63), 2**63 - 1),
           "string": st.text(max_size=8), "boolean": st.booleans(), "bytes": st.binary(max_size=12),
           "double": st.floats(allow_nan=False), "float": st.floats(width=32, allow_nan=False)}


def _fitting(type_schema):
    """Messages that fit a schema: every field present (Avro and the lane both fill defaults the same way)."""
    if isinstance(type_schema, str):
        if type_schema in _simple:
            return _simple[type_schema]
        return st.deferred(lambda: _fitting(schema.raw_definitions()[schema.full_name(type_schema)]))
    if type_schema["type"] == "array":
        return st.lists(_fitting(type_schema["items"]), max_size=3)
    if type_schema["type"] == "record":
        return st.fixed_dictionaries({field["name"]: _fitting(field["type"]) for field in type_schema["fields"]})
    return _fitting(type_schema["type"])


def test_every_lane_type_is_laid_out():
    """None of the hot types falls back to Avro unnoticed: each has a layout."""
    assert {name for name in lane.LANE_TYPES if lane.current().laid_out(name)} == lane.LANE_TYPES
    assert not lane.current().laid_out("CreateTopicRequest")
    assert SERDE_IDS[3] is lane


@pytest.mark.parametrize("type_name", sorted(lane.LANE_TYPES))
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_the_lane_reads_back_what_avro_reads_back(type_name, data):
    """Differential: any message that fits the type decodes from the lane as it decodes from Avro."""
    message = data.draw(_fitting(schema.raw_definitions()[schema.full_name(type_name)]))
    expected = avro_codec.decode(type_name, avro_codec.encode(type_name, message))
    got = lane.decode(type_name, lane.encode(type_name, message))
    assert got == expected or _same_with_nans(got, expected)


def _same_with_nans(left, right) -> bool:
    if isinstance(left, float) and isinstance(right, float):
        return left == right or (math.isnan(left) and math.isnan(right))
    if isinstance(left, dict):
        return left.keys() == right.keys() and all(_same_with_nans(left[key], right[key]) for key in left)
    if isinstance(left, list):
        return len(left) == len(right) and all(map(_same_with_nans, left, right))
    return left == right


def test_produce_request_layout_is_the_documented_one():
    """The layout the module's docstring gives: scalars, then lengths, then the variable fields, big-endian."""
    message = {"topic": "orders", "queue": 3, "batch": b"\x01\x02", "producer_id": 9, "sequence": 4}
    assert lane.encode("ProduceRequest", message) == struct.pack(">iqqII", 3, 9, 4, 6, 2) + b"orders\x01\x02"
    assert lane.encode("Empty", {}) == b""


@pytest.mark.parametrize("type_name", sorted(lane.LANE_TYPES))
@settings(max_examples=120, deadline=None)
@given(data=st.binary(max_size=120))
def test_random_bodies_get_undecodable(type_name, data):
    """Arbitrary bytes decode or fail with UNDECODABLE, never another exception, and never a count that makes it
    loop past the body."""
    try:
        lane.decode(type_name, data)
    except RocketError as error:
        assert error.code == Code.UNDECODABLE


def test_truncated_and_padded_bodies_are_refused():
    body = lane.encode("StorageAppendRequest", {"group": 1, "topic": "t", "queue": 0, "batch": b"abc"})
    for cut in range(len(body)):
        with pytest.raises(RocketError) as caught:
            lane.decode("StorageAppendRequest", body[:cut])
        assert caught.value.code == Code.UNDECODABLE
    with pytest.raises(RocketError, match="1 bytes follow") as caught:
        lane.decode("StorageAppendRequest", body + b"\0")
    huge_count = struct.pack(">qI", 0, 2**32 - 1)  # KvTxnResponse: revision... an array of 4 billion items
    with pytest.raises(RocketError):
        lane.decode("KvTxnResponse", b"\x01" + huge_count)
    with pytest.raises(RocketError, match="not UTF-8"):
        lane.decode("KvGetRequest", struct.pack(">q?II", 0, False, 1, 0) + b"\xff")


@pytest.mark.parametrize("message", [
    {"topic": 5, "queue": 0, "batch": b""},  # not a string
    {"topic": "t", "queue": 2**31, "batch": b""},  # past an int
    {"topic": "t", "queue": 0, "batch": "text"},  # not bytes
    {"queue": 0, "batch": b""},  # a field without a default missing
])
def test_messages_that_do_not_fit_get_bad_request(message):
    with pytest.raises(RocketError) as caught:
        lane.encode("ProduceRequest", message)
    assert caught.value.code == Code.BAD_REQUEST


def test_a_boolean_must_be_a_boolean():
    with pytest.raises(RocketError) as caught:
        lane.encode("KvGetRequest", {"bucket": "b", "key": "k", "serializable": 1})
    assert caught.value.code == Code.BAD_REQUEST


def test_other_types_are_avro():
    message = {"topic": "t", "queues": 4, "message_type": "normal", "storage_class": "raft"}
    assert lane.encode("CreateTopicRequest", message) == avro_codec.encode("CreateTopicRequest", message)


def test_an_older_peers_layout_is_read_with_the_fields_it_lacks_defaulted():
    """Schema resolution as Avro does it: a peer whose record lacks a field writes without it and is read with the
    field's default; this side writes to it without the field."""
    reader = {"rocket.v1.Thing": {"type": "record", "name": "Thing", "namespace": "rocket.v1", "fields": [
        {"name": "a", "type": "long"}, {"name": "name", "type": "string"},
        {"name": "b", "type": "int", "default": 7}, {"name": "c", "type": "bytes", "default": "\u00ff"}]}}
    older = {"rocket.v1.Thing": {**reader["rocket.v1.Thing"], "fields": reader["rocket.v1.Thing"]["fields"][:2]}}
    lane_types = lane.LANE_TYPES
    try:
        lane.LANE_TYPES = frozenset({"Thing"})
        old_peer = lane.Lane(lane.layouts_of(older, reader), avro_codec)
        same = lane.Lane(lane.layouts_of(reader, reader), avro_codec)
    finally:
        lane.LANE_TYPES = lane_types
    written = old_peer.encode("Thing", {"a": 1, "name": "x", "b": 3, "c": b"z"})
    assert written == struct.pack(">qI", 1, 1) + b"x"
    assert old_peer.decode("Thing", written) == {"a": 1, "name": "x", "b": 7, "c": b"\xff"}
    assert same.decode("Thing", same.encode("Thing", {"a": 1, "name": "x"})) == {"a": 1, "name": "x", "b": 7,
                                                                               "c": b"\xff"}


def test_a_client_speaks_the_lane_only_to_a_server_that_knows_it():
    assert spoken(lane, lane.LANE_SINCE_SCHEMA) is lane
    assert spoken(lane, lane.LANE_SINCE_SCHEMA - 1) is avro_codec
    assert spoken(json_codec, 1) is json_codec
    # A server reads a lane frame in the lane whatever version its sender said (only a lane client sends one).
    assert for_peer(lane, 1) is lane


async def _serve(nursery, dispatcher) -> int:
    from rocket.transport.lifecycle import Lifecycle
    from rocket.transport.tcp import serve_tcp

    return await nursery.start(lambda task_status: serve_tcp(dispatcher, Lifecycle(), "127.0.0.1", 0,
                                                             task_status=task_status))


@pytest.mark.parametrize("server_version", [lane.LANE_SINCE_SCHEMA, lane.LANE_SINCE_SCHEMA - 1])
async def test_a_lane_channel_speaks_the_lane_after_hello_and_avro_to_an_older_server(nursery, monkeypatch,
                                                                                     server_version):
    """Over a real socket: the client's frames carry serde 3 once Hello said the server knows the lane, and serde 2
    (Avro) to a server of an older schema version; either way the call works."""
    from rocket.transport import frames
    from rocket.transport.rpc import Dispatcher
    from rocket.transport.tcp_client import open_tcp_channel

    dispatcher = Dispatcher()
    seen = []

    async def produce(request: dict) -> dict:
        return {"queue": request["queue"], "base_offset": len(request["batch"]), "count": 1}

    async def hello(request: dict) -> dict:
        return {"schema_version": server_version, "version": "test"}
    dispatcher.handle("Produce", produce)
    dispatcher._handlers["Hello"] = hello
    decode = frames.FrameDecoder._parse

    def parse(self, frame):
        parsed = decode(self, frame)
        seen.append((parsed.method, parsed.serde))
        return parsed
    monkeypatch.setattr(frames.FrameDecoder, "_parse", parse)
    port = await _serve(nursery, dispatcher)
    async with open_tcp_channel("127.0.0.1", port, "lane") as channel:
        answer = await channel.call("Produce", {"topic": "t", "queue": 2, "batch": b"abc"})
    assert answer == {"queue": 2, "base_offset": 3, "count": 1, "scheduled": False, "throttle_ms": 0}
    requests = [entry for entry in seen if entry[0]]  # answers have no method
    assert requests == [("Hello", 2), ("Produce", 3 if server_version >= lane.LANE_SINCE_SCHEMA else 2)]
