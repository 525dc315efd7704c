"""Shared domain types: one Message, one TopicSpec, and the names and checks they share."""

from __future__ import annotations

import dataclasses
import re
import zlib

from rocket import limits
from rocket.errors import Code, RocketError

_name_pattern = re.compile(r"^[A-Za-z0-9._%-]+$")


@dataclasses.dataclass(slots=True)
class Message:
    """One message as a user sees it. queue and offset are set once it is stored."""

    body: bytes
    key: str = ""
    tag: str = ""
    properties: dict[str, str] = dataclasses.field(default_factory=dict)
    timestamp_ms: int = 0
    queue: int = -1
    offset: int = -1


@dataclasses.dataclass(slots=True, frozen=True)
class TopicSpec:
    name: str
    queues: int
    created_ms: int = 0
    groups: tuple[int, ...] = ()  # the storage groups its queues are spread over, fixed at creation

    def group_of(self, queue: int) -> int:
        """The storage group of a queue: queues hash onto the topic's groups, offset per topic so that
        many small topics spread over all groups."""
        return self.groups[(zlib.crc32(self.name.encode()) + queue) % len(self.groups)]

    def to_wire(self) -> dict:
        return {"name": self.name, "queues": self.queues, "created_ms": self.created_ms}

    @classmethod
    def from_wire(cls, payload: dict) -> "TopicSpec":
        return cls(payload["name"], int(payload["queues"]), int(payload.get("created_ms", 0)))


def check_name(kind: str, name: str, bytes_max: int) -> str:
    """Topic and group names become key prefixes and file names, so they are kept plain."""
    if not name or len(name.encode()) > bytes_max or not _name_pattern.match(name):
        raise RocketError(
            Code.BAD_REQUEST,
            f"{kind} name {name!r} must be 1-{bytes_max} characters of letters, digits, '.', '_', '%' or '-'",
        )
    return name


def check_topic_name(name: str) -> str:
    return check_name("topic", name, limits.topic_name_bytes_max)


def check_group_name(name: str) -> str:
    return check_name("group", name, limits.group_name_bytes_max)


def queue_for_key(key: str, queues: int) -> int:
    """Stable key -> queue mapping shared by every client (crc32 is the same everywhere)."""
    return zlib.crc32(key.encode()) % queues
