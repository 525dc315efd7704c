"""The nameserver's remoting requests: routes, cluster info, the topic list. A part of RemotingGateway
(Naming).
"""

from __future__ import annotations

import hashlib

import orjson

from rocket import limits
from rocket.errors import Code, RocketError
from rocket.gateway.remoting.bridge import Bridge
from rocket.gateway.remoting.clients import Clients
from rocket.gateway.remoting.codec import Command, ResponseCode
from rocket.model import RETRY_PREFIX
from rocket.transport.guard import Caller

PERM_READ_WRITE = 6  # RocketMQ's PermName: 4 read | 2 write


class Naming:
    """Routes. rocket's brokers are stateless: any broker serves any queue. A route names ONE broker, the cluster's
    name, holding all the topic's queues, so a queue's identity (broker name, queue id), and the offsets clients
    keep by it, never change. Its address table lists every live broker: id 0, the one producers send to and
    consumers pull from, is chosen per asking connection by rendezvous hashing, which spreads clients evenly
    over brokers and gives one client the same broker at every refresh while that broker lives; when it dies, only
    its clients move. The other live brokers follow as ids 1, 2, ... for clients that fail over by id."""

    def __init__(self, bridge: Bridge, clients: Clients):
        self.bridge, self.clients = bridge, clients
        self.dispatcher, self.clock, self.cluster = bridge.dispatcher, bridge.clock, bridge.cluster
        self._brokers: tuple[float, list[str]] = (-1e9, [])  # (read at, the live brokers' addresses)

    async def _live_brokers(self, connection) -> list[str]:
        """The remoting (TCP) addresses of the brokers that are up, cached for limits.gateway_topic_cache_s; this
        node's own address when no nameserver answers."""
        at, brokers = self._brokers
        now = self.clock.now_s()
        if now - at < limits.gateway_topic_cache_s and brokers:
            return brokers
        try:
            status = await self.dispatcher.local("ClusterStatus", {})
            brokers = sorted(node["address"] for node in status["nodes"]
                             if "broker" in node["roles"] and node["state"] in ("up", "unknown"))
        except RocketError:
            brokers = []
        if not brokers and self.dispatcher.serves("Produce"):
            brokers = [connection.local]
        self._brokers = (now, brokers)
        return brokers

    async def get_route(self, command: Command, connection, caller: Caller) -> Command:
        name = command.ext["topic"]
        if name.startswith(RETRY_PREFIX):  # a consumer may ask before its first heartbeat made it
            await self.clients.ensure_retry_topic(name[len(RETRY_PREFIX):])
        try:
            topic = await self.bridge.topic(name)
        except RocketError as error:
            if error.code != Code.UNKNOWN_TOPIC:
                raise
            return command.reply(ResponseCode.TOPIC_NOT_EXIST, f"No topic route info in name server for the topic: "
                                 f"{name} (create it: rocket topic create {name})")
        brokers = _rendezvous(await self._live_brokers(connection), connection.peer)
        if not brokers:
            raise RocketError(Code.UNAVAILABLE, "no broker is up")
        route = {
            "orderTopicConf": None,
            "queueDatas": [{"brokerName": self.cluster, "readQueueNums": topic["queues"],
                            "writeQueueNums": topic["queues"], "perm": PERM_READ_WRITE, "topicSysFlag": 0}],
            "brokerDatas": [{"cluster": self.cluster, "brokerName": self.cluster,
                             "brokerAddrs": {str(index): address for index, address in enumerate(brokers)}}],
            "filterServerTable": {},
        }
        return command.reply(body=orjson.dumps(route))

    async def cluster_info(self, command: Command, connection, caller: Caller) -> Command:
        brokers = await self._live_brokers(connection)
        info = {"brokerAddrTable": {self.cluster: {"cluster": self.cluster, "brokerName": self.cluster,
                                                   "brokerAddrs": {str(index): address
                                                                   for index, address in enumerate(brokers)}}},
                "clusterAddrTable": {self.cluster: [self.cluster]}}
        return command.reply(body=orjson.dumps(info))

    async def topic_list(self, command: Command, connection, caller: Caller) -> Command:
        topics = (await self.dispatcher.local("ListTopics", {}))["topics"] if self.dispatcher.serves("ListTopics") \
            else (await self.dispatcher.local("MetaListTopics", {}))["topics"]
        names = [topic["name"] for topic in topics if topic["message_type"] != "kv"]
        return command.reply(body=orjson.dumps({"topicList": names}))


def _rendezvous(brokers: list[str], client: str) -> list[str]:
    """The brokers, ordered by their rendezvous weight for this client (highest first)."""
    def weight(address: str) -> bytes:
        return hashlib.blake2b(f"{client}|{address}".encode(), digest_size=8).digest()
    return sorted(brokers, key=weight, reverse=True)
