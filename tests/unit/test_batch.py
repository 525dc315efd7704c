"""The produce batch codec: round trips, the delimited fast path, and checks on damaged batches."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rocket.errors import Code, RocketError
from rocket.model import Message
from rocket.serde import batch

texts = st.text(alphabet=st.characters(blacklist_characters="\0", blacklist_categories=("Cs",)), max_size=20)
messages = st.builds(
    Message,
    body=st.binary(max_size=300),
    key=texts,
    tag=texts,
    properties=st.dictionaries(texts.filter(lambda name: name and name != batch.DELIVER_AT_PROPERTY), texts, max_size=4),
    timestamp_ms=st.integers(1_700_000_000_000, 1_700_000_000_000 + 2**30),  # one batch spans < 24 days
    deliver_at_ms=st.one_of(st.just(0), st.integers(1, 10**17)),
)


@given(st.lists(messages, min_size=1, max_size=30), st.integers(0, 2**40))
def test_encode_decode_round_trip(originals, base_offset):
    """Every field of every message survives encoding, and offsets number from the base."""
    encoded = batch.encode(originals, 1)
    header = batch.check_header(encoded)
    assert header.count == len(originals)
    decoded = batch.decode(encoded, base_offset, 3)
    for index, (original, copy) in enumerate(zip(originals, decoded, strict=True)):
        assert (copy.body, copy.key, copy.tag, copy.properties) == (original.body, original.key, original.tag, original.properties)
        assert (copy.timestamp_ms, copy.deliver_at_ms) == (original.timestamp_ms, original.deliver_at_ms)
        assert (copy.queue, copy.offset) == (3, base_offset + index)
    assert batch.bodies(encoded) == batch.bodies(memoryview(encoded)) == [message.body for message in originals]
    assert bool(header.flags & batch.FLAG_TIMED) == any(message.deliver_at_ms for message in originals)
    for message in originals:
        if message.tag:
            assert header.tag_summary & batch.tag_bit(message.tag)


def test_messages_do_not_share_their_default_properties():
    first, second = Message(b"a"), Message(b"b")
    first.properties["name"] = "value"
    assert second.properties == {} and Message(b"c").properties == {}


def test_lines_fast_path():
    """A chunk of lines becomes one batch whose messages are the lines, empty ones included."""
    encoded = batch.encode_lines(b"a\n\nccc\n", 5)
    assert batch.peek_count(encoded) == 3
    assert [m.body for m in batch.decode(encoded)] == batch.bodies(encoded) == [b"a", b"", b"ccc"]


readers = pytest.mark.parametrize("read", [batch.decode, batch.bodies])


@readers
@settings(max_examples=300)
@given(st.lists(messages, min_size=1, max_size=5), st.data())
def test_any_flipped_byte_is_caught(read, originals, data):
    """Changing any single byte of a batch makes check_header refuse it with BAD_BATCH."""
    encoded = bytearray(batch.encode(originals, 1))
    position = data.draw(st.integers(0, len(encoded) - 1))
    encoded[position] ^= data.draw(st.integers(1, 255))
    with pytest.raises(RocketError) as caught:
        read(bytes(encoded))
    assert caught.value.code == Code.BAD_BATCH


@readers
@settings(max_examples=500)
@given(st.binary(max_size=600))
def test_random_bytes_are_refused_cleanly(read, data):
    """Arbitrary bytes are refused with BAD_BATCH, never another exception."""
    with pytest.raises(RocketError) as caught:
        read(data)
    assert caught.value.code == Code.BAD_BATCH


@readers
@given(st.lists(messages, min_size=1, max_size=5), st.integers(1, 2**31), st.booleans())
def test_records_that_disagree_with_the_header_are_refused(read, originals, excess, overrun):
    """A batch whose CRC is right but whose records overrun it or leave bytes over is refused with BAD_BATCH:
    the checksum covers the bytes, not their sense."""
    import struct

    encoded = bytearray(batch.encode(originals, 1))
    if overrun:  # the first body claims more bytes than the batch has
        struct.pack_into("<I", encoded, batch.HEADER_BYTES, len(encoded) + excess)
    else:  # bytes after the last message, counted in the header's payload length
        encoded += bytes(excess % 64 + 1)
        struct.pack_into("<I", encoded, batch._header.size - 8, len(encoded) - batch.HEADER_BYTES)
    covered = batch._crc_covered_header
    struct.pack_into("<I", encoded, covered, batch.crc32c(encoded[batch.HEADER_BYTES:], batch.crc32c(encoded[:covered])))
    with pytest.raises(RocketError) as caught:
        read(bytes(encoded))
    assert caught.value.code == Code.BAD_BATCH
    assert ("past the end" if overrun else "follow the last message") in caught.value.message


def test_the_delivery_time_property_is_reserved():
    """A user property may not pose as the delivery time: only deliver_at_ms sets it."""
    with pytest.raises(RocketError) as caught:
        batch.encode([Message(b"x", properties={batch.DELIVER_AT_PROPERTY: "1"})], 1)
    assert caught.value.code == Code.BAD_REQUEST


def test_version_1_batches_with_zlib_crc_still_check_and_decode():
    """Batches written before CRC-32C (version 1, zlib's CRC-32: a client or stored data from before) check
    and decode; their CRC is not taken for a version 2 one's, nor the other way round."""
    import struct
    import zlib

    current = batch.encode([Message(b"one", key="k"), Message(b"two", tag="t")], 1)
    assert struct.unpack_from("<HB", current) == (batch.MAGIC, 2)
    legacy = bytearray(current)
    legacy[2] = 1  # the version byte
    covered, crc_at = batch._crc_covered_header, batch._crc_covered_header
    struct.pack_into("<I", legacy, crc_at, zlib.crc32(legacy[batch.HEADER_BYTES:], zlib.crc32(legacy[:covered])))
    assert [m.body for m in batch.decode(bytes(legacy), 0)] == [b"one", b"two"]
    assert batch.check_header(bytes(legacy)).count == 2
    for relabelled, version in ((bytearray(legacy), 2), (bytearray(current), 1)):
        relabelled[2] = version
        with pytest.raises(RocketError) as caught:
            batch.check_header(bytes(relabelled))
        assert caught.value.code == Code.BAD_BATCH and "checksum" in caught.value.message
