"""The nameserver role: the topic registry, held durably until the Raft-backed metadata arrives.

Dev mode keeps the registry in one checksummed file replaced atomically; the registry's methods
are the seam the Raft state machine will take over (create, get, list).
"""

from __future__ import annotations

import os
import time
import zlib
from pathlib import Path

import orjson

from rocket import limits
from rocket.errors import Code, RocketError
from rocket.model import TopicSpec, check_topic_name


class TopicRegistry:
    def __init__(self, directory: Path, clock=time.time):
        self._path = directory / "topics.json"
        self._clock = clock
        directory.mkdir(parents=True, exist_ok=True)
        self._topics: dict[str, TopicSpec] = self._load()

    def _load(self) -> dict[str, TopicSpec]:
        if not self._path.exists():
            return {}
        raw = self._path.read_bytes()
        try:
            envelope = orjson.loads(raw)
            body = envelope["topics"]
            stored_crc = envelope["crc"]
        except (orjson.JSONDecodeError, KeyError, TypeError):
            raise RocketError(Code.CORRUPT_DATA, f"{self._path} is not a topic registry") from None
        if zlib.crc32(orjson.dumps(body)) != stored_crc:
            raise RocketError(Code.CORRUPT_DATA, f"{self._path} failed its checksum")
        return {entry["name"]: TopicSpec.from_wire(entry) for entry in body}

    def _save(self, topics: dict[str, TopicSpec]) -> None:
        body = [spec.to_wire() for spec in topics.values()]
        data = orjson.dumps({"crc": zlib.crc32(orjson.dumps(body)), "topics": body})
        temporary = self._path.with_suffix(".tmp")
        with open(temporary, "wb") as file:
            file.write(data)
            file.flush()
            os.fdatasync(file.fileno())
        os.replace(temporary, self._path)
        directory = os.open(self._path.parent, os.O_RDONLY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)

    def create(self, name: str, queues: int) -> TopicSpec:
        check_topic_name(name)
        if not 1 <= queues <= limits.queues_per_topic_max:
            raise RocketError(Code.BAD_REQUEST, f"queues must be 1..{limits.queues_per_topic_max}, got {queues}")
        if name in self._topics:
            raise RocketError(Code.TOPIC_EXISTS, f"topic {name!r} already exists")
        if len(self._topics) >= limits.topics_max:
            raise RocketError(Code.OVERLOADED, f"the cluster holds the maximum of {limits.topics_max} topics")
        spec = TopicSpec(name, queues, int(self._clock() * 1000))
        topics = dict(self._topics)
        topics[name] = spec
        self._save(topics)
        self._topics = topics
        return spec

    def get(self, name: str) -> TopicSpec:
        spec = self._topics.get(name)
        if spec is None:
            raise RocketError(Code.UNKNOWN_TOPIC, f"topic {name!r} does not exist")
        return spec

    def list(self) -> list[TopicSpec]:
        return sorted(self._topics.values(), key=lambda spec: spec.name)
