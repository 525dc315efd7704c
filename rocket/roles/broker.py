"""The broker role: the client-facing RPC methods. It keeps no state of its own that matters:
topics come from the nameserver's registry, messages and consumer offsets from storage.
"""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator

from rocket import __version__, limits
from rocket.errors import Code, RocketError
from rocket.model import TopicSpec, check_group_name
from rocket.roles.nameserver import TopicRegistry
from rocket.serde.batch import peek_count
from rocket.store.group import Store
from rocket.transport.rpc import Dispatcher


class Broker:
    def __init__(self, registry: TopicRegistry, store: Store, roles: tuple[str, ...]):
        self.registry = registry
        self.store = store
        self.roles = roles
        self._round_robin: dict[str, itertools.count] = {}

    def register(self, dispatcher: Dispatcher) -> None:
        handlers = {
            "Ping": self.ping,
            "CreateTopic": self.create_topic,
            "ListTopics": self.list_topics,
            "DescribeTopic": self.describe_topic,
            "Produce": self.produce,
            "Pull": self.pull,
            "Subscribe": self.subscribe,
            "CommitOffsets": self.commit_offsets,
            "FetchOffsets": self.fetch_offsets,
            "SearchOffset": self.search_offset,
        }
        for name, handler in handlers.items():
            dispatcher.handle(name, handler)

    async def ping(self, request: dict) -> dict:
        return {"version": __version__, "roles": list(self.roles)}

    async def create_topic(self, request: dict) -> dict:
        return self.registry.create(request["topic"], request["queues"]).to_wire()

    async def list_topics(self, request: dict) -> dict:
        return {"topics": [spec.to_wire() for spec in self.registry.list()]}

    async def describe_topic(self, request: dict) -> dict:
        spec = self.registry.get(request["topic"])
        queues = [{"queue": queue, **self.store.queue_stats(spec.name, queue)} for queue in range(spec.queues)]
        return {"topic": spec.to_wire(), "queues": queues}

    def _produce_queue(self, spec: TopicSpec, queue: int) -> int:
        """-1 means any queue: spread batches round robin."""
        if queue == -1:
            counter = self._round_robin.setdefault(spec.name, itertools.count())
            return next(counter) % spec.queues
        return self._queue(spec, queue)

    def _queue(self, spec: TopicSpec, queue: int) -> int:
        if not 0 <= queue < spec.queues:
            raise RocketError(Code.BAD_QUEUE, f"topic {spec.name!r} has queues 0..{spec.queues - 1}, not {queue}")
        return queue

    async def produce(self, request: dict) -> dict:
        spec = self.registry.get(request["topic"])
        queue = self._produce_queue(spec, request["queue"])
        base_offset, count = await self.store.append(spec.name, queue, request["batch"])
        return {"queue": queue, "base_offset": base_offset, "count": count}

    def _pull_positions(self, request: dict) -> tuple[TopicSpec, dict[int, int]]:
        spec = self.registry.get(request["topic"])
        positions: dict[int, int] = {}
        for entry in request["queues"]:
            queue = self._queue(spec, entry["queue"])
            if entry["offset"] < 0:
                raise RocketError(Code.BAD_REQUEST, f"offset {entry['offset']} for queue {queue} is negative")
            positions[queue] = entry["offset"]
        if not positions:
            raise RocketError(Code.BAD_REQUEST, "pull needs at least one queue")
        return spec, positions

    def _read(self, topic: str, positions: dict[int, int], max_bytes: int) -> dict:
        batches: list[dict] = []
        next_offsets: list[dict] = []
        budget = max_bytes
        for queue, offset in positions.items():
            # Past the first batch the budget is strict, so a response never exceeds a frame.
            found = self.store.read(topic, queue, offset, budget, at_least_one=not batches) if budget > 0 else []
            for base_offset, data in found:
                batches.append({"queue": queue, "base_offset": base_offset, "batch": data})
                budget -= len(data)
            if found:
                offset = found[-1][0] + peek_count(found[-1][1])
            next_offsets.append({"queue": queue, "offset": offset})
        return {"batches": batches, "next_offsets": next_offsets}

    async def pull(self, request: dict) -> dict:
        spec, positions = self._pull_positions(request)
        max_bytes = max(1, min(request["max_bytes"], limits.read_bytes_max))
        response = self._read(spec.name, positions, max_bytes)
        wait_ms = min(max(request["wait_ms"], 0), limits.pull_wait_ms_max)
        if not response["batches"] and wait_ms:
            wants = {(spec.name, queue): offset for queue, offset in positions.items()}
            await self.store.wait_for_data(wants, wait_ms / 1000)
            response = self._read(spec.name, positions, max_bytes)
        return response

    async def subscribe(self, request: dict) -> AsyncIterator[dict]:
        """Stream pull responses as data arrives, each continuing where the previous ended."""
        spec, positions = self._pull_positions(request)
        max_bytes = max(1, min(request["max_bytes"], limits.read_bytes_max))
        while True:
            response = self._read(spec.name, positions, max_bytes)
            if response["batches"]:
                yield response
                positions = {entry["queue"]: entry["offset"] for entry in response["next_offsets"]}
            else:
                wants = {(spec.name, queue): offset for queue, offset in positions.items()}
                await self.store.wait_for_data(wants, limits.pull_wait_ms_max / 1000)

    async def commit_offsets(self, request: dict) -> dict:
        group = check_group_name(request["group"])
        spec = self.registry.get(request["topic"])
        offsets = {}
        for entry in request["offsets"]:
            queue = self._queue(spec, entry["queue"])
            if entry["offset"] < 0:
                raise RocketError(Code.BAD_REQUEST, f"offset {entry['offset']} for queue {queue} is negative")
            offsets[queue] = entry["offset"]
        await self.store.commit_offsets(group, spec.name, offsets)
        return {}

    async def fetch_offsets(self, request: dict) -> dict:
        group = check_group_name(request["group"])
        spec = self.registry.get(request["topic"])
        offsets = self.store.fetch_offsets(group, spec.name)
        return {"offsets": [{"queue": queue, "offset": offset} for queue, offset in sorted(offsets.items())]}

    async def search_offset(self, request: dict) -> dict:
        spec = self.registry.get(request["topic"])
        return {
            "offsets": [
                {"queue": queue, "offset": self.store.offset_for_time(spec.name, queue, request["timestamp_ms"])}
                for queue in range(spec.queues)
            ]
        }
