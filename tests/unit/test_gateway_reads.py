"""The gateways' reads: a pulled batch that cannot be read is BAD_BATCH naming its queue and offsets; a topic's watch
(Tails) wakes every reader waiting on it once new data comes, with one long poll for them all."""

from __future__ import annotations

import pytest
import trio

from rocket import limits
from rocket.errors import Code, RocketError
from rocket.filter import compile_filter
from rocket.gateway.reads import Tails, matching
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


class TopicEnds:
    """The broker's DescribeTopic and Pull as a topic's watch sees them: each Pull from the ends waits until the test
    appends, or fails while the test says so; every call counted."""

    def __init__(self) -> None:
        self.ends = [0, 0]
        self.appended = trio.Event()
        self.failing = False
        self.calls: list[str] = []

    def append(self, queue: int) -> None:
        self.ends[queue] += 1
        self.appended.set()
        self.appended = trio.Event()

    async def local(self, method: str, request: dict) -> dict:
        self.calls.append(method)
        if self.failing:
            raise RocketError(Code.UNAVAILABLE, "storage group 1 has no replica")
        if method == "DescribeTopic":
            return {"queues": [{"queue": queue, "next_offset": end} for queue, end in enumerate(self.ends)]}
        assert {entry["queue"]: entry["offset"] for entry in request["queues"]} == {0: self.ends[0], 1: self.ends[1]}
        with trio.move_on_after(request["wait_ms"] / 1000):
            await self.appended.wait()
            return {"batches": [{"queue": 0, "base_offset": 0, "batch": b""}], "next_offsets": []}
        return {"batches": [], "next_offsets": request["queues"]}


async def test_one_watch_wakes_every_reader_of_a_topic_and_ends_with_its_last_holder(autojump_clock, nursery):
    ends = TopicEnds()
    tails = Tails(ends)  # type: ignore[arg-type]: the two methods a watch calls
    await nursery.start(tails.run)
    woken: list[int] = []
    started = trio.current_time()

    async def reader(number: int) -> None:
        with tails.watching("orders") as tail:
            await trio.sleep(1)
            seen = tail.generation  # then it looked for data, found none, and waits
            await tail.wait(seen, 3600)
            if trio.current_time() - started < 3600:  # woken, not timed out
                woken.append(number)

    async with trio.open_nursery() as readers:
        for number in range(3):
            readers.start_soon(reader, number)
        await trio.sleep(limits.pull_wait_ms_max / 1000 * 2.5)  # long polls that time out wake nobody
        assert woken == []
        ends.append(1)
    assert sorted(woken) == [0, 1, 2]
    assert ends.calls.count("DescribeTopic") == 2  # at the start, and after the data: one watch for three readers
    calls = len(ends.calls)
    await trio.sleep(limits.pull_wait_ms_max / 1000 * 2)
    assert len(ends.calls) == calls  # no holder left: the watch ended


async def test_a_failing_watch_wakes_its_readers_and_tries_again(autojump_clock, nursery):
    ends = TopicEnds()
    tails = Tails(ends)  # type: ignore[arg-type]: the two methods a watch calls
    await nursery.start(tails.run)
    with tails.watching("orders") as tail:
        await trio.sleep(1)
        seen = tail.generation
        ends.failing = True
        ends.append(0)  # the Pull under way answers; the DescribeTopic after it fails
        await tail.wait(seen, 3600)
        assert tail.generation > seen
        seen = tail.generation
        await trio.sleep(limits.gateway_tail_retry_s * 3)
        assert tail.generation > seen  # each retry that fails wakes them again: they meet the failure themselves
        ends.failing = False
        await trio.sleep(limits.gateway_tail_retry_s + 1)
        seen = tail.generation
        ends.append(1)
        await tail.wait(seen, 3600)
        assert tail.generation == seen + 1


async def test_a_sleeper_is_called_once_at_the_next_bump_and_holds_keep_the_watch(autojump_clock, nursery):
    """A parked reader (no task) sleeps on the Tail it holds: called at the next bump only; the watch runs while any
    hold is left, with or without a task in watching()."""
    ends = TopicEnds()
    tails = Tails(ends)  # type: ignore[arg-type]: the two methods a watch calls
    await nursery.start(tails.run)
    tail = tails.hold("orders")
    await trio.sleep(1)
    woken: list[str] = []
    tail.sleepers["device"] = lambda: woken.append("device")
    ends.append(0)
    await trio.sleep(1)
    ends.append(1)
    await trio.sleep(1)
    assert woken == ["device"]
    with tails.watching("orders") as same:
        assert same is tail
    calls = len(ends.calls)
    await trio.sleep(limits.pull_wait_ms_max / 1000 * 2)
    assert len(ends.calls) > calls  # still held: still watched
    tails.release("orders")
    calls = len(ends.calls)
    await trio.sleep(limits.pull_wait_ms_max / 1000 * 2)
    assert len(ends.calls) == calls
