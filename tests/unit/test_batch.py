"""The produce batch codec: round trips, the delimited fast path, and checks on damaged batches."""

import struct
import zlib

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rocket.errors import Code, RocketError
from rocket.model import Message
from rocket.serde import batch

texts = st.text(alphabet=st.characters(blacklist_characters="\0", blacklist_categories=("Cs",)), max_size=20)


def messages_stamped(timestamps: st.SearchStrategy[int]) -> st.SearchStrategy[Message]:
    return st.builds(
        Message,
        body=st.binary(max_size=300),
        key=texts,
        tag=texts,
        properties=st.dictionaries(texts.filter(lambda name: name and name != batch.DELIVER_AT_PROPERTY), texts,
                                   max_size=4),
        timestamp_ms=timestamps,
        deliver_at_ms=st.one_of(st.just(0), st.integers(1, 10**17)),
    )


messages = messages_stamped(st.integers(1, 2**63 - 1))  # 0 is "stamp it now"
legacy_messages = messages_stamped(st.integers(1_700_000_000_000, 1_700_000_000_000 + 2**30))  # a 32-bit delta each


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


def legacy(originals: list[Message], version: int = 2, timestamp_ms: int = 1) -> bytes:
    """A batch as versions 1 and 2 wrote it: records with a fixed head of lengths, the delivery time a
    property, and for version 1 zlib's CRC-32."""
    stamps = [m.timestamp_ms or timestamp_ms for m in originals]
    records, tags, flags = [], 0, 0
    for message, stamp in zip(originals, stamps):
        properties = dict(message.properties)
        if message.deliver_at_ms:
            properties[batch.DELIVER_AT_PROPERTY] = str(message.deliver_at_ms)
            flags = batch.FLAG_TIMED
        key, tag = message.key.encode(), message.tag.encode()
        packed = "\0".join(part for pair in properties.items() for part in pair).encode()
        records += [batch._record.pack(len(message.body), len(key), len(tag), len(packed), stamp - min(stamps)),
                    key, tag, packed, message.body]
        tags |= batch.tag_bit(message.tag) if message.tag else 0
    return seal(b"".join(records), len(originals), version, flags, tags, min(stamps), max(stamps))


def seal(payload: bytes, count: int, version: int = batch.VERSION, flags: int = 0, tags: int = 0, first_ms: int = 1,
         last_ms: int = 1) -> bytes:
    """A header with a right CRC over any payload: the checksum covers bytes, not their sense."""
    head = bytearray(batch._header.pack(batch.MAGIC, version, flags, count, first_ms, last_ms, tags, len(payload), 0))
    checksum = zlib.crc32 if version == 1 else batch.crc32c
    covered = batch._crc_covered_header
    struct.pack_into("<I", head, covered, checksum(payload, checksum(bytes(head[:covered]))))
    return bytes(head) + payload


@given(st.lists(legacy_messages, min_size=1, max_size=30), st.integers(0, 2**40), st.sampled_from([1, 2]))
def test_batches_of_earlier_versions_still_decode(originals, base_offset, version):
    """Stored data and clients from before version 3 write fixed-head records; they read as they were."""
    encoded = legacy(originals, version)
    assert batch.check_header(encoded).version == version
    decoded = batch.decode(encoded, base_offset, 3)
    assert decoded == [Message(m.body, m.key, m.tag, m.properties, m.timestamp_ms, 3, base_offset + index,
                               m.deliver_at_ms) for index, m in enumerate(originals)]
    assert batch.bodies(encoded) == [message.body for message in originals]


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
@given(st.lists(legacy_messages, min_size=1, max_size=5), st.integers(1, 2**31), st.booleans())
def test_legacy_records_that_disagree_with_the_header_are_refused(read, originals, excess, overrun):
    """A version 2 batch whose CRC is right but whose records overrun it or leave bytes over is refused
    with BAD_BATCH."""
    payload = bytearray(legacy(originals)[batch.HEADER_BYTES:])
    if overrun:  # the first body claims more bytes than the batch has
        struct.pack_into("<I", payload, 0, len(payload) + excess)
    else:  # bytes after the last message, counted in the header's payload length
        payload += bytes(excess % 64 + 1)
    with pytest.raises(RocketError) as caught:
        read(seal(bytes(payload), len(originals), version=2))
    assert caught.value.code == Code.BAD_BATCH
    assert ("past the end" if overrun else "follow the last message") in caught.value.message


msgpack_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.floats() | st.text(max_size=8)
    | st.binary(max_size=8),
    lambda inner: st.lists(inner, max_size=9) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=30)


@readers
@settings(max_examples=500)
@given(st.lists(msgpack_values, max_size=4), st.integers(1, 5))
def test_records_of_any_shape_are_read_or_refused_cleanly(read, records, count):
    """A version 3 payload with a right CRC but any msgpack in it reads, or is refused with BAD_BATCH:
    never another exception."""
    try:
        result = read(seal(msgspec.msgpack.encode(records), count))
    except RocketError as error:
        assert error.code == Code.BAD_BATCH
    else:
        assert len(result) == count == len(records)


one = [b"a", "", "", {}, 5]


@pytest.mark.parametrize("records, found, bodies_too", [
    (msgspec.msgpack.encode([one]) + b"\x00", "malformed records", True),  # bytes after the records
    (msgspec.msgpack.encode([one])[:-1], "malformed records", True),  # records cut short
    (msgspec.msgpack.encode([[b"a"], [b"b"]]), "holds 2 records, header says 1", True),
    (msgspec.msgpack.encode([["text body"]]), "malformed records", True),
    # fields after the body: a reader of bodies alone skips them
    (msgspec.msgpack.encode([[b"a", "", "", {}, -1]]), "malformed records", False),
    (msgspec.msgpack.encode([[b"a", "", "", {}, 5, -1, -1, -7]]), "malformed records", False),
    (msgspec.msgpack.encode([[b"a", "", "", {"n": 1}, 5]]), "malformed records", False),
])
def test_records_that_disagree_with_the_header_or_their_fields_are_refused(records, found, bodies_too):
    for read in (batch.decode, batch.bodies) if bodies_too else (batch.decode,):
        with pytest.raises(RocketError) as caught:
            read(seal(records, 1))
        assert caught.value.code == Code.BAD_BATCH and found in caught.value.message


class Plain(str):
    pass


@pytest.mark.parametrize("message", [
    Message("text body"),  # type: ignore[arg-type]
    Message(b"x", key=b"bytes key"),  # type: ignore[arg-type]
    Message(b"x", tag=7),  # type: ignore[arg-type]
    Message(b"x", key="\ud800"),
    Message(b"x", properties={"n": 1}),  # type: ignore[dict-item]
    Message(b"x", properties=None),  # type: ignore[arg-type]
    Message(b"x", properties={"n": Plain("v")}),
    Message(b"x", timestamp_ms=-5),
    Message(b"x", timestamp_ms=1.5),  # type: ignore[arg-type]
    Message(b"x", timestamp_ms=2**63),
    Message(b"x", deliver_at_ms=-5),
    Message(b"x", deliver_at_ms=1.5),  # type: ignore[arg-type]
])
def test_what_a_reader_could_not_decode_is_refused_at_encode(message):
    """A message the records could not carry, or a consumer could not read back, never reaches a queue."""
    with pytest.raises(RocketError) as caught:
        batch.encode([Message(b"fine"), message], 1)
    assert caught.value.code == Code.BAD_REQUEST


def test_subclasses_of_str_and_bytes_encode_as_plain_ones():
    encoded = batch.encode([Message(bytearray(b"body"), key=Plain("k"), tag=Plain("t"))], 1)  # type: ignore[arg-type]
    assert batch.decode(encoded) == [Message(b"body", "k", "t", {}, 1, -1, 0)]


def test_the_delivery_time_property_is_reserved():
    """A user property may not pose as the delivery time: only deliver_at_ms sets it."""
    with pytest.raises(RocketError) as caught:
        batch.encode([Message(b"x", properties={batch.DELIVER_AT_PROPERTY: "1"})], 1)
    assert caught.value.code == Code.BAD_REQUEST


def test_version_1_batches_with_zlib_crc_still_check_and_decode():
    """Batches written before CRC-32C (version 1, zlib's CRC-32: a client or stored data from before) check
    and decode; their CRC is not taken for a later version's, nor the other way round."""
    old = legacy([Message(b"one", key="k"), Message(b"two", tag="t")], version=1)
    assert [m.body for m in batch.decode(old, 0)] == [b"one", b"two"]
    current = batch.encode([Message(b"one", key="k"), Message(b"two", tag="t")], 1)
    assert struct.unpack_from("<HB", current) == (batch.MAGIC, 3)
    for relabelled, version in ((bytearray(old), 2), (bytearray(current), 1)):
        relabelled[2] = version
        with pytest.raises(RocketError) as caught:
            batch.check_header(bytes(relabelled))
        assert caught.value.code == Code.BAD_BATCH and "checksum" in caught.value.message


def test_readable_is_decode_or_none_for_a_batch_that_cannot_be_read():
    """readable() gives what decode() gives, and None where decode() refuses the batch with BAD_BATCH."""
    good = batch.encode([Message(b"a", key="k"), Message(b"b")], 5)
    assert batch.readable(good, 10, 2) == batch.decode(good, 10, 2)
    assert batch.readable(seal(msgspec.msgpack.encode([["text body"]]), 1)) is None
    assert batch.readable(good[:-1] + bytes([good[-1] ^ 1])) is None  # a checksum that fails


# ---- a poison batch (issue 35): a right CRC, and record fields that are not what a reader decodes ----------------

def _str_of(raw: bytes) -> bytes:
    """A msgpack str whose bytes are raw, UTF-8 or not (msgspec writes only valid ones)."""
    return (bytes([0xA0 | len(raw)]) if len(raw) < 32 else b"\xd9" + bytes([len(raw)])) + raw


def _array_of(items: list[bytes]) -> bytes:
    return bytes([0x90 | len(items)]) + b"".join(items)


def _map_of(pairs: list[tuple[bytes, bytes]]) -> bytes:
    return bytes([0x80 | len(pairs)]) + b"".join(name + value for name, value in pairs)


raw_strs = st.binary(max_size=12).map(_str_of)  # mostly not UTF-8
any_field = st.one_of(raw_strs, msgpack_values.map(msgspec.msgpack.encode),
                      st.lists(st.tuples(raw_strs | st.text(max_size=4).map(msgspec.msgpack.encode), raw_strs),
                               max_size=3).map(_map_of))


@st.composite
def poisoned_records(draw) -> tuple[bytes, int]:
    """A valid batch's records with random fields put in their place: any msgpack, and str whose bytes are
    anything (a key, a tag, a property name or value that is not UTF-8)."""
    originals = draw(st.lists(messages, min_size=1, max_size=4))
    records = []
    for message in originals:
        fields = [msgspec.msgpack.encode(value) for value in
                  (message.body, message.key, message.tag, message.properties, message.timestamp_ms or 1)]
        for _ in range(draw(st.integers(0, 3))):
            position = draw(st.integers(0, len(fields)))
            if position == len(fields) and len(fields) < 12:
                fields.append(draw(any_field))
            elif position < len(fields):
                fields[position] = draw(any_field)
        records.append(_array_of(fields))
    return _array_of(records), len(originals)


@settings(max_examples=1000)
@given(poisoned_records())
def test_random_record_fields_under_a_right_crc_are_read_or_refused_with_bad_batch(poisoned):
    """Every decode a reader uses (decode, readable, bodies) and the broker's check (check_produced) reads
    such a batch or refuses it with BAD_BATCH, never another exception; what the broker takes in, every
    reader can read."""
    payload, count = poisoned
    encoded = seal(payload, count)
    outcomes = {}
    for read in (batch.check_produced, batch.decode, batch.bodies, batch.readable):
        try:
            outcomes[read.__name__] = read(encoded)
        except RocketError as error:
            assert error.code == Code.BAD_BATCH, error
            outcomes[read.__name__] = None
    if outcomes["check_produced"] is not None:
        assert outcomes["decode"] is not None and outcomes["bodies"] is not None
    assert outcomes["readable"] == outcomes["decode"]


@pytest.mark.parametrize("record, where", [
    ([b"a", b"\xff\xfe"], "record 1 field key: not valid UTF-8"),
    ([b"a", b"", b"\xc3("], "record 1 field tag: not valid UTF-8"),
    ([b"a", b"", b"", {b"\xff": b"v"}], "record 1 field properties: not valid UTF-8"),
    ([b"a", b"", b"", {b"n": b"\xed\xa0\x80"}], "record 1 field properties: not valid UTF-8"),  # a surrogate
])
def test_a_str_that_is_not_utf8_is_bad_batch_naming_its_record_and_field(record, where):
    """Keys, tags and properties that are not UTF-8 are BAD_BATCH for every reader, never UnicodeDecodeError."""
    fields = [msgspec.msgpack.encode(record[0])]
    fields += [_map_of([(_str_of(k), _str_of(v)) for k, v in f.items()]) if isinstance(f, dict) else _str_of(f)
               for f in record[1:]]
    fields.append(msgspec.msgpack.encode(5))
    poisoned = seal(_array_of([msgspec.msgpack.encode([b"fine", "", "", {}, 5]), _array_of(fields)]), 2)
    for read in (batch.check_produced, batch.decode):
        with pytest.raises(RocketError) as caught:
            read(poisoned)
        assert caught.value.code == Code.BAD_BATCH and where in caught.value.message
    assert batch.readable(poisoned) is None
    assert batch.bodies(poisoned) == [b"fine", b"a"]  # a reader of bodies alone never decodes the rest


@given(st.lists(messages, min_size=1, max_size=30))
def test_what_encode_writes_passes_the_produce_check(originals):
    """What clients write (every field of any message) passes the broker's check."""
    assert batch.check_produced(batch.encode(originals, 1)).count == len(originals)


def test_the_produce_check_refuses_what_no_writer_writes():
    """Records longer than a writer writes (a receipt, an attempt), and delimited batches whose lines disagree
    with the header, are refused at produce; legacy batches are checked as they are read."""
    long = seal(msgspec.msgpack.encode([[b"a", "", "", {}, 5, -1, -1, 0, "1.2.3", 4]]), 1)
    assert batch.decode(long)[0].receipt == "1.2.3"  # a reader takes it
    with pytest.raises(RocketError) as caught:
        batch.check_produced(long)
    assert caught.value.code == Code.BAD_BATCH and "record 0 has 10 fields" in caught.value.message
    lines = batch.encode_lines(b"a\nb\n", 1)
    assert batch.check_produced(lines).count == 2
    assert batch.check_produced(memoryview(lines)).count == 2
    for payload, count in ((b"a\nb\n", 3), (b"a\nb", 2)):
        with pytest.raises(RocketError) as caught:
            batch.check_produced(seal(payload, count, flags=batch.FLAG_DELIMITED))
        assert caught.value.code == Code.BAD_BATCH and "delimited batch" in caught.value.message
    old = legacy([Message(b"one", key="k"), Message(b"two", tag="t")])
    assert batch.check_produced(old).count == 2
    with pytest.raises(RocketError) as caught:
        batch.check_produced(seal(old[batch.HEADER_BYTES:], 3, version=2))  # fewer records than the header says
    assert caught.value.code == Code.BAD_BATCH
