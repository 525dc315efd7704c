"""Routes on the broker: each topic's queue -> storage group map and the groups' replicas, cached from the nameservers
(refreshed on a newer metadata version, by age, and on errors), and calls to storage that retry on a group's other
replicas when one is gone or no longer leads: Routes, which the broker's other parts share, and Turns.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
from collections.abc import Awaitable, Callable

import trio

from rocket import limits
from rocket.clock import Clock
from rocket.errors import Code, RocketError
from rocket.model import (KV_PREFIX, RETRY_PREFIX, SYSTEM_PREFIX, Address, TopicSpec, dead_letter_parts, timer_topic,
                          unresolved_topic)
from rocket.parked import Deadlines, Slot, Unparked
from rocket.replication import NotLeader
from rocket.roles.peers import RETRYABLE, Peers
from rocket.transport.background import Background
from rocket.transport.tcp_client import TcpChannel

log = logging.getLogger("rocket.broker")


@dataclasses.dataclass(slots=True)
class Route:
    spec: TopicSpec
    version: int
    queue_groups: list[int]
    voters: dict[int, tuple[int, ...]]
    fetched_at: float
    readers: dict[int, tuple[int, ...]] = dataclasses.field(default_factory=dict)  # group -> its read replicas


# What a forwarded call left unanswered past its deadline meets (_sweep_forwarded): unlike a TIMEOUT the storage node
# answered, it marks the node silent.
_UNANSWERED = RocketError(Code.TIMEOUT, f"a storage node did not answer within {limits.storage_call_s_max} s")
UNRESOLVED_PREFIX = unresolved_topic("")
TIMER_PREFIX = timer_topic("")  # a delay topic's waiting messages, read by their timer id (rocket message get)


def _system_base(topic: str) -> str:
    """The topic beside whose queues a readable system queue lies: %DLQ%group%topic, %TXN_UNRESOLVED%topic,
    %TIMER%topic."""
    if topic.startswith(UNRESOLVED_PREFIX):
        return topic[len(UNRESOLVED_PREFIX):]
    if topic.startswith(TIMER_PREFIX):
        return topic[len(TIMER_PREFIX):]
    parts = dead_letter_parts(topic)
    if parts is not None:
        return parts[1]
    raise RocketError(Code.UNKNOWN_TOPIC, f"{topic!r} is not a topic, nor the dead letters (%DLQ%GROUP%TOPIC) or "
                      "unresolved transactions (%TXN_UNRESOLVED%TOPIC) of one")


class Turns:
    """Each topic's round-robin turns (produce to any queue, receive from its groups). A system topic's name holds a
    consumer group a client chose, so only the limits.round_robin_topics_max most recently used topics keep theirs;
    one dropped starts again at 0, which only shifts where its rotation begins."""

    def __init__(self) -> None:
        self._last: dict[str, int] = {}  # topic -> its last turn, in the order the topics were last used

    def __len__(self) -> int:
        return len(self._last)

    def take(self, name: str) -> int:
        """The topic's next turn."""
        turns = self._last
        turn = turns.pop(name, -1) + 1
        turns[name] = turn  # at the end: the dict is in the order the topics were last used
        if len(turns) > limits.round_robin_topics_max:
            del turns[next(iter(turns))]
        return turn

    def peek(self, name: str) -> int:
        """The turn take would give now, not taken."""
        return self._last.get(name, -1) + 1

    def move_on(self, name: str, ticket: int, stride: int) -> None:
        """The topic's turns go in strides (a sticky queue's): the next one taken starts the stride after ticket's,
        unless the turns already moved past it."""
        last = self._last.get(name)
        if last is not None and last // stride == ticket // stride:
            self._last[name] = (ticket // stride + 1) * stride - 1


async def complete_later(slot: Slot, attempt: Callable[[], Awaitable[object]]) -> None:
    """A parked call tried again as a task (a storage call that met a leader change, say), in Routes.start_soon: slot
    completes with what attempt() returns or the RocketError it raises."""
    try:
        outcome = await attempt()
    except RocketError as error:
        outcome = error
    slot.complete(outcome)


class Routes(Background):
    """The broker's routes and its calls to storage: each topic's route (cached), each group's leader as last seen,
    the storage nodes' addresses and which of them went silent, and the storage calls forwarded without a task.
    run() (Background) holds the nursery of the tasks the broker's parts start.

    A cached route is served stale while no nameserver answers (route). A storage node that left a call unanswered
    is asked last by every call for limits.storage_silent_s (a partitioned or hung leader), and given only
    limits.storage_silent_probe_s to answer (storage). DISK_FULL is retried on a group's other replicas (retryable).
    A call whose group this node leads is parked with the storage role in this process (the data plane,
    rocket/parked.py), one for another node's leader goes on the open channel to it without a task (parking, park
    and _forward_parked); without either it is a task."""

    def __init__(self, peers: Peers, clock: Clock):
        self.peers = peers
        self.clock = clock
        # Keyed by topics, storage groups and nodes the metadata holds (a route is kept only once the nameservers
        # gave it): bounded by limits.topics_max, storage_groups_max and the nodes.
        self._routes: dict[str, Route] = {}
        self._leaders: dict[int, int] = {}  # storage group -> the node that last served it as leader
        # storage node -> when a call to it last went unanswered (a partition, a hung node): asked last, and briefly,
        # for limits.storage_silent_s by every call, not only the one that waited
        self._silent: dict[int, float] = {}
        self._addresses: dict[int, Address] = {}
        self._forwarded = Deadlines()  # storage calls forwarded without a task (_forward_parked)
        self._reading: dict[int, int] = {}  # storage node -> this broker's reads out to it (replica_read)
        self._read_turns: dict[int, int] = {}  # storage group -> which replica comes first among the least loaded
        self._sweeping = False

    @property
    def sweeping(self) -> bool:
        """Whether a task sweeps forwarded calls for their deadlines now (it ends when none is left)."""
        return self._sweeping

    def start_soon(self, function: Callable[..., Awaitable[object]], *args) -> None:
        """A task of the broker's, in run()'s nursery."""
        assert self._nursery is not None, "Routes.run() has not started"
        self._nursery.start_soon(function, *args)

    def forget(self, topic: str) -> None:
        """Drop the topic's route (it changed, or is gone): the next call asks the nameservers."""
        self._routes.pop(topic, None)

    def leader_of(self, group: int) -> int:
        """The group's leader as far as known (the node that last served it as leader, or that a replica named); 0 if
        none."""
        return self._leaders.get(group, 0)

    def address_of(self, node: int) -> Address | None:
        return self._addresses.get(node)

    async def route(self, topic: str, refresh: bool = False) -> Route:
        # Dead letters and unresolved transactions lie beside the topic's queues (a KV bucket is a topic of its own).
        if topic.startswith(SYSTEM_PREFIX) and not topic.startswith((KV_PREFIX, RETRY_PREFIX)):
            base = _system_base(topic)
            route = await self.route(base, refresh)
            return dataclasses.replace(route, spec=dataclasses.replace(route.spec, name=topic, message_type="system"))
        route = self._routes.get(topic)
        if (route is None or refresh or route.version < self.peers.metadata_version  # the metadata changed
                or trio.current_time() - route.fetched_at > limits.route_ttl_s):
            try:
                response = await self.peers.nameserver("GetRoute", {"topic": topic})
            except RocketError as error:
                if route is None or error.code not in RETRYABLE:
                    raise
                # No nameserver answers: serve the route known (a storage node that no longer leads a group names
                # its leader), and ask again after route_retry_s rather than on every call.
                log.info("topic %s: the route is kept while no nameserver answers: %s", topic, error)
                self._routes[topic] = dataclasses.replace(
                    route, fetched_at=trio.current_time() - limits.route_ttl_s + limits.route_retry_s)
                return route
            for node in response["nodes"]:
                self._addresses[node["id"]] = Address.parse(node["address"])
            voters, readers = {}, {}
            for group in response["groups"]:
                voters[group["id"]] = tuple(group["voters"])
                if group.get("readers"):  # a route of an older nameserver, or a test's, has none
                    readers[group["id"]] = tuple(group["readers"])
                if group["leader"] and (refresh or group["id"] not in self._leaders):
                    self._leaders[group["id"]] = group["leader"]
            spec = TopicSpec.from_wire(response["topic"])
            route = Route(spec, response["version"], response["queue_groups"], voters, trio.current_time(), readers)
            self._routes[topic] = route
        return route

    async def rerouted(self, route: Route, queue: int, group: int) -> tuple[Route, int]:
        """After group refused the queue's topic as unknown: the route, and the queue's group in it, once the queue
        lies elsewhere. A topic moving to another storage class is refused by its old groups from their seal on, until
        its route switches to the new ones (roles/nameserver/class_moves.py): the route is asked for again until the
        queue's group changes, every limits.leader_poll_s (the seal lasts about one copy of a queue's tail), for up
        to limits.storage_retry_s_max. Raises UNKNOWN_TOPIC when the topic is gone, or its queue stayed where it
        was."""
        deadline = trio.current_time() + limits.storage_retry_s_max
        while True:
            route = await self.route(route.spec.name, refresh=True)  # UNKNOWN_TOPIC: it was deleted
            moved_to = route.queue_groups[self.queue(route.spec, queue)]
            if moved_to != group:
                return route, moved_to
            if trio.current_time() >= deadline:
                raise RocketError(Code.UNKNOWN_TOPIC, f"storage group {group} refuses topic {route.spec.name!r}, "
                                  "which the nameservers still place there")
            await trio.sleep(limits.leader_poll_s)

    @staticmethod
    def retryable(route: Route, group: int, at_most_once: bool = False) -> tuple[Code, ...]:
        """The errors after which a storage call is tried again on the group's other replicas (see storage)."""
        retryable = (Code.UNAVAILABLE,) if at_most_once else RETRYABLE
        if len(route.voters.get(group, ())) > 1:  # refused unproposed: the group's next leader may have room
            retryable += (Code.DISK_FULL,)
        return retryable

    def cached(self, topic: str) -> Route:
        """The route route() would give without asking anyone (cached and fresh); else Unparked: the call that needs
        it is served as a task, which may wait for the nameservers."""
        route = self._routes.get(topic)
        if (route is None or topic.startswith(SYSTEM_PREFIX) and not topic.startswith((KV_PREFIX, RETRY_PREFIX))
                or route.version < self.peers.metadata_version
                or trio.current_time() - route.fetched_at > limits.route_ttl_s):
            raise Unparked
        return route

    def _led_here(self, route: Route, group: int, method: str) -> bool:
        """Whether the group's leader, as far as known, is this node, whose storage role parks method: a call for
        it may then be parked with it (Dispatcher.park_local), in this process."""
        leader = self._leaders.get(group, 0)  # 0: none known, and no voter
        return (leader in route.voters.get(group, ()) and self._addresses.get(leader) == self.peers.address
                and self._nursery is not None and self.peers.dispatcher.parks(method))

    def _leader_channel(self, route: Route, group: int) -> tuple[int, Address, TcpChannel] | None:
        """The group's leader on another node, its address and the open channel to it, when that leader is known and
        not silent and the channel is open (what _forward_parked sends on); else None."""
        leader = self._leaders.get(group, 0)  # 0: none known, and no voter
        address = self._addresses.get(leader) if leader in route.voters.get(group, ()) else None
        if address is None or address == self.peers.address or self._nursery is None or self.is_silent(leader):
            return None
        channel = self.peers.pool.open_channel(address)
        return (leader, address, channel) if channel is not None else None

    def parking(self, route: Route, group: int, method: str) -> tuple[int, Address, TcpChannel] | None:
        """Where a storage call of the group can wait without a task: None when this node leads the group (its storage
        role parks method: park hands it over in this process), else the open channel to the leader on
        another node (_leader_channel's). Raises Unparked when neither: the call is a task from the start."""
        if self._led_here(route, group, method):
            return None
        to = self._leader_channel(route, group)
        if to is None:
            raise Unparked
        return to

    def park(self, to: tuple[int, Address, TcpChannel] | None, method: str, request: dict, slot: Slot,
                      retryable: tuple[Code, ...]) -> None:
        """Hand a storage call where parking said, without a task; slot completes with its answer or error. Raises
        Unparked, nothing sent, when the channel broke just now or this node's storage role refused it at once with
        a retryable error (no longer the leader, a full disk): the task path tries the others."""
        if to is not None:
            if not self._forward_parked(to, method, request, slot):
                raise Unparked
            return
        try:
            self.peers.dispatcher.park_local(method, request, slot)
        except RocketError as error:
            if error.code in retryable:
                raise Unparked from None
            raise

    def _forward_parked(self, to: tuple[int, Address, TcpChannel], method: str, request: dict, slot: Slot) -> bool:
        """Send a storage call without a task (TcpChannel.call_parked) to the leader _leader_channel found; False, with
        nothing sent, if its channel broke just now. slot completes with the answer or the error met; an unanswered
        call fails TIMEOUT after limits.storage_call_s_max (swept each tick) and marks the node silent, as
        _call_storage does."""
        leader, address, channel = to
        telemetry, peer = self.peers.telemetry, str(address)
        started = telemetry.clock() if telemetry is not None else 0.0

        def answered(outcome: object) -> None:
            if isinstance(outcome, RocketError):
                self._heard(leader, not (outcome.code == Code.CONNECTION_LOST or outcome is _UNANSWERED))
                if telemetry is not None:
                    telemetry.call_failed(peer, outcome.code.name)
            else:
                self._heard(leader, True)
                if telemetry is not None:
                    telemetry.call_took(peer, started)
            slot.complete(outcome)
        forwarded = Slot(answered, trio.current_time() + limits.storage_call_s_max)
        try:
            channel.call_parked(method, request, forwarded)
        except RocketError:  # the channel broke just now: the task path opens another
            return False
        self._forwarded.add(forwarded)
        if not self._sweeping:
            self._sweeping = True
            self.start_soon(self._sweep_forwarded)
        return True

    async def _sweep_forwarded(self) -> None:
        """Time out forwarded calls left unanswered, each tick while there are any (then the task ends)."""
        try:
            while self._forwarded:
                await trio.sleep(limits.raft_tick_s)
                self._forwarded.sweep(trio.current_time(), lambda: _UNANSWERED)
        finally:
            self._sweeping = False

    def queue(self, spec: TopicSpec, queue: int) -> int:
        if not 0 <= queue < spec.queues:
            raise RocketError(Code.BAD_QUEUE, f"topic {spec.name!r} has queues 0..{spec.queues - 1}, not {queue}")
        return queue

    def by_group(self, route: Route, queues) -> dict[int, list[int]]:
        groups: dict[int, list[int]] = {}
        for queue in queues:
            groups.setdefault(route.queue_groups[self.queue(route.spec, queue)], []).append(queue)
        return groups

    async def queues(self, route: Route, consumer_group: str = "", timestamp_ms: int = -1,
                     lagging: bool = False) -> list[dict]:
        """StorageQueues for every queue of the topic, group by group."""
        responses = []
        for group, queues in self.by_group(route, range(route.spec.queues)).items():
            responses.append(await self.storage(route, group, "StorageQueues", {
                "group": group, "topic": route.spec.name, "queues": queues, "consumer_group": consumer_group,
                "timestamp_ms": timestamp_ms, "lagging": lagging}))
        return responses

    def offsets(self, route: Route, entries: list[dict]) -> dict[int, int]:
        """queue -> offset of a request's entries, each queue one of the topic's and each offset not negative."""
        offsets: dict[int, int] = {}
        for entry in entries:
            queue = self.queue(route.spec, entry["queue"])
            if entry["offset"] < 0:
                raise RocketError(Code.BAD_REQUEST, f"offset {entry['offset']} for queue {queue} is negative")
            offsets[queue] = entry["offset"]
        return offsets

    def is_silent(self, node: int) -> bool:
        """Whether a call to the node went unanswered in the last limits.storage_silent_s."""
        at = self._silent.get(node)
        return at is not None and self.clock.now_s() - at < limits.storage_silent_s

    async def _call_storage(self, node: int, address: Address, method: str, request: dict, timeout_s: float) -> dict:
        """One storage call, noting whether the node answered (any answer, an error too: a TIMEOUT it gives is an
        answer) or left it unanswered (no answer in time, the connection lost)."""
        with trio.move_on_after(timeout_s) as waited:
            try:
                response = await self.peers.call(address, method, request, timeout_s + 1.0)  # waited ends it first
            except RocketError as error:
                self._heard(node, error.code != Code.CONNECTION_LOST)
                raise
        if waited.cancelled_caught:
            self._heard(node, False)
            raise RocketError(Code.TIMEOUT, f"storage node {node} did not answer {method} within {timeout_s} s")
        self._heard(node, True)
        return response

    def _heard(self, node: int, answered: bool) -> None:
        """Note whether a call to node got an answer (any answer, an error too: a TIMEOUT it gives is an answer) or
        none (no answer in time, the connection lost): a node left unanswered is asked last (is_silent)."""
        if not answered:
            self._silent[node] = self.clock.now_s()  # keyed by the cluster's storage nodes: bounded
        elif self._silent:
            self._silent.pop(node, None)

    def _leaders_own(self, group: int, node: int, voters: tuple[int, ...], error: RocketError) -> bool:
        """Whether error, from node, is the group's leader's own (its object store down, say), which outranks the
        others' "not the leader": node leads as far as known, and did not say it does not. A node that names
        another voter as the leader makes that one the leader known, to be asked next."""
        named = NotLeader.named(error)
        if named is None:
            return node == self._leaders.get(group, 0)
        if named in voters:
            self._leaders[group] = named
        return False

    async def replica_read(self, route: Route, group: int, request: dict,
                           timeout_s: float = limits.storage_call_s_max) -> dict:
        """A StorageRead (a read, or a long poll that waits for data) spread over the group's voters and read
        replicas by load: the one with the fewest of this broker's reads out answers it (among equals, each in turn),
        as a follower if it is in sync. A follower applies committed entries only, and reads from the offset asked,
        so no reader sees an uncommitted message or an offset go backwards. One that is not in sync, has not reached
        the offset yet, or is gone sends the read to the leader (storage)."""
        replicas = route.voters.get(group, ()) + route.readers.get(group, ())
        turn = self._read_turns[group] = (self._read_turns.get(group, -1) + 1) % max(1, len(replicas))
        node = min(replicas[turn:] + replicas[:turn], default=0,
                   key=lambda replica: (self.is_silent(replica), self._reading.get(replica, 0)))
        address = self._addresses.get(node)
        if address is not None and not self.is_silent(node):
            self._reading[node] = self._reading.get(node, 0) + 1
            try:
                return await self._call_storage(node, address, "StorageRead", {**request, "follower_ok": True},
                                                timeout_s)
            except RocketError as error:  # OFFSET_OUT_OF_RANGE: the replica has not caught up to there yet
                if error.code not in RETRYABLE and error.code != Code.OFFSET_OUT_OF_RANGE:
                    raise
            finally:
                self._reading[node] -= 1
        return await self.storage(route, group, "StorageRead", request, timeout_s)

    async def storage(self, route: Route, group: int, method: str, request: dict,
                       timeout_s: float = limits.storage_call_s_max, at_most_once: bool = False) -> dict:
        """Call the group's leader as far as known, else each replica in turn; refresh the route and
        try again until limits.storage_retry_s_max has passed (or, for a long poll, the call's timeout).

        at_most_once: a write that must not be applied twice (KV) is tried again only after UNAVAILABLE (not
        the leader, not hosted, unreachable, or its entry lost to a new leader: surely not applied) or, in a group
        of several replicas, DISK_FULL (refused before it was proposed; the leader hands its groups over). A call that
        went out and got no answer (TIMEOUT, CONNECTION_LOST) may have been applied: its error is passed on, and
        the caller learns the outcome is unknown; so is TIMEOUT when the retries run out with a call out."""
        retryable = self.retryable(route, group, at_most_once)
        unknown = RocketError(Code.TIMEOUT, f"a write to storage group {group} got no answer within "
                              f"{limits.storage_retry_s_max} s: its outcome is unknown")
        failure = RocketError(Code.UNAVAILABLE, f"storage group {group} has no replica")
        # What the leader said last outranks the followers' "not the leader" (its object store down, say).
        leader_failure: RocketError | None = None
        leader = self._leaders.get(group, 0)  # 0: none known, and no voter
        address = self._addresses.get(leader) if leader in route.voters.get(group, ()) else None
        if address is not None and not self.is_silent(leader):  # the usual case, first: no retry scope, no sort
            try:
                return await self._call_storage(leader, address, method, request, timeout_s)
            except RocketError as error:
                if error.code not in retryable:
                    raise
                failure = error
                if self._leaders_own(group, leader, route.voters.get(group, ()), error):
                    leader_failure = error
        with trio.move_on_after(max(limits.storage_retry_s_max, timeout_s)):
            for attempt in itertools.count():
                voters = route.voters.get(group, ())
                leader = self._leaders.get(group, 0)  # 0: none known, and no voter
                for node in sorted(voters, key=lambda voter: (self.is_silent(voter), voter != leader)):
                    address = self._addresses.get(node)
                    if address is None:
                        continue
                    if at_most_once:
                        failure = unknown  # while the call is out
                    try:
                        response = await self._call_storage(node, address, method, request, min(
                            timeout_s, limits.storage_silent_probe_s) if self.is_silent(node) else timeout_s)
                    except RocketError as error:
                        if error.code not in retryable:
                            raise
                        failure = error
                        if self._leaders_own(group, node, voters, error):
                            leader_failure = error
                        continue
                    self._leaders[group] = node
                    return response
                await trio.sleep(min(limits.storage_retry_backoff_s_min * 2 ** attempt, limits.storage_retry_backoff_s_max))
                route = await self.route(route.spec.name, refresh=True)
        raise leader_failure or failure
