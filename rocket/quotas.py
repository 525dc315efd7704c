"""Client quotas (issue 34), as Kafka's: throttle, don't fail. Each broker enforces alone the quotas of the metadata
(Quotas), one per entity (check_entity), with a token bucket per entity and rate (Bucket); a call over one is slowed,
never refused. Pure: the clock is a function the owner passes (the node's `Clock`).
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Iterable

from rocket import limits
from rocket.access import in_namespace
from rocket.errors import Code, RocketError

RATES = ("produce_bytes_per_s", "consume_bytes_per_s", "requests_per_s")
ANY_USER = "user:*"


def check_entity(entity: str) -> str:
    """`user:NAME`, `user:*`, `topic:NAME` or `namespace:NS` (`namespace:NS/topic:NAME` is topic:NS%NAME).

    Quotas live in the metadata beside users and policies (roles/nameserver/metadata.py), one per entity: `user:NAME`
    is that user's; `user:*` every user's that has none of its own (the most specific entity wins whole, as in
    Kafka: a `user:NAME` quota replaces `user:*`, it does not merge with it field by field); `topic:NAME` every
    client's calls on that topic, together (one bucket per topic, shared by all its clients); `namespace:NS` every
    client's calls on the topics of namespace NS, together. Each sets RATES; 0 means unlimited. Nodes get them with
    the users and policies (MetaAclState)."""
    if "/" in entity:
        entity = in_namespace(entity, "quota entity")
    kind, _, name = entity.partition(":")
    if kind not in ("user", "topic", "namespace") or not name or (kind != "user" and name == "*") \
            or (kind == "namespace" and "%" in name) or len(name) > 255 or any(c.isspace() for c in name):
        raise RocketError(Code.BAD_REQUEST, f"quota entity {entity!r}: expected user:NAME, user:* (every user "
                          "without a quota of its own), topic:NAME or namespace:NS")
    return entity


def check_quota(request: dict) -> dict:
    """The quota's wire form (AclQuota), its rates checked: numbers, 0 (unlimited) or more."""
    quota: dict[str, object] = {"entity": check_entity(request["entity"])}
    for rate in RATES:
        value = request.get(rate, 0)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
            raise RocketError(Code.BAD_REQUEST, f"{rate} {value!r}: a number, 0 (unlimited) or more")
        quota[rate] = float(value) if rate == "requests_per_s" else int(value)
    return quota


class Bucket:
    """A token bucket: `rate` tokens a second, at most `rate * limits.quota_burst_s` saved; a take may leave it in
    debt (at most `rate * limits.quota_throttle_s_max`), which is the time its owner is throttled for."""

    __slots__ = ("rate", "tokens", "at")

    def __init__(self, rate: float, now: float):
        self.rate = rate
        self.tokens = rate * limits.quota_burst_s
        self.at = now

    def take(self, amount: float, now: float) -> float:
        """Take amount; returns the seconds until the bucket is out of debt (0: it is not in debt)."""
        rate = self.rate
        self.tokens = min(rate * limits.quota_burst_s, self.tokens + (now - self.at) * rate) - amount
        self.at = now
        if self.tokens >= 0:
            return 0.0
        floor = -rate * limits.quota_throttle_s_max
        if self.tokens < floor:
            self.tokens = floor
        return -self.tokens / rate


class Quotas:
    """A broker's view: the quotas of the metadata (refreshed by the node) and its buckets, the least recently used
    first, at most limits.quota_buckets_max; a bucket idle for limits.quota_idle_s is full again, so it is dropped.

    Each broker enforces the quotas alone, so a client talking to N brokers gets N times its quota, as with Kafka's
    per-broker quotas. The transport's dispatcher charges a call after serving it (transport/metering.py): the bytes of
    a Produce request, of a Pull, Subscribe or Receive answer, one request for every call from the wire. A call on a
    topic with a quota and by a user with one is held by both: its throttle is the longer. A bucket may go into debt;
    the time until the debt is repaid is the call's throttle time. The answer carries it (`throttle_ms`) and the
    connection reads no further request until it has passed (Kafka mutes the channel), so a client that ignores it is
    held too. Without auth calls carry no user: only topic quotas apply. The clients' side is client/throttle.py."""

    def __init__(self, monotonic: Callable[[], float]):
        self._monotonic = monotonic
        self.entities: dict[str, dict] = {}  # entity -> its AclQuota
        self._buckets: collections.OrderedDict[tuple[str, str], Bucket] = collections.OrderedDict()
        self.throttled = 0  # calls throttled, and their seconds (for metrics and tests)
        self.throttled_s = 0.0

    def update(self, quotas: Iterable[dict]) -> None:
        """Take the quotas of an AclState answer."""
        self.entities = {quota["entity"]: quota for quota in quotas}

    def __len__(self) -> int:
        return len(self._buckets)

    def quota_of_user(self, user: str) -> dict | None:
        return self.entities.get(f"user:{user}") or self.entities.get(ANY_USER)

    def charge(self, user: str | None, topic: str, produced: int = 0, consumed: int = 0, requests: int = 1) -> float:
        """Charge one call served (its bytes in and out, and a request) to the user's and the topic's buckets;
        returns the seconds its caller is throttled for (0 when within every quota). O(1)."""
        entities = self.entities
        if not entities:
            return 0.0
        now = self._monotonic()
        throttle = 0.0
        if user is not None:
            quota = entities.get(f"user:{user}") or entities.get(ANY_USER)
            if quota is not None:
                throttle = self._take(f"user:{user}", quota, produced, consumed, requests, now)
        if topic:
            quota = entities.get(f"topic:{topic}")
            if quota is not None:
                throttle = max(throttle, self._take(f"topic:{topic}", quota, produced, consumed, requests, now))
            namespace, separator, _ = topic.partition("%")  # within namespace NS a topic is NS%name
            quota = entities.get(f"namespace:{namespace}") if separator and namespace else None
            if quota is not None:
                owner = f"namespace:{namespace}"
                throttle = max(throttle, self._take(owner, quota, produced, consumed, requests, now))
        self._expire(now)
        if throttle > 0:
            throttle = min(throttle, limits.quota_throttle_s_max)
            self.throttled += 1
            self.throttled_s += throttle
        return throttle

    def _take(self, owner: str, quota: dict, produced: int, consumed: int, requests: int, now: float) -> float:
        throttle = 0.0
        for rate_name, amount in (("produce_bytes_per_s", produced), ("consume_bytes_per_s", consumed),
                                  ("requests_per_s", requests)):
            rate = quota[rate_name]
            if not rate or not amount:
                continue
            key = (owner, rate_name)
            bucket = self._buckets.get(key)
            if bucket is None:
                bucket = self._buckets[key] = Bucket(rate, now)
            else:
                self._buckets.move_to_end(key)
                if bucket.rate != rate:  # the quota changed: the new rate from now on
                    bucket.tokens = min(bucket.tokens + (now - bucket.at) * bucket.rate, rate * limits.quota_burst_s)
                    bucket.rate, bucket.at = rate, now
            throttle = max(throttle, bucket.take(amount, now))
        return throttle

    def _expire(self, now: float) -> None:
        """Drop the buckets idle long enough to be full (amortized O(1): the oldest come first), and the least
        recently used beyond the bound (a client whose bucket is dropped in debt gets a full one: lenient)."""
        buckets = self._buckets
        while buckets:
            key, oldest = next(iter(buckets.items()))
            if len(buckets) <= limits.quota_buckets_max and now - oldest.at < limits.quota_idle_s:
                return
            del buckets[key]
