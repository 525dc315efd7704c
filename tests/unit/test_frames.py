"""TCP frame codec: round trips, split delivery, and that arbitrary bytes only ever yield frames or FrameError."""

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rocket import limits
from rocket.errors import Code
from rocket.transport import frames
from rocket.transport.frames import FrameDecoder, FrameError, Kind


def decode_in_pieces(data: bytes, split: int) -> list[frames.Frame]:
    """Feed data to a decoder split bytes at a time; the frames it yields, having kept nothing back."""
    decoder = FrameDecoder()
    decoded = []
    for start in range(0, len(data), split):
        decoder.feed(data[start : start + split])
        while (frame := decoder.next_frame()) is not None:
            decoded.append(frame)
    assert decoder.buffered_bytes == 0
    return decoded


@given(
    kind=st.sampled_from(list(Kind)),
    serde=st.integers(0, 255),
    request_id=st.integers(0, 2**64 - 1),
    method=st.text(alphabet=st.characters(min_codepoint=33, max_codepoint=126), max_size=40),
    body=st.binary(max_size=2000),
    split=st.integers(1, 64),
)
def test_frames_round_trip_in_any_split(kind, serde, request_id, method, body, split):
    """A frame fed in pieces of any size decodes to exactly what was encoded."""
    decoded = decode_in_pieces(frames.encode(kind, serde, request_id, body, method) * 2, split)
    assert len(decoded) == 2
    for frame in decoded:
        assert (frame.kind, frame.serde, frame.request_id, frame.method, frame.body) == (kind, serde, request_id, method, body)


@settings(max_examples=500)
@given(st.binary(max_size=4096))
def test_random_bytes_give_frames_or_frame_errors(data):
    """Garbage never raises anything but FrameError, and never returns a frame longer than its input."""
    decoder = FrameDecoder(frame_bytes_max=1 << 20)
    decoder.feed(data)
    try:
        while (frame := decoder.next_frame()) is not None:
            assert len(frame.body) <= len(data)
    except FrameError as error:
        assert error.code in (Code.BAD_FRAME, Code.FRAME_TOO_LARGE)


def test_oversized_frame_is_refused_from_its_header():
    """A frame header announcing more than the limit is refused before its body arrives, naming the request."""
    decoder = FrameDecoder(frame_bytes_max=1000)
    decoder.feed(frames.encode(Kind.REQUEST, 1, 77, b"x" * 2000, "Produce")[:30])
    try:
        decoder.next_frame()
    except FrameError as error:
        assert error.code == Code.FRAME_TOO_LARGE
        assert error.request_id == 77
    else:
        raise AssertionError("oversized frame accepted")


@given(
    body=st.binary(max_size=200),
    attachments=st.lists(st.binary(max_size=300), max_size=8),
    split=st.integers(1, 97),
)
def test_attachment_lists_round_trip_uncopied_in_any_split(body, attachments, split):
    """A frame with a list of attachments (a pull response's batches) decodes to the same message and
    attachments, whatever pieces it arrives in."""
    (frame,) = decode_in_pieces(b"".join(frames.encode_parts(Kind.RESPONSE, 2, 7, body, attachment=attachments)), split)
    assert bytes(frame.body) == body
    assert [bytes(each) for each in frame.attachment] == attachments


def test_attachment_tables_that_do_not_add_up_are_bad_frames():
    """A count or lengths that run past the frame, or leave bytes over, are BAD_FRAME for that request."""
    message = b"{}"
    tables = [
        b"",  # no count
        struct.pack(">I", 3) + struct.pack(">I", 1),  # three lengths announced, one given
        struct.pack(">II", 1, 5) + b"abc",  # the attachment is shorter than its length
        struct.pack(">II", 1, 2) + b"abcd",  # bytes left over after the last attachment
        struct.pack(">I", 2**32 - 1),  # a count no frame can hold
    ]
    for request_id, table in enumerate(tables, 1):
        body = struct.pack(">I", len(message)) + message + table
        header = struct.pack(">IBBBBQH", frames.HEADER_BYTES - 4 + len(body), 1, Kind.RESPONSE, 1,
                             frames.FLAG_ATTACHMENTS, request_id, 0)
        decoder = FrameDecoder()
        decoder.feed(header + body)
        with pytest.raises(FrameError) as refused:
            decoder.next_frame()
        assert (refused.value.code, refused.value.request_id) == (Code.BAD_FRAME, request_id)
    both = struct.pack(">IBBBBQH", frames.HEADER_BYTES - 4, 1, Kind.RESPONSE, 1, 0x03, 9, 0)
    decoder = FrameDecoder()
    decoder.feed(both)
    with pytest.raises(FrameError) as refused:
        decoder.next_frame()
    assert refused.value.code == Code.BAD_FRAME


def receive(decoder: FrameDecoder, data: bytes) -> frames.Frame:
    """As a socket delivers a large frame: its first bytes, then the rest into the frame's own buffer."""
    decoder.feed(data[:100])
    assert decoder.next_frame() is None
    position = 100
    while (frame := decoder.next_frame()) is None:
        target = decoder.writable()
        if target is None:  # a server's decoder: into the shared buffer until enough came for a buffer of its own
            decoder.feed(data[position : position + limits.tcp_receive_bytes])
            position += limits.tcp_receive_bytes
            continue
        taken = min(len(target), len(data) - position)
        target[:taken] = data[position : position + taken]  # what recv_into(writable()) does
        decoder.wrote(taken)
        position += taken
    assert decoder.buffered_bytes == 0
    return frame


def test_a_claimed_length_costs_nothing_until_its_bytes_arrive():
    """A server's decoder: a header that claims the largest frame holds no more than what came; as the frame
    arrives, it holds at most frame_buffer_growth times that (plus the slack), and the frame decodes whole."""
    body = bytes(range(256)) * (limits.frame_bytes_max // 256 - 1)
    data = frames.encode(Kind.REQUEST, 1, 5, body, method="Produce")
    decoder = FrameDecoder()
    decoder.feed(data[:frames.HEADER_BYTES])
    assert decoder.next_frame() is None and decoder.held_bytes == frames.HEADER_BYTES
    arrived = frames.HEADER_BYTES
    while arrived < len(data):
        target = decoder.writable()
        if target is None:
            piece = data[arrived : arrived + 1000]
            decoder.feed(piece)
        else:
            piece = data[arrived : arrived + min(len(target), 100_000)]
            target[: len(piece)] = piece
            decoder.wrote(len(piece))
        arrived += len(piece)
        bound = limits.frame_buffer_growth * arrived + limits.frame_buffer_slack_bytes
        assert decoder.held_bytes <= max(arrived, bound), arrived
        frame = decoder.next_frame()
        assert (frame is None) == (arrived < len(data))
    assert frame.method == "Produce" and bytes(frame.body) == body and decoder.held_bytes == 0


def test_a_server_receives_a_1_mib_batch_into_one_buffer():
    """A produce frame of a 1 MiB batch is a little over 1 MiB; begun with one read of tcp_receive_bytes, it gets one
    buffer of the whole frame, filled by the reads after it, never grown (a second buffer and a copy)."""
    data = b"".join(frames.encode_parts(Kind.REQUEST, 2, 5, b"\x00" * 40, "Produce", attachment=b"x" * limits.MiB))
    decoder = FrameDecoder()
    decoder.feed(data[:limits.tcp_receive_bytes])
    assert decoder.next_frame() is None
    buffers = set()
    arrived = limits.tcp_receive_bytes
    while arrived < len(data):
        target = decoder.writable()
        buffers.add(id(target.obj))
        piece = data[arrived:arrived + min(len(target), limits.tcp_receive_bytes)]
        target[:len(piece)] = piece
        decoder.wrote(len(piece))
        arrived += len(piece)
    assert len(buffers) == 1
    frame = decoder.next_frame()
    assert bytes(frame.attachment) == b"x" * limits.MiB


def test_a_client_decoder_allocates_a_large_frame_at_its_header():
    """A client's (reusing) decoder trusts its server: the whole buffer at once, filled with no copy."""
    decoder = FrameDecoder(reuse=True)
    decoder.feed(frames.encode(Kind.RESPONSE, 1, 5, b"x" * 1_000_000)[:100])
    assert decoder.next_frame() is None and decoder.held_bytes >= 1_000_000


@pytest.mark.parametrize("reuse", [True, False])
def test_a_frame_buffer_is_filled_again_only_once_no_view_of_it_is_left(reuse):
    """A client's decoder receives a large frame into a buffer it used before, but never into one that a
    frame still being read (or a batch sliced from it) holds a view of."""
    decoder = FrameDecoder(reuse=reuse)
    first = receive(decoder, frames.encode(Kind.RESPONSE, 0, 1, b"a" * 200_000))
    batch = first.body[1000:2000]
    second = receive(decoder, frames.encode(Kind.RESPONSE, 0, 2, b"b" * 200_000))
    buffer = first.body.obj
    del first
    third = receive(decoder, frames.encode(Kind.RESPONSE, 0, 3, b"c" * 300_000))
    assert third.body.obj is not buffer and bytes(batch) == b"a" * 1000  # the batch's view kept it
    del batch
    fourth = receive(decoder, frames.encode(Kind.RESPONSE, 0, 4, b"d" * 100_000))
    assert (fourth.body.obj is buffer) == reuse
    assert (bytes(second.body), bytes(third.body), bytes(fourth.body)) == (b"b" * 200_000, b"c" * 300_000,
                                                                           b"d" * 100_000)
