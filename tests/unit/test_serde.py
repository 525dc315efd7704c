"""RPC serdes: every message type round-trips in JSON and Avro, and bad bodies get stable codes."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rocket.errors import Code, RocketError
from rocket.serde import avro_codec, json_codec, lane, schema

SERDES = [json_codec, avro_codec, lane]

pull_responses = st.fixed_dictionaries({
    "batches": st.lists(st.fixed_dictionaries({
        "queue": st.integers(0, 2**31 - 1), "base_offset": st.integers(0, 2**63 - 1), "batch": st.binary(max_size=100),
    }), max_size=5),
    "next_offsets": st.lists(st.fixed_dictionaries({"queue": st.integers(0, 1000), "offset": st.integers(0, 2**62)}), max_size=5),
    "throttle_ms": st.integers(0, 2**31),
})


@pytest.mark.parametrize("serde", SERDES, ids=lambda s: s.name)
@given(message=pull_responses)
def test_pull_response_round_trips(serde, message):
    """A message with nested arrays and bytes decodes to what was encoded."""
    assert serde.decode("PullResponse", serde.encode("PullResponse", message)) == message


@pytest.mark.parametrize("serde", SERDES, ids=lambda s: s.name)
def test_produce_request_round_trips(serde):
    """Bytes fields survive both serdes."""
    message = {"topic": "orders", "queue": -1, "batch": bytes(range(256)), "producer_id": 2**63 - 1, "sequence": 7}
    assert serde.decode("ProduceRequest", serde.encode("ProduceRequest", message)) == message


@pytest.mark.parametrize("serde", SERDES, ids=lambda s: s.name)
def test_no_wire_request_says_its_batch_was_written_in_the_brokers_process(serde):
    """A Produce's "records" (batch.WRITTEN_HERE: the broker checks only the header of a batch a gateway in its own
    process encoded) is no field of the schema: a request from the wire never carries it, whatever it sends."""
    message = {"topic": "orders", "queue": -1, "batch": b"not a batch", "producer_id": 0, "sequence": 0,
               "records": "written here"}
    assert "records" not in serde.decode("ProduceRequest", serde.encode("ProduceRequest", message))
    assert "records" not in json_codec.decode("ProduceRequest", b'{"topic": "t", "batch": "", "records": 1}')


def test_every_schema_loads():
    """Every .avsc file parses and has a JSON walker."""
    for name in schema.known_types():
        schema.avro_schema(name)


def test_missing_field_names_the_field():
    """JSON without a required field gets BAD_REQUEST naming it; defaults fill optional ones."""
    with pytest.raises(RocketError) as caught:
        json_codec.decode("ProduceRequest", b'{"topic": "t"}')
    assert caught.value.code == Code.BAD_REQUEST and "batch" in caught.value.message
    assert json_codec.decode("CreateTopicRequest", b'{"topic": "t"}') == {
        "topic": "t", "queues": 8, "message_type": "normal", "storage_class": "raft", "retention_s": -1,
        "local_retention_s": -1, "request_id": "", "read_replicas": 0}


@pytest.mark.parametrize("serde", SERDES, ids=lambda s: s.name)
@settings(max_examples=300)
@given(data=st.binary(max_size=200))
def test_random_bodies_get_stable_codes(serde, data):
    """Arbitrary bytes decode or fail with UNDECODABLE or BAD_REQUEST, never another exception."""
    for type_name in ("ProduceRequest", "PullRequest", "CommitOffsetsRequest"):
        try:
            serde.decode(type_name, data)
        except RocketError as error:
            assert error.code in (Code.UNDECODABLE, Code.BAD_REQUEST)


_junk = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), st.text(max_size=5),
                  st.binary(max_size=5), st.lists(st.integers(), max_size=2), st.dictionaries(st.text(max_size=3),
                                                                                             st.integers(), max_size=2))


def _values(type_schema, decoding: bool, depth: int = 0):
    """Values for a schema as the JSON codec meets them (decoding: parsed JSON; else a handler's dict), most of them
    fitting, some not (junk in a field, a field left out, a key the schema does not know)."""
    if isinstance(type_schema, str):
        simple = {"int": st.integers(-(2**31) - 1, 2**31), "long": st.integers(-(2**63) - 1, 2**63),
                  "string": st.text(max_size=8), "boolean": st.booleans(), "double": st.floats(allow_nan=False),
                  "float": st.floats(allow_nan=False),
                  "bytes": st.binary(max_size=8).map(lambda b: __import__("base64").b64encode(b).decode())
                  if decoding else st.binary(max_size=8)}
        if type_schema in simple:
            return st.one_of(simple[type_schema], _junk) if depth else simple[type_schema]
        if depth > 3:
            return _junk
        return _values(schema.raw_definitions()[schema.full_name(type_schema)], decoding, depth + 1)
    if isinstance(type_schema, list):  # a union (no RPC message has one; the walk does not know them)
        return st.one_of(*(_values(branch, decoding, depth + 1) for branch in type_schema if branch != "null"))
    kind = type_schema["type"]
    if kind == "array":
        return st.lists(_values(type_schema["items"], decoding, depth + 1), max_size=3)
    if kind == "map":  # the same
        return st.dictionaries(st.text(max_size=3), _values(type_schema["values"], decoding, depth + 1), max_size=2)
    if kind == "record":
        fields = {field["name"]: _values(field["type"], decoding, depth + 1) for field in type_schema["fields"]}
        return st.fixed_dictionaries({}, optional={**fields, "unknown": _junk})
    return _values(kind, decoding, depth)


@pytest.mark.parametrize("type_name", schema.known_types())
@pytest.mark.parametrize("decoding", [True, False], ids=["decode", "encode"])
@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_the_compiled_json_walk_does_what_the_walk_does(type_name, decoding, data):
    """JSON's schema walk is compiled once per type (schema._compiled): it must give what the interpreting walk gives,
    and fail where it fails (then the walk, run again, names the field)."""
    definition = schema.raw_definitions()[schema.full_name(type_name)]
    value = data.draw(_values(definition, decoding))
    try:
        expected = schema._walk(definition, value, "", decoding=decoding)
    except Exception as error:
        expected = type(error)
    try:
        got = schema._compiled(schema.full_name(type_name), decoding)(value)
    except Exception:  # to_json_ready and from_json_ready run the walk then: its result or its error is theirs
        got = "failed"
    if isinstance(expected, type):
        assert got == "failed"
    else:
        assert got == expected  # and a message that fits takes the compiled path
