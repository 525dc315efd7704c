"""The cluster metadata (RIP-18): the nameserver group's Raft state machine. Pure: no I/O, no clock. Its commands are
JSON objects decided by the nameserver leader (which did the placement and read the clock) and applied identically on
every nameserver; `version` rises with every change, so a cached route knows it is stale.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from typing import Any

import orjson

from rocket import limits
from rocket.errors import Code, RocketError, invariant
from rocket.ml.health import PINS as HEALTH_PINS
from rocket.model import DEFAULT_STORAGE_CLASS, KV_PREFIX, TopicSpec, check_group_name
from rocket.roles.nameserver.control import Control, alter, elect
from rocket.serde.typed import Assignment, GroupInfo, NodeAddress, ReplicaLag, Route, topic_info

META_GROUP = 1  # the nameservers' own Raft group; storage groups are numbered from 2
FIRST_STORAGE_GROUP = 2
NODE_STATES = ("up", "draining")
STORAGE_MODES = ("raft", "controller")
DEFAULT_CLASS = DEFAULT_STORAGE_CLASS  # implicit, not stored: mode raft, the config's replication, the nodes' groups
CONSUME_MODES = ("clustering", "broadcasting")
CONSUMER_GROUP_FIELDS = ("max_attempts", "retry_backoff_s", "consume_mode", "fifo")  # what an update may change


@dataclasses.dataclass(slots=True)
class StorageClass:
    """A named pool of storage groups that topics are placed on. In controller mode (RIP-44) a group has a master
    and slaves, and the controller in this metadata names the master and the replicas in sync."""

    name: str
    mode: str  # one of STORAGE_MODES
    replicas: int
    min_in_sync_replicas: int = 1  # controller mode: writes are refused (NOT_ENOUGH_REPLICAS) with fewer in sync
    unclean_election: bool = False  # controller mode: whether a replica out of sync may become master
    ha_max_lag_s: float = limits.ha_lag_s_default  # controller mode: a slave further behind leaves the set


def apply_json(entries, command: Callable[[dict], Any]) -> list:
    """Apply entries whose data are JSON commands: each one's result, or the RocketError it was refused with (None for
    a new leader's empty entry)."""
    results: list = []
    for entry in entries:
        if not entry.data:
            results.append(None)
            continue
        try:
            results.append(command(orjson.loads(entry.data)))
        except RocketError as error:
            results.append(error)
    return results


@dataclasses.dataclass(slots=True)
class Members:
    """A storage group's replicas. While a replica moves, the new one is a learner and `leaving`
    names the one it replaces (0 when it only adds). `readers` are learners that stay: read replicas of its topics
    (issue 53). A controller-mode group has `control`."""

    voters: tuple[int, ...]
    learners: tuple[int, ...] = ()
    leaving: int = 0
    storage_class: str = DEFAULT_CLASS
    control: Control | None = None
    readers: tuple[int, ...] = ()

    def electable(self) -> tuple[int, ...]:
        """The replicas a controller may elect or keep in the SyncStateSet: during a move, the new one too (once it
        holds everything the master acknowledged, it joins the set), and not the one it replaces."""
        return tuple(node for node in self.voters + self.learners if node != self.leaving)


@dataclasses.dataclass(slots=True)
class ConsumerGroup:
    """A consumer group's settings, which every broker and gateway reads (RocketMQ keeps them per group on the
    server: its subscription group config)."""

    name: str
    max_attempts: int = 0  # deliveries before the dead letters; 0: none set, the consumer's own (its request's)
    retry_backoff_s: tuple[float, ...] = ()  # the invisible time after the nth failed delivery; (): rocket's default
    consume_mode: str = "clustering"  # one of CONSUME_MODES
    fifo: bool = False  # its consumers take a FIFO topic's messages in order

    def to_wire(self) -> dict:
        return {"group": self.name, "max_attempts": self.max_attempts, "retry_backoff_s": list(self.retry_backoff_s),
                "consume_mode": self.consume_mode, "fifo": self.fifo}


def check_consumer_group(settings: dict) -> dict:
    """The settings given (any of CONSUMER_GROUP_FIELDS), normalised; each refused in one line saying what is
    allowed."""
    checked = {}
    for field, value in settings.items():
        if field == "max_attempts":
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= limits.checks_config_max:
                raise RocketError(Code.BAD_REQUEST, f"max_attempts must be 1..{limits.checks_config_max} (0: none "
                                  f"set, the consumer's own), got {value!r}")
        elif field == "retry_backoff_s":
            if not isinstance(value, (list, tuple)) or not all(
                    isinstance(seconds, (int, float)) and not isinstance(seconds, bool) for seconds in value):
                raise RocketError(Code.BAD_REQUEST, f"retry_backoff_s must be a list of seconds, got {value!r}")
            value = tuple(float(seconds) for seconds in value)
            if len(value) > limits.group_retry_backoff_steps_max:
                raise RocketError(Code.BAD_REQUEST, f"retry_backoff_s has {len(value)} steps; at most "
                                  f"{limits.group_retry_backoff_steps_max}")
            if not all(0 <= seconds <= limits.pop_invisible_s_max for seconds in value):
                raise RocketError(Code.BAD_REQUEST, f"each step of retry_backoff_s must be 0..{limits.pop_invisible_s_max} "
                                  f"seconds, got {list(value)}")
        elif field == "consume_mode":
            if value not in CONSUME_MODES:
                raise RocketError(Code.BAD_REQUEST, f"consume_mode must be one of {', '.join(CONSUME_MODES)}, got "
                                  f"{value!r}")
        elif field == "fifo":
            if not isinstance(value, bool):
                raise RocketError(Code.BAD_REQUEST, f"fifo must be true or false, got {value!r}")
        else:
            raise RocketError(Code.BAD_REQUEST, f"a consumer group has no setting {field!r}: only "
                              f"{', '.join(CONSUMER_GROUP_FIELDS)}")
        checked[field] = value
    return checked


def group_exists(name: str) -> RocketError:
    return RocketError(Code.GROUP_EXISTS, f"consumer group {name!r} exists: change its settings with update")


def unknown_group(name: str) -> RocketError:
    return RocketError(Code.UNKNOWN_GROUP, f"consumer group {name!r} has no settings: create it first")


@dataclasses.dataclass(slots=True)
class ClassMove:
    """A topic moving to another storage class (roles/nameserver/class_moves.py): its queues' groups there, placed
    when it started, and before; switched once the topic's queues are there."""

    storage_class: str
    queue_groups: tuple[int, ...]
    old_groups: tuple[int, ...]
    switched: bool = False


MOVABLE_TYPES = ("normal", "fifo")  # a delay or transaction topic's pending messages wait in its groups: it stays


@dataclasses.dataclass
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


def class_exists(name: str) -> RocketError:
    return RocketError(Code.BAD_REQUEST, f"storage class {name!r} exists")


def unknown_class(name: str) -> RocketError:
    return RocketError(Code.BAD_REQUEST, f"storage class {name!r} does not exist")


class Metadata:
    """The state machine. It holds topics (with the storage groups their queues hash onto), storage groups and their
    voters, the storage classes (issue 32) with, for controller-mode groups, the controller's master, sync state set
    and epochs, and the last elections; the consumer groups' settings (max attempts, retry backoff, consume mode,
    FIFO), keyed by group name; users, policies and client quotas; and the node registry."""

    def __init__(self) -> None:
        self.topics: dict[str, TopicSpec] = {}
        self.groups: dict[int, Members] = {}
        self.nodes: dict[int, NodeInfo] = {}
        self.classes: dict[str, StorageClass] = {}  # the ones operators made; not the default
        self.elections: list[dict] = []  # the last limits.elections_kept_max masters chosen, oldest first
        self.consumer_groups: dict[str, ConsumerGroup] = {}  # consumer group name -> its settings
        # Users (secrets sealed under the cluster key: rocket/access.py) and policies, and their own version.
        self.users: dict[str, dict] = {}  # name -> {"sealed", "super", "created_ms"}
        self.policies: dict[tuple[str, str, str], dict] = {}  # (user, resource, effect) -> AclPolicy
        # Client quotas (rocket/quotas.py): entity (user:NAME, user:*, topic:NAME) -> AclQuota; under acl_version too.
        self.quotas: dict[str, dict] = {}
        self.acl_version = 0
        # Deleted topics: those whose queues are being dropped from their storage groups (the name is taken until the
        # delete finishes), and those whose groups still refuse appends to the name (name -> its groups, when it was
        # dropped): made again, or after limits.topic_tombstone_s, the groups reopen it (roles/nameserver/deletes.py).
        self.deleting: dict[str, TopicSpec] = {}
        self.tombstones: dict[str, tuple[tuple[int, ...], int]] = {}
        # The latest limits.create_requests_kept_max creates that carried a request id: id -> (kind, name), so that a
        # retry of an applied create gets its answer, not "exists".
        self.created: dict[str, tuple[str, str]] = {}
        self.class_moves: dict[str, ClassMove] = {}  # topics moving to another storage class (class_moves.py)
        self.version = 0

    # ---- the state machine ---------------------------------------------------------------------------

    def apply(self, entries, positions) -> list:
        return apply_json(entries, self._command)

    def _command(self, command: dict):
        operation = command["op"]
        result = None
        if operation == "register":
            node = NodeInfo(command["node"], command["address"], tuple(command["roles"]))
            known = self.nodes.get(node.id)
            if known is not None:
                node.state, node.health_pin, node.degraded_for = known.state, known.health_pin, known.degraded_for
            self.nodes[node.id] = node
        elif operation == "create_topic":
            name = command["name"]
            storage_class = command.get("storage_class", DEFAULT_CLASS)
            if self.created_by(command.get("request_id", ""), "topic") == name and name in self.topics:
                return self.topics[name]  # a retry: the first answer
            if name in self.topics:
                raise exists(name)
            self.check_not_deleted(name)
            invariant(name not in self.tombstones or command.get("reopened", False),
                      "a deleted topic's groups take its name again before it is made again")
            if len(self.topics) >= limits.topics_max:
                raise RocketError(Code.OVERLOADED, f"the cluster holds the maximum of {limits.topics_max} topics")
            if storage_class != DEFAULT_CLASS and storage_class not in self.classes:
                raise unknown_class(storage_class)
            self._add_groups(command["new_groups"])
            invariant(all(group in self.groups for group in command["groups"]), "a topic's groups exist")
            invariant(all(self.groups[group].storage_class == storage_class for group in command["groups"]),
                      "a topic's groups are of its storage class")
            queue_groups = tuple(command.get("queue_groups", ()))
            invariant(not queue_groups or len(queue_groups) == command["queues"], "one group per queue")
            self.topics[name] = TopicSpec(name, command["queues"], command["created_ms"], tuple(command["groups"]),
                                          command.get("message_type", "normal"),
                                          retention_s=command.get("retention_s", -1.0),
                                          local_retention_s=command.get("local_retention_s", -1.0),
                                          history=command.get("history", 1),
                                          ttl_ms=command.get("ttl_ms", 0), queue_groups=queue_groups,
                                          storage_class=storage_class,
                                          read_replicas=command.get("read_replicas", 0))
            self.tombstones.pop(name, None)
            self._remember(command.get("request_id", ""), "topic", name)
        elif operation == "create_groups":  # more storage nodes joined: more groups for new queues
            self._add_groups(command["new_groups"])
        elif operation == "delete_topic":  # a KV bucket, whose keys were deleted first
            self.topic(command["name"])
            del self.topics[command["name"]]
        elif operation == "drop_topic":  # the name stays taken while its groups drop its queues
            self._not_moving(command["name"], "deleted")
            self.deleting[command["name"]] = self.topic(command["name"])
            del self.topics[command["name"]]
        elif operation == "topic_dropped":
            spec = self.deleting.pop(command["name"], None)
            if spec is not None:
                self.tombstones[spec.name] = (tuple(sorted({spec.group_of(queue) for queue in range(spec.queues)})),
                                              command["dropped_ms"])
        elif operation == "tombstone_cleared":
            self.tombstones.pop(command["name"], None)
        elif operation == "update_topic":
            spec = self.topic(command["name"])
            self.topics[spec.name] = dataclasses.replace(
                spec, retention_s=command["retention_s"], local_retention_s=command["local_retention_s"],
                read_replicas=command.get("read_replicas", spec.read_replicas))
        elif operation == "add_queues":
            spec = self.topic(command["name"])
            self._not_moving(spec.name, "given queues")
            if spec.queues != command["from_queues"]:
                raise RocketError(Code.UNAVAILABLE, f"topic {spec.name!r} has {spec.queues} queues now, not "
                                  f"{command['from_queues']}; retry")
            invariant(all(group in self.groups and self.groups[group].storage_class == spec.storage_class
                          for group in command["queue_groups"]), "new queues' groups exist, of the topic's class")
            queue_groups = tuple(spec.group_of(queue) for queue in range(spec.queues)) + tuple(command["queue_groups"])
            self.topics[spec.name] = dataclasses.replace(
                spec, queues=len(queue_groups), queue_groups=queue_groups,
                groups=tuple(sorted(set(spec.groups) | set(command["queue_groups"]))))
        elif operation in ("class_move_start", "class_move_switch", "class_move_done"):
            result = self._class_move(command)
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
            if members is None or members.learners or command["add"] in self.members_of(command["group"]):
                raise RocketError(Code.UNAVAILABLE, f"group {command['group']} cannot start that move now")
            self.groups[command["group"]] = dataclasses.replace(members, learners=(command["add"],),
                                                                leaving=command["remove"])
        elif operation == "move_done":
            members = self.groups.get(command["group"])
            if members is None or not members.learners:
                raise RocketError(Code.UNAVAILABLE, f"group {command['group']} has no move to finish")
            if members.control is not None and members.leaving in members.control.sync_state_set:
                raise RocketError(Code.UNAVAILABLE, f"node {members.leaving} is still in group {command['group']}'s "
                                  "SyncStateSet; retry")
            voters = tuple(sorted((set(members.voters) - {members.leaving}) | set(members.learners)))
            self.groups[command["group"]] = dataclasses.replace(members, voters=voters, learners=(), leaving=0)
        elif operation == "reader_add":
            members = self.groups.get(command["group"])
            if members is None or command["node"] in self.members_of(command["group"]):
                raise RocketError(Code.UNAVAILABLE, f"group {command['group']} cannot take node {command['node']} "
                                  "as a read replica now")
            self.groups[command["group"]] = dataclasses.replace(members, readers=members.readers + (command["node"],))
        elif operation == "reader_remove":
            members = self.groups.get(command["group"])
            if members is not None:
                self.groups[command["group"]] = dataclasses.replace(
                    members, readers=tuple(node for node in members.readers if node != command["node"]))
        elif operation == "create_class":
            result = self._create_class(command)
        elif operation == "elect_master":
            result = self._elect_master(command)
        elif operation == "alter_sync_state_set":
            result = self._alter_sync_state_set(command)
        elif operation == "mirror_control":
            self._mirror_control(command)
        elif operation == "create_consumer_group":
            result = self._create_consumer_group(command)
        elif operation == "update_consumer_group":
            result = self._update_consumer_group(command)
        elif operation == "delete_consumer_group":
            self.consumer_groups.pop(command["group"], None)
        elif operation in ("create_user", "delete_user", "grant", "revoke", "set_quota", "delete_quota"):
            result = self._acl(command)
        else:
            invariant(False, f"unknown metadata command {operation!r}")
        self.version += 1
        if operation in ("create_topic", "update_topic", "add_queues", "class_move_start"):
            return self.topics[command["name"]]
        return result

    def _not_moving(self, name: str, what: str) -> None:
        move = self.class_moves.get(name)
        if move is not None:
            raise RocketError(Code.UNAVAILABLE, f"topic {name!r} is moving to storage class {move.storage_class!r}; "
                              f"it can be {what} once it moved")

    def _class_move(self, command: dict) -> None:
        """A topic's move to another storage class: start (its queues placed on the class's groups), switch (its
        queues are there from now on) and done (the old groups dropped them)."""
        operation, name = command["op"], command["name"]
        move = self.class_moves.get(name)
        if operation == "class_move_start":
            spec = self.topic(name)
            storage_class = command["storage_class"]
            if move is not None:
                if move.storage_class != storage_class:
                    self._not_moving(name, "moved elsewhere")
                return
            if storage_class != DEFAULT_CLASS and storage_class not in self.classes:
                raise unknown_class(storage_class)
            if spec.storage_class == storage_class:
                return
            if spec.message_type not in MOVABLE_TYPES or name.startswith(KV_PREFIX):
                raise RocketError(Code.BAD_REQUEST, f"topic {name!r} is a {spec.message_type} topic: only "
                                  f"{' and '.join(MOVABLE_TYPES)} topics move between storage classes (the others' "
                                  "pending messages wait in their storage groups)")
            queue_groups = tuple(command["queue_groups"])
            invariant(len(queue_groups) == spec.queues and all(
                group in self.groups and self.groups[group].storage_class == storage_class for group in queue_groups),
                "a moving topic's queues are placed on groups of its new class, one each")
            for queue, group in enumerate(queue_groups):
                shared = set(self.members_of(group)) & set(self.members_of(spec.group_of(queue)))
                if shared:
                    raise RocketError(Code.BAD_REQUEST, f"topic {name!r}, queue {queue}: its new group {group} has a "
                                      f"replica on node {min(shared)}, which holds the queue already (group "
                                      f"{spec.group_of(queue)}); a node keeps one copy of a queue, so a topic moves "
                                      "to groups on other nodes")
            self.class_moves[name] = ClassMove(storage_class, queue_groups,
                                               tuple(spec.group_of(queue) for queue in range(spec.queues)))
        elif operation == "class_move_switch":
            if move is None or move.switched:
                return
            spec = self.topic(name)
            self.topics[name] = dataclasses.replace(spec, storage_class=move.storage_class,
                                                    queue_groups=move.queue_groups,
                                                    groups=tuple(sorted(set(move.queue_groups))))
            move.switched = True
        else:
            invariant(move is None or move.switched, "a topic's move is done only once its queues switched")
            self.class_moves.pop(name, None)

    def created_by(self, request_id: str, kind: str) -> str | None:
        """The name a create with this request id made, if it was applied (and is remembered)."""
        found = self.created.get(request_id) if request_id else None
        return found[1] if found is not None and found[0] == kind else None

    def _remember(self, request_id: str, kind: str, name: str) -> None:
        if request_id:
            self.created[request_id] = (kind, name)
            while len(self.created) > limits.create_requests_kept_max:
                del self.created[next(iter(self.created))]

    def check_not_deleted(self, name: str) -> None:
        if name in self.deleting:
            raise RocketError(Code.UNAVAILABLE, f"topic {name!r} is being deleted; make it again once that is done")

    # ---- users and policies -------------------------------------------------------------------------

    def _acl(self, command: dict):
        operation = command["op"]
        if operation == "create_user":
            name = command["user"]
            if name in self.users:
                raise RocketError(Code.BAD_REQUEST, f"user {name!r} exists: delete it first to change its secret")
            if len(self.users) >= limits.users_max:
                raise RocketError(Code.OVERLOADED, f"the cluster holds the maximum of {limits.users_max} users")
            self.users[name] = {"sealed": command["sealed"], "super": command["super"],
                                "created_ms": command["created_ms"]}
        elif operation == "delete_user":
            self.user(command["user"])
            del self.users[command["user"]]
            self.policies = {key: policy for key, policy in self.policies.items() if key[0] != command["user"]}
        elif operation == "grant":
            policy = command["policy"]
            self.user(policy["user"])
            key = (policy["user"], policy["resource"], policy["effect"])
            if key not in self.policies and len(self.policies) >= limits.policies_max:
                raise RocketError(Code.OVERLOADED, f"the cluster holds the maximum of {limits.policies_max} policies")
            self.policies[key] = policy
        elif operation == "set_quota":
            quota = command["quota"]
            if quota["entity"] not in self.quotas and len(self.quotas) >= limits.quotas_max:
                raise RocketError(Code.OVERLOADED, f"the cluster holds the maximum of {limits.quotas_max} quotas")
            self.quotas[quota["entity"]] = quota
        elif operation == "delete_quota":
            if self.quotas.pop(command["entity"], None) is None:
                raise RocketError(Code.NOT_FOUND, f"no quota on {command['entity']}")
        else:  # revoke: the user's policies on the resource, of the effect if one is named
            removed = [key for key in self.policies if key[:2] == (command["user"], command["resource"])
                       and command["effect"] in ("", key[2])]
            if not removed:
                raise RocketError(Code.NOT_FOUND, f"user {command['user']!r} has no policy on {command['resource']}")
            for key in removed:
                del self.policies[key]
        self.acl_version += 1

    def user(self, name: str) -> dict:
        found = self.users.get(name)
        if found is None:
            raise RocketError(Code.NOT_FOUND, f"no user {name!r}")
        return found

    # ---- storage classes and the controller (RIP-44) -------------------------------------------------

    def _create_class(self, command: dict) -> StorageClass:
        """A class and its groups; a controller-mode group starts with its first voter as master and every replica
        in sync (they are all empty)."""
        name = command["name"]
        if self.created_by(command.get("request_id", ""), "class") == name and name in self.classes:
            return self.classes[name]  # a retry: the first answer
        if name == DEFAULT_CLASS or name in self.classes:
            raise class_exists(name)
        if len(self.classes) >= limits.storage_classes_max:
            raise RocketError(Code.OVERLOADED, f"the cluster holds the maximum of {limits.storage_classes_max} "
                              "storage classes")
        invariant(command["mode"] in STORAGE_MODES, "a known storage mode")
        invariant(all(len(group["voters"]) == command["replicas"] for group in command["new_groups"]),
                  "a class's groups have its replicas")
        storage_class = StorageClass(name, command["mode"], command["replicas"], command["min_in_sync_replicas"],
                                     command["unclean_election"], float(command["ha_max_lag_s"]))
        self._add_groups(command["new_groups"], name, controlled=storage_class.mode == "controller")
        self.classes[name] = storage_class
        self._remember(command.get("request_id", ""), "class", name)
        return storage_class

    # ---- consumer groups' settings --------------------------------------------------------------------

    def _create_consumer_group(self, command: dict) -> ConsumerGroup:
        name = check_group_name(command["group"])
        settings = check_consumer_group(command["settings"])
        if name in self.consumer_groups:
            raise group_exists(name)
        if len(self.consumer_groups) >= limits.consumer_groups_max:
            raise RocketError(Code.OVERLOADED, f"the cluster holds the maximum of {limits.consumer_groups_max} "
                              "consumer groups with settings")
        self.consumer_groups[name] = made = ConsumerGroup(name, **settings)
        return made

    def _update_consumer_group(self, command: dict) -> ConsumerGroup:
        """Only the settings given change."""
        name = command["group"]
        settings = check_consumer_group(command["settings"])
        known = self.consumer_groups.get(name)
        if known is None:
            raise unknown_group(name)
        self.consumer_groups[name] = updated = dataclasses.replace(known, **settings)
        return updated

    def consumer_group(self, name: str) -> ConsumerGroup:
        found = self.consumer_groups.get(name)
        if found is None:
            raise unknown_group(name)
        return found

    def control(self, group: int) -> tuple[Members, Control]:
        members = self.groups.get(group)
        if members is None:
            raise RocketError(Code.BAD_REQUEST, f"storage group {group} does not exist")
        if members.control is None:
            raise RocketError(Code.BAD_REQUEST, f"storage group {group} is not in controller mode")
        return members, members.control

    def _elect_master(self, command: dict) -> dict:
        members, control = self.control(command["group"])
        elected, record = elect(command, members.electable(), control)
        self.groups[command["group"]] = dataclasses.replace(members, control=elected)
        self.elections.append(record)
        del self.elections[:-limits.elections_kept_max]
        return elected.to_wire()

    def _alter_sync_state_set(self, command: dict) -> dict:
        members, control = self.control(command["group"])
        altered = alter(command, members.electable(), control, members.leaving)
        self.groups[command["group"]] = dataclasses.replace(members, control=altered)
        return altered.to_wire()

    def _mirror_control(self, command: dict) -> None:
        """A standalone controller's word on its groups (roles/controller/remote.py), kept here for routes and status
        where it is newer than what the metadata holds; and its last elections."""
        for word in command["groups"]:
            members = self.groups.get(word["group"])
            if members is None or members.control is None:
                continue
            mirrored = Control(word["master"], word["master_epoch"], tuple(sorted(word["sync_state_set"])),
                               word["sync_state_set_epoch"])
            if (mirrored.master_epoch, mirrored.sync_state_set_epoch) > (members.control.master_epoch,
                                                                        members.control.sync_state_set_epoch):
                self.groups[word["group"]] = dataclasses.replace(members, control=mirrored)
        self.elections = list(command["elections"])[-limits.elections_kept_max:]

    def control_of(self, group: int) -> tuple[tuple[int, ...], Control]:
        members, control = self.control(group)
        return members.electable(), control

    def controlled(self) -> list[tuple[int, tuple[int, ...], Control]]:
        """Each controller-mode group, with the replicas it may elect or keep in sync, and the controller's word."""
        return [(group, members.electable(), members.control) for group, members in self.groups.items()
                if members.control is not None]

    def unclean(self, group: int) -> bool:
        """Whether the group's class allows an unclean election."""
        storage_class = self.groups[group].storage_class
        return storage_class in self.classes and self.classes[storage_class].unclean_election

    def snapshot(self) -> list[bytes]:
        return [orjson.dumps({
            "version": self.version,
            "topics": [[s.name, s.queues, s.created_ms, list(s.groups), s.message_type, s.retention_s,
                        s.local_retention_s, s.history, s.ttl_ms, list(s.queue_groups), s.storage_class,
                        s.read_replicas]
                       for s in self.topics.values()],
            "groups": [[group, list(m.voters), list(m.learners), m.leaving, m.storage_class,
                        None if m.control is None else [m.control.master, m.control.master_epoch,
                                                        list(m.control.sync_state_set), m.control.sync_state_set_epoch],
                        list(m.readers)]
                       for group, m in self.groups.items()],
            "nodes": [dataclasses.asdict(node) for node in self.nodes.values()],
            "classes": [dataclasses.asdict(storage_class) for storage_class in self.classes.values()],
            "elections": self.elections,
            "consumer_groups": [group.to_wire() for group in self.consumer_groups.values()],
            "users": self.users,
            "policies": list(self.policies.values()),
            "acl_version": self.acl_version,
            "quotas": list(self.quotas.values()),
            "deleting_specs": [[s.name, s.queues, s.created_ms, list(s.groups), list(s.queue_groups), s.storage_class]
                               for s in self.deleting.values()],
            "tombstones": [[name, list(groups), dropped_ms] for name, (groups, dropped_ms) in self.tombstones.items()],
            "created": [[request_id, kind, name] for request_id, (kind, name) in self.created.items()],
            "class_moves": [[name, move.storage_class, list(move.queue_groups), list(move.old_groups), move.switched]
                            for name, move in self.class_moves.items()],
        })]

    def restore(self, chunks: Iterable[bytes]) -> None:
        data = b"".join(chunks)
        if not data:
            return
        state = orjson.loads(data)
        self.version = state["version"]
        # Snapshots written before a field was added lack it: it takes its default.
        self.topics = {name: TopicSpec(name, queues, created, tuple(groups), *rest[:5],
                                       queue_groups=tuple(rest[5]) if len(rest) > 5 else (),
                                       storage_class=rest[6] if len(rest) > 6 else DEFAULT_CLASS,
                                       read_replicas=rest[7] if len(rest) > 7 else 0)
                       for name, queues, created, groups, *rest in state["topics"]}
        self.groups = {group: Members(tuple(voters), tuple(learners), leaving, rest[0] if rest else DEFAULT_CLASS,
                                      Control(rest[1][0], rest[1][1], tuple(rest[1][2]), rest[1][3])
                                      if len(rest) > 1 and rest[1] is not None else None,
                                      tuple(rest[2]) if len(rest) > 2 else ())
                       for group, voters, learners, leaving, *rest in state["groups"]}
        self.classes = {entry["name"]: StorageClass(**entry) for entry in state.get("classes", ())}
        self.elections = list(state.get("elections", ()))
        self.consumer_groups = {entry["group"]: ConsumerGroup(entry["group"], entry["max_attempts"],
                                                              tuple(entry["retry_backoff_s"]), entry["consume_mode"],
                                                              entry["fifo"])
                                for entry in state.get("consumer_groups", ())}  # snapshots before settings had none
        self.users = state.get("users", {})  # snapshots before users had none
        self.policies = {(policy["user"], policy["resource"], policy["effect"]): policy
                         for policy in state.get("policies", ())}
        self.quotas = {quota["entity"]: quota for quota in state.get("quotas", ())}  # snapshots before quotas had none
        self.acl_version = state.get("acl_version", 0)
        self.deleting = {name: TopicSpec(name, queues, created, tuple(groups), queue_groups=tuple(queue_groups),
                                         storage_class=storage_class)
                         for name, queues, created, groups, queue_groups, storage_class
                         in state.get("deleting_specs", ())}
        self.tombstones = {name: (tuple(groups), dropped_ms)
                           for name, groups, dropped_ms in state.get("tombstones", ())}
        self.created = {request_id: (kind, name) for request_id, kind, name in state.get("created", ())}
        self.class_moves = {name: ClassMove(storage_class, tuple(queue_groups), tuple(old_groups), switched)
                            for name, storage_class, queue_groups, old_groups, switched
                            in state.get("class_moves", ())}
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

    def _add_groups(self, new_groups: list[dict], storage_class: str = DEFAULT_CLASS, controlled: bool = False) -> None:
        for group in new_groups:
            if group["id"] in self.groups:
                raise RocketError(Code.UNAVAILABLE, f"storage group {group['id']} exists already; retry")
        for group in new_groups:
            voters = tuple(group["voters"])
            control = Control(voters[0], 1, tuple(sorted(voters)), 1) if controlled else None
            self.groups[group["id"]] = Members(voters, storage_class=storage_class, control=control)

    def storage_nodes(self) -> list[NodeInfo]:
        return [node for node in self.nodes.values() if "storage" in node.roles]

    def next_group_id(self) -> int:
        return max(self.groups, default=FIRST_STORAGE_GROUP - 1) + 1

    def addresses(self, nodes) -> list[NodeAddress]:
        return [NodeAddress(node, self.nodes[node].address) for node in sorted(nodes) if node in self.nodes]

    def route(self, name: str, leaders: dict[int, int]) -> Route:
        """Everything a broker needs to reach a topic's queues: queue -> group -> voters -> addresses."""
        spec = self.topic(name)
        groups = sorted(set(spec.queue_groups or spec.groups))
        members = {node for group in groups for node in self.members_of(group)}
        return Route(self.version, topic_info(spec), [spec.group_of(queue) for queue in range(spec.queues)],
                     [self.group_info(group, leaders) for group in groups], self.addresses(members))

    def members_of(self, group: int) -> tuple[int, ...]:
        members = self.groups[group]
        return members.voters + members.learners + members.readers

    def readers_wanted(self) -> dict[int, int]:
        """The read replicas each group with any should keep: the most any topic with a queue in it asks for."""
        wanted: dict[int, int] = {}
        for spec in self.topics.values():
            if spec.read_replicas:
                for group in set(spec.queue_groups or spec.groups):
                    wanted[group] = max(wanted.get(group, 0), spec.read_replicas)
        return wanted

    def replicas(self, node: int) -> int:
        return sum(node in self.members_of(group) for group in self.groups)

    def leader_of(self, group: int, leaders: dict[int, int]) -> int:
        """A controller-mode group's master (the controller's choice), else the node that reported leading it (in
        leaders), or 0. A group being placed is not in the metadata yet: it is a Raft group."""
        members = self.groups.get(group)
        return members.control.master if members is not None and members.control else leaders.get(group, 0)

    def group_info(self, group: int, leaders: dict[int, int], lagging: list[ReplicaLag] | None = None) -> GroupInfo:
        members = self.groups[group]
        info = GroupInfo(group, list(members.voters), list(members.learners + members.readers),
                         self.leader_of(group, leaders), lagging or [], members.storage_class,
                         readers=list(members.readers))
        control = members.control
        if control is not None:
            storage_class = self.classes[members.storage_class]
            info.mode, info.master, info.master_epoch = "controller", control.master, control.master_epoch
            info.sync_state_set, info.sync_state_set_epoch = list(control.sync_state_set), control.sync_state_set_epoch
            info.min_in_sync_replicas = storage_class.min_in_sync_replicas
            info.ha_max_lag_s, info.unclean_election = storage_class.ha_max_lag_s, storage_class.unclean_election
        return info

    def class_groups(self, name: str) -> list[int]:
        """The groups of a storage class (BAD_REQUEST if there is no such class): where its topics' queues go."""
        if name != DEFAULT_CLASS and name not in self.classes:
            raise unknown_class(name)
        return sorted(group for group, members in self.groups.items() if members.storage_class == name)

    def raft_groups(self) -> list[int]:
        """The default class's groups: the pool the nameservers grow as storage nodes join."""
        return self.class_groups(DEFAULT_CLASS)

    def storage_classes(self, replication: int) -> list[StorageClass]:
        """Every class, the default first: it is not stored, and its replicas are the config's replication."""
        default = StorageClass(DEFAULT_CLASS, "raft", replication)
        return [default] + [self.classes[name] for name in sorted(self.classes)]

    def describe_class(self, storage_class: StorageClass, leaders: dict[int, int], elections: bool) -> dict:
        """A class with its groups' info and, if asked, the elections kept of its groups."""
        groups = self.class_groups(storage_class.name)
        members = set(groups)
        return {**dataclasses.asdict(storage_class), "groups": [self.group_info(group, leaders) for group in groups],
                "elections": [entry for entry in self.elections if entry["group"] in members] if elections else []}

    def assignment(self, node: int) -> Assignment:
        """The storage groups a node hosts, with the addresses of their members."""
        groups = [group for group in self.groups if node in self.members_of(group)]
        members = {member for group in groups for member in self.members_of(group)}
        return Assignment(self.version, [self.group_info(group, {}) for group in groups], self.addresses(members))
