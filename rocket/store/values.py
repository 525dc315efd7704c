"""The values the queue index holds and the state machine works on: a batch's index entry, a queue's stats, a
pending timer. Pure."""

from __future__ import annotations

import dataclasses
import typing

from rocket.model import ALL_TAGS, half_topic

HALF_PREFIX = half_topic("")


class IndexEntry(typing.NamedTuple):  # made for every batch applied or read: a frozen dataclass costs 3x to make
    base_offset: int
    position: int
    count: int  # pyright: ignore[reportIncompatibleMethodOverride]: the field hides tuple.count, unused
    batch_bytes: int
    first_timestamp_ms: int
    append_ms: int
    tag_summary: int = ALL_TAGS  # the batch header's 64-bit tag summary, so filters skip batches unread


@dataclasses.dataclass(slots=True)
class QueueStats:
    next_offset: int = 0
    bytes: int = 0
    last_append_ms: int = 0
    group: int = 0  # the Raft group the queue belongs to
    available_from: int = 0  # batches before this offset are not on this replica (it installed a snapshot)
    # Telemetry, on this node only, since it started: what reads returned, and the in and out totals as the last
    # telemetry sample saw them (Store.take_traffic); None until then, unless the queue began on this node.
    out_messages: int = 0
    out_bytes: int = 0
    sampled: tuple[int, int, int, int] | None = None
    committed: dict[str, int] | None = None  # consumer group -> offset it committed on this queue since then


@dataclasses.dataclass(slots=True, frozen=True)
class Timer:
    """A delayed message waiting in a system queue (topic, queue, offset) for its delivery time."""

    deliver_at_ms: int
    topic: str
    queue: int
    offset: int
    checks: int = 0  # a half message: how often its transaction was checked back
