"""Unhealthy storage nodes (issue 31). A mixin of Nameserver.

The leader keeps, per storage node, the cumulative fsync histogram and peer-call counts its heartbeats carry. Every
`health_window_s` it takes the differences since the window began (a node's fsync p99; the calls the other nodes
made to it, and how many failed), has the scorer judge each node against its peers, and HealthJudge turn verdicts
into healthy or degraded (rocket.ml.health). Pins are in the metadata, so every leader honours them. A degraded node
leads nothing (QueuePlacement._balance_leaders moves its leaderships off) and gets nothing new.
"""

from __future__ import annotations

import logging

import trio

from rocket import limits
from rocket.errors import Code, RocketError
from rocket.ml.health import AUTO, DEGRADED, PINS, HealthJudge, NodeWindow, Scorer, ThresholdScorer
from rocket.telemetry.registry import FSYNC_BUCKETS, bucket_quantile

log = logging.getLogger("rocket.nameserver")


def fsync_window(before: list[int], after: list[int]) -> tuple[float | None, int]:
    """(p99 in seconds or None, fsyncs) of a window, from the cumulative bucket counts at its ends; None too when
    the counts went back (the node restarted) or there were too few fsyncs to say."""
    if len(after) != len(FSYNC_BUCKETS) or len(before) not in (0, len(after)):
        return None, 0
    increases = [now - then for now, then in zip(after, before or [0] * len(after))]
    if any(increase < 0 for increase in increases):
        return None, 0
    fsyncs = increases[-1]
    if fsyncs < limits.health_fsyncs_min:
        return None, fsyncs
    return bucket_quantile(0.99, list(FSYNC_BUCKETS), increases), fsyncs


def node_windows(before: dict[int, dict], after: dict[int, dict], addresses: dict[str, int]) -> list[NodeWindow]:
    """Every node of after, its window since before (node -> heartbeat load, with fsync_buckets and peer_calls):
    its fsync p99, and the calls the other nodes made to it (by its address) that ended and failed."""
    calls = {node: [0, 0] for node in after}
    for reporter, load in after.items():
        if reporter not in before:
            continue  # its counts began within the window, or before it: no difference to take
        earlier = {entry["peer"]: entry for entry in before[reporter].get("peer_calls", ())}
        for entry in load.get("peer_calls", ()):
            target = addresses.get(entry["peer"])
            then = earlier.get(entry["peer"], {"calls": 0, "errors": 0})
            ended, failed = entry["calls"] - then["calls"], entry["errors"] - then["errors"]
            if target in calls and target != reporter and ended >= 0 and failed >= 0:
                calls[target][0] += ended
                calls[target][1] += failed
    windows = []
    for node, load in sorted(after.items()):
        earlier = before.get(node)
        p99_s, fsyncs = (fsync_window(earlier.get("fsync_buckets", []), load.get("fsync_buckets", []))
                         if earlier is not None else (None, 0))
        windows.append(NodeWindow(node, p99_s, fsyncs, calls[node][0], calls[node][1]))
    return windows


class NodeHealthChecks:
    def _init_health(self, scorer: Scorer | None = None) -> None:
        self.scorer: Scorer = scorer or ThresholdScorer()
        self.judge = HealthJudge()
        self._window_began: float | None = None  # trio time; None: no window yet on this leader
        self._window_counts: dict[int, dict] = {}  # node -> its counts when the window began
        self.windows: dict[int, NodeWindow] = {}  # the last window judged, per node
        self.windows_judged = 0

    def degraded(self) -> set[int]:
        """The storage nodes to lead nothing and get nothing new: the judge's, and the ones pinned degraded (so
        that a pin acts at once, not at the next window)."""
        pinned = {node.id for node in self.metadata.nodes.values() if node.health_pin == DEGRADED}
        unpinned = {node.id for node in self.metadata.nodes.values() if node.health_pin != AUTO}
        return pinned | (self.judge.degraded() - unpinned)

    def _counts_now(self) -> dict[int, dict]:
        storage = {node.id for node in self.metadata.storage_nodes()}
        return {node: {"fsync_buckets": load.get("fsync_buckets", []), "peer_calls": load.get("peer_calls", [])}
                for node, (_, load) in self._heartbeats.items()
                if node in storage and self._node_state(node)[0] == "up"}

    def _judge_health(self) -> None:
        """On the leader, every heartbeat interval: close the window once health_window_s passed, and judge it."""
        now = trio.current_time()
        if self._window_began is None:
            self._window_began, self._window_counts = now, self._counts_now()
            return
        if now - self._window_began < self.config.health_window_s:
            return
        after = self._counts_now()
        addresses = {node.address: node.id for node in self.metadata.nodes.values()}
        windows = node_windows(self._window_counts, after, addresses)
        self._window_began, self._window_counts = now, after
        self.windows = {window.node: window for window in windows}
        self.windows_judged += 1
        before = self.degraded()
        verdicts = [self.scorer.score(window, windows) for window in windows]
        pins = {node.id: node.health_pin for node in self.metadata.storage_nodes()}
        judged = self.judge.judge(verdicts, sorted(pins), pins)
        for node in sorted(self.degraded() ^ before):
            report = log.warning if node in self.degraded() else log.info
            report("node %d is %s: %s", node, judged[node].state if node in judged else "healthy",
                   judged[node].reason if node in judged else "")

    def _health_of(self, node: int) -> tuple[str, str]:
        """(healthy | degraded, the reason) of a storage node, or ("", "") for other nodes."""
        info = self.metadata.nodes.get(node)
        if info is None or "storage" not in info.roles:
            return "", ""
        health = self.judge.nodes.get(node)
        if info.health_pin != AUTO:
            return info.health_pin, f"pinned {info.health_pin} by an operator"
        if health is None:
            return "healthy", "not judged yet"
        return health.state, health.reason

    # ---- the RPCs ------------------------------------------------------------------------------------

    async def node_health(self, request: dict) -> dict:
        if request["node"] and request["node"] not in self.metadata.nodes:
            raise RocketError(Code.BAD_REQUEST, f"node {request['node']} is not registered")
        return await self._on_leader("NodeHealth", request, self._node_health_here)

    async def _node_health_here(self, request: dict) -> dict:
        nodes = []
        for info in sorted(self.metadata.storage_nodes(), key=lambda info: info.id):
            if request["node"] and info.id != request["node"]:
                continue
            health = self.judge.nodes.get(info.id)
            window = self.windows.get(info.id)
            verdict = health.verdict if health is not None else None
            state, reason = self._health_of(info.id)
            nodes.append({
                "node": info.id, "state": state, "reason": reason, "pin": info.health_pin,
                "unhealthy_windows": health.unhealthy_windows if health else 0,
                "healthy_windows": health.healthy_windows if health else 0,
                "fsyncs": window.fsyncs if window else 0,
                "calls": window.calls if window else 0, "call_errors": window.call_errors if window else 0,
                "unhealthy": bool(verdict and verdict.unhealthy), "score": verdict.score if verdict else 0.0,
                "verdict": verdict.reason if verdict else "no window yet",
                "features": [{"name": name, "value": value} for name, value in (verdict.features if verdict else {}).items()]})
        return {"scorer": self.scorer.name, "window_s": self.config.health_window_s,
                "windows_judged": self.windows_judged, "degrade_windows": self.judge.degrade_windows,
                "recover_windows": self.judge.recover_windows, "nodes": nodes}

    async def pin_node_health(self, request: dict) -> dict:
        if request["pin"] not in PINS:
            raise RocketError(Code.BAD_REQUEST, f"pin must be one of {', '.join(PINS)}, got {request['pin']!r}")
        info = self.metadata.nodes.get(request["node"])
        if info is not None and "storage" not in info.roles:
            raise RocketError(Code.BAD_REQUEST, f"node {request['node']} stores nothing: only storage nodes have a "
                              "health to pin")
        return await self._on_leader("PinNodeHealth", request, self._pin_here)

    async def _pin_here(self, request: dict) -> dict:
        await self._propose({"op": "health_pin", "node": request["node"], "pin": request["pin"]})
        return {}
