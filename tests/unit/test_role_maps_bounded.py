"""The roles' and gateways' per-key maps that clients choose the keys of stay within their named limits: many
distinct keys leave each at its bound, and what dropping an entry must keep (monotone append times) is kept."""

from __future__ import annotations

from types import SimpleNamespace

import orjson
import pytest
import trio

from rocket import limits
from rocket.errors import Code, RocketError
from rocket.gateway.remoting.bridge import Bridge
from rocket.gateway.remoting.clients import Clients
from rocket.gateway.remoting.codec import Command, RequestCode
from rocket.gateway.remoting.consuming import Consuming
from rocket.roles.broker.routes import Turns
from rocket.roles.storage.kv import KeyValues
from rocket.roles.storage.stamps import AppendStamps
from rocket.transport.guard import Caller


class Clock:
    def __init__(self) -> None:
        self.ms = 1_000_000
        self.s = 0.0

    def wall_ms(self) -> int:
        return self.ms

    def now_s(self) -> float:
        return self.s


def test_append_stamps_are_bounded_and_stay_monotone_when_the_clock_steps_back(monkeypatch):
    """A leader stamping appends of many queues keeps limits.append_stamp_queues_max of their times; a queue whose
    time was dropped still never gets an earlier stamp, even after the wall clock stepped back."""
    monkeypatch.setattr(limits, "append_stamp_queues_max", 4)
    stamps = AppendStamps(Clock())  # type: ignore[arg-type]
    first = stamps.stamp("t", 0)
    stamps.clock.ms += 10
    for queue in range(1, 50):
        stamps.stamp("t", queue)
    assert len(stamps.last_ms) == 4
    assert ("t", 0) not in stamps.last_ms
    stamps.clock.ms -= 500  # the wall clock stepped back
    assert stamps.stamp("t", 0) >= first + 10  # the floor: the latest time of the queues dropped
    assert stamps.stamp("t", 49) == first + 10  # kept: its own time
    assert len(stamps.last_ms) == 4


def test_the_most_recently_appended_queues_keep_their_times(monkeypatch):
    """Appending to a queue makes it the last to go: a busy queue keeps its own time among many idle ones."""
    monkeypatch.setattr(limits, "append_stamp_queues_max", 3)
    stamps = AppendStamps(Clock())  # type: ignore[arg-type]
    for queue in range(20):
        stamps.stamp("busy", 0)
        stamps.stamp("idle", queue)
    assert ("busy", 0) in stamps.last_ms and len(stamps.last_ms) == 3


def test_round_robin_turns_are_bounded(monkeypatch):
    """Dead-letter topics name a consumer group a client chose: the broker keeps the turns of only
    limits.round_robin_topics_max topics, and a topic in use keeps rotating."""
    monkeypatch.setattr(limits, "round_robin_topics_max", 5)
    turns = Turns()
    seen = []
    for number in range(100):
        seen.append(turns.take("orders"))
        turns.take(f"%DLQ%group{number}%orders")
    assert seen == list(range(100))
    assert len(turns) == 5


async def test_kv_reads_count_only_known_kinds():
    """A read of an unknown kind is refused before it is counted: the metric's labels are a fixed set."""
    host = SimpleNamespace(on_round=lambda propose: None, in_sync=lambda group, lag: True)  # a replica in sync
    reads = KeyValues(None, host, SimpleNamespace(hosted=lambda group: None), None)  # type: ignore[arg-type]
    for number in range(20):
        with pytest.raises(RocketError) as refused:
            await reads.kv_read({"op": f"made-up-{number}", "bucket": "b", "shard": 0, "group": 1,
                                 "serializable": True})
        assert refused.value.code == Code.BAD_REQUEST
    assert reads.kv_reads == {}


class Dispatcher:
    def __init__(self) -> None:
        self.commits_fail = False
        self.calls: list[str] = []

    async def local(self, method: str, request: dict) -> dict:
        self.calls.append(method)
        if method == "CommitOffsets" and self.commits_fail:
            raise RocketError(Code.UNAVAILABLE, "no storage")
        return {"members": [request.get("member", "")]} if method == "GroupHeartbeat" else {}


class Gateway:
    """The remoting gateway's clients and consuming parts, over a bridge to a fake dispatcher."""

    def __init__(self) -> None:
        self.bridge = Bridge(Dispatcher(), Clock(), "rocket")
        self.dispatcher, self.clock = self.bridge.dispatcher, self.bridge.clock
        self.clients = Clients(self.bridge)
        self.consuming = Consuming(self.bridge, self.clients)


def heartbeat(client: str, consumer_group: str = "", producer_group: str = "", topic: str = "t") -> Command:
    body = {"clientID": client}
    if consumer_group:
        body["consumerDataSet"] = [{"groupName": consumer_group, "messageModel": "BROADCASTING",
                                    "subscriptionDataSet": [{"topic": topic}]}]
    if producer_group:
        body["producerDataSet"] = [{"groupName": producer_group}]
    return Command(RequestCode.HEART_BEAT, body=orjson.dumps(body))


async def test_remoting_client_groups_are_bounded_and_emptied_ones_go(monkeypatch):
    """One connection naming many groups fills at most limits.remoting_client_groups_max of each kind; a group
    whose last client leaves (unregisters or disconnects) is forgotten, with what it saw of its members."""
    monkeypatch.setattr(limits, "remoting_client_groups_max", 3)
    gateway, connection = Gateway(), object()
    for number in range(10):
        await gateway.clients.heart_beat(heartbeat(f"c{number}", f"consumers{number}", f"producers{number}"),
                                         connection, Caller())
    assert len(gateway.clients._groups) == 3 and len(gateway.clients._producers) == 3
    assert len(gateway.clients._members_seen) <= 3
    await gateway.clients.unregister_client(Command(RequestCode.UNREGISTER_CLIENT, ext={
        "clientID": "c0", "consumerGroup": "consumers0", "producerGroup": "producers0"}), connection, Caller())
    assert "consumers0" not in gateway.clients._groups and "producers0" not in gateway.clients._producers
    assert not [key for key in gateway.clients._members_seen if key[0] == "consumers0"]
    await gateway.clients.heart_beat(heartbeat("c9", "consumers9", "producers9"), connection, Caller())  # room again
    assert "consumers9" in gateway.clients._groups and "producers9" in gateway.clients._producers
    await gateway.clients.connection_closed(connection)
    assert gateway.clients._groups == {} and gateway.clients._producers == {} and gateway.clients._members_seen == {}


async def test_remoting_unwritten_offsets_are_bounded(monkeypatch):
    """While storage does not take commits, a gateway holds the unwritten offsets of at most
    limits.remoting_unwritten_offsets_keys_max groups and topics, the ones already held kept."""
    monkeypatch.setattr(limits, "remoting_unwritten_offsets_keys_max", 4)
    gateway = Gateway()
    gateway.dispatcher.commits_fail = True
    for number in range(20):
        gateway.clients.commit_later(f"group{number}", "t", 0, number)
    assert len(gateway.clients._offsets) == 4 and gateway.clients.uncommitted("group0", "t", 0) == 0
    await gateway.clients._flush_offsets()
    assert len(gateway.clients._offsets) == 4
    gateway.clients.commit_later("group0", "t", 1, 7)  # a pair held takes more queues
    assert gateway.clients.uncommitted("group0", "t", 1) == 7
    gateway.dispatcher.commits_fail = False
    await gateway.clients._flush_offsets()
    assert gateway.clients._offsets == {}


async def test_pop_locks_go_once_unused():
    """The storage role's pop locks are bounded by the pops under way: a lock nobody holds or waits for goes."""
    from rocket.roles.storage.pops import Pops

    locks = Pops(*[None] * 5)  # type: ignore[arg-type]  # only its locks are used
    for number in range(50):
        key = (f"group{number}", "t", 0)
        held = locks._pop_locks.setdefault(key, trio.Lock())
        async with held:
            locks._drop_pop_lock(key, held)
            assert key in locks._pop_locks  # held: kept
        locks._drop_pop_lock(key, held)
    assert locks._pop_locks == {}
