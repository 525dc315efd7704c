"""Unhealthy storage nodes (issue 31): the leader judges each storage node against its peers, window by window, and
a degraded node leads nothing and gets nothing new. A part of Nameserver.
"""

from __future__ import annotations

import logging
from typing import Protocol

import trio

from rocket import limits
from rocket.clock import Clock
from rocket.config import NodeConfig
from rocket.errors import Code, RocketError
from rocket.ml.health import (AUTO, DEGRADED, KIND_NAMES, PINS, WINDOW_FIELDS, WINDOW_METRIC, HealthJudge,
                              HealthModel, ModelScorer, NodeHealth, NodeWindow, Recent, Scorer, ThresholdScorer)
from rocket.ml.trees import ModelError
from rocket.roles.nameserver.forecasts import read_model, read_training, with_training
from rocket.roles.nameserver.group import MetadataGroup
from rocket.serde.typed import (Empty, HealthFeature, NodeHealthInfo, NodeHealthRequest, NodeHealthResponse, NodeLoad,
                                PeerCalls, PinNodeHealthRequest)
from rocket.telemetry.registry import FSYNC_BUCKETS, RPC_BUCKETS, Telemetry, bucket_quantile
from rocket.tier.objectstore import ObjectStore

log = logging.getLogger("rocket.nameserver")

HEALTH_MODEL_KEY = "models/health/latest.json"


def quantile_window(before: list[int], after: list[int], bounds: tuple[float, ...], least: int,
                    quantile: float = 0.99) -> tuple[float | None, int]:
    """(the quantile in seconds or None, observations) of a window, from a histogram's cumulative bucket counts at
    its ends; None too when the counts went back (the node restarted) or there were fewer than least observations."""
    if len(after) != len(bounds) or len(before) not in (0, len(after)):
        return None, 0
    increases = [now - then for now, then in zip(after, before or [0] * len(after))]
    if any(increase < 0 for increase in increases):
        return None, 0
    if increases[-1] < least:
        return None, increases[-1]
    return bucket_quantile(quantile, list(bounds), increases), increases[-1]


def fsync_window(before: list[int], after: list[int]) -> tuple[float | None, int, float | None]:
    """A window's fsync p99, fsyncs and fsync median (from health_fsyncs_few fsyncs on). Below health_fsyncs_min
    fsyncs, from health_fsyncs_few on, the median stands for the p99 (which is at least that): a disk so slow that it
    syncs a few times a window is not hidden by its own slowness."""
    p99_s, fsyncs = quantile_window(before, after, FSYNC_BUCKETS, limits.health_fsyncs_min)
    p50_s, _ = quantile_window(before, after, FSYNC_BUCKETS, limits.health_fsyncs_few, 0.5)
    return (p50_s if p99_s is None else p99_s), fsyncs, p50_s


def node_windows(before: dict[int, NodeLoad], after: dict[int, NodeLoad], addresses: dict[str, int],
                 seconds: float = limits.health_window_s_default, at_ms: int = 0,
                 followed: dict[int, int] | None = None, judged: set[int] | None = None) -> list[NodeWindow]:
    """Every judged node of after (all of them by default), its window since before (node -> heartbeat load, with
    fsync_buckets, peer_calls, cpu_starved_s and lagging; every node of after reports its calls): its fsync p99 and
    median; the calls the other nodes made to it (by its address) that ended and failed, and the p99 and median of
    the answered ones, their histograms summed over the callers; the CPU it was denied; and how far behind its
    groups' leaders it was at the end (followed: node -> the groups it follows)."""
    judged = set(after) if judged is None else judged & set(after)
    calls = {node: [0, 0, [0] * len(RPC_BUCKETS)] for node in judged}
    lag = {node: 0 for node in judged}
    for reporter, load in after.items():
        for entry in load.lagging:
            if entry.node in lag:
                lag[entry.node] += entry.entries
        if reporter not in before:
            continue  # its counts began within the window, or before it: no difference to take
        earlier = {entry.peer: entry for entry in before[reporter].peer_calls}
        for entry in load.peer_calls:
            target = addresses.get(entry.peer)
            then = earlier.get(entry.peer) or PeerCalls(entry.peer, 0, 0)
            ended, failed = entry.calls - then.calls, entry.errors - then.errors
            if target in calls and target != reporter and ended >= 0 and failed >= 0:
                calls[target][0] += ended
                calls[target][1] += failed
                buckets, old = entry.buckets, then.buckets or [0] * len(RPC_BUCKETS)
                if len(buckets) == len(RPC_BUCKETS) == len(old) and all(a >= b for a, b in zip(buckets, old)):
                    calls[target][2] = [total + a - b for total, a, b in zip(calls[target][2], buckets, old)]
    windows = []
    for node in sorted(judged):
        load, earlier = after[node], before.get(node)
        p99_s, fsyncs, p50_s = (fsync_window(earlier.fsync_buckets, load.fsync_buckets) if earlier is not None
                                else (None, 0, None))
        call_p99_s, _ = quantile_window([], calls[node][2], RPC_BUCKETS, limits.health_calls_min)
        call_p50_s, _ = quantile_window([], calls[node][2], RPC_BUCKETS, limits.health_calls_min, 0.5)
        starved = max(0.0, load.cpu_starved_s - earlier.cpu_starved_s) if earlier is not None else 0.0
        windows.append(NodeWindow(node, p99_s, fsyncs, calls[node][0], calls[node][1], call_p99_s, starved,
                                  lag[node], (followed or {}).get(node, 0), seconds, at_ms, p50_s, call_p50_s))
    return windows


def note_windows(telemetry: Telemetry | None, windows: list[NodeWindow]) -> None:
    """Every window judged into this node's telemetry, field by field (a missing p99 left out): the health model
    trains on them (jobs/train_health.py)."""
    if telemetry is None:
        return
    for window in windows:
        labels = {"target": str(window.node)}
        for field in WINDOW_FIELDS[1:]:
            value = getattr(window, field)
            if value is not None:
                telemetry.note(window.at_ms, WINDOW_METRIC + field, labels, value)


class Nodes(Protocol):
    """What health reads of the nameserver leader's view of the nodes: each one's last heartbeat (its trio time and
    load), whether it is up, and each storage group's leader as last reported."""

    heartbeats: dict[int, tuple[float, NodeLoad]]
    leaders: dict[int, int]

    def node_state(self, node: int) -> tuple[str, int]: ...


class NodeHealthChecks:
    """Storage node health, judged on the leader. The leader keeps, per storage node, the cumulative fsync histogram
    and peer-call counts its heartbeats carry. Every `health_window_s` it takes the differences since the window
    began (node_windows), has the scorer judge each node against its peers, and HealthJudge turn verdicts into
    healthy or degraded (rocket.ml.health). Pins are in the metadata, so every leader honours them; operators pin
    nodes with `cluster health`. A degraded node leads nothing (QueuePlacement.balance_leaders moves its
    leaderships off) and gets nothing new; its replicas move away after `health_move_after_s` (Nameserver.leaving)."""

    def __init__(self, meta: MetadataGroup, config: NodeConfig, clock: Clock, objects: ObjectStore | None,
                 nodes: Nodes, scorer: Scorer | None = None):
        self.meta = meta
        self.metadata = meta.metadata
        self.config = config
        self.clock = clock
        self.objects = objects  # where the health model is (None: never a model)
        self.nodes = nodes
        self.threshold = ThresholdScorer()
        self.scorer: Scorer = scorer or self.threshold
        self.model_state = "no model"  # what `rocket cluster health` shows, with the last training's decision
        self.training = ""  # the last training's decision (forecasts.read_training)
        self._model_text: bytes | None = None
        self.judge = HealthJudge()
        self.recent = Recent()  # the judgements before this window's, for the model's recent features
        self._window_began: float | None = None  # trio time; None: no window yet on this leader
        self._window_counts: dict[int, NodeLoad] = {}  # node -> its load (its counts) when the window began
        self.windows: dict[int, NodeWindow] = {}  # the last window judged, per node
        self.windows_judged = 0
        self._degraded_since: dict[int, float] = {}  # node -> trio time it was first seen degraded, while it is
        self._model_key = config.tier_key(HEALTH_MODEL_KEY)

    def forget_window(self) -> None:
        """Leadership lost: a later term starts its windows afresh, from the metadata."""
        self._window_began = None
        self.recent = Recent()

    async def follow_model(self) -> None:
        """Score with the model in the object store while it is valid, fresh, trained on windows like this
        cluster's, and no worse than the threshold on its held-out runs; else with the threshold, saying why once."""
        self.training = await read_training(self.objects, self._model_key, "health model's training", self.training)
        readable, text = await read_model(self.objects, self._model_key, "health model")
        if not readable or (text == self._model_text and not isinstance(self.scorer, ModelScorer)):
            return  # unchanged, and refused (a model in use is checked again: it grows stale)
        if text is None:
            self._score_by(self.threshold, "no model", None)
            return
        try:
            model = HealthModel.from_json(text)
        except ModelError as error:
            self._score_by(self.threshold, f"model refused: {error}", text)
            return
        age_s = (self.clock.wall_ms() - int(model.metrics.get("trained_at_ms", 0))) / 1000
        window_s = self.config.health_window_s
        f1, threshold_f1 = model.metrics.get("f1"), model.metrics.get("threshold_f1")
        if age_s > limits.model_stale_s:
            self._score_by(self.threshold, f"model {model.version} is stale: trained {age_s / 86_400:.1f} days ago",
                           text)
        elif not 0.5 <= model.window_s / window_s <= 2.0:
            self._score_by(self.threshold, f"model {model.version} refused: trained on {model.window_s:g} s windows, "
                           f"this cluster judges {window_s:g} s ones", text)
        elif isinstance(f1, (int, float)) and isinstance(threshold_f1, (int, float)) and f1 < threshold_f1:
            self._score_by(self.threshold, f"model {model.version} refused: on held-out runs its F1 {f1:.2f} is "
                           f"below the threshold's {threshold_f1:.2f}", text)
        else:
            self._score_by(ModelScorer(model), f"model {model.version}", text)

    def _score_by(self, scorer: Scorer, state: str, text: bytes | None) -> None:
        if state != self.model_state:
            report = log.warning if "refused" in state or "stale" in state else log.info
            report("node health: %s; scoring by %s", state, scorer.name)
        self.scorer, self.model_state, self._model_text = scorer, state, text

    def degraded(self) -> set[int]:
        """The storage nodes to lead nothing and get nothing new: the judge's, and the ones pinned degraded (so
        that a pin acts at once, not at the next window)."""
        pinned = {node.id for node in self.metadata.nodes.values() if node.health_pin == DEGRADED}
        unpinned = {node.id for node in self.metadata.nodes.values() if node.health_pin != AUTO}
        return pinned | self.disk_full() | (self.judge.degraded() - unpinned if self.config.health_act else set())

    def disk_full(self) -> set[int]:
        """Storage nodes whose last heartbeat had less free disk than limits.disk_reserve_bytes: they refuse new
        data (DISK_FULL), so they lead nothing until they report room again (their replicas stay)."""
        heartbeats = self.nodes.heartbeats
        return {node.id for node in self.metadata.storage_nodes()
                if node.id in heartbeats and heartbeats[node.id][1].free_disk_bytes < limits.disk_reserve_bytes}

    def _counts_now(self) -> dict[int, NodeLoad]:
        """The last load of every node that is up, with its counts: storage nodes are judged, and every node
        (brokers call storage nodes most) reports its calls to the others. Each heartbeat brings a new load, so
        these stay as they were."""
        heartbeats = self.nodes.heartbeats
        return {node: load for node, (_, load) in heartbeats.items() if self.nodes.node_state(node)[0] == "up"}

    async def judge_window(self) -> None:
        """On the leader, every heartbeat interval: close the window once health_window_s passed, and judge it.
        A new leader starts from the degraded nodes the metadata records (its judge's runs start empty)."""
        now = trio.current_time()
        if self._window_began is None:
            self._window_began, self._window_counts = now, self._counts_now()
            self.judge.nodes = {node.id: NodeHealth(node.id, DEGRADED, DEGRADED, reason="degraded (judged by the "
                                                    f"previous leader: {KIND_NAMES.get(node.degraded_for, '?')})",
                                                    kind=node.degraded_for)
                                for node in self.metadata.storage_nodes() if node.degraded_for}
            self._degraded_since = {node: now for node in self.judge.nodes}
            return
        if now - self._window_began < self.config.health_window_s:
            return
        after = self._counts_now()
        addresses = {node.address: node.id for node in self.metadata.nodes.values()}
        followed: dict[int, int] = {}
        for group, members in self.metadata.groups.items():
            for voter in members.voters:
                if voter != self.nodes.leaders.get(group):
                    followed[voter] = followed.get(voter, 0) + 1
        storage = {node.id for node in self.metadata.storage_nodes()}
        windows = node_windows(self._window_counts, after, addresses, now - self._window_began,
                               self.clock.wall_ms(), followed, storage)
        self._window_began, self._window_counts = now, after
        self.windows = {window.node: window for window in windows}
        self.windows_judged += 1
        note_windows(self.meta.peers.telemetry, windows)
        before = self.degraded()
        earlier = self.recent.before(windows)
        verdicts = [self._score(window, windows, earlier) for window in windows]
        pins = {node.id: node.health_pin for node in self.metadata.storage_nodes()}
        judged = self.judge.judge(verdicts, sorted(pins), pins)
        now_degraded = self.degraded()
        self._degraded_since = {node: self._degraded_since.get(node, now) for node in now_degraded}
        for node in sorted(now_degraded ^ before):
            report = log.warning if node in self.degraded() else log.info
            report("node %d is %s: %s", node, judged[node].state if node in judged else "healthy",
                   judged[node].reason if node in judged else "")
        for info in self.metadata.storage_nodes():  # the judge's states into the metadata, for the next leader
            health = judged.get(info.id)
            degraded_for = (health.kind or "unknown") if health and health.automatic == DEGRADED else ""
            if degraded_for != info.degraded_for:
                await self.meta.propose({"op": "health_judged", "node": info.id, "degraded_for": degraded_for})

    def degraded_for_s(self, node: int) -> float | None:
        """How long the node has been degraded, as of the last window; None when it is not."""
        since = self._degraded_since.get(node)
        return None if since is None or node not in self.degraded() else trio.current_time() - since

    def _score(self, window: NodeWindow, windows: list[NodeWindow], earlier: tuple[list[NodeWindow], ...]):
        """The scorer's verdict; the threshold's if the model fails on this window (logged: never act on a failed
        model)."""
        if self.scorer is self.threshold:
            return self.threshold.score(window, windows)
        try:
            return self.scorer.score(window, windows, earlier)
        except (ArithmeticError, ValueError, TypeError, KeyError, IndexError) as error:
            log.warning("node health: %s failed on node %d's window (%r); the threshold judges it", self.scorer.name,
                        window.node, error)
            return self.threshold.score(window, windows)

    def health_of(self, node: int) -> tuple[str, str]:
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

    async def node_health(self, request: NodeHealthRequest) -> NodeHealthResponse:
        if request.node and request.node not in self.metadata.nodes:
            raise RocketError(Code.BAD_REQUEST, f"node {request.node} is not registered")
        return await self.meta.on_leader("NodeHealth", request, self._node_health_here)

    async def _node_health_here(self, request: NodeHealthRequest) -> NodeHealthResponse:
        nodes = []
        for info in sorted(self.metadata.storage_nodes(), key=lambda info: info.id):
            if request.node and info.id != request.node:
                continue
            health = self.judge.nodes.get(info.id)
            window = self.windows.get(info.id)
            verdict = health.verdict if health is not None else None
            state, reason = self.health_of(info.id)
            nodes.append(NodeHealthInfo(
                node=info.id, state=state, reason=reason, pin=info.health_pin,
                unhealthy_windows=health.unhealthy_windows if health else 0,
                healthy_windows=health.healthy_windows if health else 0,
                fsyncs=window.fsyncs if window else 0,
                calls=window.calls if window else 0, call_errors=window.call_errors if window else 0,
                fsync_p99_s=window.fsync_p99_s if window and window.fsync_p99_s is not None else -1.0,
                call_p99_s=window.call_p99_s if window and window.call_p99_s is not None else -1.0,
                cpu_starved_s=window.cpu_starved_s if window else 0.0,
                raft_lag_entries=window.raft_lag_entries if window else 0,
                unhealthy=bool(verdict and verdict.unhealthy), score=verdict.score if verdict else 0.0,
                verdict=verdict.reason if verdict else "no window yet",
                features=[HealthFeature(name, value) for name, value in (verdict.features if verdict else {}).items()]))
        return NodeHealthResponse(scorer=self.scorer.name, model=with_training(self.model_state, self.training),
                                  window_s=self.config.health_window_s,
                                  windows_judged=self.windows_judged, degrade_windows=self.judge.degrade_windows,
                                  recover_windows=self.judge.recover_windows, nodes=nodes)

    async def pin_node_health(self, request: PinNodeHealthRequest) -> Empty:
        if request.pin not in PINS:
            raise RocketError(Code.BAD_REQUEST, f"pin must be one of {', '.join(PINS)}, got {request.pin!r}")
        info = self.metadata.nodes.get(request.node)
        if info is not None and "storage" not in info.roles:
            raise RocketError(Code.BAD_REQUEST, f"node {request.node} stores nothing: only storage nodes have a "
                              "health to pin")
        return await self.meta.on_leader("PinNodeHealth", request, self._pin_here)

    async def _pin_here(self, request: PinNodeHealthRequest) -> Empty:
        await self.meta.propose({"op": "health_pin", "node": request.node, "pin": request.pin})
        return Empty()
