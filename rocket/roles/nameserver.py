"""The nameserver role: the cluster metadata on the nameservers' Raft group, served to brokers and
storage nodes. Writes run on the group's leader (other nameservers forward them); routes are served
by any nameserver from its applied state. The leader alone tracks liveness and load from the nodes'
heartbeats, in memory: a new leader learns them again within a heartbeat.
"""

from __future__ import annotations

import logging
import time

import orjson
import trio

from rocket import limits
from rocket.config import NodeConfig
from rocket.errors import Code, RocketError
from rocket.ml.placement import LeastLoaded, NodeLoad, Placement
from rocket.model import check_topic_name
from rocket.raft.host import RaftHost
from rocket.roles.metadata import META_GROUP, Metadata
from rocket.roles.peers import RETRYABLE, Peers
from rocket.transport.rpc import Dispatcher

log = logging.getLogger("rocket.nameserver")


class Nameserver:
    def __init__(self, config: NodeConfig, host: RaftHost, peers: Peers, placement: Placement | None = None):
        self.config = config
        self.host = host
        self.peers = peers
        self.placement = placement or LeastLoaded()
        self.members = config.nameserver_members()
        self.metadata = Metadata()
        host.add_group(META_GROUP, tuple(self.members), self.metadata)
        self._heartbeats: dict[int, tuple[float, dict]] = {}  # node -> (when, load): on the leader only
        self._leaders: dict[int, int] = {}  # storage group -> the node that last reported leading it
        self._creating = trio.Lock()  # topic creations are placed one at a time

    def register(self, dispatcher: Dispatcher) -> None:
        dispatcher.handle("NodeHeartbeat", self.node_heartbeat)
        dispatcher.handle("GetRoute", self.get_route)
        dispatcher.handle("MetaCreateTopic", self.create_topic)
        dispatcher.handle("MetaListTopics", self.list_topics)
        dispatcher.handle("ClusterStatus", self.cluster_status)

    def leads(self) -> bool:
        return self.host.leader_of(META_GROUP) == self.config.node_id

    async def _on_leader(self, method: str, request: dict, here):
        """Run here when this node leads the metadata group, else forward the call to the leader."""
        with trio.move_on_after(limits.leader_wait_s_max):
            while True:
                leader = self.host.leader_of(META_GROUP)
                if leader == self.config.node_id:
                    return await here(request)
                if leader in self.members:
                    try:
                        return await self.peers.call(self.members[leader], method, request)
                    except RocketError as error:
                        if error.code not in RETRYABLE:
                            raise
                await trio.sleep(limits.leader_poll_s)  # an election is on, or the leader just failed
        raise RocketError(Code.UNAVAILABLE, f"the nameservers have no leader after {limits.leader_wait_s_max} s")

    async def _propose(self, command: dict):
        return await self.host.propose(META_GROUP, orjson.dumps(command))

    # ---- nodes ---------------------------------------------------------------------------------------

    async def node_heartbeat(self, request: dict) -> dict:
        return await self._on_leader("NodeHeartbeat", request, self._heartbeat_here)

    async def _heartbeat_here(self, request: dict) -> dict:
        node = request["node"]
        known = self.metadata.nodes.get(node)
        if known is None or known.address != request["address"] or list(known.roles) != list(request["roles"]):
            await self._propose({"op": "register", "node": node, "address": request["address"],
                                 "roles": list(request["roles"])})
        self._heartbeats[node] = (trio.current_time(), request["load"])
        for group in request["load"]["leads"]:
            self._leaders[group] = node
        return self.metadata.assignment(node)

    def _node_state(self, node: int) -> tuple[str, int]:
        """(up | suspect | down | unknown, heartbeat age in ms or -1), as this leader has seen it."""
        heard = self._heartbeats.get(node)
        if heard is None:
            return "unknown", -1
        age_s = trio.current_time() - heard[0]
        state = "up" if age_s < limits.node_suspect_s else "suspect" if age_s < limits.node_down_s else "down"
        return state, int(age_s * 1000)

    def _loads(self) -> list[NodeLoad]:
        loads = []
        for node in self.metadata.storage_nodes():
            load = self._heartbeats.get(node.id, (0, {}))[1]
            loads.append(NodeLoad(node.id, sum(node.id in voters for voters in self.metadata.groups.values()),
                                  len(load.get("leads", ())), load.get("bytes", 0), load.get("free_disk_bytes", 0),
                                  self._node_state(node.id)[0] == "up" and node.state == "up"))
        return loads

    # ---- topics and routes ---------------------------------------------------------------------------

    async def create_topic(self, request: dict) -> dict:
        check_topic_name(request["topic"])
        if not 1 <= request["queues"] <= limits.queues_per_topic_max:
            raise RocketError(Code.BAD_REQUEST, f"queues must be 1..{limits.queues_per_topic_max}, "
                              f"got {request['queues']}")
        return await self._on_leader("MetaCreateTopic", request, self._create_topic_here)

    async def _create_topic_here(self, request: dict) -> dict:
        name = request["topic"]
        async with self._creating:
            if name in self.metadata.topics:
                raise RocketError(Code.TOPIC_EXISTS, f"topic {name!r} already exists")
            pool = sorted(self.metadata.groups)
            new_groups = []
            missing = self.config.storage_groups - len(pool)
            if missing > 0:
                loads = self._loads()
                available = sum(load.available for load in loads)
                if not available:
                    raise RocketError(Code.UNAVAILABLE, "no storage node is up yet; retry")
                replicas = min(self.config.replication, available)
                if replicas < self.config.replication:
                    log.warning("placing %d storage groups on %d replicas: only %d storage nodes are up", missing,
                                replicas, available)
                first = self.metadata.next_group_id()
                placed = self.placement.place(missing, replicas, loads)
                new_groups = [{"id": first + i, "voters": list(voters)} for i, voters in enumerate(placed)]
            command = {"op": "create_topic", "name": name, "queues": request["queues"],
                       "created_ms": int(time.time() * 1000), "new_groups": new_groups,
                       "groups": pool + [group["id"] for group in new_groups]}
            await self._propose(command)
        return self.metadata.topic(name).to_wire()

    async def list_topics(self, request: dict) -> dict:
        return {"topics": [self.metadata.topics[name].to_wire() for name in sorted(self.metadata.topics)]}

    async def get_route(self, request: dict) -> dict:
        """From this nameserver's state; a topic it does not know yet is looked up on the leader."""
        if request["topic"] in self.metadata.topics or self.leads():
            return self.metadata.route(request["topic"], self._leaders)
        return await self._on_leader("GetRoute", request, self._route_here)

    async def _route_here(self, request: dict) -> dict:
        return self.metadata.route(request["topic"], self._leaders)

    # ---- status --------------------------------------------------------------------------------------

    async def cluster_status(self, request: dict) -> dict:
        return await self._on_leader("ClusterStatus", request, self._status_here)

    async def _status_here(self, request: dict) -> dict:
        nodes = []
        for node in sorted(self.metadata.nodes.values(), key=lambda node: node.id):
            liveness, age_ms = self._node_state(node.id)
            load = self._heartbeats.get(node.id, (0, {"groups": 0, "leads": [], "bytes": 0, "free_disk_bytes": 0}))[1]
            nodes.append({"id": node.id, "address": node.address, "roles": list(node.roles),
                          "state": liveness if node.state == "up" else node.state, "heartbeat_age_ms": age_ms,
                          "load": load})
        return {
            "version": self.metadata.version,
            "nameserver_leader": self.host.leader_of(META_GROUP),
            "nameservers": sorted(self.members),
            "nodes": nodes,
            "groups": [self.metadata.group_info(group, self._leaders) for group in sorted(self.metadata.groups)],
            "topics": len(self.metadata.topics),
        }
