"""Client quotas (rocket/quotas.py): token-bucket math on a fake clock, which quota applies, the bounded bucket map,
the metadata's quota ops, the dispatcher's charging and muting, and the clients honouring throttle_ms."""

import orjson
import pytest
import trio

from rocket import limits
from rocket.cli.acl import parse_rate
from rocket.client.producer import Producer
from rocket.client.throttle import Throttle
from rocket.errors import Code, RocketError
from rocket.quotas import Bucket, Quotas, check_entity, check_quota
from rocket.raft.core import Entry
from rocket.roles.nameserver.metadata import Metadata
from rocket.serde import json_codec
from rocket.transport.local import MockChannel
from rocket.transport.guard import Caller
from rocket.transport.rpc import Dispatcher


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def quota(entity: str, produce: int = 0, consume: int = 0, requests: float = 0.0) -> dict:
    return {"entity": entity, "produce_bytes_per_s": produce, "consume_bytes_per_s": consume,
            "requests_per_s": requests}


# ---- the bucket -------------------------------------------------------------------------------------------------

def test_a_bucket_gives_its_burst_then_throttles_by_the_debt_and_refills_at_its_rate():
    bucket = Bucket(100.0, now=0.0)  # 100 tokens a second, limits.quota_burst_s of them saved
    assert bucket.take(100 * limits.quota_burst_s, 0.0) == 0.0  # the burst
    assert bucket.take(50, 0.0) == pytest.approx(0.5)  # 50 in debt at 100/s: half a second
    assert bucket.take(0, 0.25) == pytest.approx(0.25)  # a quarter second repaid half of it
    assert bucket.take(0, 0.5) == 0.0  # out of debt
    assert bucket.take(0, 1000.0) == 0.0 and bucket.tokens == 100 * limits.quota_burst_s  # never more than the burst


def test_a_bucket_debt_is_capped_at_the_longest_throttle():
    bucket = Bucket(10.0, now=0.0)
    assert bucket.take(10**9, 0.0) == pytest.approx(limits.quota_throttle_s_max)
    # Idle for quota_idle_s, even the deepest debt is repaid and the bucket full again (so dropping it is safe).
    assert bucket.take(0, limits.quota_idle_s) == 0.0 and bucket.tokens == 10 * limits.quota_burst_s


# ---- which quota applies ----------------------------------------------------------------------------------------

def test_no_quota_no_bucket_and_no_throttle():
    quotas = Quotas(FakeClock())
    assert quotas.charge("alice", "orders", produced=10**9) == 0.0 and len(quotas) == 0
    quotas.update([quota("topic:other", produce=1)])
    assert quotas.charge("alice", "orders", produced=10**9) == 0.0 and len(quotas) == 0


def test_a_users_own_quota_replaces_the_default_and_zero_is_unlimited():
    clock = FakeClock()
    quotas = Quotas(clock)
    quotas.update([quota("user:*", produce=1000), quota("user:alice", consume=1000)])
    # bob has none of his own: user:*'s 1000 B/s; a second's burst, then 1 s per 1000 B.
    assert quotas.charge("bob", "", produced=1000) == 0.0
    assert quotas.charge("bob", "", produced=2000) == pytest.approx(2.0)
    # alice's own quota leaves produce unlimited (no merging with user:*), and limits consume.
    assert quotas.charge("alice", "", produced=10**6) == 0.0
    assert quotas.charge("alice", "", consumed=3000) == pytest.approx(2.0)
    # each user has buckets of their own
    assert quotas.charge("carol", "", produced=1000) == 0.0


def test_a_topic_quota_holds_every_client_of_the_topic_and_the_longer_throttle_wins():
    clock = FakeClock()
    quotas = Quotas(clock)
    quotas.update([quota("topic:orders", produce=1000), quota("user:alice", produce=500)])
    assert quotas.charge(None, "orders", produced=2000) == pytest.approx(1.0)  # no user (auth off): the topic's
    assert quotas.charge(None, "orders", produced=1000) == pytest.approx(2.0)  # shared: the debt adds up
    # alice on orders: her bucket (500 B/s, 1500 in debt: 3 s) and the topic's (2000 + 2000 in debt: 4 s)
    assert quotas.charge("alice", "orders", produced=2000) == pytest.approx(4.0)
    assert quotas.charge("alice", "other", produced=1000) == pytest.approx(5.0)  # hers alone, deeper
    assert quotas.throttled == 4


def test_requests_per_second_count_each_call():
    clock = FakeClock()
    quotas = Quotas(clock)
    quotas.update([quota("user:*", requests=10)])
    throttles = [quotas.charge("bob", "") for _ in range(15)]
    assert throttles[:10] == [0.0] * 10 and throttles[-1] == pytest.approx(0.5)
    clock.now += 0.5
    assert quotas.charge("bob", "") == pytest.approx(0.1)


def test_a_changed_quota_takes_its_new_rate_at_once():
    clock = FakeClock()
    quotas = Quotas(clock)
    quotas.update([quota("user:*", produce=1000)])
    assert quotas.charge("bob", "", produced=1000) == 0.0
    quotas.update([quota("user:*", produce=100)])
    assert quotas.charge("bob", "", produced=100) == pytest.approx(1.0)  # 100 in debt at 100/s
    quotas.update([])
    assert quotas.charge("bob", "", produced=10**6) == 0.0


# ---- the bucket map's bounds ------------------------------------------------------------------------------------

def test_the_bucket_map_is_bounded_and_forgets_the_least_recently_used(monkeypatch):
    monkeypatch.setattr(limits, "quota_buckets_max", 3)
    clock = FakeClock()
    quotas = Quotas(clock)
    quotas.update([quota("user:*", produce=1000)])
    for user in range(10):
        quotas.charge(f"u{user}", "", produced=1)
        assert len(quotas) <= 3
    assert [key[0] for key in quotas._buckets] == ["user:u7", "user:u8", "user:u9"]
    quotas.charge("u7", "", produced=1)  # used: now the most recent
    quotas.charge("u10", "", produced=1)
    assert [key[0] for key in quotas._buckets] == ["user:u9", "user:u7", "user:u10"]


def test_idle_buckets_expire():
    clock = FakeClock()
    quotas = Quotas(clock)
    quotas.update([quota("user:*", produce=1000)])
    for user in range(5):
        quotas.charge(f"u{user}", "", produced=5000)
    assert len(quotas) == 5
    clock.now += limits.quota_idle_s
    quotas.charge("fresh", "", produced=1)
    assert len(quotas) == 1


# ---- checks and the metadata ------------------------------------------------------------------------------------

def test_entities_and_rates_are_checked():
    for good in ("user:alice", "user:*", "topic:orders"):
        assert check_entity(good) == good
    for bad in ("alice", "group:g", "topic:*", "user:", "user:a b"):
        with pytest.raises(RocketError) as refused:
            check_entity(bad)
        assert refused.value.code == Code.BAD_REQUEST
    with pytest.raises(RocketError):
        check_quota(quota("user:*", produce=-1))
    assert check_quota({"entity": "user:*", "requests_per_s": 5}) == quota("user:*", requests=5.0)


def apply(metadata: Metadata, *commands: dict) -> list:
    return metadata.apply([Entry(1, n + 1, orjson.dumps(c)) for n, c in enumerate(commands)], [-1] * len(commands))


def test_metadata_sets_and_drops_quotas_under_the_acl_version_and_snapshots_them():
    metadata = Metadata()
    apply(metadata, {"op": "set_quota", "quota": quota("user:*", produce=1000)},
          {"op": "set_quota", "quota": quota("topic:orders", consume=5)},
          {"op": "set_quota", "quota": quota("user:*", produce=2000)})
    assert metadata.acl_version == 3 and metadata.quotas["user:*"]["produce_bytes_per_s"] == 2000
    [missing] = apply(metadata, {"op": "delete_quota", "entity": "user:nobody"})
    assert isinstance(missing, RocketError) and missing.code == Code.NOT_FOUND
    apply(metadata, {"op": "delete_quota", "entity": "topic:orders"})
    assert list(metadata.quotas) == ["user:*"] and metadata.acl_version == 4
    copy = Metadata()
    copy.restore(metadata.snapshot())
    assert copy.quotas == metadata.quotas and copy.snapshot() == metadata.snapshot()
    old = orjson.loads(metadata.snapshot()[0])
    del old["quotas"]  # a snapshot from before quotas
    copy.restore([orjson.dumps(old)])
    assert copy.quotas == {}


def test_metadata_holds_at_most_quotas_max(monkeypatch):
    monkeypatch.setattr(limits, "quotas_max", 2)
    metadata = Metadata()
    results = apply(metadata, *({"op": "set_quota", "quota": quota(f"user:u{n}", produce=1)} for n in range(3)),
                    {"op": "set_quota", "quota": quota("user:u0", produce=2)})
    assert results[2].code == Code.OVERLOADED and results[3] is None and len(metadata.quotas) == 2


# ---- the dispatcher charges and mutes ---------------------------------------------------------------------------

def produce_dispatcher() -> Dispatcher:
    dispatcher = Dispatcher()

    async def produce(request: dict) -> dict:
        return {"queue": 0, "base_offset": 0, "count": 1}

    dispatcher.handle("Produce", produce)
    dispatcher.metering.quotas = Quotas(trio.current_time)
    return dispatcher


async def produce_call(dispatcher: Dispatcher, caller: Caller | None, size: int) -> dict:
    body = json_codec.encode("ProduceRequest", {"topic": "orders", "queue": 0, "batch": b""})
    reply, _ = await dispatcher.call("Produce", json_codec, body, memoryview(b"x" * size), detached=True,
                                     caller=caller)
    return json_codec.decode("ProduceResponse", reply)


async def test_the_dispatcher_answers_the_throttle_time_and_holds_the_connections_next_call(autojump_clock):
    dispatcher = produce_dispatcher()
    dispatcher.metering.quotas.update([quota("topic:orders", produce=1000)])
    caller = Caller(source="10.0.0.1")
    assert (await produce_call(dispatcher, caller, 900))["throttle_ms"] == 0  # within the burst
    response = await produce_call(dispatcher, caller, 2000)
    # 2000 B at 1000 B/s, less what the burst had left, and the request's JSON head (it counts too)
    assert 1950 <= response["throttle_ms"] <= 2100
    assert caller.muted_until > trio.current_time()
    started = trio.current_time()
    await produce_call(dispatcher, caller, 1)  # a client that ignores the throttle is held all the same
    assert trio.current_time() - started >= 1.95
    # Nodes (peers) and in-process calls (no caller) are not charged.
    assert (await produce_call(dispatcher, Caller(peer=True), 10**6))["throttle_ms"] == 0
    assert (await produce_call(dispatcher, None, 10**6))["throttle_ms"] == 0


async def test_without_auth_user_quotas_do_not_apply(autojump_clock):
    dispatcher = produce_dispatcher()
    dispatcher.metering.quotas.update([quota("user:*", produce=10)])
    assert (await produce_call(dispatcher, Caller(user="alice"), 10**5))["throttle_ms"] == 0  # unproven name


# ---- clients honour it ------------------------------------------------------------------------------------------

async def test_the_producer_waits_the_throttle_time_before_its_next_batch(autojump_clock):
    sent_at = []

    def produce(request: dict) -> dict:
        sent_at.append(trio.current_time())
        return {"queue": 0, "base_offset": 0, "count": 1, "scheduled": False, "throttle_ms": 1500}

    async with trio.open_nursery() as nursery:
        producer = Producer(MockChannel({"Produce": produce}), "orders", 1, nursery, linger_s=0, batch_bytes=1000,
                            in_flight_max=1)
        receipt = await producer._produce(b"batch", 0)
        await producer._produce(b"batch", 0)
    assert receipt.throttle_ms == 1500 and sent_at[1] - sent_at[0] >= 1.5
    assert producer.throttle.times == 2 and producer.throttle.total_ms == 3000


async def test_a_throttle_without_throttle_ms_waits_nothing(autojump_clock):
    throttle = Throttle()
    assert throttle.told({"queue": 0}) == 0
    started = trio.current_time()
    await throttle.wait()
    assert trio.current_time() == started


def test_the_cli_reads_rates_as_people_write_them():
    assert parse_rate("--produce-bytes", "200KiB") == 200 * 1024
    assert parse_rate("--produce-bytes", "1MiB/s") == 1024 * 1024
    assert parse_rate("--produce-bytes", "5MB") == 5_000_000
    assert parse_rate("--produce-bytes", "1048576") == 1048576
    assert parse_rate("--produce-bytes", "0") == 0
