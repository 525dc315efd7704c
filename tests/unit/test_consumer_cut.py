"""The consumer cuts a pull response the same way whether it hands out messages or only their bodies."""

from hypothesis import given
from hypothesis import strategies as st

from rocket.client.consumer import Consumer
from rocket.model import Message
from rocket.serde import batch as batch_codec


@st.composite
def responses(draw):
    """A pull response over up to three queues, each a run of consecutive batches, and the positions asked
    for (anywhere inside a queue's first batch: a response starts at the batch holding the position)."""
    batches, wanted = [], {}
    for queue in range(draw(st.integers(1, 3))):
        offset = draw(st.integers(0, 1000))
        sizes = draw(st.lists(st.integers(1, 6), min_size=1, max_size=4))
        wanted[queue] = offset + draw(st.integers(0, sizes[0] - 1))
        lines = draw(st.booleans())
        for size in sizes:
            bodies = [b"q%d-%d" % (queue, offset + index) for index in range(size)]
            if lines:
                encoded = batch_codec.encode_lines(b"".join(body + b"\n" for body in bodies), 1)
            else:
                encoded = batch_codec.encode([Message(body, key="k") for body in bodies], 1)
            batches.append({"queue": queue, "base_offset": offset, "batch": encoded})
            offset += size
    return {"batches": batches, "next_offsets": []}, wanted


@given(responses(), st.one_of(st.none(), st.integers(0, 30)))
def test_bodies_and_messages_are_cut_alike(response_and_wanted, limit):
    """poll_bodies() hands out exactly the bodies of poll()'s messages, and leaves each queue cut by the limit
    at the same position."""
    response, wanted = response_and_wanted
    consumer = Consumer(channel=None, topic="t", group="g")
    messages, resume = consumer._decode(response, wanted, limit)
    bodies, resume_of_bodies = consumer._bodies(response, wanted, limit)
    assert bodies == [message.body for message in messages]
    assert resume_of_bodies == resume
    assert limit is None or len(bodies) <= limit
    for message in messages:
        assert message.offset >= wanted[message.queue]
        assert message.queue not in resume or message.offset < resume[message.queue]
