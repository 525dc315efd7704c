"""Queue placement by predicted load (issue 30): a new queue goes to the group with the lowest predicted load, and
leadership is balanced by the same predictions. A part of Nameserver.
"""

from __future__ import annotations

import collections
import logging
from typing import Protocol

import trio

from rocket import limits
from rocket.clock import Clock
from rocket.config import NodeConfig
from rocket.errors import Code, RocketError
from rocket.ml.placement import GroupLoad, NodeLoad, Planner, QueueChoice
from rocket.model import KV_PREFIX, Address, TopicSpec
from rocket.roles.nameserver.forecasts import Forecasts
from rocket.roles.nameserver.group import MetadataGroup
from rocket.serde.typed import PlacementExplainResponse, TopicRequest
from rocket.serde.typed import QueuePlacement as PlacedQueue

log = logging.getLogger("rocket.nameserver")


class Cluster(Protocol):
    """What placement reads of the nameserver leader's view of the nodes: each group's leader as last reported, the
    groups whose replica move runs, the storage nodes as replica placement sees them, the degraded ones, and whether
    a node's replicas are leaving it."""

    leaders: dict[int, int]
    moving: set[int]

    def loads(self) -> list[NodeLoad]: ...

    def degraded(self) -> set[int]: ...

    def leaving(self, node: int) -> bool: ...


class QueuePlacement:
    """Queue placement and leader balancing, on the predictions of Forecasts. A new queue goes to the group with the
    lowest predicted load (rocket.ml.placement.Planner.place), among its topic's storage class's groups, and the
    choice is recorded in the topic's metadata: a queue never moves to another group afterwards, so its order and
    offsets stay as they are (its group's replicas may move, with their log). `rocket topic update --queues N` adds
    queues the same way; a KV bucket's shards are fixed, since its keys hash onto them. `cluster placement
    --explain` explains a choice (place)."""

    def __init__(self, meta: MetadataGroup, config: NodeConfig, clock: Clock, forecasts: Forecasts, cluster: Cluster):
        self.meta = meta
        self.planner = Planner(config.rebalance_moves_per_hour)  # replica-count moves (Nameserver) spend its budget too
        self.metadata = meta.metadata
        self.clock = clock
        self.forecasts = forecasts
        self.cluster = cluster
        # topic -> its last placement, as PlacementExplain answers it (the model and note are those of the time asked)
        self._explanations: collections.OrderedDict[str, PlacementExplainResponse] = collections.OrderedDict()
        self._last_transfer = float("-inf")  # trio time of the last leadership transfer this leader asked for

    # ---- placement -----------------------------------------------------------------------------------

    def _queue_counts(self, topic: str = "") -> tuple[collections.Counter, collections.Counter]:
        """Queues per group: of every topic, and of topic."""
        queues_in: collections.Counter = collections.Counter()
        topic_queues: collections.Counter = collections.Counter()
        for spec in self.metadata.topics.values():
            for queue in range(spec.queues):
                group = spec.group_of(queue)
                queues_in[group] += 1
                if spec.name == topic:
                    topic_queues[group] += 1
        return queues_in, topic_queues

    def _group_loads(self, topic: str, voters: dict[int, tuple[int, ...]], now_ms: int) -> list[GroupLoad]:
        queues_in, topic_queues = self._queue_counts(topic)
        loads, degraded = [], self.cluster.degraded()
        for group, members in sorted(voters.items()):
            leaving = any(self.cluster.leaving(voter) for voter in members)
            leader = self.metadata.leader_of(group, self.cluster.leaders) or members[0]
            predicted = self.forecasts.predict(("group", group), now_ms, max(1, queues_in[group]))
            loads.append(GroupLoad(group, leader, predicted, queues_in[group], topic_queues[group],
                                   not leaving and leader not in degraded))
        if not any(load.available for load in loads):  # better a group short of a replica than none
            for load in loads:
                load.available = True
        return loads

    def place(self, spec: TopicSpec | None, topic: str, first_queue: int, count: int,
               voters: dict[int, tuple[int, ...]]) -> list[QueueChoice]:
        """Groups for queues first_queue.. of topic (spec: as it is now, None when it is new), among the groups
        given with their voters, and the record of why, for `rocket cluster placement --explain`."""
        now_ms = self.clock.wall_ms()
        queues_after = first_queue + count
        loads = self._group_loads(topic, voters, now_ms)
        topic_predicted = (self.forecasts.predict(("topic", topic), now_ms, queues_after)
                           if self.forecasts.history.rates(("topic", topic)) else None)
        choices = self.planner.place(first_queue, count, topic_predicted, loads)
        earlier = self._explanations.pop(topic, None) if spec is not None else None
        self._explanations[topic] = PlacementExplainResponse(
            topic, self.forecasts.predictor.name, "", now_ms, (earlier.queues if earlier else []) + [
                PlacedQueue(choice.queue, choice.group, choice.node, choice.predicted, choice.score, choice.runner_up,
                            choice.runner_up_score) for choice in choices])
        while len(self._explanations) > limits.placement_explanations_max:
            self._explanations.popitem(last=False)
        return choices

    async def balance_leaders(self) -> None:
        """On the leader, at most once per limits.leader_transfer_s: move one group's leadership off a degraded node,
        to the healthy voter leading the least predicted load; or else, within the planner's move budget, from the
        node that leads the most predicted load to the least loaded of the group's voters
        (rocket.ml.placement.Planner.leader_move), never a degraded one. The group's leader does it (StorageMembers
        "transfer"); the next heartbeats tell who leads. Controller-mode groups are left out, degraded or not: the
        controller names their master."""
        now = trio.current_time()
        if now - self._last_transfer < limits.leader_transfer_s or self.cluster.moving:
            return
        now_ms = self.clock.wall_ms()
        voters = {group: members.voters for group, members in self.metadata.groups.items()
                  if not members.learners and members.control is None}
        queues_in, _ = self._queue_counts()
        leaders = self.cluster.leaders
        loads = [GroupLoad(group, leaders.get(group, 0),
                           self.forecasts.predict(("group", group), now_ms, max(1, queues_in[group])), 0)
                 for group in voters]
        degraded = self.cluster.degraded()
        nodes = [load.node for load in self.cluster.loads() if load.available and load.node not in degraded]
        transfer = self.planner.leader_move(loads, voters, nodes, degraded, now, self.forecasts.predictor.error_bytes_s)
        if transfer is None:
            return
        group, target, off_degraded = transfer
        self._last_transfer = now
        leader = leaders.get(group, 0)
        info = self.metadata.nodes.get(leader)
        if info is None:
            return
        try:
            await self.meta.peers.call(Address.parse(info.address), "StorageMembers",
                                       {"group": group, "action": "transfer", "node": target})
        except RocketError as error:
            log.info("group %d: leadership transfer from node %d to node %d: %s", group, leader, target, error)
            return
        log.info("group %d: leadership moves from node %d to node %d %s", group, leader, target,
                 "off a degraded node" if off_degraded else "to even out the predicted load")
        leaders[group] = target

    async def add_queues(self, spec: TopicSpec, queues: int) -> None:
        """On the leader, under the nameserver's creating lock: place queues added to a topic."""
        if spec.name.startswith(KV_PREFIX):
            raise RocketError(Code.BAD_REQUEST, f"bucket {spec.bucket!r} keeps its {spec.queues} shards: its keys "
                              "hash onto them")
        if queues <= spec.queues:
            raise RocketError(Code.BAD_REQUEST, f"topic {spec.name!r} has {spec.queues} queues; queues can only be "
                              f"added, got {queues}")
        if queues > limits.queues_per_topic_max:
            raise RocketError(Code.BAD_REQUEST, f"queues must be 1..{limits.queues_per_topic_max}, got {queues}")
        voters = {group: self.metadata.groups[group].voters for group in self.metadata.class_groups(spec.storage_class)}
        choices = self.place(spec, spec.name, spec.queues, queues - spec.queues, voters)
        await self.meta.propose({"op": "add_queues", "name": spec.name, "from_queues": spec.queues,
                             "queue_groups": [choice.group for choice in choices]})

    async def placement_explain(self, request: TopicRequest) -> PlacementExplainResponse:
        return await self.meta.on_leader("PlacementExplain", request, self._explain_here)

    async def _explain_here(self, request: TopicRequest) -> PlacementExplainResponse:
        spec = self.metadata.topic(request.topic)
        recorded = self._explanations.get(spec.name)
        rows = {row.queue: row for row in (recorded.queues if recorded else [])}
        queues = [rows.get(queue) or PlacedQueue(queue, spec.group_of(queue), 0, -1.0, -1.0, 0, -1.0)
                  for queue in range(spec.queues)]
        note = "" if recorded and len(rows) == spec.queues else (
            "queues without scores were placed before this nameserver led"
            + ("" if spec.queue_groups else ", by a hash onto the topic's groups"))
        return PlacementExplainResponse(spec.name, recorded.predictor if recorded else "", self.forecasts.model_state,
                                        recorded.placed_ms if recorded else 0, queues, note)
