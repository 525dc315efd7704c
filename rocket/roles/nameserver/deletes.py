"""Topic deletes on the nameservers: the topic leaves the metadata at once (its name stays taken), each of its
storage groups drops its queues, and then the name is free; the groups refuse appends to it until it is made again
or limits.topic_tombstone_s passed. A part of Nameserver, over the metadata group."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

import trio

from rocket import limits
from rocket.clock import Clock, sleep_periodic
from rocket.errors import Code, RocketError
from rocket.model import TopicSpec, check_user_topic_name
from rocket.roles.nameserver.group import MetadataGroup
from rocket.serde.typed import DeleteTopicRequest, Empty

log = logging.getLogger("rocket.nameserver")


def queues_by_group(spec: TopicSpec) -> dict[int, list[int]]:
    by_group: dict[int, list[int]] = {}
    for queue in range(spec.queues):
        by_group.setdefault(spec.group_of(queue), []).append(queue)
    return by_group


class TopicDeletes:
    """A delete is three steps, each a change to the metadata or a call safe to repeat, so that a leader that dies
    in the middle leaves it to the next one (finish_forever):
    1. drop_topic: the topic leaves the topics (routes answer UNKNOWN_TOPIC) into `deleting`; the name stays taken.
    2. StorageDrop on each group's leader: one Raft entry drops the topic's queues (data, timers, dead letters,
       offsets, pop states) on every replica, and refuses appends to the name from then on, so a produce that raced
       the delete with a cached route is refused, never half stored; then the leader deletes its objects in the tier.
    3. topic_dropped: the name is free, and its groups are remembered (tombstones). Making the topic again first has
       them take the name again (reopen); so does finish_forever once limits.topic_tombstone_s passed.
    Each drop names the topic's incarnation (its creation time), and a reopen the new one: a group refuses a drop of an
    incarnation older than the newest it heard of, so a deposed leader's late drop never reaches the topic made
    again."""

    def __init__(self, meta: MetadataGroup, clock: Clock, call_leader: Callable[..., Awaitable[dict]]):
        self.meta = meta
        self.clock = clock
        self.call_leader = call_leader  # Nameserver.call_group_leader
        self._finishing: set[str] = set()  # deletes whose drops run now (one run each, not the call's and the loop's)

    async def delete_topic(self, request: DeleteTopicRequest) -> Empty:
        check_user_topic_name(request.topic)
        return await self.meta.on_leader("MetaDeleteTopic", request, self._delete_here)

    async def _delete_here(self, request: DeleteTopicRequest) -> Empty:
        name = request.topic
        if name not in self.meta.metadata.deleting:
            self.meta.metadata.topic(name)  # UNKNOWN_TOPIC
            await self.meta.propose({"op": "drop_topic", "name": name})
            log.info("topic %s: deleting", name)
        await self._finish(name)
        return Empty()

    async def _finish(self, name: str) -> None:
        """Drop the topic from each of its groups, then free its name: one run at a time per topic, each drop sent
        only while this node leads and the topic is still being deleted."""
        while name in self._finishing:  # the call and finish_forever both come: the second waits for the first
            await trio.sleep(limits.leader_poll_s)
        spec = self.meta.metadata.deleting.get(name)
        if spec is None:
            return
        self._finishing.add(name)
        try:
            for group, queues in queues_by_group(spec).items():
                if name not in self.meta.metadata.deleting or not self.meta.leads():
                    raise RocketError(Code.UNAVAILABLE, f"topic {name!r}: the nameserver leader changed during the "
                                      "delete; the new one finishes it")
                await self._drop(group, {"group": group, "op": "topic", "topic": name, "queues": queues,
                                         "incarnation": spec.created_ms})
            await self.meta.propose({"op": "topic_dropped", "name": name, "dropped_ms": self.clock.wall_ms()})
        finally:
            self._finishing.discard(name)
        log.info("topic %s: deleted from groups %s", name, sorted(queues_by_group(spec)))

    async def reopen(self, name: str, incarnation: int) -> None:
        """Before a deleted topic's name is made again (at incarnation, its creation time), or once it was deleted
        long enough: its groups take appends to it again, and refuse drops of older incarnations from then on."""
        found = self.meta.metadata.tombstones.get(name)
        for group in found[0] if found is not None else ():
            if group in self.meta.metadata.groups:
                await self._drop(group, {"group": group, "op": "reopen", "topic": name, "queues": [],
                                         "incarnation": incarnation})

    async def finish_forever(self, leads: Callable[[], bool]) -> None:
        """On the leader: finish the deletes a leader left, and reopen names deleted limits.topic_tombstone_s ago."""
        while True:
            await sleep_periodic(limits.topic_delete_retry_s)
            if not leads():
                continue
            metadata = self.meta.metadata
            expired = [(name, dropped_ms) for name, (_, dropped_ms) in metadata.tombstones.items()
                       if self.clock.wall_ms() - dropped_ms > limits.topic_tombstone_s * 1000]
            try:
                for name in list(metadata.deleting):
                    await self._finish(name)
                for name, dropped_ms in expired:
                    await self.reopen(name, dropped_ms)
                    await self.meta.propose({"op": "tombstone_cleared", "name": name})
            except RocketError as error:
                log.warning("finishing topic deletes: %s", error)

    async def _drop(self, group: int, request: dict) -> None:
        """StorageDrop on the group's leader, for up to limits.leader_wait_s_max."""
        await self.call_leader(group, "StorageDrop", request, limits.leader_wait_s_max, limits.leader_poll_s)
