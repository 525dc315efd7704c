"""The client SDK (Producer, Consumer, SimpleConsumer, Admin) and the in-process channels, with no socket: a small
broker kept in memory behind a Dispatcher, reached through LocalChannel, or scripted answers from a MockChannel."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from rocket import limits
from rocket.client.admin import Admin
from rocket.client.connection import FailoverChannel
from rocket.client.consumer import Consumer
from rocket.client.producer import Producer, open_producer
from rocket.client.simple import SimpleConsumer
from rocket.errors import Code, RocketError
from rocket.model import Message, queue_for_key
from rocket.serde import batch as batch_codec
from rocket.transport.channel import Channel
from rocket.transport.h2_client import Http2Channel
from rocket.transport.local import LocalChannel, MockChannel
from rocket.transport.rpc import Dispatcher
from rocket.transport.tcp_client import TcpChannel


class MemoryBroker:
    """Topics held in memory, per queue a list of (base offset, batch), with committed group positions; one
    member per group, which is given every queue."""

    def __init__(self, topics: dict[str, int]):
        self.queues = {topic: [[] for _ in range(count)] for topic, count in topics.items()}
        self.committed: dict[tuple[str, str, int], int] = {}  # (group, topic, queue) -> offset
        self.heartbeats: list[dict] = []
        self.dispatcher = Dispatcher()
        for method, handler in [("CreateTopic", self.create_topic), ("ListTopics", self.list_topics),
                                ("DescribeTopic", self.describe_topic), ("Produce", self.produce),
                                ("Pull", self.pull), ("FetchOffsets", self.fetch_offsets),
                                ("CommitOffsets", self.commit_offsets), ("GroupHeartbeat", self.group_heartbeat)]:
            self.dispatcher.handle(method, handler)

    def _topic(self, name: str) -> list[list[tuple[int, bytes]]]:
        if name not in self.queues:
            raise RocketError(Code.UNKNOWN_TOPIC, f"no topic {name!r}")
        return self.queues[name]

    @staticmethod
    def _next_offset(stored: list[tuple[int, bytes]]) -> int:
        return stored[-1][0] + batch_codec.peek_count(stored[-1][1]) if stored else 0

    def messages(self, topic: str, queue: int) -> list[Message]:
        return [message for base, batch in self.queues[topic][queue] for message in batch_codec.decode(batch, base, queue)]

    async def create_topic(self, request: dict) -> dict:
        if request["topic"] in self.queues:
            raise RocketError(Code.TOPIC_EXISTS, f"topic {request['topic']!r} exists")
        self.queues[request["topic"]] = [[] for _ in range(request["queues"])]
        return {"name": request["topic"], "queues": request["queues"], "message_type": request["message_type"]}

    async def list_topics(self, request: dict) -> dict:
        return {"topics": [{"name": name, "queues": len(queues)} for name, queues in sorted(self.queues.items())]}

    async def describe_topic(self, request: dict) -> dict:
        queues = self._topic(request["topic"])
        return {"topic": {"name": request["topic"], "queues": len(queues)},
                "queues": [{"queue": queue, "min_offset": 0, "next_offset": self._next_offset(stored),
                            "bytes": sum(len(batch) for _, batch in stored)} for queue, stored in enumerate(queues)]}

    async def produce(self, request: dict) -> dict:
        queues = self._topic(request["topic"])
        queue = request["queue"] if request["queue"] >= 0 else 0
        batch = bytes(request["batch"])  # the attachment is a view of the request, as over TCP
        base = self._next_offset(queues[queue])
        queues[queue].append((base, batch))
        return {"queue": queue, "base_offset": base, "count": batch_codec.peek_count(batch)}

    async def pull(self, request: dict) -> dict:
        """Every batch holding or following each asked offset, up to max_bytes (at least one)."""
        queues = self._topic(request["topic"])
        batches, next_offsets, taken_bytes = [], [], 0
        for position in request["queues"]:
            queue, offset = position["queue"], position["offset"]
            for base, batch in queues[queue]:
                end = base + batch_codec.peek_count(batch)
                if end > offset and (not batches or taken_bytes + len(batch) <= request["max_bytes"]):
                    batches.append({"queue": queue, "base_offset": base, "batch": batch})
                    taken_bytes += len(batch)
                    offset = end
            next_offsets.append({"queue": queue, "offset": offset})
        return {"batches": batches, "next_offsets": next_offsets}

    async def fetch_offsets(self, request: dict) -> dict:
        return {"offsets": [{"queue": queue, "offset": offset} for (group, topic, queue), offset
                            in self.committed.items() if group == request["group"] and topic == request["topic"]]}

    async def commit_offsets(self, request: dict) -> dict:
        for entry in request["offsets"]:
            self.committed[(request["group"], request["topic"], entry["queue"])] = entry["offset"]
        return {}

    async def group_heartbeat(self, request: dict) -> dict:
        self.heartbeats.append(request)
        queues = [] if request["leave"] else list(range(len(self._topic(request["topic"]))))
        return {"members": [request["member"]], "queues": queues}


@pytest.fixture
def broker() -> MemoryBroker:
    return MemoryBroker({"orders": 4})


@pytest.fixture
def channel(broker) -> LocalChannel:
    return LocalChannel(broker.dispatcher)


def test_every_transport_implements_the_channel_interface():
    """TCP, HTTP/2, failover and both in-process channels all declare the one Channel interface."""
    for implementation in (TcpChannel, Http2Channel, FailoverChannel, LocalChannel, MockChannel):
        assert Channel in implementation.__mro__, implementation


# LocalChannel


async def test_local_channel_answers_as_a_remote_server_does(channel):
    """A call goes through the serde both ways: defaults are filled in and bytes come back as views."""
    produced = await channel.call("Produce", {"topic": "orders", "queue": 2,
                                              "batch": batch_codec.encode([Message(b"a")], 1)})
    assert produced == {"queue": 2, "base_offset": 0, "count": 1, "scheduled": False, "throttle_ms": 0}
    pulled = await channel.call("Pull", {"topic": "orders", "queues": [{"queue": 2, "offset": 0}]})
    assert isinstance(pulled["batches"][0]["batch"], memoryview)
    assert batch_codec.decode(pulled["batches"][0]["batch"])[0].body == b"a"


async def test_local_channel_maps_errors_as_tcp_does(broker, channel):
    """Refusals keep their code and message, bugs become INTERNAL, and a malformed request is BAD_REQUEST."""
    with pytest.raises(RocketError) as unknown_topic:
        await channel.call("DescribeTopic", {"topic": "nope"})
    assert (unknown_topic.value.code, unknown_topic.value.message) == (Code.UNKNOWN_TOPIC, "no topic 'nope'")

    async def broken(request: dict) -> dict:
        raise ValueError("a bug")

    broker.dispatcher.handle("ListTopics", broken)
    with pytest.raises(RocketError) as bug:
        await channel.call("ListTopics", {})
    assert (bug.value.code, bug.value.message) == (Code.INTERNAL, "ListTopics failed: ValueError")
    with pytest.raises(RocketError) as malformed:
        await channel.call("FetchOffsets", {"topic": "orders"})
    assert malformed.value.code == Code.BAD_REQUEST and "group" in malformed.value.message
    with pytest.raises(RocketError) as unserved:
        await channel.call("ClusterStatus", {})
    assert unserved.value.code == Code.UNKNOWN_METHOD


async def test_local_channel_times_out_a_slow_handler(broker, channel, autojump_clock):
    """A handler slower than timeout_s ends the call with TIMEOUT."""

    async def slow(request: dict) -> dict:
        await trio.sleep(60)
        return {"topics": []}

    broker.dispatcher.handle("ListTopics", slow)
    with pytest.raises(RocketError) as caught:
        await channel.call("ListTopics", {}, timeout_s=1)
    assert caught.value.code == Code.TIMEOUT


async def test_local_channel_streams_items_then_the_error_that_ends_them(broker, channel):
    """A server stream yields its decoded items in order, then raises the error it ended with."""

    async def subscribe(request: dict):
        for offset in range(3):
            yield {"batches": [], "next_offsets": [{"queue": 0, "offset": offset}]}
        raise RocketError(Code.OFFSET_OUT_OF_RANGE, "gone")

    broker.dispatcher.handle("Subscribe", subscribe)
    received = []
    with pytest.raises(RocketError) as caught:
        async for item in channel.stream("Subscribe", {"topic": "orders", "queues": []}):
            received.append(item["next_offsets"][0]["offset"])
    assert received == [0, 1, 2] and caught.value.code == Code.OFFSET_OUT_OF_RANGE


# Producer


async def test_keyed_messages_land_in_their_key_queue_in_order(broker, channel):
    """send_many puts each key's messages in queue_for_key's queue, in the order they were given."""
    messages = [Message(b"%d" % index, key=f"customer-{index % 5}") for index in range(40)]
    async with open_producer(channel, "orders") as producer:
        receipts = await producer.send_many(messages)
    assert sum(receipt.count for receipt in receipts) == 40
    for index in range(5):
        key = f"customer-{index}"
        stored = [message.body for message in broker.messages("orders", queue_for_key(key, 4)) if message.key == key]
        assert stored == [message.body for message in messages if message.key == key]


async def test_send_many_cuts_batches_at_batch_bytes(broker, channel):
    """Messages larger together than batch_bytes go in several batches, all stored in order."""
    messages = [Message(b"x" * 100, key="one-key") for _ in range(10)]
    async with open_producer(channel, "orders", batch_bytes=300) as producer:
        receipts = await producer.send_many(messages)
    queue = queue_for_key("one-key", 4)
    assert len(receipts) == len(broker.queues["orders"][queue]) > 1
    assert [message.offset for message in broker.messages("orders", queue)] == list(range(10))


def held_produce() -> tuple[MockChannel, trio.Event]:
    """A channel whose Produce answers once the event is set: the first batch stays in flight until then."""
    release = trio.Event()

    async def produce(request: dict) -> dict:
        await release.wait()
        return {"queue": request["queue"], "base_offset": 100, "count": batch_codec.peek_count(request["batch"]),
                "scheduled": False}

    return MockChannel({"Produce": produce}), release


async def test_sends_made_while_a_batch_is_in_flight_share_the_next_one(autojump_clock):
    """Nagle's rule: the first send goes at once; those made while it is out go as one Produce once it is answered,
    and each learns its own offset."""
    channel, release = held_produce()
    sent: list[Message] = []
    async with trio.open_nursery() as nursery:
        producer = Producer(channel, "orders", 4, nursery, linger_s=60, batch_bytes=limits.MiB, in_flight_max=4)

        async def send(index: int) -> None:
            sent.append(await producer.send(Message(b"%d" % index, key="same")))

        async with trio.open_nursery() as senders:
            for index in range(5):
                senders.start_soon(send, index)
            await trio.testing.wait_all_tasks_blocked()
            assert len(channel.messages("Produce")) == 1  # the rest wait for it, not for the linger of 60 s
            release.set()
        assert trio.current_time() < 1
    first, second = channel.messages("Produce")
    assert first["queue"] == second["queue"] == queue_for_key("same", 4)
    assert [batch_codec.peek_count(request["batch"]) for request in (first, second)] == [1, 4]
    stored = [message.body for request in (first, second) for message in batch_codec.decode(request["batch"], 100)]
    assert sorted(stored) == [b"0", b"1", b"2", b"3", b"4"]
    assert len(sent) == 5 and {message.offset for message in sent} == {100, 101, 102, 103}


async def test_messages_without_a_key_go_round_the_queues(autojump_clock):
    """Unkeyed sends, one after the other, visit every queue in turn, from a queue each producer draws; each goes
    at once, alone, waiting for no linger."""

    async def produce(request: dict) -> dict:
        return {"queue": request["queue"], "base_offset": 0, "count": 1, "scheduled": False}

    channel = MockChannel({"Produce": produce})
    async with trio.open_nursery() as nursery:
        producer = Producer(channel, "orders", 4, nursery, linger_s=60, batch_bytes=limits.MiB, in_flight_max=4)
        for index in range(8):
            await producer.send(Message(b"%d" % index))
        assert trio.current_time() < 1
    queues = [request["queue"] for request in channel.messages("Produce")]
    assert queues == [(queues[0] + turn) % 4 for turn in range(8)]


async def test_concurrent_sends_without_a_key_fill_one_batch_then_move_to_the_next_queue(autojump_clock):
    """Kafka's sticky partitioner: unkeyed sends made while a batch fills join it, whatever their number, rather
    than one batch per queue; the sends after it went fill the next queue's."""
    channel, release = held_produce()
    async with trio.open_nursery() as nursery:
        producer = Producer(channel, "orders", 4, nursery, linger_s=60, batch_bytes=limits.MiB, in_flight_max=4)
        async with trio.open_nursery() as senders:
            for index in range(6):
                senders.start_soon(producer.send, Message(b"%d" % index))
            await trio.testing.wait_all_tasks_blocked()
            release.set()
    [first, second] = [(request["queue"], batch_codec.peek_count(request["batch"]))
                       for request in channel.messages("Produce")]
    assert (first[1], second[1]) == (1, 5) and second[0] == (first[0] + 1) % 4


async def test_a_refused_batch_fails_its_senders_and_the_next_flush(autojump_clock):
    """A Produce error reaches every send() of its batch, and flush() raises a pipelined batch's error once."""

    async def produce(request: dict) -> dict:
        raise RocketError(Code.UNAVAILABLE, "no leader")

    channel = MockChannel({"Produce": produce})
    async with trio.open_nursery() as nursery:
        producer = Producer(channel, "orders", 4, nursery, linger_s=0.01, batch_bytes=limits.MiB, in_flight_max=4)
        with pytest.raises(RocketError) as refused:
            await producer.send(Message(b"a", key="k"))
        assert refused.value.code == Code.UNAVAILABLE
        await producer.send_encoded(batch_codec.encode([Message(b"b")], 1), 0)
        with pytest.raises(RocketError):
            await producer.flush()
        await producer.flush()  # the failure was reported once


# Consumer


async def produce_bodies(channel: Channel, queue_bodies: dict[int, list[list[bytes]]]) -> None:
    """Store, per queue, one batch per list of bodies."""
    for queue, batches in queue_bodies.items():
        for bodies in batches:
            await channel.call("Produce", {"topic": "orders", "queue": queue,
                                           "batch": batch_codec.encode([Message(body) for body in bodies], 1)})


async def test_consumer_reads_from_earliest_and_commits_where_it_stopped(broker, channel):
    """A consumer from earliest decodes every stored message in per-queue order and commits the next offsets."""
    await produce_bodies(channel, {0: [[b"a", b"b"], [b"c"]], 3: [[b"x"]]})
    consumer = Consumer(channel, "orders", "billing", start="earliest", wait_ms=0)
    await consumer.open()
    polled = await consumer.poll()
    assert [(message.queue, message.offset, message.body) for message in polled] == [
        (0, 0, b"a"), (0, 1, b"b"), (0, 2, b"c"), (3, 0, b"x")]
    assert await consumer.poll() == []
    await consumer.close()
    assert {key: offset for key, offset in broker.committed.items() if offset} == {
        ("billing", "orders", 0): 3, ("billing", "orders", 3): 1}
    assert broker.heartbeats[-1]["leave"] is True


async def test_consumer_resumes_inside_a_batch_at_its_committed_position(broker, channel):
    """A committed offset in the middle of a batch hands out only the messages from that offset on."""
    await produce_bodies(channel, {1: [[b"0", b"1", b"2", b"3", b"4"]]})
    broker.committed[("billing", "orders", 1)] = 2
    consumer = Consumer(channel, "orders", "billing", start="earliest", wait_ms=0)
    await consumer.open()
    assert [message.offset for message in await consumer.poll()] == [2, 3, 4]


async def test_poll_limit_resumes_at_the_first_message_not_handed_out(broker, channel):
    """poll(limit=n) hands out n messages, and the next poll starts with the first one it held back."""
    await produce_bodies(channel, {2: [[b"0", b"1", b"2", b"3", b"4"]]})
    consumer = Consumer(channel, "orders", "billing", start="earliest", wait_ms=0)
    await consumer.open()
    assert [message.body for message in await consumer.poll(limit=3)] == [b"0", b"1", b"2"]
    assert await consumer.poll_bodies() == [b"3", b"4"]
    await consumer.commit()
    assert broker.committed[("billing", "orders", 2)] == 5


async def test_start_latest_skips_what_was_stored_before(broker, channel):
    """A new group from latest reads only messages stored after it opened."""
    await produce_bodies(channel, {0: [[b"old"]]})
    consumer = Consumer(channel, "orders", "billing", start="latest", wait_ms=0)
    await consumer.open()
    await produce_bodies(channel, {0: [[b"new"]]})
    assert [message.body for message in await consumer.poll()] == [b"new"]


async def test_broadcasting_members_commit_positions_of_their_own(broker, channel):
    """In broadcasting mode a member reads every queue and commits under its own group%member name."""
    await produce_bodies(channel, {0: [[b"a"]], 1: [[b"b"]]})
    consumer = Consumer(channel, "orders", "audit", start="earliest", wait_ms=0, mode="broadcasting", member="m1")
    await consumer.open()
    assert sorted(message.body for message in await consumer.poll()) == [b"a", b"b"]
    await consumer.commit()
    assert broker.committed[("audit%m1", "orders", 0)] == 1 and not broker.heartbeats


# SimpleConsumer


def receive_response() -> dict:
    """Two messages handed out at offsets 10 and 11 (attempts 1 and 2); a third whose batch is gone."""
    batch = batch_codec.encode([Message(b"first"), Message(b"second")], 1)
    return {"batches": [{"queue": 3, "base_offset": 10, "batch": batch}],
            "handles": [{"queue": 3, "offset": 10, "attempt": 1, "visible_at_ms": 0},
                        {"queue": 3, "offset": 11, "attempt": 2, "visible_at_ms": 0},
                        {"queue": 3, "offset": 40, "attempt": 1, "visible_at_ms": 0}],
            "fifo": False}


async def test_simple_consumer_receives_messages_with_their_receipts():
    """receive() asks with the consumer's settings and hands out decoded messages with attempt and receipt."""
    channel = MockChannel({"Receive": lambda request: receive_response()})
    consumer = SimpleConsumer(channel, "orders", "pickers", invisible_s=20)
    messages = await consumer.receive(max_messages=8, wait_s=2)
    assert [(message.body, message.attempt, message.receipt) for message in messages] == [
        (b"first", 1, "3.10.1"), (b"second", 2, "3.11.2")]
    [request] = channel.messages("Receive")
    assert (request["max_messages"], request["invisible_ms"], request["wait_ms"]) == (8, 20_000, 2000)


async def test_ack_sends_receipts_and_names_the_stale_ones():
    """ack() sends each message's receipt; receipts the server calls stale raise NOT_FOUND naming them."""
    channel = MockChannel({"Receive": lambda request: receive_response(),
                           "Ack": lambda request: {"stale": request["receipts"][1:]}})
    consumer = SimpleConsumer(channel, "orders", "pickers")
    first, second = await consumer.receive()
    with pytest.raises(RocketError) as caught:
        await consumer.ack(first, second)
    assert caught.value.code == Code.NOT_FOUND and "3.11.2" in caught.value.message
    assert channel.messages("Ack")[0]["receipts"] == [{"queue": 3, "offset": 10, "attempt": 1},
                                                       {"queue": 3, "offset": 11, "attempt": 2}]


async def test_nack_hides_a_message_for_its_attempts_backoff_and_dead_letter_gives_up():
    """nack() sets the invisible time of the message's attempt from the backoff; dead_letter() sends it away."""
    channel = MockChannel({"Receive": lambda request: receive_response(),
                           "ChangeInvisible": lambda request: {"stale": []},
                           "DeadLetter": lambda request: {"stale": []}})
    consumer = SimpleConsumer(channel, "orders", "pickers")
    first, second = await consumer.receive()
    await consumer.nack(second)
    await consumer.dead_letter(first)
    assert channel.messages("ChangeInvisible")[0]["invisible_ms"] == limits.pop_retry_backoff_s[1] * 1000
    [dead] = channel.messages("DeadLetter")
    assert dead["receipts"] == [{"queue": 3, "offset": 10, "attempt": 1}] and dead["invisible_ms"] == -1


# Admin


async def test_waiting_for_a_move_outlasts_a_group_without_a_leader(broker, channel):
    """wait_moved goes on through UNAVAILABLE (a node killed mid-move leaves a group leaderless for a moment) and
    returns once the topic is in its new class; any other error ends it."""
    answers = [RocketError(Code.UNAVAILABLE, "not the leader; the leader is unknown"), "raft", "pair"]

    async def describe(request: dict) -> dict:
        answer = answers.pop(0)
        if isinstance(answer, RocketError):
            raise answer
        return {"topic": {"name": request["topic"], "queues": 1, "storage_class": answer}, "queues": []}

    broker.dispatcher.handle("DescribeTopic", describe)
    assert (await Admin(channel).wait_moved("orders", "pair", poll_s=0)).storage_class == "pair"
    answers.append(RocketError(Code.UNKNOWN_TOPIC, "no topic 'orders'"))
    with pytest.raises(RocketError) as caught:
        await Admin(channel).wait_moved("orders", "pair", poll_s=0)
    assert caught.value.code == Code.UNKNOWN_TOPIC


async def test_admin_creates_lists_and_describes_topics(broker, channel):
    """Admin's topic calls go to the server and come back as TopicSpecs and queue states."""
    admin = Admin(channel)
    created = await admin.create_topic("payments", 2, "fifo")
    assert (created.name, created.queues, created.message_type) == ("payments", 2, "fifo")
    assert [spec.name for spec in await admin.list_topics()] == ["orders", "payments"]
    await produce_bodies(channel, {0: [[b"a", b"b"]]})
    spec, queues = await admin.describe_topic("orders")
    assert spec.queues == 4 and queues[0]["next_offset"] == 2
    with pytest.raises(RocketError) as caught:
        await admin.create_topic("orders", 4)
    assert caught.value.code == Code.TOPIC_EXISTS


async def test_admin_gets_one_message_by_its_offset(broker, channel):
    """get_message finds the message at an offset inside a stored batch, and NOT_FOUND past the end."""
    await produce_bodies(channel, {1: [[b"0", b"1", b"2"]]})
    admin = Admin(channel)
    assert (await admin.get_message("orders", 1, 1)).body == b"1"
    with pytest.raises(RocketError) as caught:
        await admin.get_message("orders", 1, 7)
    assert caught.value.code == Code.NOT_FOUND


async def test_admin_update_topic_writes_retention_as_the_wire_expects():
    """None keeps a setting (-2), a negative one takes the default (-1), and seconds round to at least 1."""
    channel = MockChannel({"UpdateTopic": lambda request: {"name": request["topic"], "queues": 4}})
    admin = Admin(channel)
    await admin.update_topic("orders", retention_s=None, local_retention_s=-5)
    await admin.update_topic("orders", retention_s=0, local_retention_s=0.2)
    assert [(request["retention_s"], request["local_retention_s"]) for request in channel.messages("UpdateTopic")] \
        == [(-2, -1), (0, 1)]


async def test_admin_cancel_timer_checks_the_timer_id_before_calling():
    """cancel_timer sends the queue and offset of a QUEUE.OFFSET id, and refuses another id without a call."""
    channel = MockChannel({"CancelTimer": lambda request: {}})
    admin = Admin(channel)
    await admin.cancel_timer("orders", "2.17")
    with pytest.raises(RocketError) as caught:
        await admin.cancel_timer("orders", "seventeen")
    assert caught.value.code == Code.BAD_REQUEST
    assert channel.calls == [("CancelTimer", {"topic": "orders", "queue": 2, "offset": 17})]
