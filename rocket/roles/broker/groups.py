"""Consumer groups on the broker: committed offsets, live members and the queues each reads, describe, reset and delete
(the last four take and return typed messages; the offsets' calls, on every consumer's path, plain ones)."""

from __future__ import annotations

from rocket import limits
from rocket.errors import Code, RocketError
from rocket.model import check_group_name, dead_letter_topic
from rocket.roles.broker.admin import GroupSettings
from rocket.roles.broker.routes import Route, Routes
from rocket.serde.typed import (DeleteGroupRequest, Empty, GroupHeartbeatRequest, GroupHeartbeatResponse,
                                GroupInfoRequest, GroupInfoResponse, GroupQueue, ResetGroupRequest)


def allocate(queues: int, members: list[str], member: str) -> list[int]:
    """The queues a member of a group reads: the sorted members split the queues in contiguous runs, the
    first ones taking one more when they do not divide evenly."""
    if member not in members:
        return []
    index, count = members.index(member), len(members)
    size, extra = divmod(queues, count)
    start = index * size + min(index, extra)
    return list(range(start, start + size + (index < extra)))


class ConsumerGroups:
    def __init__(self, routes: Routes, settings: GroupSettings):
        self.routes = routes
        self.settings = settings

    async def commit_offsets(self, request: dict) -> dict:
        consumer_group = check_group_name(request["group"])
        route = await self.routes.route(request["topic"])
        await self._commit(route, consumer_group, self.routes.offsets(route, request["offsets"]))
        return {}

    async def _commit(self, route: Route, consumer_group: str, offsets: dict[int, int], reset_pop: bool = False) -> None:
        """Commit offsets on their queues' groups; those of a group that refused the topic because it moved to
        another storage class, on their new groups (Routes.rerouted)."""
        for group, queues in self.routes.by_group(route, offsets).items():
            try:
                await self.routes.storage(route, group, "StorageCommitOffsets", {
                    "group": group, "consumer_group": consumer_group, "topic": route.spec.name,
                    "reset_pop": reset_pop,
                    "offsets": [{"queue": queue, "offset": offsets[queue]} for queue in queues]})
            except RocketError as error:
                if error.code != Code.UNKNOWN_TOPIC:
                    raise
                moved, _ = await self.routes.rerouted(route, queues[0], group)
                await self._commit(moved, consumer_group, {queue: offsets[queue] for queue in queues}, reset_pop)

    async def lock_queues(self, request: dict) -> dict:
        """An orderly consumer's queue locks (remoting LOCK_BATCH_MQ and UNLOCK_BATCH_MQ), kept by each queue's
        storage group, so that two brokers never grant one queue to two clients (store/machine.py decides)."""
        consumer_group = check_group_name(request["group"])
        route = await self.routes.route(request["topic"])
        held: list[int] = []
        for group, queues in self.routes.by_group(route, request["queues"]).items():
            held += (await self.routes.storage(route, group, "StorageLock", {
                "group": group, "op": request["op"], "consumer_group": consumer_group, "topic": route.spec.name,
                "client": request["client"], "queues": queues}))["queues"]
        return {"queues": sorted(held)}

    async def describe_group(self, request: GroupInfoRequest) -> GroupInfoResponse:
        """Per queue: the group's pull position, the live pull consumer reading it, its pop consumption, its lag and
        its dead letters."""
        consumer_group = check_group_name(request.group)
        route = await self.routes.route(request.topic)
        members = await self._members(route, consumer_group)
        reader = {queue: member for member in members for queue in allocate(route.spec.queues, members, member)}
        found = await self.routes.queues(route, consumer_group)
        dead = await self.routes.queues(await self.routes.route(dead_letter_topic(consumer_group, route.spec.name)))
        committed = {entry["queue"]: entry["offset"] for response in found for entry in response["offsets"]}
        pops = {entry["queue"]: entry for response in found for entry in response["pops"]}
        dead_letters = {info["queue"]: info["next_offset"] - info["min_offset"] for response in dead
                        for info in response["queues"]}
        queues = []
        for info in sorted((info for response in found for info in response["queues"]), key=lambda info: info["queue"]):
            queue, pop_state = info["queue"], pops[info["queue"]]
            consumed = max(committed.get(queue, info["min_offset"]), pop_state["done_before"])
            queues.append(GroupQueue(queue, info["min_offset"], info["next_offset"], committed.get(queue, -1),
                                     pop_state["cursor"], pop_state["done_before"], pop_state["in_flight"],
                                     max(0, info["next_offset"] - consumed), dead_letters.get(queue, 0),
                                     reader.get(queue, "")))
        return GroupInfoResponse(route.spec.name, consumer_group, queues)

    async def group_heartbeat(self, request: GroupHeartbeatRequest) -> GroupHeartbeatResponse:
        """A pull consumer in clustering mode is alive (or leaves): the group's live members and the
        queues this member reads (RocketMQ's averaging allocation: queues split in contiguous runs)."""
        route = await self.routes.route(request.topic)
        members = await self._members(route, request.group, request.member, request.leave)
        return GroupHeartbeatResponse(members, allocate(route.spec.queues, members, request.member))

    async def _members(self, route: Route, consumer_group: str, member: str = "", leave: bool = True) -> list[str]:
        """The live pull members of a group on a topic, after member heartbeats or leaves (by default, none)."""
        group = route.queue_groups[0]
        return (await self.routes.storage(route, group, "StorageGroupHeartbeat", {
            "group": group, "consumer_group": consumer_group, "topic": route.spec.name, "member": member,
            "leave": leave}))["members"]

    async def reset_group(self, request: ResetGroupRequest) -> GroupInfoResponse:
        """Move the group's pull and pop positions on every queue, or on one, to the earliest or latest message,
        to the first stored at or after a time, or (one queue) to an offset; what was in flight is dropped.
        Refused while the group has live pull members, as Kafka refuses: each keeps its positions in memory and
        its next commit would put them back. Pop consumers keep theirs in storage, which this moves."""
        consumer_group = check_group_name(request.group)
        route = await self.routes.route(request.topic)
        to, queue = request.to, request.queue
        if to not in ("earliest", "latest", "time", "offset"):
            raise RocketError(Code.BAD_REQUEST, f"reset to {to!r}: expected earliest, latest, time or offset")
        if queue != -1:
            self.routes.queue(route.spec, queue)
        if to == "offset":
            if queue == -1 or request.offset < 0:
                raise RocketError(Code.BAD_REQUEST, "a reset to an offset names one queue and an offset of 0 or more")
            targets = {queue: request.offset}
        else:
            by_time = to == "time"
            targets = {}
            timestamp_ms = max(0, request.timestamp_ms) if by_time else -1
            for response in await self.routes.queues(route, timestamp_ms=timestamp_ms):
                if by_time:
                    targets.update((entry["queue"], entry["offset"]) for entry in response["time_offsets"])
                else:
                    field = "min_offset" if to == "earliest" else "next_offset"
                    targets.update((info["queue"], info[field]) for info in response["queues"])
            if queue != -1:
                targets = {queue: targets[queue]}
        await self._refuse_if_live(route, consumer_group, "reset", ", or move a running one with Consumer.seek()")
        await self._commit(route, consumer_group, targets, reset_pop=True)
        return await self.describe_group(GroupInfoRequest(route.spec.name, consumer_group))

    async def delete_group(self, request: DeleteGroupRequest) -> Empty:
        """Forget a consumer group on a topic: its committed offsets, pop states and dead letters, on every queue,
        and its settings (which are the group's, on every topic). Refused while it has live pull members, whose next
        commit would make it again. A group made again with the name starts where a new group starts."""
        consumer_group = check_group_name(request.group)
        route = await self.routes.route(request.topic)
        await self._refuse_if_live(route, consumer_group, "delete")
        for group, queues in self.routes.by_group(route, range(route.spec.queues)).items():
            await self.routes.storage(route, group, "StorageDrop", {
                "group": group, "op": "group", "topic": route.spec.name, "queues": queues,
                "consumer_group": consumer_group})
        await self.settings.delete(consumer_group)
        return Empty()

    async def _refuse_if_live(self, route: Route, consumer_group: str, action: str, advice: str = "") -> None:
        members = await self._members(route, consumer_group)
        if members:
            raise RocketError(Code.GROUP_ACTIVE, (
                f"group {consumer_group!r} on {route.spec.name!r} has {len(members)} live consumer(s) "
                f"({', '.join(members[:3])}{', ...' if len(members) > 3 else ''}), whose next commit would undo the "
                f"{action}: stop them first (a closed consumer leaves at once; one stopped without closing, "
                f"{limits.group_member_expiry_s:g} s after its last poll){advice}"))

    async def fetch_offsets(self, request: dict) -> dict:
        consumer_group = check_group_name(request["group"])
        route = await self.routes.route(request["topic"])
        offsets = [entry for response in await self.routes.queues(route, consumer_group)
                   for entry in response["offsets"]]
        return {"offsets": sorted(offsets, key=lambda entry: entry["queue"])}
