"""Where new replicas and queues go (Placement, LeastLoaded, place_queues) and which leaderships move (leader_transfer
on forecast load), as the nameserver's Planner decides them within its MoveBudget; hot_group_move, the PD-style
baseline on current flow, and forecast_move, its search on forecast load, for the evaluation. Pure: no I/O, no clock."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Collection, Mapping
from typing import Protocol

from rocket import limits
from rocket.errors import Code, RocketError


@dataclasses.dataclass(slots=True)
class NodeLoad:
    node: int
    replicas: int = 0  # replicas hosted, counting ones placed by this decision
    leads: int = 0  # groups it leads: a proxy for the traffic it serves
    bytes: int = 0  # bytes stored
    free_disk_bytes: int = 0
    available: bool = True  # up and not draining: never place on a down or draining node


class Placement(Protocol):
    def place(self, groups: int, replicas: int, nodes: list[NodeLoad]) -> list[tuple[int, ...]]:
        """Replica sets for `groups` new groups, each on `replicas` distinct available nodes."""
        ...


class LeastLoaded:
    """Each replica goes to the available node with the lowest score that does not hold one yet."""

    def score(self, load: NodeLoad) -> float:
        """In replicas: each hosted replica counts one, and leads, stored bytes and a low disk add their weights."""
        low_disk = load.free_disk_bytes and load.free_disk_bytes < limits.placement_free_disk_bytes_min
        free_penalty = limits.placement_low_disk_replicas if low_disk else 0.0
        return (load.replicas + limits.placement_lead_replicas * load.leads
                + load.bytes / limits.placement_replica_bytes + free_penalty)

    def place(self, groups: int, replicas: int, nodes: list[NodeLoad]) -> list[tuple[int, ...]]:
        loads = {load.node: dataclasses.replace(load) for load in nodes if load.available}
        if len(loads) < replicas:
            raise RocketError(Code.UNAVAILABLE, f"{replicas} replicas need {replicas} available storage nodes; "
                              f"{len(loads)} are available")
        placed: list[tuple[int, ...]] = []
        for _ in range(groups):
            chosen: list[int] = []
            for _ in range(replicas):
                node = min((load for load in loads.values() if load.node not in chosen),
                           key=lambda load: (self.score(load), load.node)).node
                loads[node].replicas += 1
                chosen.append(node)
            placed.append(tuple(sorted(chosen)))
        return placed


@dataclasses.dataclass(slots=True)
class GroupLoad:
    """A storage group as queue placement sees it."""

    group: int
    leader: int  # the node leading it (0: unknown)
    predicted: float  # bytes/s in it is expected to carry over the forecast's horizon
    queues: int  # queues of every topic it holds
    topic_queues: int = 0  # queues of the topic being placed it holds
    available: bool = True  # every voter up and not draining: never place on a group that is not


@dataclasses.dataclass(slots=True, frozen=True)
class QueueChoice:
    """Where one new queue went and why: the scores (predicted bytes/s of the group and of its leader's node, with
    what this placement put there before) of the chosen group and of the runner-up."""

    queue: int
    group: int
    node: int
    predicted: float  # the new queue's own predicted bytes/s
    score: float
    runner_up: int  # 0: there was no other group
    runner_up_score: float


def new_queue_load(topic_predicted: float | None, queues_after: int, groups: list[GroupLoad]) -> float:
    """The bytes/s each new queue of a topic is expected to carry: its topic's predicted load spread over the queues
    it will have; for a topic without traffic yet (None), the load of the cluster's average queue. A new topic's
    queues then weigh something, and spread over the groups instead of piling onto the least loaded one (what a
    forecast of an empty history says: nothing)."""
    if topic_predicted is not None:
        return topic_predicted / max(1, queues_after)
    return sum(load.predicted for load in groups) / max(1, sum(load.queues for load in groups))


def place_queues(first_queue: int, count: int, queue_predicted: float, groups: list[GroupLoad]) -> list[QueueChoice]:
    """New queues first_queue.. of a topic, each expected to carry queue_predicted bytes/s, onto the available
    groups with the lowest predicted load: a group's own, plus limits.placement_node_weight times the load of every
    group its leader leads (a hot node's other groups count too), plus what this placement adds (queue_predicted
    each: see new_queue_load). A topic's queues spread evenly first, as Kafka spreads a topic's partitions over its
    brokers: no group takes more than ceil(the topic's queues / available groups) of them, so that one topic's
    traffic, whatever it turns out to be, is not one group's. Load chooses within that. Ties go to the group holding
    fewer of the topic's queues, then fewer queues, then the lower id."""
    candidates = [dataclasses.replace(load) for load in groups if load.available]
    if not candidates:
        raise RocketError(Code.UNAVAILABLE, "no storage group has all its replicas on available nodes")
    node_load: dict[int, float] = {}
    for load in candidates:
        node_load[load.leader] = node_load.get(load.leader, 0.0) + load.predicted

    def score(load: GroupLoad) -> float:
        return load.predicted + limits.placement_node_weight * node_load[load.leader]

    topic_cap = -(-(sum(load.topic_queues for load in groups) + count) // len(candidates))
    choices: list[QueueChoice] = []
    for queue in range(first_queue, first_queue + count):
        allowed = [load for load in candidates if load.topic_queues < topic_cap] or candidates
        ranked = sorted(allowed, key=lambda load: (score(load), load.topic_queues, load.queues, load.group))
        chosen = ranked[0]
        runner_up = ranked[1] if len(ranked) > 1 else None
        choices.append(QueueChoice(queue, chosen.group, chosen.leader, queue_predicted, score(chosen),
                                   runner_up.group if runner_up else 0, score(runner_up) if runner_up else 0.0))
        chosen.predicted += queue_predicted
        node_load[chosen.leader] += queue_predicted
        chosen.topic_queues += 1
        chosen.queues += 1
    return choices


def leader_transfer(groups: list[GroupLoad], voters: dict[int, tuple[int, ...]], nodes: list[int],
                    narrow_bytes_s: float = limits.leader_group_bytes_s) -> tuple[int, int] | None:
    """The one leadership transfer (group, to node) that best evens out the predicted load the nodes lead, or None
    when the nodes are within limits.leader_balance_ratio of their mean (or limits.leader_balance_bytes_s of each
    other). Each led group weighs its predicted bytes/s plus limits.leader_group_bytes_s, so that leader counts even
    out when there is no traffic. Only to an available node (in nodes) among the group's voters, and only when it
    narrows the gap between the two nodes by narrow_bytes_s at least, so that transfers stop (and do not chase the
    forecast's own error: Planner.leader_move)."""
    if len(nodes) < 2:
        return None
    weight = {load.group: load.predicted + limits.leader_group_bytes_s for load in groups}
    led = {node: 0.0 for node in nodes}
    for load in groups:
        if load.leader in led:
            led[load.leader] += weight[load.group]
    high = max(nodes, key=lambda node: (led[node], node))
    low_ranked = sorted(nodes, key=lambda node: (led[node], node))
    mean = sum(led.values()) / len(led)
    if led[high] - led[low_ranked[0]] <= max(limits.leader_balance_bytes_s, limits.leader_balance_ratio * mean):
        return None
    best = None
    for load in groups:
        if load.leader != high:
            continue
        for target in low_ranked:
            if target == high or target not in voters.get(load.group, ()):
                continue
            gap_after = abs((led[high] - weight[load.group]) - (led[target] + weight[load.group]))
            # It must narrow the gap by a group's weight at least: moves of next to nothing could go round.
            if gap_after <= led[high] - led[target] - narrow_bytes_s and (
                    best is None or gap_after < best[0]):
                best = (gap_after, load.group, target)
            break  # the least loaded voter of this group is the one to try
    return None if best is None else (best[1], best[2])


def degraded_leader_transfer(groups: list[GroupLoad], voters: dict[int, tuple[int, ...]], nodes: list[int],
                             degraded: set[int]) -> tuple[int, int] | None:
    """The one leadership transfer (group, to node) off a degraded node: its group with the most predicted load, to
    that group's voter among nodes (the available, healthy ones) that leads the least; None when no degraded node
    leads a group that has such a voter."""
    led = {node: 0.0 for node in nodes}
    for load in groups:
        if load.leader in led:
            led[load.leader] += load.predicted + limits.leader_group_bytes_s
    for load in sorted(groups, key=lambda load: (-load.predicted, load.group)):
        if load.leader not in degraded:
            continue
        targets = [node for node in voters.get(load.group, ()) if node in led]
        if targets:
            return load.group, min(targets, key=lambda node: (led[node], node))
    return None


class MoveBudget:
    """Balancing moves per hour as a token bucket (PD's schedule limits, over time): an hour's worth may go at once,
    so that a cluster that just restarted evens out, and then one every 3600 / per_hour seconds. Times are seconds
    on any monotonic clock; the first take starts it. 0 per hour: none."""

    def __init__(self, per_hour: float):
        self.per_hour = per_hour
        self.tokens = per_hour
        self.at: float | None = None

    def left(self, now_s: float) -> float:
        """Moves the budget allows now (fractions are the next one filling up)."""
        if self.at is not None:
            self.tokens = min(self.per_hour, self.tokens + (now_s - self.at) * self.per_hour / 3600.0)
        self.at = now_s
        return self.tokens

    def take(self, now_s: float) -> bool:
        """Spend one move if the budget has it."""
        if self.left(now_s) < 1.0:
            return False
        self.tokens -= 1.0
        return True


class Planner:
    """The nameserver's one rebalancing policy, on forecast load: where a topic's new queues go (place_queues), which
    leadership moves (off a degraded node first, then leader_transfer's, whose tolerances are its hysteresis), and
    whether a balancing move may go now. Leader transfers and the replica moves that even out replica counts share
    the budget (the config's rebalance_moves_per_hour); moves off degraded, down or draining nodes never wait for it.
    Replicas do not move for load: placement_eval measured forecast_move, which does, as the worst policy (docs:
    Telemetry)."""

    def __init__(self, moves_per_hour: float):
        self.budget = MoveBudget(moves_per_hour)

    def place(self, first_queue: int, count: int, topic_predicted: float | None, groups: list[GroupLoad]
              ) -> list[QueueChoice]:
        """A topic's new queues first_queue.. (topic_predicted: its bytes/s, None without traffic yet)."""
        queue_load = new_queue_load(topic_predicted, first_queue + count, groups)
        return place_queues(first_queue, count, queue_load, groups)

    def describe(self, now_s: float) -> str:
        """The budget as `cluster status` shows it."""
        if not self.budget.per_hour:
            return "rebalancing off (moves off degraded, down or draining nodes only)"
        return f"rebalancing: {int(self.budget.left(now_s))} of {self.budget.per_hour:g} moves an hour left"

    def leader_move(self, groups: list[GroupLoad], voters: dict[int, tuple[int, ...]], nodes: list[int],
                    degraded: set[int], now_s: float, error_bytes_s: float = 0.0) -> tuple[int, int, bool] | None:
        """(group, to node, whether off a degraded node) for the one leadership to move now, or None. nodes: the
        available ones that are not degraded. error_bytes_s: the predictions' error on groups (Predictor); a
        balancing transfer must narrow the gap by limits.leader_error_share of it, so that forecast noise moves
        nothing (placement_eval, seeds 30-37: the goal held in 5 of 8 seeds against 3, with 41% fewer moves)."""
        transfer = degraded_leader_transfer(groups, voters, nodes, degraded)
        if transfer is not None:
            return transfer[0], transfer[1], True
        transfer = leader_transfer(groups, voters, nodes,
                                   max(limits.leader_group_bytes_s, limits.leader_error_share * error_bytes_s))
        if transfer is None or not self.budget.take(now_s):
            return None
        return transfer[0], transfer[1], False


@dataclasses.dataclass(slots=True, frozen=True)
class Move:
    """One rebalancing step: the group's leadership (leader_only), or its replica on source with whatever it serves,
    goes to target."""

    group: int
    source: int
    target: int
    leader_only: bool


def node_flows(groups: list[GroupLoad], voters: dict[int, tuple[int, ...]], nodes: list[int],
               follower_share: float = limits.hot_follower_share) -> dict[int, float]:
    """Each node's load from the flow of the groups it holds: all of a group's for its leader, follower_share of it
    for each other voter."""
    load = {node: 0.0 for node in nodes}
    for group in groups:
        for voter in voters.get(group.group, ()):
            if voter in load:
                load[voter] += group.predicted * (1.0 if voter == group.leader else follower_share)
    return load


def hot_group_move(groups: list[GroupLoad], voters: dict[int, tuple[int, ...]], nodes: list[int],
                   follower_share: float = limits.hot_follower_share,
                   tolerance: float = limits.hot_tolerance_ratio,
                   decrease: float = limits.hot_decrease_ratio,
                   worth: Callable[[Move, float], bool] | None = None, busy: Collection[int] = (),
                   replica_moves: bool = True) -> Move | None:
    """The PD-style baseline, after TiKV PD's hot-region scheduler: one move by the flow each group carries now
    (GroupLoad.predicted is taken as it), no forecast. Sources are the nodes above the mean load by tolerance,
    hottest first; targets the nodes below it by tolerance. From a source, its groups by flow, hottest first: the
    leadership to a voter that is a target, else the source's replica (and its leadership, if it led) to a target
    that holds none of the group and fewer replicas than the source (as PD's region-score filter: balancing replica
    counts would move it back), whichever leaves the hotter of the two nodes lower. A move must leave that at most
    decrease times the source's load, so that nothing swaps back and forth, and worth(move, the load it takes off the
    hotter node) must hold if given (forecast_move's cost of a move). Groups in busy (a move of theirs under way)
    are left alone, as PD leaves a region with an operator pending; without replica_moves (as many replica moves
    under way as may run at once), leaderships only. None when no move does."""
    load = node_flows(groups, voters, nodes, follower_share)
    if len(load) < 2:
        return None
    replicas = dict.fromkeys(load, 0)
    for group in groups:
        for voter in voters.get(group.group, ()):
            if voter in replicas:
                replicas[voter] += 1
    mean = sum(load.values()) / len(load)
    targets = sorted((node for node in load if load[node] * tolerance < mean), key=lambda node: (load[node], node))
    sources = sorted((node for node in load if load[node] > mean * tolerance), key=lambda node: (-load[node], node))
    for source in sources:
        held = [group for group in groups if source in voters.get(group.group, ()) and group.group not in busy]
        for group in sorted(held, key=lambda group: (-group.predicted, group.group)):
            members = voters[group.group]
            leads = group.leader == source
            moves: list[tuple[float, Move]] = []
            if leads:  # the leadership: the source keeps a follower's share, the new leader gains the rest
                shift = group.predicted * (1 - follower_share)
                moves += [(max(load[source] - shift, load[target] + shift), Move(group.group, source, target, True))
                          for target in targets if target in members]
            shift = group.predicted * (1.0 if leads else follower_share)
            moves += [(max(load[source] - shift, load[target] + shift), Move(group.group, source, target, False))
                      for target in targets if replica_moves and target not in members
                      and replicas[target] < replicas[source]]
            moves = [(after, move) for after, move in moves if after <= decrease * load[source]
                     and (worth is None or worth(move, load[source] - after))]
            if moves:
                return min(moves, key=lambda move: (move[0], not move[1].leader_only, move[1].target))[1]
    return None


def forecast_move(groups: list[GroupLoad], voters: dict[int, tuple[int, ...]], nodes: list[int],
                  kept_bytes: Mapping[int, float], payback_s: float = limits.plan_payback_s,
                  follower_share: float = limits.hot_follower_share, busy: Collection[int] = (),
                  replica_moves: bool = True) -> Move | None:
    """The forecast planner's one move: hot_group_move's search on forecast load (GroupLoad.predicted: bytes/s over
    the forecast's horizon, so that a spike the forecast expects to pass moves nothing), where a move must pay for
    itself: the load it takes off the hotter node, over payback_s, at least its cost. A replica costs the bytes it
    copies (kept_bytes of its group), a leadership the writes its stall holds (limits.plan_leader_stall_s)."""
    predicted = {group.group: group.predicted for group in groups}

    def worth(move: Move, gain: float) -> bool:
        if move.leader_only:
            return gain * payback_s >= predicted[move.group] * limits.plan_leader_stall_s
        return gain * payback_s >= kept_bytes.get(move.group, 0.0)

    return hot_group_move(groups, voters, nodes, follower_share, worth=worth, busy=busy, replica_moves=replica_moves)
