"""RPC serdes: every message type round-trips in JSON and Avro, and bad bodies get stable codes."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rocket.errors import Code, RocketError
from rocket.serde import avro_codec, json_codec, schema

SERDES = [json_codec, avro_codec]

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


def test_every_schema_loads():
    """Every .avsc file parses and has a JSON walker."""
    for name in schema.known_types():
        schema.avro_schema(name)


def test_missing_field_names_the_field():
    """JSON without a required field gets BAD_REQUEST naming it; defaults fill optional ones."""
    with pytest.raises(RocketError) as caught:
        json_codec.decode("ProduceRequest", b'{"topic": "t"}')
    assert caught.value.code == Code.BAD_REQUEST and "batch" in caught.value.message
    assert json_codec.decode("CreateTopicRequest", b'{"topic": "t"}') == {"topic": "t", "queues": 8, "message_type": "normal",
                                                                          "storage_class": "raft"}


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
