"""A produce on the broker's data plane (roles/broker/produce.py, `produce_parked`): parked with the storage role in
this process when this node leads the queue's group, a task otherwise; produces to any queue stick to one queue until
one is answered, and take their turns evenly across both paths; and an append that meets a leader change after it was
proposed is sent again, numbered as before."""

from __future__ import annotations

import itertools
import random

import pytest
import trio
import trio.testing

from rocket.clock import Clock
from rocket import limits
from rocket.errors import Code, RocketError
from rocket.model import Address, Message, TopicSpec, bucket_topic, shard_of
from rocket.parked import Slot, Unparked
from rocket.roles.broker.kv import KeyValues
from rocket.roles.broker.produce import Produce
from rocket.roles.broker.routes import Routes, Turns
from rocket.serde import batch as batch_codec
from rocket.transport.rpc import Dispatcher

HERE, THERE = Address("127.0.0.1", 1), Address("127.0.0.1", 2)
BATCH = batch_codec.encode([Message(b"x")], 1)


class Channel:
    """An open channel to node 2: what call_parked sent, each with its slot."""

    def __init__(self):
        self.sent: list[tuple[dict, Slot]] = []

    def call_parked(self, method: str, request: dict, slot: Slot) -> None:
        self.sent.append((request, slot))


class Pool:
    def __init__(self):
        self.channels: dict[Address, Channel] = {}

    def open_channel(self, address: Address) -> Channel | None:
        return self.channels.get(address)


class Peers:
    metadata_version = 0
    telemetry = None

    def __init__(self, dispatcher: Dispatcher):
        self.dispatcher = dispatcher
        self.address = HERE
        self.pool = Pool()
        self.calls: list[dict] = []

    async def call(self, address: Address, method: str, request: dict, timeout_s: float) -> dict:
        self.calls.append(request)
        return {"queue": request["queue"], "base_offset": 40, "count": 1, "scheduled": False}


# Topic orders: queue q on group 10 + q, led here (node 1) for queues 0 and 2 and on node 2 for 1 and 3; bucket b:
# shard s on group 20 + s, shard 0 led here and shard 1 on node 2. Every group has both nodes as voters.
ROUTES = {"orders": (TopicSpec("orders", queues=4), [10, 11, 12, 13]),
          bucket_topic("b"): (TopicSpec(bucket_topic("b"), queues=2, message_type="kv"), [20, 21])}


class Nameservers(Peers):
    async def nameserver(self, method: str, request: dict) -> dict:
        assert method == "GetRoute"
        spec, groups = ROUTES[request["topic"]]
        return {"version": 1, "topic": spec.to_wire(), "queue_groups": groups,
                "nodes": [{"id": 1, "address": str(HERE)}, {"id": 2, "address": str(THERE)}],
                "groups": [{"id": group, "voters": [1, 2], "leader": 1 + group % 2} for group in groups]}


class Broker:
    """The broker's routes and produce over fake peers, with the routes of ROUTES known (cached) and run() started:
    a StorageAppend or StorageKvTxn led here is parked in `parked`."""

    def __init__(self):
        self.dispatcher = Dispatcher()
        self.parked: list[tuple[dict, Slot]] = []
        for method in ("StorageAppend", "StorageKvTxn"):
            self.dispatcher.handle(method, None, parked=lambda request, slot: self.parked.append((request, slot)))
        self.peers = Nameservers(self.dispatcher)
        self.routes = Routes(self.peers, Clock())
        self.producer = Produce(self.routes, Turns(), random.Random(1))
        self.kv = KeyValues(self.routes, self.peers)
        self.keys = {shard: next(f"k{n}" for n in itertools.count() if shard_of(f"k{n}", 2) == shard)
                     for shard in (0, 1)}

    async def start(self, nursery: trio.Nursery) -> Broker:
        await nursery.start(self.routes.run)
        for topic in ROUTES:
            await self.routes.route(topic)
        return self

    async def produce(self, request: dict) -> int:
        """The task path's produce: the queue it went to."""
        return (await self.producer.produce(request))["queue"]


async def make_broker(nursery: trio.Nursery) -> Broker:
    return await Broker().start(nursery)


async def test_round_robin_stays_even_when_some_queues_are_led_elsewhere(nursery, monkeypatch):
    """A produce to any queue takes its turn only where it is parked: one that must go to another node's leader
    leaves the turn to the task that serves it, so queues get batches in turn, parked or not."""
    monkeypatch.setattr(limits, "produce_sticky_batches", 1)  # a queue per batch: round robin
    broker = await make_broker(nursery)
    queues = []
    for _ in range(8):
        request = {"topic": "orders", "queue": -1, "batch": BATCH}
        try:
            broker.producer.produce_parked(request, Slot(lambda outcome: None))
            queues.append(broker.parked[-1][0]["queue"])
        except Unparked:
            queues.append(await broker.produce(request))
    assert queues == [0, 1, 2, 3, 0, 1, 2, 3]
    assert [request["queue"] for request, _ in broker.parked] == [0, 2, 0, 2]


def send_to_any_queue(broker: Broker) -> tuple[int, Slot]:
    """A produce to any queue, parked here or forwarded to node 2: the queue it went to, and its slot there."""
    channel = broker.peers.pool.channels.setdefault(THERE, Channel())
    parked, forwarded = len(broker.parked), len(channel.sent)
    broker.producer.produce_parked({"topic": "orders", "queue": -1, "batch": BATCH}, Slot(lambda outcome: None))
    [(request, slot)] = broker.parked[parked:] + channel.sent[forwarded:]
    return request["queue"], slot


def answer(slot: Slot, queue: int) -> None:
    slot.complete({"queue": queue, "base_offset": 0, "count": 1, "scheduled": False})


async def test_produces_to_any_queue_stick_to_one_queue_until_one_is_answered(nursery, monkeypatch):
    """Kafka's sticky partitioner (KIP-480): the produces sent while none is answered go to one queue, so that one
    Raft round of one group carries them; the first answer moves the next ones on, and answers to produces sent
    before it do not move them again. Without answers a queue takes at most limits.produce_sticky_batches."""
    monkeypatch.setattr(limits, "produce_sticky_batches", 3)
    broker = await make_broker(nursery)
    sent = [send_to_any_queue(broker) for _ in range(4)]  # none answered: three to queue 0, then the fourth moves on
    assert [queue for queue, _ in sent] == [0, 0, 0, 1]
    answer(sent[3][1], 1)  # answered: the next go to queue 2
    sent.append(send_to_any_queue(broker))
    answer(sent[0][1], 0)  # an older turn's answer: they stay
    sent.append(send_to_any_queue(broker))
    assert [queue for queue, _ in sent[4:]] == [2, 2]
    sent[5][1].complete(RocketError(Code.NOT_ENOUGH_REPLICAS, "no"))  # a failure moves them on too
    sent.append(send_to_any_queue(broker))
    assert sent[6][0] == 3


async def test_a_big_batch_to_any_queue_moves_the_next_ones_on(nursery, monkeypatch):
    """A batch of limits.produce_sticky_bytes fills a round alone: big batches go round robin, over the leaders."""
    monkeypatch.setattr(limits, "produce_sticky_bytes", len(BATCH))
    broker = await make_broker(nursery)
    assert [send_to_any_queue(broker)[0] for _ in range(5)] == [0, 1, 2, 3, 0]


async def test_one_produce_at_a_time_to_any_queue_goes_round_robin(nursery):
    """Each answered before the next is sent: every queue in turn, as before stickiness."""
    broker = await make_broker(nursery)
    queues = []
    for _ in range(6):
        queue, slot = send_to_any_queue(broker)
        queues.append(queue)
        answer(slot, queue)
    assert queues == [0, 1, 2, 3, 0, 1]


@pytest.mark.parametrize("code", [Code.UNAVAILABLE, Code.TIMEOUT, Code.DISK_FULL])
async def test_an_append_lost_to_a_leader_change_or_swept_is_sent_again_with_its_sequence(nursery, code):
    """As the task path's retries (_storage) do: the storage role stores a numbered batch once however often it
    comes (store/producers.py), so an unknown outcome is safe to try again; a leader whose disk is full refused it
    unproposed, and another replica may lead with room."""
    broker = await make_broker(nursery)
    answers = []
    broker.producer.produce_parked({"topic": "orders", "queue": 0, "batch": BATCH}, Slot(answers.append))
    [(call, slot)] = broker.parked
    assert call["producer_id"] > 0 and call["sequence"] == 0
    slot.complete(RocketError(code, "lost, or not applied in time"))
    await trio.testing.wait_all_tasks_blocked()
    assert broker.peers.calls == [call]  # the same call, its producer id and sequence as they were
    assert answers == [{"queue": 0, "base_offset": 40, "count": 1, "scheduled": False}]


@pytest.mark.parametrize("code", [Code.BAD_REQUEST, Code.NOT_ENOUGH_REPLICAS])
async def test_an_append_that_fails_otherwise_is_answered_with_its_error(nursery, code):
    broker = await make_broker(nursery)
    answers = []
    broker.producer.produce_parked({"topic": "orders", "queue": 0, "batch": BATCH, "producer_id": 3, "sequence": 1},
                          Slot(answers.append))
    error = RocketError(code, "no")
    broker.parked[0][1].complete(error)
    await trio.testing.wait_all_tasks_blocked()
    assert answers == [error] and broker.peers.calls == []


async def test_a_produce_for_another_nodes_leader_is_forwarded_without_a_task_over_its_open_channel(nursery,
                                                                                                   monkeypatch):
    """With a channel to the leader open, the append goes out on it (TcpChannel.call_parked) and its answer
    completes the produce: round robin takes every queue in turn, none of them a task."""
    monkeypatch.setattr(limits, "produce_sticky_batches", 1)
    broker = await make_broker(nursery)
    channel = broker.peers.pool.channels[THERE] = Channel()
    answers = []
    for _ in range(4):
        broker.producer.produce_parked({"topic": "orders", "queue": -1, "batch": BATCH}, Slot(answers.append))
    assert [request["queue"] for request, _ in broker.parked] == [0, 2]
    assert [request["queue"] for request, _ in channel.sent] == [1, 3]
    channel.sent[0][1].complete({"queue": 1, "base_offset": 7, "count": 1, "scheduled": False})
    assert answers == [{"queue": 1, "base_offset": 7, "count": 1, "scheduled": False}]


async def test_a_forwarded_append_left_unanswered_times_out_marks_the_node_and_is_sent_again(autojump_clock, nursery):
    broker = await make_broker(nursery)
    channel = broker.peers.pool.channels[THERE] = Channel()
    answers = []
    broker.producer.produce_parked({"topic": "orders", "queue": 1, "batch": BATCH}, Slot(answers.append))
    [(call, _)] = channel.sent
    await trio.sleep(limits.storage_call_s_max + 2 * limits.raft_tick_s)  # the sweep fails it, then the task
    assert broker.routes.is_silent(2)
    assert broker.peers.calls == [call]  # sent again by _storage, as it was numbered
    assert answers == [{"queue": 1, "base_offset": 40, "count": 1, "scheduled": False}]
    assert not broker.routes.sweeping  # nothing left to sweep: the sweeper ended


async def test_a_timeout_the_leader_answers_is_an_answer_not_silence(nursery):
    """As _call_storage counts it: the node answered (its own write timed out), so it is not asked last."""
    broker = await make_broker(nursery)
    channel = broker.peers.pool.channels[THERE] = Channel()
    broker.producer.produce_parked({"topic": "orders", "queue": 1, "batch": BATCH}, Slot(lambda outcome: None))
    channel.sent[0][1].complete(RocketError(Code.TIMEOUT, "a write was not applied in time on node 2"))
    await trio.testing.wait_all_tasks_blocked()
    assert not broker.routes.is_silent(2)


def _applied(revision: int) -> dict:
    return {"results": [{"succeeded": True, "revision": revision, "results": [{"revision": revision, "entries": []}]}]}


async def test_a_kv_put_for_another_nodes_leader_is_forwarded_without_a_task(nursery):
    """A put whose shard is led on node 2 goes out on the open channel to it as one StorageKvTxn, parked; one whose
    shard is led here is parked with this node's storage role. Neither is a task."""
    broker = await make_broker(nursery)
    channel = broker.peers.pool.channels[THERE] = Channel()
    answers = []
    for shard in (0, 1):
        broker.kv.kv_put_parked({"bucket": "b", "key": broker.keys[shard], "value": b"v", "ttl_ms": -1,
                              "if_revision": -1, "if_absent": False}, Slot(answers.append))
    [(local, _)] = broker.parked
    [(forwarded, slot)] = channel.sent
    assert (local["group"], forwarded["group"]) == (20, 21)
    assert forwarded["txns"][0]["success"][0]["key"] == broker.keys[1]
    slot.complete(_applied(12))
    assert answers == [{"revision": 12, "deleted": 0}]
    assert broker.peers.calls == []


@pytest.mark.parametrize("code, resent", [(Code.UNAVAILABLE, True), (Code.TIMEOUT, False),
                                          (Code.CONNECTION_LOST, False)])
async def test_a_forwarded_kv_put_is_sent_again_only_when_surely_not_applied(nursery, monkeypatch, code, resent):
    """At most once: UNAVAILABLE (not the leader: not applied) is tried again as a task; an unknown outcome is the
    put's answer."""
    broker = await make_broker(nursery)
    channel = broker.peers.pool.channels[THERE] = Channel()

    async def storage(route, group, method, request, at_most_once=False, **_):
        broker.peers.calls.append(request)
        return _applied(30)
    monkeypatch.setattr(broker.routes, "storage", storage)
    answers = []
    broker.kv.kv_put_parked({"bucket": "b", "key": broker.keys[1], "value": b"v", "ttl_ms": -1, "if_revision": -1,
                          "if_absent": False}, Slot(answers.append))
    error = RocketError(code, "no")
    channel.sent[0][1].complete(error)
    await trio.testing.wait_all_tasks_blocked()
    assert answers == ([{"revision": 30, "deleted": 0}] if resent else [error])
    assert len(broker.peers.calls) == (1 if resent else 0)


def _get(broker: Broker, shard: int) -> dict:
    return {"bucket": "b", "key": broker.keys[shard], "revision": 0, "serializable": False}


async def test_a_kv_get_is_parked_here_or_forwarded_without_a_task(nursery):
    """A get of a shard led here is parked with this node's storage role; one led on node 2 goes out on the open
    channel to it; each answers with the entry, or NOT_FOUND without one."""
    broker = await make_broker(nursery)
    broker.dispatcher.handle("StorageKvRead", None, parked=lambda request, slot: broker.parked.append((request, slot)))
    channel = broker.peers.pool.channels[THERE] = Channel()
    answers = []
    for shard in (0, 1):
        broker.kv.kv_get_parked(_get(broker, shard), Slot(answers.append))
    [(local, local_slot)] = broker.parked
    [(forwarded, forwarded_slot)] = channel.sent
    assert (local["group"], local["op"], local["key"]) == (20, "get", broker.keys[0])
    assert (forwarded["group"], forwarded["shard"], forwarded["key"]) == (21, 1, broker.keys[1])
    found = {"key": broker.keys[1], "value": b"v", "revision": 3, "create_revision": 3, "version": 1, "expires_ms": 0}
    forwarded_slot.complete({"entries": [found], "revision": 3})
    local_slot.complete({"entries": [], "revision": 3})
    assert answers[0] == {"entries": [found], "more": False, "count": 1}
    assert answers[1].code == Code.NOT_FOUND and broker.peers.calls == []


async def test_a_forwarded_kv_get_that_meets_a_leader_change_is_asked_again_as_a_task(nursery, monkeypatch):
    broker = await make_broker(nursery)
    channel = broker.peers.pool.channels[THERE] = Channel()

    async def kv_get(request: dict) -> dict:
        return {"entries": [], "more": False, "count": 0, "asked": request["key"]}
    monkeypatch.setattr(broker.kv, "kv_get", kv_get)
    answers = []
    broker.kv.kv_get_parked(_get(broker, 1), Slot(answers.append))
    channel.sent[0][1].complete(RocketError(Code.UNAVAILABLE, "node 2 no longer leads group 21"))
    await trio.testing.wait_all_tasks_blocked()
    assert answers == [{"entries": [], "more": False, "count": 0, "asked": broker.keys[1]}]


async def test_a_kv_get_with_a_bad_revision_is_refused_before_anything_is_sent(nursery):
    broker = await make_broker(nursery)
    with pytest.raises(RocketError) as refused:
        broker.kv.kv_get_parked({**_get(broker, 0), "revision": -1}, Slot(lambda outcome: None))
    assert refused.value.code == Code.BAD_REQUEST and not broker.parked
