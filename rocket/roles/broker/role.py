"""The broker role: the client-facing RPC methods, and nothing that cannot be lost. Topics and routes
come from the nameservers (cached; refreshed when the node's heartbeat reports a newer metadata
version, by age, and on errors), messages and consumer offsets
live in the storage groups. Any broker serves any client; a call that finds a replica gone or no
longer leading is retried on the group's other replicas.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import time
from collections.abc import AsyncIterator

import trio

from rocket import __version__, limits
from rocket.config import Address
from rocket.errors import Code, RocketError
from rocket.filter import Filter, SqlFilter, compile_filter
from rocket.model import (SYSTEM_PREFIX, TopicSpec, check_group_name, dead_letter_topic, read_charge, timer_topic,
                          unresolved_topic)
from rocket.roles.peers import RETRYABLE, Peers, address_of
from rocket.serde import batch as batch_codec
from rocket.serde.batch import FLAG_TIMED, FLAG_TRANSACTION, check_header
from rocket.transport.rpc import Dispatcher

log = logging.getLogger("rocket.broker")


@dataclasses.dataclass(slots=True)
class _Route:
    spec: TopicSpec
    version: int
    queue_groups: list[int]
    voters: dict[int, tuple[int, ...]]
    fetched_at: float


DEAD_LETTER_PREFIX = dead_letter_topic("", "")[:-1]  # "%DLQ%"
UNRESOLVED_PREFIX = unresolved_topic("")
TIMER_PREFIX = timer_topic("")  # a delay topic's waiting messages, read by their timer id (rocket message get)


def _system_base(topic: str) -> str:
    """The topic beside whose queues a readable system queue lies: %DLQ%group%topic, %TXN_UNRESOLVED%topic,
    %TIMER%topic."""
    if topic.startswith(UNRESOLVED_PREFIX):
        return topic[len(UNRESOLVED_PREFIX):]
    if topic.startswith(TIMER_PREFIX):
        return topic[len(TIMER_PREFIX):]
    if topic.startswith(DEAD_LETTER_PREFIX):
        consumer_group, _, base = topic[len(DEAD_LETTER_PREFIX):].partition("%")
        if dead_letter_topic(consumer_group, base) == topic:
            return base
    raise RocketError(Code.UNKNOWN_TOPIC, f"{topic!r} is not a topic, nor the dead letters (%DLQ%GROUP%TOPIC) or "
                      "unresolved transactions (%TXN_UNRESOLVED%TOPIC) of one")


def allocate(queues: int, members: list[str], member: str) -> list[int]:
    """The queues a member of a group reads: the sorted members split the queues in contiguous runs, the
    first ones taking one more when they do not divide evenly."""
    if member not in members:
        return []
    index, count = members.index(member), len(members)
    size, extra = divmod(queues, count)
    start = index * size + min(index, extra)
    return list(range(start, start + size + (index < extra)))


def _may_match(chosen: SqlFilter, batch: bytes) -> bool:
    """Whether a message of the batch matches; a batch that cannot be read goes to the client, whose poll names
    it (BAD_BATCH with its offsets) and can step past it, where failing the pull would stop every queue."""
    messages = batch_codec.readable(batch)
    return messages is None or any(chosen.matches(message) for message in messages)


def _check_message_type(spec: TopicSpec, flags: int) -> None:
    """A topic takes only sends of its type (RocketMQ 5's topic message type check)."""
    timed = bool(flags & FLAG_TIMED)
    if spec.message_type == "system":
        raise RocketError(Code.WRONG_MESSAGE_TYPE, f"{spec.name!r} is a system queue: only the system writes there "
                          "(rocket dlq resend sends dead letters to their topic again)")
    if bool(flags & FLAG_TRANSACTION) != (spec.message_type == "transaction"):
        raise RocketError(Code.WRONG_MESSAGE_TYPE, f"topic {spec.name!r} is a {spec.message_type} topic: "
                          "transactional (half) messages go to transaction topics, and only they")
    if timed and spec.message_type != "delay":
        raise RocketError(Code.WRONG_MESSAGE_TYPE, f"topic {spec.name!r} is a {spec.message_type} topic: messages "
                          "with a delivery time go to a delay topic")
    if not timed and spec.message_type == "delay":
        raise RocketError(Code.WRONG_MESSAGE_TYPE, f"topic {spec.name!r} is a delay topic: give each message a "
                          "delivery time")


class Broker:
    def __init__(self, peers: Peers, roles: tuple[str, ...]):
        self.peers = peers
        self.roles = roles
        self._routes: dict[str, _Route] = {}
        self._leaders: dict[int, int] = {}  # storage group -> the node that last served it as leader
        self._addresses: dict[int, Address] = {}
        self._round_robin: dict[str, itertools.count] = {}
        self._read_turns: dict[int, int] = {}  # storage group -> which replica reads next
        self._filters: dict[tuple[str, str], Filter] = {}  # compiled filters, the most recent limits.filters_cached_max

    def register(self, dispatcher: Dispatcher, forward_status: bool) -> None:
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
            "CancelTimer": self.cancel_timer,
            "EndTransaction": self.end_transaction,
            "TransactionChecks": self.transaction_checks,
            "DescribeGroup": self.describe_group,
            "GroupHeartbeat": self.group_heartbeat,
            "ResetGroup": self.reset_group,
            "Receive": self.receive,
            "Ack": self.ack,
            "ChangeInvisible": self.change_invisible,
            "DeadLetter": self.dead_letter,
            "UpdateTopic": self.update_topic,
            "TierStatus": self.tier_status,
        }
        if forward_status:  # a broker without a nameserver beside it asks the nameservers
            handlers["ClusterStatus"] = self.cluster_status
            handlers["DrainNode"] = self.drain_node
        for name, handler in handlers.items():
            dispatcher.handle(name, handler)

    # ---- routes and storage calls --------------------------------------------------------------------

    async def _route(self, topic: str, refresh: bool = False) -> _Route:
        if topic.startswith(SYSTEM_PREFIX):  # dead letters and unresolved transactions lie beside the topic's queues
            base = _system_base(topic)
            route = await self._route(base, refresh)
            return dataclasses.replace(route, spec=dataclasses.replace(route.spec, name=topic, message_type="system"))
        route = self._routes.get(topic)
        if (route is None or refresh or route.version < self.peers.metadata_version  # the metadata changed
                or trio.current_time() - route.fetched_at > limits.route_ttl_s):
            response = await self.peers.nameserver("GetRoute", {"topic": topic})
            for node in response["nodes"]:
                self._addresses[node["id"]] = address_of(node["address"])
            voters = {}
            for group in response["groups"]:
                voters[group["id"]] = tuple(group["voters"])
                if group["leader"] and (refresh or group["id"] not in self._leaders):
                    self._leaders[group["id"]] = group["leader"]
            spec = TopicSpec.from_wire(response["topic"])
            route = _Route(spec, response["version"], response["queue_groups"], voters, trio.current_time())
            self._routes[topic] = route
        return route

    async def _storage(self, route: _Route, group: int, method: str, request: dict,
                       timeout_s: float = limits.storage_call_s_max) -> dict:
        """Call the group's leader as far as known, else each replica in turn; refresh the route and
        try again until limits.storage_retry_s_max has passed (or, for a long poll, the call's timeout)."""
        failure = RocketError(Code.UNAVAILABLE, f"storage group {group} has no replica")
        with trio.move_on_after(max(limits.storage_retry_s_max, timeout_s)):
            for attempt in itertools.count():
                voters = route.voters.get(group, ())
                leader = self._leaders.get(group)
                for node in sorted(voters, key=lambda voter: voter != leader):
                    address = self._addresses.get(node)
                    if address is None:
                        continue
                    try:
                        response = await self.peers.call(address, method, request, timeout_s)
                    except RocketError as error:
                        if error.code not in RETRYABLE:
                            raise
                        failure = error
                        continue
                    self._leaders[group] = node
                    return response
                await trio.sleep(min(0.05 * 2 ** attempt, 1.0))
                route = await self._route(route.spec.name, refresh=True)
        raise failure

    # ---- methods -------------------------------------------------------------------------------------

    async def ping(self, request: dict) -> dict:
        return {"version": __version__, "roles": list(self.roles)}

    async def create_topic(self, request: dict) -> dict:
        return await self.peers.nameserver("MetaCreateTopic", request, timeout_s=limits.leader_wait_s_max + 5)

    async def list_topics(self, request: dict) -> dict:
        return await self.peers.nameserver("MetaListTopics", request)

    async def update_topic(self, request: dict) -> dict:
        spec = await self.peers.nameserver("MetaUpdateTopic", request, timeout_s=limits.leader_wait_s_max + 5)
        self._routes.pop(request["topic"], None)
        return spec

    async def tier_status(self, request: dict) -> dict:
        """Per topic (one, or all), per queue: where data starts, locally and in the tier, and its bytes."""
        if request["topic"]:
            names = [request["topic"]]
        else:
            names = [topic["name"] for topic in (await self.list_topics({}))["topics"]]
        topics = []
        for name in names:
            route = await self._route(name)
            queues = []
            for group, numbers in self._by_group(route, range(route.spec.queues)).items():
                response = await self._storage(route, group, "StorageTier", {"group": group, "topic": name,
                                                                            "queues": numbers})
                queues.extend(response["queues"])
            topics.append({"topic": route.spec.to_wire(), "queues": sorted(queues, key=lambda info: info["queue"])})
        return {"topics": topics}

    async def cluster_status(self, request: dict) -> dict:
        return await self.peers.nameserver("ClusterStatus", request, timeout_s=limits.leader_wait_s_max + 5)

    async def drain_node(self, request: dict) -> dict:
        return await self.peers.nameserver("DrainNode", request, timeout_s=limits.leader_wait_s_max + 5)

    def _queue(self, spec: TopicSpec, queue: int) -> int:
        if not 0 <= queue < spec.queues:
            raise RocketError(Code.BAD_QUEUE, f"topic {spec.name!r} has queues 0..{spec.queues - 1}, not {queue}")
        return queue

    async def produce(self, request: dict) -> dict:
        """Check the batch's header and CRC (its messages stay undecoded) and send it to its group."""
        route = await self._route(request["topic"])
        spec = route.spec
        _check_message_type(spec, check_header(request["batch"]).flags)
        queue = request["queue"]
        if queue == -1:  # any queue: spread batches round robin
            queue = next(self._round_robin.setdefault(spec.name, itertools.count())) % spec.queues
        group = route.queue_groups[self._queue(spec, queue)]
        return await self._storage(route, group, "StorageAppend",
                                   {"group": group, "topic": spec.name, "queue": queue, "batch": request["batch"]})

    async def _on_queue(self, method: str, request: dict) -> dict:
        """A storage call on the group of the request's queue."""
        route = await self._route(request["topic"])
        group = route.queue_groups[self._queue(route.spec, request["queue"])]
        return await self._storage(route, group, method, {**request, "group": group})

    async def cancel_timer(self, request: dict) -> dict:
        """Drop a delayed message that has not been delivered yet."""
        return await self._on_queue("StorageCancelTimer", request)

    async def end_transaction(self, request: dict) -> dict:
        return await self._on_queue("StorageEndTransaction", request)

    async def transaction_checks(self, request: dict) -> AsyncIterator[dict]:
        """Stream the topic's transactions due for a check back to the producer that asked, every
        limits.transaction_check_poll_s; each goes to one asker per check interval."""
        route = await self._route(request["topic"])
        if route.spec.message_type != "transaction":
            raise RocketError(Code.WRONG_MESSAGE_TYPE, f"topic {route.spec.name!r} is not a transaction topic")
        while True:
            for group, queues in self._by_group(route, range(route.spec.queues)).items():
                try:
                    found = await self._storage(route, group, "StorageTransactionChecks",
                                                {"group": group, "topic": route.spec.name, "queues": queues})
                except RocketError as error:  # a group without a leader now: the next round asks again
                    log.info("transaction checks of %s on group %d: %s", route.spec.name, group, error)
                    continue
                if found["checks"]:
                    yield found
            await trio.sleep(limits.transaction_check_poll_s)
            route = await self._route(route.spec.name)

    async def receive(self, request: dict) -> dict:
        """Pop consumption over all queues of the topic, storage group after storage group (starting at a
        different one each time, so receivers spread); waits up to wait_ms for messages."""
        route = await self._route(request["topic"])
        check_group_name(request["group"])
        self._filter(request)  # a malformed filter is refused here, with its position
        groups = list(self._by_group(route, range(route.spec.queues)).items())
        start = next(self._round_robin.setdefault("%receive%" + route.spec.name, itertools.count())) % len(groups)
        groups = groups[start:] + groups[:start]
        wanted = min(max(request["max_messages"], 1), limits.pop_messages_max)
        deadline = trio.current_time() + min(max(request["wait_ms"], 0), limits.pull_wait_ms_max) / 1000
        while True:
            fifo = route.spec.message_type == "fifo"
            response = {"batches": [], "handles": [], "cursors": [], "next_visible_ms": 0, "fifo": fifo}
            for group, queues in groups:
                if len(response["handles"]) >= wanted:
                    break
                found = await self._storage(route, group, "StoragePop", {
                    "group": group, "consumer_group": request["group"], "topic": route.spec.name, "queues": queues,
                    "max_messages": wanted - len(response["handles"]), "invisible_ms": request["invisible_ms"],
                    "wait_ms": 0, "max_attempts": request["max_attempts"], "filter_type": request["filter_type"],
                    "filter": request["filter"], "fifo": fifo})
                for field in ("batches", "handles", "cursors"):
                    response[field].extend(found[field])
                if found["next_visible_ms"]:
                    response["next_visible_ms"] = min(response["next_visible_ms"] or found["next_visible_ms"],
                                                      found["next_visible_ms"])
            left_s = deadline - trio.current_time()
            if response["handles"] or left_s <= 0:
                return response
            if response["next_visible_ms"]:
                left_s = min(left_s, max(0.05, response["next_visible_ms"] / 1000 - time.time()))
            await self._wait_for_data(route, {entry["queue"]: entry["offset"] for entry in response["cursors"]}, left_s)

    async def ack(self, request: dict) -> dict:
        return await self._receipt({**request, "invisible_ms": -1})

    async def change_invisible(self, request: dict) -> dict:
        """Make a received message visible again after invisible_ms (0: at once, for a retry now)."""
        if request["invisible_ms"] < 0:
            raise RocketError(Code.BAD_REQUEST, f"invisible_ms {request['invisible_ms']} is negative")
        return await self._receipt(request)

    async def dead_letter(self, request: dict) -> dict:
        """Move received messages to the group's dead-letter queue now, whatever their attempts (RocketMQ's
        ForwardMessageToDeadLetterQueue); answers the receipts that were stale."""
        return await self._receipt({**request, "invisible_ms": -1}, dead=True)

    async def _receipt(self, request: dict, dead: bool = False) -> dict:
        """On each storage group of the receipts' queues."""
        route = await self._route(request["topic"])
        consumer_group = check_group_name(request["group"])
        by_group: dict[int, list[dict]] = {}
        for receipt in request["receipts"]:
            by_group.setdefault(route.queue_groups[self._queue(route.spec, receipt["queue"])], []).append(receipt)
        stale = []
        for group, receipts in by_group.items():
            response = await self._storage(route, group, "StorageReceipt", {
                **request, "group": group, "consumer_group": consumer_group, "receipts": receipts, "dead": dead})
            stale.extend(response["stale"])
        return {"stale": stale}

    def _by_group(self, route: _Route, queues) -> dict[int, list[int]]:
        groups: dict[int, list[int]] = {}
        for queue in queues:
            groups.setdefault(route.queue_groups[self._queue(route.spec, queue)], []).append(queue)
        return groups

    async def _pull_positions(self, request: dict) -> tuple[_Route, dict[int, int]]:
        route = await self._route(request["topic"])
        positions: dict[int, int] = {}
        for entry in request["queues"]:
            queue = self._queue(route.spec, entry["queue"])
            if entry["offset"] < 0:
                raise RocketError(Code.BAD_REQUEST, f"offset {entry['offset']} for queue {queue} is negative")
            positions[queue] = entry["offset"]
        if not positions:
            raise RocketError(Code.BAD_REQUEST, "pull needs at least one queue")
        return route, positions

    async def _replica_read(self, route: _Route, group: int, request: dict) -> dict:
        """A read spread over the group's replicas: a follower in sync answers as a read replica; one
        that is not (or is gone) sends the read to the leader."""
        voters = sorted(route.voters.get(group, ()))
        if voters:
            turn = self._read_turns[group] = self._read_turns.get(group, -1) + 1
            address = self._addresses.get(voters[turn % len(voters)])
            if address is not None:
                try:
                    return await self.peers.call(address, "StorageRead", {**request, "follower_ok": True},
                                                 limits.storage_call_s_max)
                except RocketError as error:  # OFFSET_OUT_OF_RANGE: the replica has not caught up to there yet
                    if error.code not in RETRYABLE and error.code != Code.OFFSET_OUT_OF_RANGE:
                        raise
        return await self._storage(route, group, "StorageRead", request)

    async def _read(self, route: _Route, positions: dict[int, int], max_bytes: int, replicas: bool = True,
                    tag_mask: int = -1) -> dict:
        """Read group after group with what is left of the byte budget, so a response fits a frame;
        from any replica in sync, or from the leaders alone."""
        batches: list[dict] = []
        next_offsets: list[dict] = []
        budget = max_bytes
        for group, queues in self._by_group(route, positions).items():
            wanted = [{"queue": queue, "offset": positions[queue]} for queue in queues]
            if budget <= 0:
                next_offsets.extend(wanted)
                continue
            request = {"group": group, "topic": route.spec.name, "queues": wanted, "max_bytes": budget, "wait_ms": 0,
                       "at_least_one": not batches, "any_replica": False, "follower_ok": False, "tag_mask": tag_mask}
            if replicas:
                response = await self._replica_read(route, group, request)
            else:
                response = await self._storage(route, group, "StorageRead", request)
            batches.extend(response["batches"])
            budget -= sum(read_charge(len(found["batch"])) for found in response["batches"])
            next_offsets.extend(response["next_offsets"])
        return {"batches": batches, "next_offsets": next_offsets}

    async def _wait_for_data(self, route: _Route, positions: dict[int, int], wait_s: float) -> None:
        """Long-poll every group at once; return when one of them has data, or after wait_s. A group that
        fails the poll ends the wait too: the caller reads again, and that read reports the failure."""
        async def wait_on(group: int, queues: list[int], done: trio.CancelScope) -> None:
            try:
                await self._storage(route, group, "StorageRead", {
                    "group": group, "topic": route.spec.name, "wait_ms": int(wait_s * 1000), "max_bytes": 0,
                    "at_least_one": False, "any_replica": False, "follower_ok": False, "tag_mask": -1,
                    "queues": [{"queue": queue, "offset": positions[queue]} for queue in queues]},
                    timeout_s=wait_s + limits.storage_call_s_max)
            except RocketError as error:
                log.info("long poll of %s on group %d: %s", route.spec.name, group, error)
            done.cancel()

        with trio.move_on_after(wait_s + 1):
            async with trio.open_nursery() as nursery:
                for group, queues in self._by_group(route, positions).items():
                    nursery.start_soon(wait_on, group, queues, nursery.cancel_scope)

    def _filter(self, request: dict) -> Filter:
        """The pull's filter, compiled once per expression (BAD_FILTER names where it does not parse)."""
        key = (request["filter_type"], request["filter"])
        found = self._filters.get(key)
        if found is None:
            found = compile_filter(*key)
            if len(self._filters) >= limits.filters_cached_max:
                del self._filters[next(iter(self._filters))]
            self._filters[key] = found
        return found

    async def _read_filtered(self, route: _Route, positions: dict[int, int], max_bytes: int, chosen: Filter) -> dict:
        """A read from any replica in sync, else from the leaders, of the batches that may hold a match:
        storage skips batches by their tag summary unread; an SQL filter decodes the rest here and keeps
        the batches with a match. Clients filter the messages of the batches they get."""
        tag_mask = -1 if chosen.tag_mask is None else chosen.tag_mask - 2**64 * (chosen.tag_mask >= 2**63)
        response = await self._read(route, positions, max_bytes, tag_mask=tag_mask)
        if not response["batches"]:  # a replica may lag: nothing new means nothing on the leaders
            response = await self._read(route, positions, max_bytes, replicas=False, tag_mask=tag_mask)
        if isinstance(chosen, SqlFilter):
            response["batches"] = [stored for stored in response["batches"] if _may_match(chosen, stored["batch"])]
        return response

    async def pull(self, request: dict) -> dict:
        """Batches past the positions that may hold messages the filter matches; waits up to wait_ms for
        some, reading on past batches the filter skipped."""
        route, positions = await self._pull_positions(request)
        chosen = self._filter(request)
        max_bytes = max(1, min(request["max_bytes"], limits.read_bytes_max))
        deadline = trio.current_time() + min(max(request["wait_ms"], 0), limits.pull_wait_ms_max) / 1000
        while True:
            response = await self._read_filtered(route, positions, max_bytes, chosen)
            if response["batches"] or trio.current_time() >= deadline:
                return response
            moved = {entry["queue"]: entry["offset"] for entry in response["next_offsets"]}
            if moved == positions:
                await self._wait_for_data(route, positions, deadline - trio.current_time())
            positions = moved

    async def subscribe(self, request: dict) -> AsyncIterator[dict]:
        """Stream pull responses as data arrives, each continuing where the previous ended."""
        route, positions = await self._pull_positions(request)
        chosen = self._filter(request)
        max_bytes = max(1, min(request["max_bytes"], limits.read_bytes_max))
        while True:
            response = await self._read_filtered(route, positions, max_bytes, chosen)
            moved = {entry["queue"]: entry["offset"] for entry in response["next_offsets"]}
            if response["batches"]:
                yield response
            elif moved == positions:
                await self._wait_for_data(route, positions, limits.pull_wait_ms_max / 1000)
            positions = moved

    async def commit_offsets(self, request: dict) -> dict:
        consumer_group = check_group_name(request["group"])
        route = await self._route(request["topic"])
        offsets: dict[int, int] = {}
        for entry in request["offsets"]:
            queue = self._queue(route.spec, entry["queue"])
            if entry["offset"] < 0:
                raise RocketError(Code.BAD_REQUEST, f"offset {entry['offset']} for queue {queue} is negative")
            offsets[queue] = entry["offset"]
        await self._commit(route, consumer_group, offsets)
        return {}

    async def _commit(self, route: _Route, consumer_group: str, offsets: dict[int, int], reset_pop: bool = False) -> None:
        for group, queues in self._by_group(route, offsets).items():
            await self._storage(route, group, "StorageCommitOffsets", {
                "group": group, "consumer_group": consumer_group, "topic": route.spec.name, "reset_pop": reset_pop,
                "offsets": [{"queue": queue, "offset": offsets[queue]} for queue in queues]})

    async def describe_group(self, request: dict) -> dict:
        """Per queue: the group's pull position, the live pull consumer reading it, its pop consumption, its lag and
        its dead letters."""
        consumer_group = check_group_name(request["group"])
        route = await self._route(request["topic"])
        members = await self._members(route, consumer_group)
        reader = {queue: member for member in members for queue in allocate(route.spec.queues, members, member)}
        found = await self._queues(route, consumer_group)
        dead = await self._queues(await self._route(dead_letter_topic(consumer_group, route.spec.name)))
        committed = {entry["queue"]: entry["offset"] for response in found for entry in response["offsets"]}
        pops = {entry["queue"]: entry for response in found for entry in response["pops"]}
        dead_letters = {info["queue"]: info["next_offset"] - info["min_offset"] for response in dead
                        for info in response["queues"]}
        queues = []
        for info in sorted((info for response in found for info in response["queues"]), key=lambda info: info["queue"]):
            queue, pop_state = info["queue"], pops[info["queue"]]
            consumed = max(committed.get(queue, info["min_offset"]), pop_state["done_before"])
            queues.append({"queue": queue, "min_offset": info["min_offset"], "next_offset": info["next_offset"],
                           "committed": committed.get(queue, -1), "pop_cursor": pop_state["cursor"],
                           "pop_done_before": pop_state["done_before"], "in_flight": pop_state["in_flight"],
                           "lag": max(0, info["next_offset"] - consumed), "dead_letters": dead_letters.get(queue, 0),
                           "member": reader.get(queue, "")})
        return {"topic": route.spec.name, "group": consumer_group, "queues": queues}

    async def group_heartbeat(self, request: dict) -> dict:
        """A pull consumer in clustering mode is alive (or leaves): the group's live members and the
        queues this member reads (RocketMQ's averaging allocation: queues split in contiguous runs)."""
        route = await self._route(request["topic"])
        members = await self._members(route, request["group"], request["member"], request["leave"])
        return {"members": members, "queues": allocate(route.spec.queues, members, request["member"])}

    async def _members(self, route: _Route, consumer_group: str, member: str = "", leave: bool = True) -> list[str]:
        """The live pull members of a group on a topic, after member heartbeats or leaves (by default, none)."""
        group = route.queue_groups[0]
        return (await self._storage(route, group, "StorageGroupHeartbeat", {
            "group": group, "consumer_group": consumer_group, "topic": route.spec.name, "member": member,
            "leave": leave}))["members"]

    async def reset_group(self, request: dict) -> dict:
        """Move the group's pull and pop positions on every queue, or on one, to the earliest or latest message,
        to the first stored at or after a time, or (one queue) to an offset; what was in flight is dropped.
        Refused while the group has live pull members, as Kafka refuses: each keeps its positions in memory and
        its next commit would put them back. Pop consumers keep theirs in storage, which this moves."""
        consumer_group = check_group_name(request["group"])
        route = await self._route(request["topic"])
        to, queue = request["to"], request["queue"]
        if to not in ("earliest", "latest", "time", "offset"):
            raise RocketError(Code.BAD_REQUEST, f"reset to {to!r}: expected earliest, latest, time or offset")
        if queue != -1:
            self._queue(route.spec, queue)
        if to == "offset":
            if queue == -1 or request["offset"] < 0:
                raise RocketError(Code.BAD_REQUEST, "a reset to an offset names one queue and an offset of 0 or more")
            targets = {queue: request["offset"]}
        else:
            by_time = to == "time"
            targets = {}
            for response in await self._queues(route, timestamp_ms=max(0, request["timestamp_ms"]) if by_time else -1):
                if by_time:
                    targets.update((entry["queue"], entry["offset"]) for entry in response["time_offsets"])
                else:
                    field = "min_offset" if to == "earliest" else "next_offset"
                    targets.update((info["queue"], info[field]) for info in response["queues"])
            if queue != -1:
                targets = {queue: targets[queue]}
        members = await self._members(route, consumer_group)
        if members:
            raise RocketError(Code.GROUP_ACTIVE, (
                f"group {consumer_group!r} on {route.spec.name!r} has {len(members)} live consumer(s) "
                f"({', '.join(members[:3])}{', ...' if len(members) > 3 else ''}), whose next commit would undo the "
                f"reset: stop them first (a closed consumer leaves at once; one stopped without closing, "
                f"{limits.group_member_expiry_s:g} s after its last poll), or move a running one with Consumer.seek()"))
        await self._commit(route, consumer_group, targets, reset_pop=True)
        return await self.describe_group(request)

    async def _queues(self, route: _Route, consumer_group: str = "", timestamp_ms: int = -1) -> list[dict]:
        """StorageQueues for every queue of the topic, group by group."""
        responses = []
        for group, queues in self._by_group(route, range(route.spec.queues)).items():
            responses.append(await self._storage(route, group, "StorageQueues", {
                "group": group, "topic": route.spec.name, "queues": queues, "consumer_group": consumer_group,
                "timestamp_ms": timestamp_ms}))
        return responses

    async def describe_topic(self, request: dict) -> dict:
        route = await self._route(request["topic"])
        queues = [info for response in await self._queues(route) for info in response["queues"]]
        return {"topic": route.spec.to_wire(), "queues": sorted(queues, key=lambda info: info["queue"])}

    async def fetch_offsets(self, request: dict) -> dict:
        consumer_group = check_group_name(request["group"])
        route = await self._route(request["topic"])
        offsets = [entry for response in await self._queues(route, consumer_group) for entry in response["offsets"]]
        return {"offsets": sorted(offsets, key=lambda entry: entry["queue"])}

    async def search_offset(self, request: dict) -> dict:
        route = await self._route(request["topic"])
        offsets = [entry for response in await self._queues(route, timestamp_ms=max(0, request["timestamp_ms"]))
                   for entry in response["time_offsets"]]
        return {"offsets": sorted(offsets, key=lambda entry: entry["queue"])}
