"""The remoting gateway's pure layers: frames and RemotingCommand headers (codec), and RocketMQ's message layouts
(messages). Layouts are checked against hand-built bytes per apache/rocketmq's RemotingCommand,
RocketMQSerializable and MessageDecoder, and hostile input may only ever raise the module's own error."""

from __future__ import annotations

import ipaddress
import socket
import struct
import zlib

import lz4.frame
import orjson
import pytest
import zstandard
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from rocket import limits
from rocket.gateway.remoting import codec, messages
from rocket.gateway.remoting.codec import Command, FrameReader, RemotingError
from rocket.gateway.remoting.messages import BadMessage
from rocket.model import Message
from rocket.transport import frames as rocket_frames
from rocket.transport.frames import Kind

FAST = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

i16 = st.integers(-(2**15), 2**15 - 1)
i32 = st.integers(-(2**31), 2**31 - 1)
ext_dicts = st.dictionaries(st.text(max_size=20), st.text(max_size=40), max_size=8)
commands = st.builds(
    Command, code=i16, opaque=i32, flag=i32, remark=st.none() | st.text(max_size=60), ext=ext_dicts,
    body=st.binary(max_size=300), language=st.sampled_from(codec.LANGUAGES), version=i16,
    serialize=st.sampled_from([codec.JSON, codec.ROCKETMQ]))


def wire(command: Command) -> bytes:
    return b"".join(codec.encode(command))


def frame_of(serialize: int, header: bytes, body: bytes = b"") -> bytes:
    """A whole frame, length prefix included, built by hand."""
    return struct.pack(">II", 4 + len(header) + len(body), (serialize << 24) | len(header)) + header + body


def read_all(data: bytes, split: int = 1 << 30) -> list[Command]:
    reader = FrameReader()
    decoded = []
    for start in range(0, len(data), split):
        reader.feed(data[start:start + split])
        while (frame := reader.next_frame()) is not None:
            decoded.append(codec.decode(frame))
    assert reader.next_frame() is None
    return decoded


def expected_remark(command: Command) -> str | None:
    # RocketMQSerializable writes no remark as length 0 and reads length 0 as null: "" comes back as None
    if command.serialize == codec.ROCKETMQ and command.remark == "":
        return None
    return command.remark


def assert_same(decoded: Command, sent: Command) -> None:
    assert (decoded.code, decoded.opaque, decoded.flag) == (sent.code, sent.opaque, sent.flag)
    assert decoded.remark == expected_remark(sent)
    assert decoded.ext == sent.ext
    assert decoded.body == sent.body
    assert (decoded.language, decoded.version, decoded.serialize) == (sent.language, sent.version, sent.serialize)


# --- codec: round trips --------------------------------------------------------------------------------------


@FAST
@given(command=commands)
def test_encode_decode_round_trip(command):
    (decoded,) = read_all(wire(command))
    assert_same(decoded, command)


@FAST
@given(sent=st.lists(commands, min_size=1, max_size=4), split=st.integers(1, 64))
def test_frames_back_to_back_in_pieces(sent, split):
    decoded = read_all(b"".join(map(wire, sent)), split)
    assert len(decoded) == len(sent)
    for one, command in zip(decoded, sent):
        assert_same(one, command)


def test_empty_remark_in_binary_reads_as_none_and_json_keeps_it():
    for serialize, remark in ((codec.ROCKETMQ, None), (codec.JSON, "")):
        (decoded,) = read_all(wire(Command(10, remark="", serialize=serialize)))
        assert decoded.remark == remark


def test_unknown_language_goes_out_as_other_in_binary():
    (decoded,) = read_all(wire(Command(10, language="COBOL", serialize=codec.ROCKETMQ)))
    assert decoded.language == "OTHER"


def test_reply_keeps_opaque_and_serialization_and_stringifies_ext():
    request = Command(codec.RequestCode.PULL_MESSAGE, opaque=42, flag=0, version=453, serialize=codec.ROCKETMQ)
    reply = request.reply(ext={"queueId": 3, "batch": True, "off": False, "gone": None}, remark="r", body=b"x")
    assert reply.is_response and not reply.is_oneway and not request.is_response
    assert (reply.opaque, reply.serialize, reply.version) == (42, codec.ROCKETMQ, 453)
    assert reply.ext == {"queueId": "3", "batch": "true", "off": "false"}
    (decoded,) = read_all(wire(reply))
    assert_same(decoded, reply)
    assert Command(1, flag=codec.FLAG_ONEWAY).is_oneway


def test_hand_built_binary_header_decodes():
    remark = "héllo ✓".encode()
    ext = [("topic".encode(), "TopicA".encode()), ("queueId".encode(), b"3"), ("ключ".encode(), "значение".encode())]
    ext_bytes = b"".join(struct.pack(">H", len(key)) + key + struct.pack(">i", len(value)) + value
                         for key, value in ext)
    header = (struct.pack(">h", 310) + struct.pack(">B", 3) + struct.pack(">h", 453) + struct.pack(">i", -7)
              + struct.pack(">i", 2) + struct.pack(">i", len(remark)) + remark
              + struct.pack(">i", len(ext_bytes)) + ext_bytes)
    (command,) = read_all(frame_of(1, header, b"the body"))
    assert command.code == 310 and command.language == "PYTHON" and command.version == 453
    assert command.opaque == -7 and command.flag == 2 and command.is_oneway and not command.is_response
    assert command.remark == "héllo ✓"
    assert command.ext == {"topic": "TopicA", "queueId": "3", "ключ": "значение"}
    assert command.body == b"the body" and command.serialize == codec.ROCKETMQ
    # and the encoder writes exactly these header bytes
    again = Command(310, -7, 2, "héllo ✓", {"topic": "TopicA", "queueId": "3", "ключ": "значение"}, b"the body",
                    "PYTHON", 453, codec.ROCKETMQ)
    assert wire(again) == frame_of(1, header, b"the body")


def test_binary_language_byte_past_the_table_is_other():
    header = struct.pack(">hBhiiii", 10, 200, 0, 1, 0, 0, 0)
    (command,) = read_all(frame_of(1, header))
    assert command.language == "OTHER" and command.remark is None and command.ext == {}


def test_ali_ons_json_header_ext_values_become_strings():
    header = (b'{"code":11,"language":"JAVA","opaque":5,"flag":0,"version":121,"remark":null,'
              b'"extFields":{"consumerGroup":"g","queueId":3,"queueOffset":1234567890123,"maxMsgNums":32,'
              b'"sysFlag":2,"suspendTimeoutMillis":15000,"subscription":"*","unitMode":false,"ratio":1.5,'
              b'"nothing":null}}')
    (command,) = read_all(frame_of(0, header, b"\x00\x01"))
    assert (command.code, command.opaque, command.flag, command.version) == (11, 5, 0, 121)
    assert command.language == "JAVA" and command.remark is None and command.serialize == codec.JSON
    assert command.ext == {"consumerGroup": "g", "queueId": "3", "queueOffset": "1234567890123", "maxMsgNums": "32",
                           "sysFlag": "2", "suspendTimeoutMillis": "15000", "subscription": "*",
                           "unitMode": "false", "ratio": "1.5"}
    assert command.body == b"\x00\x01"


def test_json_header_defaults():
    (command,) = read_all(frame_of(0, b'{"code":105}'))
    assert (command.code, command.opaque, command.flag, command.version, command.language) == (105, 0, 0, 0, "JAVA")
    assert command.ext == {} and command.remark is None


# --- codec: hostile input ------------------------------------------------------------------------------------


def decode_only_remoting_error(frame: bytes) -> None:
    try:
        codec.decode(frame)
    except RemotingError as error:
        assert str(error) and "\n" not in str(error)  # one line that says why


@settings(max_examples=400, deadline=None)
@given(data=st.binary(max_size=200))
def test_decode_random_bytes(data):
    decode_only_remoting_error(data)


@settings(max_examples=400, deadline=None)
@given(serialize=st.sampled_from([0, 1]), header=st.binary(max_size=120), body=st.binary(max_size=20))
def test_decode_random_headers_of_either_type(serialize, header, body):
    decode_only_remoting_error(frame_of(serialize, header, body)[4:])


@settings(max_examples=300, deadline=None)
@given(command=commands, data=st.data())
def test_decode_mutated_valid_frames(command, data):
    frame = bytearray(wire(command)[4:])
    for _ in range(data.draw(st.integers(1, 4))):
        frame[data.draw(st.integers(0, len(frame) - 1))] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(0, len(frame)))
    decode_only_remoting_error(bytes(frame[:cut]))


@settings(max_examples=300, deadline=None)
@given(chunks=st.lists(st.binary(max_size=64), max_size=8))
def test_frame_reader_random_bytes(chunks):
    reader = FrameReader()
    try:
        for chunk in chunks:
            reader.feed(chunk)
            while (frame := reader.next_frame()) is not None:
                decode_only_remoting_error(frame)
    except RemotingError:
        pass


@pytest.mark.parametrize("length", [0, 1, 2, 3, limits.remoting_frame_bytes_max + 1, 2**32 - 1])
def test_frame_length_out_of_bounds(length):
    reader = FrameReader()
    reader.feed(struct.pack(">I", length) + b"\x00" * 8)
    with pytest.raises(RemotingError):
        reader.next_frame()


def test_frame_length_at_the_limit_waits_for_the_bytes():
    reader = FrameReader()
    reader.feed(struct.pack(">I", limits.remoting_frame_bytes_max) + b"\x00" * 100)
    assert reader.next_frame() is None


def test_truncated_frames_wait_and_truncated_decode_fails():
    data = wire(Command(10, opaque=9, remark="r", ext={"a": "b"}, body=b"body", serialize=codec.ROCKETMQ))
    for cut in range(len(data)):
        reader = FrameReader()
        reader.feed(data[:cut])
        assert reader.next_frame() is None
    header_length = struct.unpack_from(">I", data, 4)[0] & 0xFFFFFF
    for cut in range(4 + header_length):  # a frame cut inside its header
        with pytest.raises(RemotingError):
            codec.decode(data[4:4 + cut])


@pytest.mark.parametrize("serialize", [0, 1])
def test_header_length_past_the_end(serialize):
    with pytest.raises(RemotingError, match="past the frame"):
        codec.decode(struct.pack(">I", (serialize << 24) | 50) + b"{}" * 10)


def test_header_length_over_the_limit():
    header = b" " * (limits.remoting_header_bytes_max + 1)
    with pytest.raises(RemotingError, match="over"):
        codec.decode(struct.pack(">I", len(header)) + header)
    # exactly at the limit is read (and here fails only as JSON)
    header = b'{"code":1}'.ljust(limits.remoting_header_bytes_max)
    assert codec.decode(struct.pack(">I", len(header)) + header).code == 1


@given(serialize=st.integers(2, 255))
def test_unknown_serialize_type(serialize):
    with pytest.raises(RemotingError, match="serialize type"):
        codec.decode(frame_of(serialize, b'{"code":10}')[4:])


@pytest.mark.parametrize("header", [
    b"[1, 2, 3]", b'"text"', b"17", b"null", b"", b"{", b"\xff\xfe{}",
    b'{"code":"10"}', b'{"code":true}', b'{"code":10.0}', b'{"opaque":1}', b'{"code":null}',
    b'{"code":70000}', b'{"code":1,"opaque":99999999999}', b'{"code":1,"flag":"0"}', b'{"code":1,"version":[]}',
    b'{"code":10,"extFields":["a","b"]}', b'{"code":10,"extFields":"x"}', b'{"code":10,"extFields":7}',
    b"[" * 5000 + b"]" * 5000, b'{"code":123456789012345678901234567890}',
])
def test_malformed_json_headers(header):
    with pytest.raises(RemotingError):
        codec.decode(frame_of(0, header)[4:])


def _binary(remark_length: int, remark: bytes, ext_length: int, ext: bytes) -> bytes:
    return (struct.pack(">hBhii", 10, 0, 0, 1, 0) + struct.pack(">i", remark_length) + remark
            + struct.pack(">i", ext_length) + ext)


def _field(key: bytes, value: bytes, key_length: int | None = None, value_length: int | None = None) -> bytes:
    return (struct.pack(">H", len(key) if key_length is None else key_length) + key
            + struct.pack(">i", len(value) if value_length is None else value_length) + value)


@pytest.mark.parametrize("header", [
    b"", b"\x00", struct.pack(">hBhii", 10, 0, 0, 1, 0),  # fixed part only: no remark length
    struct.pack(">hBhiii", 10, 0, 0, 1, 0, 0),  # no ext length
    _binary(10, b"abc", 0, b""),  # remark past the end
    _binary(-1, b"", 0, b""),  # negative remark length
    _binary(-(2**31), b"", 0, b""),
    _binary(0, b"", 100, b"\x00\x01"),  # ext past the end
    _binary(0, b"", -5, b""),  # negative ext length
    _binary(0, b"", 9, _field(b"k", b"v", key_length=40)),  # key past the ext bytes
    _binary(0, b"", 9, _field(b"k", b"v", value_length=-1)),  # negative value length
    _binary(0, b"", 9, _field(b"k", b"v", value_length=70)),  # value past the ext bytes
    _binary(0, b"", 4, b"\x00\x01k\x00"),  # value length cut short
    _binary(2, b"\xff\xfe", 0, b""),  # remark not UTF-8
    _binary(0, b"", 9, _field(b"\xc3", b"v")),  # key not UTF-8
    _binary(0, b"", 9, _field(b"k", b"\xed\xa0\x80")),  # value a UTF-8 encoded surrogate
])
def test_malformed_binary_headers(header):
    with pytest.raises(RemotingError):
        codec.decode(frame_of(1, header)[4:])


# --- codec: telling remoting from rocket's frames ------------------------------------------------------------


@FAST
@given(command=commands)
def test_looks_like_remoting_for_remoting_frames(command):
    data = wire(command)
    assert struct.unpack_from(">I", data, 4)[0] & 0xFFFFFF < 64 * 1024
    assert codec.looks_like_remoting(data[:limits.tcp_sniff_bytes])
    assert codec.looks_like_remoting(data)


def test_looks_like_remoting_false_for_rocket_frames():
    data = rocket_frames.encode(Kind.REQUEST, 1, 1, b"{}", method="Ping")
    assert not codec.looks_like_remoting(data[:limits.tcp_sniff_bytes])
    assert not codec.looks_like_remoting(data)
    for kind in Kind:
        for serde in (0, 1, 2):
            assert not codec.looks_like_remoting(rocket_frames.encode(kind, serde, 7, b"x" * 300, method="M"))
    assert not codec.looks_like_remoting(wire(Command(10))[:5])  # too few bytes to tell


# --- messages: properties, stored layout ---------------------------------------------------------------------

plain_text = st.text(alphabet=st.characters(blacklist_characters="\x01\x02", blacklist_categories=("Cs",)),
                     max_size=30)
property_dicts = st.dictionaries(plain_text, plain_text, max_size=8)


@given(properties=property_dicts)
def test_properties_text_round_trip(properties):
    text = messages.properties_text(properties)
    assert messages.parse_properties(text) == properties


def test_properties_text_layout_and_malformed():
    assert messages.properties_text({"KEYS": "a b", "TAGS": "t"}) == "KEYS\x01a b\x02TAGS\x01t\x02"
    assert messages.parse_properties("") == {}
    with pytest.raises(BadMessage):
        messages.parse_properties("KEYS\x01a\x02broken\x02")


def parse_stored(data: bytes) -> dict:
    """MessageDecoder.decode's reading of one stored message (sysFlag without the IPv6 bits), field by field."""
    position = 0

    def take(fmt: str):
        nonlocal position
        (value,) = struct.unpack_from(fmt, data, position)
        position += struct.calcsize(fmt)
        return value

    def raw(size: int) -> bytes:
        nonlocal position
        chunk = data[position:position + size]
        assert len(chunk) == size
        position += size
        return chunk

    fields = {"total": take(">i"), "magic": take(">I"), "body_crc": take(">i"), "queue": take(">i"),
              "flag": take(">i"), "queue_offset": take(">q"), "commit_log_offset": take(">q"),
              "sys_flag": take(">i"), "born_ms": take(">q")}
    fields["born_host"] = raw(16 if fields["sys_flag"] & 0x10 else 4)  # MessageSysFlag.BORNHOST_V6_FLAG
    fields.update(born_port=take(">i"), store_ms=take(">q"))
    fields["store_host"] = raw(16 if fields["sys_flag"] & 0x20 else 4)  # STOREHOSTADDRESS_V6_FLAG
    fields.update(store_port=take(">i"), reconsume_times=take(">i"), prepared_offset=take(">q"))
    fields["body"] = raw(take(">i"))
    topic_length = take(">B") if fields["magic"] == 0xDAA320A7 else take(">H")
    fields["topic"] = raw(topic_length).decode()
    fields["properties"] = raw(take(">h")).decode()
    assert position == len(data)
    return fields


topics = st.text(alphabet=st.characters(min_codepoint=32, max_codepoint=0x7FF, blacklist_categories=("Cs",)),
                 min_size=1, max_size=200)


@FAST
@given(topic=topics, body=st.binary(max_size=500), queue=st.integers(0, 1023), offset=st.integers(0, 2**40),
       timestamp=st.integers(0, 2**45), reconsume=st.integers(0, 100), properties=property_dicts,
       port=st.integers(0, 65535))
def test_encode_stored_layout(topic, body, queue, offset, timestamp, reconsume, properties, port):
    message = Message(body, properties=properties, timestamp_ms=timestamp, queue=queue, offset=offset)
    host = socket.inet_aton("10.1.2.3")
    data = messages.encode_stored(message, topic, (host, port), reconsume_times=reconsume)
    fields = parse_stored(data)
    assert fields["total"] == len(data)
    assert fields["magic"] == (0xDAA320AB if len(topic.encode()) > 127 else 0xDAA320A7)
    assert fields["body_crc"] == zlib.crc32(body) & 0x7FFFFFFF
    assert (fields["queue"], fields["queue_offset"]) == (queue, offset)
    assert fields["commit_log_offset"] == messages.commit_log_offset(topic, queue, offset)
    assert fields["sys_flag"] == 0 and fields["flag"] == 0
    assert fields["born_ms"] == fields["store_ms"] == timestamp
    assert (fields["store_host"], fields["store_port"]) == (host, port)
    assert fields["reconsume_times"] == reconsume
    assert fields["body"] == body and fields["topic"] == topic
    assert messages.parse_properties(fields["properties"]) == properties


def test_encode_stored_magic_versions_and_property_override():
    message = Message(b"hi", properties={"own": "1"}, queue=2, offset=5)
    short = parse_stored(messages.encode_stored(message, "t" * 127, (bytes(4), 0)))
    assert short["magic"] == 0xDAA320A7 and short["topic"] == "t" * 127
    assert struct.unpack(">i", struct.pack(">I", short["magic"]))[0] == messages.MAGIC_V1
    long = parse_stored(messages.encode_stored(message, "t" * 128, (bytes(4), 0), properties={"KEYS": "k"}))
    assert long["magic"] == 0xDAA320AB and long["topic"] == "t" * 128
    assert struct.unpack(">i", struct.pack(">I", long["magic"]))[0] == messages.MAGIC_V2
    assert long["properties"] == "KEYS\x01k\x02"
    # properties a client could not read in a signed 16-bit length are left out
    huge = parse_stored(messages.encode_stored(Message(b"", properties={"p": "x" * 40000}, queue=0, offset=0), "t",
                                               (bytes(4), 0)))
    assert huge["properties"] == ""


# --- messages: batch bodies ----------------------------------------------------------------------------------


def batch_entry(body: bytes, flag: int, properties: bytes, magic: int = 0, crc: int = 0) -> bytes:
    """MessageDecoder.encodeMessage: total size, magic, body crc, flag, body length + body, properties length
    (short) + properties."""
    total = 4 + 4 + 4 + 4 + 4 + len(body) + 2 + len(properties)
    return (struct.pack(">i", total) + struct.pack(">i", magic) + struct.pack(">i", crc) + struct.pack(">i", flag)
            + struct.pack(">i", len(body)) + body + struct.pack(">h", len(properties)) + properties)


batch_messages = st.lists(st.tuples(st.binary(max_size=100), i32, property_dicts), min_size=1, max_size=6)


@FAST
@given(sent=batch_messages)
def test_decode_batch_round_trip(sent):
    body = b"".join(batch_entry(data, flag, messages.properties_text(properties).encode(),
                                crc=zlib.crc32(data) & 0x7FFFFFFF) for data, flag, properties in sent)
    assert messages.decode_batch(body) == [(data, flag, properties) for data, flag, properties in sent]


def test_decode_batch_empty():
    assert messages.decode_batch(b"") == []


def _two() -> tuple[bytes, set[int]]:
    first = batch_entry(b"hello", 0, b"KEYS\x01k\x02")
    second = batch_entry(b"world!", 3, b"TAGS\x01t\x02")
    return first + second, {0, len(first), len(first) + len(second)}


def test_decode_batch_cut_short_anywhere():
    body, boundaries = _two()
    for cut in range(len(body)):
        if cut in boundaries:
            assert len(messages.decode_batch(body[:cut])) == (0 if cut == 0 else 1)
            continue
        with pytest.raises(BadMessage):
            messages.decode_batch(body[:cut])


def _patched(entry: bytes, at: int, fmt: str, value: int) -> bytes:
    data = bytearray(entry)
    struct.pack_into(fmt, data, at, value)
    return bytes(data)


ENTRY = batch_entry(b"hello", 0, b"KEYS\x01k\x02")


@pytest.mark.parametrize("body", [
    _patched(ENTRY, 0, ">i", len(ENTRY) + 1),  # total past the end
    _patched(ENTRY, 0, ">i", 0),  # total too small (and would never advance)
    _patched(ENTRY, 0, ">i", -len(ENTRY)),
    _patched(ENTRY, 0, ">i", 21),
    _patched(ENTRY, 16, ">i", 6),  # body length past the message's total
    _patched(ENTRY, 16, ">i", 2**31 - 1),
    _patched(ENTRY, 16, ">i", -1),  # negative body length
    _patched(ENTRY, 25, ">h", 100),  # properties length past the total
    _patched(ENTRY, 25, ">h", -1),  # negative properties length
    batch_entry(b"x", 0, b"\xff\xfe\x01\x02"),  # properties not UTF-8
    batch_entry(b"x", 0, b"KEYS\x01\xc3\x02"),
    batch_entry(b"x", 0, b"no separator\x02"),
    ENTRY + b"\x00\x00\x00",  # trailing bytes: a message cut short
])
def test_decode_batch_malformed(body):
    with pytest.raises(BadMessage):
        messages.decode_batch(body)


@settings(max_examples=400, deadline=None)
@given(data=st.binary(max_size=200))
def test_decode_batch_random_bytes(data):
    try:
        messages.decode_batch(data)
    except BadMessage:
        pass


@settings(max_examples=400, deadline=None)
@given(total=i32, body_length=i32, properties_length=i16, rest=st.binary(max_size=60))
def test_decode_batch_random_lengths(total, body_length, properties_length, rest):
    data = struct.pack(">iiiii", total, 0, 0, 0, body_length) + rest[:max(0, body_length)] \
        + struct.pack(">h", properties_length) + rest
    try:
        messages.decode_batch(data)
    except BadMessage:
        pass


# --- messages: ids and commit log offsets --------------------------------------------------------------------


@FAST
@given(topic=st.text(max_size=50), queue=st.integers(0, 1023), offset=st.integers(0, 2**63 - 1))
def test_commit_log_offset_fits_a_double_and_splits(topic, queue, offset):
    value = messages.commit_log_offset(topic, queue, offset)
    assert 0 <= value < 2**53
    assert float(value) == value
    assert value == ((zlib.crc32(topic.encode()) & 0x1FF) << 44) | (queue << 34) | (offset % 2**34)
    assert messages.split_commit_log_offset(value) == (messages.topic_hash(topic), queue, offset % 2**34)
    if offset < 2**34:
        assert messages.split_commit_log_offset(value)[1:] == (queue, offset)


@pytest.mark.parametrize("value", [-1, 2**53, 2**63 - 1])
def test_split_commit_log_offset_refuses_foreign_values(value):
    with pytest.raises(BadMessage):
        messages.split_commit_log_offset(value)


SPAN = 2**34


@FAST
@given(low=st.integers(0, SPAN - 1), next_offset=st.integers(1, 2**42))
def test_unwrap_offset_is_the_latest_candidate_below_next(low, next_offset):
    assume(low < next_offset)
    value = messages.unwrap_offset(low, next_offset)
    assert value % SPAN == low
    assert value < next_offset <= value + SPAN


def test_unwrap_offset_examples():
    assert messages.unwrap_offset(5, 100) == 5
    assert messages.unwrap_offset(5, SPAN) == 5
    assert messages.unwrap_offset(5, SPAN + 6) == SPAN + 5
    assert messages.unwrap_offset(5, SPAN + 5) == 5
    assert messages.unwrap_offset(SPAN - 1, 3 * SPAN) == 3 * SPAN - 1
    assert messages.unwrap_offset(0, 3 * SPAN) == 2 * SPAN


@FAST
@given(host=st.binary(min_size=4, max_size=4), port=st.integers(0, 2**31 - 1), offset=st.integers(0, 2**63 - 1))
def test_message_id_round_trip(host, port, offset):
    text = messages.message_id(host, port, offset)
    assert len(text) == 32 and text == text.upper()
    assert messages.parse_message_id(text) == (f"{socket.inet_ntoa(host)}:{port}", offset)
    assert messages.parse_message_id(text.lower()) == (f"{socket.inet_ntoa(host)}:{port}", offset)


@FAST
@given(host=st.ip_addresses(v=6), port=st.integers(0, 2**31 - 1), offset=st.integers(0, 2**63 - 1))
def test_an_ipv6_message_id_round_trips(host, port, offset):
    text = messages.message_id(host.packed, port, offset)
    assert len(text) == 56
    assert messages.parse_message_id(text) == (f"[{host}]:{port}", offset)


@pytest.mark.parametrize("address, expected", [
    ("10.1.2.3:99", (bytes([10, 1, 2, 3]), 99)),
    ("::1:1234", (bytes(15) + b"\x01", 1234)),
    ("[::1]:1234", (bytes(15) + b"\x01", 1234)),
    ("::ffff:10.1.2.3:7", (bytes([10, 1, 2, 3]), 7)),  # an IPv4 client on a dual-stack socket: 4 bytes
    ("not an address:5", (bytes(4), 5)), ("nowhere", (bytes(4), 0)), ("", (bytes(4), 0))])
def test_host_bytes(address, expected):
    assert messages.host_bytes(address) == expected


def test_ipv6_hosts_are_16_bytes_and_flagged_as_message_decoder_reads_them():
    born = Message(b"six", properties={messages.BORN_HOST_PROPERTY: "[2001:db8::7]:5555"}, queue=1, offset=9,
                   timestamp_ms=1234)
    store = messages.host_bytes("[::1]:10911")
    fields = parse_stored(messages.encode_stored(born, "t", store))
    assert fields["sys_flag"] == messages.SYSFLAG_BORNHOST_V6 | messages.SYSFLAG_STOREHOST_V6 == 0x30
    assert fields["born_host"] == ipaddress.ip_address("2001:db8::7").packed and fields["born_port"] == 5555
    assert (fields["store_host"], fields["store_port"]) == store and fields["body"] == b"six"
    mixed = parse_stored(messages.encode_stored(born, "t", messages.host_bytes("10.0.0.1:10911")))
    assert mixed["sys_flag"] == 0x10 and mixed["store_host"] == bytes([10, 0, 0, 1])


def test_message_id_layout():
    assert messages.message_id(bytes([10, 0, 0, 1]), 10911, 0x0102) == "0A000001" + "00002A9F" + "0000000000000102"


@pytest.mark.parametrize("text", ["", "zz" * 16, "0A" * 15, "0A" * 17, "0A" * 27, "0A" * 29, "é" * 32])
def test_parse_message_id_malformed(text):
    with pytest.raises(BadMessage):
        messages.parse_message_id(text)


@given(text=st.text(max_size=40))
def test_parse_message_id_only_bad_message(text):
    try:
        messages.parse_message_id(text)
    except BadMessage:
        pass


# --- messages: compression, delays, conversion ---------------------------------------------------------------


def test_an_uncompressed_body_is_kept():
    plain = b"a body that compresses " * 200
    assert messages.uncompress(plain, 0) == plain
    assert messages.uncompress(plain, messages.SYSFLAG_MULTI_TAGS) == plain


# RocketMQ 5's compression types (sysFlag bits 8-10) and how its compressors write them: zlib (0 and 3), an LZ4 frame
# (Lz4Compressor: LZ4FrameOutputStream), a Zstandard frame (ZstdCompressor: ZstdOutputStream)
CODECS = {"zlib": (0, lambda data: zlib.compress(data, 9)), "zlib (5.x)": (3, zlib.compress),
          "lz4": (1, lz4.frame.compress), "zstd": (2, lambda data: zstandard.ZstdCompressor(level=19).compress(data))}


def flag(codec: str) -> int:
    return messages.SYSFLAG_COMPRESSED | (CODECS[codec][0] << 8)


@pytest.mark.parametrize("codec", list(CODECS))
def test_every_compression_type_inflates_up_to_the_message_limit(codec):
    _, compress = CODECS[codec]
    plain = b"a body that compresses " * 200
    assert messages.uncompress(compress(plain), flag(codec)) == plain
    assert messages.uncompress(compress(plain), flag(codec) | messages.SYSFLAG_MULTI_TAGS) == plain
    exact = b"\x00" * limits.message_bytes_max
    assert messages.uncompress(compress(exact), flag(codec)) == exact


@pytest.mark.parametrize("codec", list(CODECS))
@pytest.mark.parametrize("size", [limits.message_bytes_max + 1, 4 * limits.message_bytes_max])
def test_uncompress_bomb(codec, size):
    bomb = CODECS[codec][1](b"\x00" * size)
    assert len(bomb) < 100_000
    with pytest.raises(BadMessage, match="inflates past"):
        messages.uncompress(bomb, flag(codec))


@pytest.mark.parametrize("codec", list(CODECS))
@pytest.mark.parametrize("body", [b"not compressed at all", b"\x78\x9c\xff\xff\xff\xff", bytes(range(256)),
                                  b"\x28\xb5\x2f\xfd", b"\x04\x22\x4d\x18"])  # and zstd's and LZ4's magic alone
def test_uncompress_garbage(codec, body):
    with pytest.raises(BadMessage):
        messages.uncompress(body, flag(codec))


@given(body=st.binary(max_size=200), codec=st.sampled_from(list(CODECS)))
def test_uncompress_random_bytes_only_bad_message(body, codec):
    try:
        messages.uncompress(body, flag(codec))
    except BadMessage:
        pass


def test_uncompress_refuses_a_compression_type_rocketmq_does_not_have():
    with pytest.raises(BadMessage, match="compression type 5 is not one RocketMQ knows"):
        messages.uncompress(b"\x28\xb5\x2f\xfd", messages.SYSFLAG_COMPRESSED | (5 << 8))


@pytest.mark.parametrize("codec", list(CODECS))
@pytest.mark.parametrize("keep", ["nothing", "half", "all but the last 4 bytes"])
def test_uncompress_truncated_stream(codec, keep):
    compressed = CODECS[codec][1](b"0123456789" * 1000)
    cut = {"nothing": 0, "half": len(compressed) // 2, "all but the last 4 bytes": len(compressed) - 4}[keep]
    with pytest.raises(BadMessage):
        messages.uncompress(compressed[:cut], flag(codec))


NOW = 1_700_000_000_000


@pytest.mark.parametrize("properties, expected", [
    ({}, 0),
    ({"DELAY": "0"}, 0),
    ({"DELAY": ""}, 0),
    ({"DELAY": "-3"}, 0),
    ({"DELAY": "1"}, NOW + 1000),
    ({"DELAY": "3"}, NOW + 10_000),
    ({"DELAY": "18"}, NOW + 7_200_000),
    ({"DELAY": "19"}, NOW + 7_200_000),
    ({"DELAY": "1000"}, NOW + 7_200_000),
    ({"TIMER_DELIVER_MS": "1800000000000"}, 1_800_000_000_000),
    ({"TIMER_DELIVER_MS": "0"}, 1),
    ({"TIMER_DELAY_SEC": "30"}, NOW + 30_000),
    ({"TIMER_DELAY_MS": "1500"}, NOW + 1500),
    ({"TIMER_DELIVER_MS": "1800000000000", "DELAY": "18"}, 1_800_000_000_000),
])
def test_delay_of(properties, expected):
    assert messages.delay_of(properties, NOW) == expected


@pytest.mark.parametrize("properties", [{"DELAY": "two"}, {"DELAY": "1.5"}, {"TIMER_DELIVER_MS": "soon"},
                                        {"TIMER_DELAY_SEC": "1e3"}, {"TIMER_DELAY_MS": "x"}])
def test_delay_of_non_integer(properties):
    with pytest.raises(BadMessage):
        messages.delay_of(properties, NOW)


def test_to_rocket_keys_tags_delay():
    message = messages.to_rocket(b"b", {"KEYS": "a b", "TAGS": "t", "DELAY": "2", "x": "1", "UNIQ_KEY": "ID1"},
                                 born_ms=5, now_ms=NOW, born_host="10.1.2.3:4567")
    assert message.key == "a" and message.tag == "t"
    # kept as the gRPC gateway keeps them (rocket/gateway/properties.py): one message, read alike over both
    assert message.properties == {"__rmq.keys": "a b", "x": "1", "__rmq.id": "ID1", "__rmq.born_host": "10.1.2.3:4567"}
    assert message.deliver_at_ms == NOW + 5000 and message.timestamp_ms == 5 and message.body == b"b"
    assert messages.remoting_properties(message) == {"KEYS": "a b", "x": "1", "TAGS": "t", "UNIQ_KEY": "ID1"}
    stored = messages.encode_stored(_stored_copy(message), "t", (bytes(4), 0))
    assert stored[48:52] == bytes([10, 1, 2, 3]) and struct.unpack(">i", stored[52:56])[0] == 4567  # born host

    single = messages.to_rocket(b"b", {"KEYS": "only", "TIMER_DELAY_SEC": "1", "WAIT": "true", "TRAN_MSG": "true"},
                                born_ms=0, now_ms=NOW)
    assert single.key == "only" and single.tag == "" and single.properties == {}
    assert single.timestamp_ms == NOW and single.deliver_at_ms == NOW + 1000
    assert messages.remoting_properties(single) == {"KEYS": "only"}

    none = messages.to_rocket(b"", {}, born_ms=1, now_ms=NOW)
    assert (none.key, none.tag, none.properties, none.deliver_at_ms) == ("", "", {}, 0)
    assert messages.remoting_properties(none) == {}


@given(properties=property_dicts, keys=st.lists(st.text(alphabet="abc", min_size=1, max_size=3), max_size=3),
       tag=st.text(alphabet="xyz", max_size=3))
def test_to_rocket_then_remoting_properties(properties, keys, tag):
    properties = {name: value for name, value in properties.items()
                  if name not in messages.CLIENT_ONLY and name not in messages.RENAMED and not name.startswith("__rmq.")}
    sent = dict(properties)
    if keys:
        sent[messages.KEYS] = " ".join(keys)
    if tag:
        sent[messages.TAGS] = tag
    message = messages.to_rocket(b"", sent, born_ms=1, now_ms=NOW)
    assert message.key == (keys[0] if keys else "") and message.tag == tag
    assert messages.remoting_properties(message) == sent


def test_json_encode_is_plain_json():
    header = orjson.loads(codec._encode_json(Command(10, 3, 0, None, {"a": "1"})))
    assert header["code"] == 10 and header["extFields"] == {"a": "1"} and "remark" not in header


def _stored_copy(message):
    """The message as stored at queue 0, offset 0."""
    return messages.Message(message.body, key=message.key, tag=message.tag, properties=message.properties,
                            timestamp_ms=message.timestamp_ms, queue=0, offset=0)

