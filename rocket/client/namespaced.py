"""A channel within a namespace (connect(namespace=...)): the topics, consumer groups and KV buckets its requests name
are the namespace's (model.in_namespace), the names in its answers are seen from within it, and listings hold only
the namespace's own."""

from __future__ import annotations

from collections.abc import AsyncIterator

import trio

from rocket import limits
from rocket.errors import RocketError
from rocket.model import check_namespace, in_namespace, outside_namespace
from rocket.transport.channel import Channel

NAMED = ("topic", "group", "bucket")  # request fields that name a resource (when they are strings)
ANSWER_NAMES = ("name", "topic", "group", "bucket")  # answer fields that may
LISTINGS = {"ListTopics": "topics", "KvListBuckets": "buckets", "ConsumerGroups": "groups", "TierStatus": "topics"}
# Answers that name no resource: the data plane's, left as they come.
UNNAMED = frozenset({"Produce", "Pull", "Subscribe", "Receive", "Ack", "ChangeInvisible", "DeadLetter", "Bury",
                     "CommitOffsets", "FetchOffsets", "SearchOffset", "KvPut", "KvGet", "KvDelete", "KvRange", "KvTxn",
                     "KvWatch", "KvExport", "Ping", "Hello"})


def seen_from(namespace: str, error: RocketError) -> RocketError:
    """An error as seen from within namespace: the names in its message without the namespace's prefix."""
    stored = f"{namespace}%"
    return RocketError(error.code, error.message.replace(stored, "")) if stored in error.message else error


class NamespacedChannel:
    """A Channel over another, within namespace."""

    def __init__(self, channel: Channel, namespace: str):
        self.channel = channel
        self.namespace = check_namespace(namespace)

    async def call(self, method: str, message: dict, timeout_s: float = limits.request_timeout_s_default,
                   sent: trio.Event | None = None) -> dict:
        try:
            answer = await self.channel.call(method, self._request(message), timeout_s, sent)
        except RocketError as error:
            raise seen_from(self.namespace, error) from None
        return self._answer(method, answer)

    async def stream(self, method: str, message: dict) -> AsyncIterator[dict]:
        try:
            async for item in self.channel.stream(method, self._request(message)):
                yield self._answer(method, item)
        except RocketError as error:
            raise seen_from(self.namespace, error) from None

    def __getattr__(self, name: str):
        return getattr(self.channel, name)  # discover(), and what else the channel below has

    def _request(self, message: dict) -> dict:
        return {key: in_namespace(self.namespace, value) if key in NAMED and isinstance(value, str) else value
                for key, value in message.items()}

    def _answer(self, method: str, answer: dict) -> dict:
        if method in UNNAMED:
            return answer
        listing = LISTINGS.get(method)
        if listing is not None:
            answer = {**answer, listing: [item for item in answer[listing] if self._inside(item)]}
        return {key: self._seen(key, item) for key, item in answer.items()}

    def _inside(self, item: dict) -> bool:
        topic = item.get("topic")
        named: dict = topic if isinstance(topic, dict) else item
        name = next((named[key] for key in ANSWER_NAMES if isinstance(named.get(key), str)), None)
        return name is not None and outside_namespace(self.namespace, name) is not None

    def _seen(self, key: str, value: object) -> object:
        """A field of an answer with the namespace's names in it as seen from within it, at any depth."""
        if isinstance(value, str):
            seen = outside_namespace(self.namespace, value) if key in ANSWER_NAMES else None
            return value if seen is None else seen
        if isinstance(value, dict):
            return {inner: self._seen(inner, item) for inner, item in value.items()}
        if isinstance(value, list):
            return [self._seen(key, item) for item in value]
        return value
