"""Calls from one role to another: over a pooled TCP channel (ChannelPool) to another node, or straight to this
node's own handler when the callee lives in the same process (dev mode runs every role in one). Nameserver
discovery: calls to the nameservers go first to the one that answered last, then to the others in turn.
"""

from __future__ import annotations

import logging

import trio

from rocket import __version__, limits
from rocket.clock import sleep_periodic
from rocket.config import NodeConfig
from rocket.errors import Code, RocketError
from rocket.model import Address
from rocket.serde.schema import SCHEMA_VERSION
from rocket.transport.pool import ChannelPool
from rocket.telemetry.registry import Telemetry
from rocket.transport.rpc import Dispatcher

log = logging.getLogger("rocket.peers")
RETRYABLE = (Code.UNAVAILABLE, Code.CONNECTION_LOST, Code.TIMEOUT)  # another node may answer instead


class Peers:
    def __init__(self, config: NodeConfig, dispatcher: Dispatcher, pool: ChannelPool):
        self.config = config
        self.address = config.address
        self.dispatcher = dispatcher
        self.pool = pool
        self.nameservers = list(config.nameserver_members().values())
        self._nameserver_at = 0  # the nameserver that answered last: asked first next time
        self.controllers = list(config.controller_members().values())  # a standalone controller group, if any
        self._controller_at = 0
        self.metadata_version = 0  # the newest metadata version a heartbeat answer carried
        self.metadata_changed = trio.Event()  # set (and replaced) when a heartbeat answer carries a newer version
        self.telemetry: Telemetry | None = None  # where calls to other nodes are timed and their errors counted

    async def call(self, address: Address, method: str, request: dict,
                   timeout_s: float = limits.request_timeout_s_default) -> dict:
        if address == self.address:
            return await self.dispatcher.local(method, request)
        if self.telemetry is None:
            return await self.pool.call(address, method, request, timeout_s)
        started = self.telemetry.clock()
        try:
            response = await self.pool.call(address, method, request, timeout_s)
        except RocketError as error:
            self.telemetry.call_failed(str(address), error.code.name)
            raise
        if not request.get("wait_ms"):  # a long poll's time is how long it waited, not the peer's speed
            self.telemetry.call_took(str(address), started)
        return response

    async def nameserver(self, method: str, request: dict, timeout_s: float = limits.request_timeout_s_default) -> dict:
        """Ask the nameservers, starting with the one that answered last; the next one on failure."""
        response, self._nameserver_at = await self._ask(self.nameservers, self._nameserver_at, "nameserver", method,
                                                        request, timeout_s)
        return response

    async def controller(self, method: str, request: dict, timeout_s: float = limits.request_timeout_s_default) -> dict:
        """Ask the standalone controllers (config controllers), as nameserver() asks the nameservers."""
        response, self._controller_at = await self._ask(self.controllers, self._controller_at, "controller", method,
                                                        request, timeout_s)
        return response

    async def _ask(self, nodes: list[Address], first: int, what: str, method: str, request: dict,
                   timeout_s: float) -> tuple[dict, int]:
        """The answer of the first of nodes (from index first on) that gives one, and its index."""
        error = RocketError(Code.UNAVAILABLE, f"no {what} is configured")
        for attempt in range(len(nodes)):
            at = (first + attempt) % len(nodes)
            try:
                return await self.call(nodes[at], method, request, timeout_s), at
            except RocketError as failure:
                if failure.code not in RETRYABLE:
                    raise
                error = failure
        raise error

    async def heartbeat(self, load: dict | None = None, assignment_version: int = -1) -> dict | None:
        """Report this node, its roles and load to the nameservers; returns its assignment (marked
        unchanged when it is still the one of assignment_version), or None (logged) when no nameserver
        answered."""
        load = dict(load or {"groups": 0, "leads": [], "bytes": 0, "free_disk_bytes": 0, "lagging": []})
        if self.telemetry is not None:  # the nameservers judge storage nodes' health from every node's counts
            load.update(self.telemetry.health_counts())
        request = {"node": self.config.node_id, "address": str(self.address), "roles": list(self.config.roles),
                   "load": load, "assignment_version": assignment_version, "version": __version__,
                   "schema_version": SCHEMA_VERSION}
        started = self.telemetry.clock() if self.telemetry is not None else 0.0
        try:
            assignment = await self.nameserver("NodeHeartbeat", request, timeout_s=limits.leader_wait_s_max + 5)
        except RocketError as error:
            log.warning("heartbeat to the nameservers failed: %s", error)
            return None
        finally:
            if self.telemetry is not None:
                self.telemetry.heartbeat_took(started)
        if assignment["version"] > self.metadata_version:
            self.metadata_version = assignment["version"]
            self.metadata_changed.set()
            self.metadata_changed = trio.Event()
        return assignment

    async def report_forever(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Heartbeats of a node that stores nothing (brokers, nameservers), so the cluster lists it."""
        task_status.started()
        while True:
            await self.heartbeat()
            await sleep_periodic(limits.node_heartbeat_s)
