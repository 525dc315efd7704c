"""The RocketMQ gateways' pulled messages: a batch that cannot be read is BAD_BATCH naming its queue and offsets."""

from __future__ import annotations

import pytest

from rocket.errors import Code, RocketError
from rocket.filter import compile_filter
from rocket.gateway.reads import matching
from rocket.model import Message
from rocket.serde import batch as batch_codec


def test_a_batch_that_cannot_be_read_is_bad_batch_with_its_queue_and_offsets():
    good = batch_codec.encode([Message(b"m0")], 1)
    payload = b"\x91\x95\xc4\x01x\xa2\xff\xfe\xa0\x80\x01"  # one record whose key is not UTF-8
    poison = batch_codec._seal(0, 1, 1, 1, 0, payload)
    response = {"batches": [{"queue": 2, "base_offset": 7, "batch": good},
                            {"queue": 2, "base_offset": 8, "batch": poison}], "next_offsets": []}
    with pytest.raises(RocketError) as caught:
        matching(response, 2, 7, compile_filter("tag", "*"), 10)
    assert caught.value.code == Code.BAD_BATCH
    assert caught.value.message.startswith("queue 2, offsets 8-8: malformed records: record 0 field key")
    found, _ = matching({"batches": response["batches"][:1], "next_offsets": []}, 2, 7, compile_filter("tag", "*"), 10)
    assert [m.body for m in found] == [b"m0"]
