"""The cluster metadata (RIP-18): the nameserver group's Raft state machine. Pure: no I/O, no clock.

It holds topics (with the storage groups their queues hash onto), storage groups and their voters,
and the node registry. Commands are JSON objects decided by the nameserver leader (which did the
placement and read the clock) and applied identically on every nameserver. `version` rises with
every change, so a cached route knows it is stale.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

import orjson

from rocket import limits
from rocket.errors import Code, RocketError, invariant
from rocket.ml.health import PINS as HEALTH_PINS
from rocket.model import KV_PREFIX, TopicSpec

META_GROUP = 1  # the nameservers' own Raft group; storage groups are numbered from 2
FIRST_STORAGE_GROUP = 2
NODE_STATES = ("up", "draining")


@dataclasses.dataclass(slots=True)
class Members:
    """A storage group's replicas. While a replica moves, the new one is a learner and `leaving`
    names the one it replaces (0 when it only adds)."""

    voters: tuple[int, ...]
    learners: tuple[int, ...] = ()
    leaving: int = 0


@dataclasses.dataclass(slots=True)
class NodeInfo:
    id: int
    address: str
    roles: tuple[str, ...]
    state: str = "up"
    health_pin: str = "auto"  # an operator's pin of a storage node's health: healthy, degraded, or auto (judged)
    degraded_for: str = ""  # what the health judge degraded it for (of rocket.ml.health.KINDS); "": not degraded


def exists(name: str) -> RocketError:
    if name.startswith(KV_PREFIX):
        return RocketError(Code.BUCKET_EXISTS, f"bucket {name[len(KV_PREFIX):]!r} already exists")
    return RocketError(Code.TOPIC_EXISTS, f"topic {name!r} already exists")


class Metadata:
    def __init__(self) -> None:
        self.topics: dict[str, TopicSpec] = {}
        self.groups: dict[int, Members] = {}
        self.nodes: dict[int, NodeInfo] = {}
        self.version = 0

    # ---- the state machine ---------------------------------------------------------------------------

    def apply(self, entries, positions) -> list:
        results: list = []
        for entry in entries:
            if not entry.data:  # a new leader's empty entry
                results.append(None)
                continue
            try:
                results.append(self._command(orjson.loads(entry.data)))
            except RocketError as error:
                results.append(error)
        return results

    def _command(self, command: dict):
        operation = command["op"]
        if operation == "register":
            node = NodeInfo(command["node"], command["address"], tuple(command["roles"]))
            known = self.nodes.get(node.id)
            if known is not None:
                node.state, node.health_pin, node.degraded_for = known.state, known.health_pin, known.degraded_for
            self.nodes[node.id] = node
        elif operation == "create_topic":
            name = command["name"]
            if name in self.topics:
                raise exists(name)
            if len(self.topics) >= limits.topics_max:
                raise RocketError(Code.OVERLOADED, f"the cluster holds the maximum of {limits.topics_max} topics")
            self._add_groups(command["new_groups"])
            invariant(all(group in self.groups for group in command["groups"]), "a topic's groups exist")
            queue_groups = tuple(command.get("queue_groups", ()))
            invariant(not queue_groups or len(queue_groups) == command["queues"], "one group per queue")
            self.topics[name] = TopicSpec(name, command["queues"], command["created_ms"], tuple(command["groups"]),
                                          command.get("message_type", "normal"), history=command.get("history", 1),
                                          ttl_ms=command.get("ttl_ms", 0), queue_groups=queue_groups)
        elif operation == "create_groups":  # more storage nodes joined: more groups for new queues
            self._add_groups(command["new_groups"])
        elif operation == "delete_topic":
            self.topic(command["name"])
            del self.topics[command["name"]]
        elif operation == "update_topic":
            spec = self.topic(command["name"])
            self.topics[spec.name] = dataclasses.replace(spec, retention_s=command["retention_s"],
                                                         local_retention_s=command["local_retention_s"])
        elif operation == "add_queues":
            spec = self.topic(command["name"])
            if spec.queues != command["from_queues"]:
                raise RocketError(Code.UNAVAILABLE, f"topic {spec.name!r} has {spec.queues} queues now, not "
                                  f"{command['from_queues']}; retry")
            invariant(all(group in self.groups for group in command["queue_groups"]), "new queues' groups exist")
            queue_groups = tuple(spec.group_of(queue) for queue in range(spec.queues)) + tuple(command["queue_groups"])
            self.topics[spec.name] = dataclasses.replace(
                spec, queues=len(queue_groups), queue_groups=queue_groups,
                groups=tuple(sorted(set(spec.groups) | set(command["queue_groups"]))))
        elif operation == "node_state":
            invariant(command["state"] in NODE_STATES, "a known node state")
            self._registered(command["node"]).state = command["state"]
        elif operation == "health_pin":
            invariant(command["pin"] in HEALTH_PINS, "a known health pin")
            self._registered(command["node"]).health_pin = command["pin"]
        elif operation == "health_judged":  # the leader's judge changed its mind: a new leader starts from here
            self._registered(command["node"]).degraded_for = command["degraded_for"]
        elif operation == "move_start":
            members = self.groups.get(command["group"])
            if members is None or members.learners or command["add"] in members.voters:
                raise RocketError(Code.UNAVAILABLE, f"group {command['group']} cannot start that move now")
            self.groups[command["group"]] = Members(members.voters, (command["add"],), command["remove"])
        elif operation == "move_done":
            members = self.groups.get(command["group"])
            if members is None or not members.learners:
                raise RocketError(Code.UNAVAILABLE, f"group {command['group']} has no move to finish")
            voters = tuple(sorted((set(members.voters) - {members.leaving}) | set(members.learners)))
            self.groups[command["group"]] = Members(voters)
        else:
            invariant(False, f"unknown metadata command {operation!r}")
        self.version += 1
        return self.topics[command["name"]] if operation in ("create_topic", "update_topic", "add_queues") else None

    def snapshot(self) -> list[bytes]:
        return [orjson.dumps({
            "version": self.version,
            "topics": [[s.name, s.queues, s.created_ms, list(s.groups), s.message_type, s.retention_s,
                        s.local_retention_s, s.history, s.ttl_ms, list(s.queue_groups)] for s in self.topics.values()],
            "groups": [[group, list(m.voters), list(m.learners), m.leaving] for group, m in self.groups.items()],
            "nodes": [dataclasses.asdict(node) for node in self.nodes.values()],
        })]

    def restore(self, chunks: Iterable[bytes]) -> None:
        data = b"".join(chunks)
        if not data:
            return
        state = orjson.loads(data)
        self.version = state["version"]
        self.topics = {name: TopicSpec(name, queues, created, tuple(groups), *rest[:5],
                                       queue_groups=tuple(rest[5]) if len(rest) > 5 else ())
                       for name, queues, created, groups, *rest in state["topics"]}
        self.groups = {group: Members(tuple(voters), tuple(learners), leaving)
                       for group, voters, learners, leaving in state["groups"]}
        self.nodes = {node["id"]: NodeInfo(node["id"], node["address"], tuple(node["roles"]), node["state"],
                                           node.get("health_pin", "auto"),  # snapshots before pins had none
                                           node.get("degraded_for", ""))
                      for node in state["nodes"]}

    # ---- queries -------------------------------------------------------------------------------------

    def topic(self, name: str) -> TopicSpec:
        spec = self.topics.get(name)
        if spec is None:
            if name.startswith(KV_PREFIX):
                raise RocketError(Code.UNKNOWN_BUCKET, f"bucket {name[len(KV_PREFIX):]!r} does not exist")
            raise RocketError(Code.UNKNOWN_TOPIC, f"topic {name!r} does not exist")
        return spec

    def _registered(self, node: int) -> NodeInfo:
        found = self.nodes.get(node)
        if found is None:
            raise RocketError(Code.BAD_REQUEST, f"node {node} is not registered")
        return found

    def _add_groups(self, new_groups: list[dict]) -> None:
        for group in new_groups:
            if group["id"] in self.groups:
                raise RocketError(Code.UNAVAILABLE, f"storage group {group['id']} exists already; retry")
        for group in new_groups:
            self.groups[group["id"]] = Members(tuple(group["voters"]))

    def storage_nodes(self) -> list[NodeInfo]:
        return [node for node in self.nodes.values() if "storage" in node.roles]

    def next_group_id(self) -> int:
        return max(self.groups, default=FIRST_STORAGE_GROUP - 1) + 1

    def addresses(self, nodes) -> list[dict]:
        return [{"id": node, "address": self.nodes[node].address} for node in sorted(nodes) if node in self.nodes]

    def route(self, name: str, leaders: dict[int, int]) -> dict:
        """Everything a broker needs to reach a topic's queues: queue -> group -> voters -> addresses."""
        spec = self.topic(name)
        groups = sorted(set(spec.queue_groups or spec.groups))
        members = {node for group in groups for node in self.members_of(group)}
        return {
            "version": self.version,
            "topic": spec.to_wire(),
            "queue_groups": [spec.group_of(queue) for queue in range(spec.queues)],
            "groups": [self.group_info(group, leaders) for group in groups],
            "nodes": self.addresses(members),
        }

    def members_of(self, group: int) -> tuple[int, ...]:
        return self.groups[group].voters + self.groups[group].learners

    def replicas(self, node: int) -> int:
        return sum(node in self.members_of(group) for group in self.groups)

    def group_info(self, group: int, leaders: dict[int, int]) -> dict:
        members = self.groups[group]
        return {"id": group, "voters": list(members.voters), "learners": list(members.learners),
                "leader": leaders.get(group, 0)}

    def assignment(self, node: int) -> dict:
        """The storage groups a node hosts, with the addresses of their members."""
        groups = [group for group in self.groups if node in self.members_of(group)]
        members = {member for group in groups for member in self.members_of(group)}
        return {
            "version": self.version,
            "groups": [self.group_info(group, {}) for group in groups],
            "nodes": self.addresses(members),
        }
