"""Topics moving to another storage class while they are produced to and consumed: each queue is copied to a group of
the new class with its offsets, the old groups are sealed, the rest and the consumers' positions copied, the route
switched, and the old copies dropped. A part of Nameserver, over the metadata group."""

from __future__ import annotations

import collections
import logging
from collections.abc import Awaitable, Callable

import trio

from rocket import limits
from rocket.errors import Code, RocketError
from rocket.model import TopicSpec
from rocket.roles.nameserver.group import MetadataGroup
from rocket.roles.nameserver.metadata import ClassMove
from rocket.roles.nameserver.queues import QueuePlacement

log = logging.getLogger("rocket.nameserver")


def by_group(groups: tuple[int, ...]) -> dict[int, list[int]]:
    """group -> its queues, of a topic whose queue i lies in groups[i]."""
    queues: dict[int, list[int]] = {}
    for queue, group in enumerate(groups):
        queues.setdefault(group, []).append(queue)
    return queues


class ClassMoves:
    """`rocket topic update T --storage-class C`. A move is steps that are each a change to the metadata or a call
    safe to repeat, so that a leader that dies in the middle leaves it to the next one (finish_forever):
    1. class_move_start: the topic's queues are placed on groups of the new class (recorded; the topic stays put).
    2. Copy: each queue's batches are read from its old group's leader and imported by its new group's at the same
       offsets (StorageImport skips what the queue holds), while producers still write to the old group, until a
       round leaves less than limits.class_move_tail_bytes to copy.
    3. Seal: from one Raft entry on, each old group refuses the topic's appends, commits and pops (with
       UNKNOWN_TOPIC, as for a deleted topic: the produce that meets it on a broker waits for the new route) and
       still serves its reads.
    4. The tail is copied, then the consumer groups' committed offsets, their pop positions (where their done
       messages end: what is in flight is delivered again), the dead letters, the answers the old groups remember
       of their producers (a batch sent again after the switch gets its first answer, and is stored once), and the
       orderly consumers' queue locks.
    5. class_move_switch: the topic's queues are in the new groups, and brokers learn it from the metadata version.
    6. limits.class_move_drop_grace_s later (brokers with the old route read the old groups meanwhile), each old
       group drops its copies (op moved: the tier's objects stay, the new groups' now), and class_move_done."""

    def __init__(self, meta: MetadataGroup, placement: QueuePlacement, call_leader: Callable[..., Awaitable[dict]]):
        self.meta = meta
        self.metadata = meta.metadata
        self.placement = placement
        self.call_leader = call_leader  # Nameserver.call_group_leader
        self._wake = trio.Event()  # a move started: finish_forever takes it at once

    async def start(self, spec: TopicSpec, storage_class: str) -> None:
        """On the leader, under the nameserver's creating lock: place the topic's queues on the class's groups and
        record the move; finish_forever makes it."""
        groups = self.metadata.class_groups(storage_class)
        if storage_class == spec.storage_class and spec.name not in self.metadata.class_moves:
            return
        if not groups:
            raise RocketError(Code.BAD_REQUEST, f"storage class {storage_class!r} has no storage groups yet")
        voters = {group: self.metadata.groups[group].voters for group in groups}
        placed = [choice.group for choice in self.placement.place(None, spec.name, 0, spec.queues, voters)]
        await self.meta.propose({"op": "class_move_start", "name": spec.name, "storage_class": storage_class,
                                 "queue_groups": self._apart(spec, placed, groups)})
        if spec.name in self.metadata.class_moves:
            log.info("topic %s: moving from storage class %s to %s", spec.name, spec.storage_class, storage_class)
            self._wake.set()

    def _apart(self, spec: TopicSpec, placed: list[int], groups: list[int]) -> list[int]:
        """The groups placement chose for the topic's queues, each moved, where it shares a node with the queue's
        old group (a node keeps one copy of a queue), to the group on other nodes that the move gives the fewest of
        them; the metadata refuses the move if a queue has none."""
        members = {group: set(self.metadata.members_of(group)) for group in groups}
        taken = collections.Counter(placed)
        for queue, group in enumerate(placed):
            old = set(self.metadata.members_of(spec.group_of(queue)))
            apart = [other for other in groups if not members[other] & old]
            if members[group] & old and apart:
                taken[group] -= 1
                placed[queue] = min(apart, key=lambda other: (taken[other], other))
                taken[placed[queue]] += 1
        return placed

    async def finish_forever(self, leads: Callable[[], bool]) -> None:
        """On the leader: make the moves started, one after the other, and those a leader left."""
        while True:
            with trio.move_on_after(limits.topic_delete_retry_s):
                await self._wake.wait()
            self._wake = trio.Event()
            for name in list(self.metadata.class_moves) if leads() else ():
                try:
                    await self._finish(name)
                except RocketError as error:
                    log.warning("topic %s: its move to another storage class waits: %s", name, error)

    async def _finish(self, name: str) -> None:
        move = self.metadata.class_moves[name]
        spec = self.metadata.topic(name)
        if not move.switched:
            for group in by_group(move.queue_groups):  # a topic moved back finds its old tombstones there
                await self._drop(group, name, "reopen", [], spec.created_ms)
            await self._copy(name, move, sealed=False)
            for group, queues in by_group(move.old_groups).items():
                await self._drop(group, name, "seal", queues, spec.created_ms)
            started = trio.current_time()
            await self._copy(name, move, sealed=True)
            await self._copy_consumed(name, move)
            self._check_leads(name)
            await self.meta.propose({"op": "class_move_switch", "name": name})
            log.info("topic %s: switched to storage class %s; appends waited %.3f s", name, move.storage_class,
                     trio.current_time() - started)
            await trio.sleep(limits.class_move_drop_grace_s)
        for group, queues in by_group(move.old_groups).items():
            self._check_leads(name)
            await self._drop(group, name, "moved", queues, spec.created_ms)
        await self.meta.propose({"op": "class_move_done", "name": name})
        log.info("topic %s: moved; its old groups %s dropped it", name, sorted(set(move.old_groups)))

    def _check_leads(self, name: str) -> None:
        if not self.meta.leads():
            raise RocketError(Code.UNAVAILABLE, f"topic {name!r}: the nameserver leader changed during its move; the "
                              "new one finishes it")

    async def _copy(self, name: str, move: ClassMove, sealed: bool) -> None:
        """Each queue's batches its new group lacks, from its old group: all of them once the old groups are sealed,
        else until less than limits.class_move_tail_bytes is left."""
        for queue, (old, new) in enumerate(zip(move.old_groups, move.queue_groups)):
            await self._copy_queue(name, queue, old, new, sealed)

    async def _copy_queue(self, topic: str, queue: int, old: int, new: int, sealed: bool) -> None:
        """The queue's batches (of the topic, or of a dead-letter topic beside it) its new group lacks, from its old
        group (see _copy)."""
        (source,) = (await self._queues(old, topic, [queue]))["queues"]
        (copy,) = (await self._queues(new, topic, [queue]))["queues"]
        position = copy["next_offset"] if copy["next_offset"] > copy["min_offset"] else source["min_offset"]
        while position < source["next_offset"] or not sealed:
            self._check_leads(topic)
            read = await self.call_leader(old, "StorageRead", {
                "group": old, "topic": topic, "queues": [{"queue": queue, "offset": position}],
                "max_bytes": limits.class_move_read_bytes, "wait_ms": 0, "at_least_one": True, "any_replica": False,
                "follower_ok": False, "tag_mask": -1}, limits.leader_wait_s_max, limits.leader_poll_s)
            batches = read["batches"]
            if not batches:
                if sealed:
                    raise RocketError(Code.UNAVAILABLE, f"{topic}/{queue}: group {old} returned nothing at {position}, "
                                      f"before its end {source['next_offset']}")
                return
            imported = await self.call_leader(new, "StorageImport", {
                "group": new, "topic": topic, "queue": queue, "base_offset": batches[0]["base_offset"],
                "batches": [batch["batch"] for batch in batches]}, limits.leader_wait_s_max, limits.leader_poll_s)
            position = imported["offset"]
            if not sealed:
                (source,) = (await self._queues(old, topic, [queue]))["queues"]
                behind = source["next_offset"] - position
                if behind <= 0 or sum(len(batch["batch"]) for batch in batches) < limits.class_move_tail_bytes:
                    return  # the last read was short: what is left is about one more

    async def _copy_consumed(self, name: str, move: ClassMove) -> None:
        """The sealed old groups' consumer offsets, pop positions, dead letters, answers to producers and orderly
        consumers' locks, into the new groups."""
        for old, queues in by_group(move.old_groups).items():
            consumed = await self._queues(old, name, queues, consumed=True)
            for dead_letters in consumed["dead_letters"]:
                for queue in queues:
                    await self._copy_queue(dead_letters, queue, old, move.queue_groups[queue], True)
            for queue in queues:
                answers = [answer for answer in consumed["producers"] if answer["queue"] == queue]
                if answers:
                    new = move.queue_groups[queue]
                    await self.call_leader(new, "StorageImport", {
                        "group": new, "topic": name, "queue": queue, "base_offset": 0, "batches": [],
                        "producers": answers}, limits.leader_wait_s_max, limits.leader_poll_s)
            holders: dict[tuple[int, str, str], list[int]] = {}
            for lock in consumed["locks"]:
                holders.setdefault((move.queue_groups[lock["queue"]], lock["consumer_group"], lock["client"]),
                                   []).append(lock["queue"])
            for (new, consumer_group, client), held in holders.items():
                await self.call_leader(new, "StorageLock", {
                    "group": new, "op": "lock", "consumer_group": consumer_group, "topic": name, "client": client,
                    "queues": held}, limits.leader_wait_s_max, limits.leader_poll_s)
            commits: dict[tuple[str, bool, int], dict[int, int]] = {}
            for entry in consumed["committed"]:
                new = move.queue_groups[entry["queue"]]
                commits.setdefault((entry["consumer_group"], entry["pop"], new), {})[entry["queue"]] = entry["offset"]
            for (consumer_group, pop, new), offsets in sorted(commits.items(), key=lambda item: not item[0][1]):
                await self.call_leader(new, "StorageCommitOffsets", {  # pops first: a pull commit then wins
                    "group": new, "consumer_group": consumer_group, "topic": name, "reset_pop": pop,
                    "offsets": [{"queue": queue, "offset": offset} for queue, offset in offsets.items()]},
                    limits.leader_wait_s_max, limits.leader_poll_s)

    async def _queues(self, group: int, topic: str, queues: list[int], consumed: bool = False) -> dict:
        return await self.call_leader(group, "StorageQueues", {
            "group": group, "topic": topic, "queues": queues, "consumer_group": "", "timestamp_ms": -1,
            "lagging": False, "consumed": consumed}, limits.leader_wait_s_max, limits.leader_poll_s)

    async def _drop(self, group: int, topic: str, op: str, queues: list[int], incarnation: int) -> None:
        await self.call_leader(group, "StorageDrop", {"group": group, "op": op, "topic": topic, "queues": queues,
                                                      "consumer_group": "", "incarnation": incarnation},
                               limits.leader_wait_s_max, limits.leader_poll_s)
