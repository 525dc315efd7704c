"""Queue placement by predicted load (issue 30): a new queue goes to the group with the lowest predicted load, and
leadership is balanced by the same predictions. A mixin of Nameserver.
"""

from __future__ import annotations

import collections
import logging

import trio

from rocket import limits
from rocket.errors import Code, RocketError
from rocket.ml.forecast import STEP_MS, Forecaster, ModelError
from rocket.ml.load import LoadHistory, ModelPredictor, Predictor, RecentPredictor
from rocket.ml.placement import (GroupLoad, QueueChoice, degraded_leader_transfer, leader_transfer, new_queue_load,
                                 place_queues)
from rocket.model import KV_PREFIX, Address, TopicSpec

log = logging.getLogger("rocket.nameserver")

MODEL_KEY = "models/forecast/latest.json"


class QueuePlacement:
    """Queue placement, the load history and the forecast model it follows, and leader balancing. A new queue goes to
    the group with the lowest predicted load (rocket.ml.placement.place_queues), among its topic's storage class's
    groups, and the choice is recorded in the topic's metadata: a queue never moves to another group afterwards, so
    its order and offsets stay as they are (its group's replicas may move, with their log).
    `rocket topic update --queues N` adds queues the same way; a KV bucket's shards are fixed, since its keys hash
    onto them. A model refused (invalid or stale) has its reason logged and shown in `cluster status` (model_state),
    and `cluster placement --explain` explains a choice (_place)."""

    def _init_queue_placement(self, objects) -> None:
        self.objects = objects  # the node's object store, where models are (None: never a model)
        self.history = LoadHistory()
        # Other nameserver -> (series, step) -> bytes recorded here that it has not taken yet: the series times
        # limits.load_share_steps bound each (older steps are dropped, _share_history).
        self._unshared: dict[int, collections.Counter] = {}
        self.predictor: Predictor = RecentPredictor()
        self.model_state = "no model"  # what `rocket cluster status` shows
        self._model_text: bytes | None = None
        self._explanations: collections.OrderedDict[str, dict] = collections.OrderedDict()
        self._predicted_for: tuple = ()  # (step, predictor) the cached predictions are of
        self._predicted: dict[tuple, float] = {}
        self._last_transfer = float("-inf")  # trio time of the last leadership transfer this leader asked for
        prefix = self.config.tier_s3_prefix
        self._model_key = f"{prefix}/{MODEL_KEY}" if prefix else MODEL_KEY

    # ---- load and the model --------------------------------------------------------------------------

    def _record_traffic(self, load: dict) -> None:
        """On the leader: a heartbeat's bytes into the history, and into what the other nameservers are sent. The
        history keeps each storage group's and topic's traffic in one-minute steps (rocket.ml.load.LoadHistory)."""
        now_ms = self.clock.wall_ms()
        step = now_ms // STEP_MS
        reports = [(("group", entry["group"]), entry["bytes"]) for entry in load.get("group_bytes_in", ())]
        reports += [(("topic", entry["topic"]), entry["bytes"]) for entry in load.get("topic_bytes_in", ())]
        others = [member for member in self.members if member != self.config.node_id]
        for series, count in reports:
            self.history.add(series, now_ms, count)
            if count > 0:
                for member in others:
                    self._unshared.setdefault(member, collections.Counter())[series, step] += count

    async def _share_history(self) -> None:
        """Every heartbeat interval: the history this node recorded since as leader, to the other nameservers, so that
        a new leader has the old one's: placement and leader balancing need an hour of it. What a nameserver did not
        take (down, slow) waits for the next interval, for limits.load_share_steps."""
        oldest = self.clock.wall_ms() // STEP_MS - limits.load_share_steps
        for member, unshared in self._unshared.items():
            for key in [key for key in unshared if key[1] < oldest]:
                del unshared[key]
            if not unshared:
                continue
            sent = collections.Counter(unshared)
            steps = [{"kind": kind, "group": key if kind == "group" else 0, "topic": key if kind == "topic" else "",
                      "step": step, "bytes": count} for ((kind, key), step), count in sent.items()]
            with trio.move_on_after(limits.node_heartbeat_s):
                try:
                    await self.peers.call(self.members[member], "MetaLoadShare", {"steps": steps})
                except RocketError as error:
                    log.debug("load history to nameserver %d: %s", member, error)
                    continue
                unshared -= sent  # what was recorded while the call was under way waits for the next

    async def load_share(self, request: dict) -> dict:
        """On the other nameservers: the leader's history of its last interval (or, on a new leader, what the old one
        recorded in its last, which only it heard)."""
        for entry in request["steps"]:
            series = ("group", entry["group"]) if entry["kind"] == "group" else ("topic", entry["topic"])
            self.history.add(series, entry["step"] * STEP_MS, entry["bytes"])
        return {}

    async def _follow_model_forever(self) -> None:
        while True:
            await self._follow_model()
            await self._follow_health_model()
            self.history.forget_before(self.clock.wall_ms())
            await trio.sleep(limits.model_poll_s)

    async def _follow_model(self) -> None:
        """Take the model file if it changed; refuse it, or a stale one, for the fallback, saying why once.

        Every nameserver follows the forecast model in the object store (`models/forecast/latest.json`, which the
        Spark job writes), read again every limits.model_poll_s. It is used while it is valid, fresh, and no worse on
        its held-out data than the last-value forecast (its metrics say); otherwise placement falls back to the
        recent load (RecentPredictor) and logs why, once per change."""
        readable, text = await self._read_model(self._model_key, "forecast model")
        if not readable:
            return
        if text is None:
            if self.model_state != "no model":
                self._use(RecentPredictor(), "no model", None)
            return
        if text != self._model_text or isinstance(self.predictor, ModelPredictor):
            try:
                model = Forecaster.from_json(text)
            except ModelError as error:
                self._use(RecentPredictor(), f"model refused: {error}", text)
                return
            age_s = (self.clock.wall_ms() - int(model.metrics.get("trained_at_ms", 0))) / 1000
            if age_s > limits.model_stale_s:
                self._use(RecentPredictor(), f"model {model.version} is stale: trained {age_s / 86_400:.1f} days ago",
                          text)
                return
            rmse, naive_rmse = model.metrics.get("rmse"), model.metrics.get("naive_rmse")
            if isinstance(rmse, (int, float)) and isinstance(naive_rmse, (int, float)) and rmse > naive_rmse:
                self._use(RecentPredictor(), f"model {model.version} refused: on held-out data it forecast worse "
                          f"than the last value (RMSE {rmse:,.0f} against {naive_rmse:,.0f})", text)
                return
            if not isinstance(self.predictor, ModelPredictor) or self.predictor.model.version != model.version:
                self._use(ModelPredictor(model), f"model {model.version}", text)

    async def _read_model(self, key: str, what: str) -> tuple[bool, bytes | None]:
        """(readable, the file or None where there is none) of a model in the object store; not readable (logged)
        when the store failed: keep what was in use."""
        if self.objects is None:
            return True, None
        try:
            return True, await self.objects.get(key)
        except RocketError as error:
            if error.code == Code.NOT_FOUND:
                return True, None
            log.warning("%s: cannot read %s (%s); keeping what was in use", what, key, error)
            return False, None

    def _use(self, predictor: Predictor, state: str, text: bytes | None) -> None:
        if state != self.model_state:
            report = log.warning if "refused" in state or "stale" in state else log.info
            report("queue placement: %s; placing by %s", state, predictor.name)
        self.predictor, self.model_state, self._model_text = predictor, state, text

    def _predict(self, series: tuple, now_ms: int, members: int) -> float:
        """The predictor's bytes/s for a series, kept until the minute ends or the predictor changes: the history
        moves by whole steps, and leader balancing asks for every group every few seconds."""
        step = now_ms // STEP_MS
        if self._predicted_for != (step, self.predictor):
            self._predicted_for, self._predicted = (step, self.predictor), {}
        key = (series, members)
        found = self._predicted.get(key)
        if found is None:
            found = self._predicted[key] = self.predictor.predict(self.history, series, now_ms, members=members)
        return found

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
        loads, degraded = [], self.degraded()
        for group, members in sorted(voters.items()):
            leaving = any(self._leaving(voter) for voter in members)
            leader = self.metadata.leader_of(group, self.leaders) or members[0]
            loads.append(GroupLoad(group, leader, self._predict(("group", group), now_ms, max(1, queues_in[group])),
                                   queues_in[group], topic_queues[group], not leaving and leader not in degraded))
        if not any(load.available for load in loads):  # better a group short of a replica than none
            for load in loads:
                load.available = True
        return loads

    def _place(self, spec: TopicSpec | None, topic: str, first_queue: int, count: int,
               voters: dict[int, tuple[int, ...]]) -> list[QueueChoice]:
        """Groups for queues first_queue.. of topic (spec: as it is now, None when it is new), among the groups
        given with their voters, and the record of why, for `rocket cluster placement --explain`."""
        now_ms = self.clock.wall_ms()
        queues_after = first_queue + count
        loads = self._group_loads(topic, voters, now_ms)
        topic_predicted = (self._predict(("topic", topic), now_ms, queues_after)
                           if self.history.rates(("topic", topic)) else None)
        choices = place_queues(first_queue, count, new_queue_load(topic_predicted, queues_after, loads), loads)
        earlier = self._explanations.pop(topic, None) if spec is not None else None
        self._explanations[topic] = {
            "topic": topic, "predictor": self.predictor.name, "placed_ms": now_ms,
            "queues": (earlier["queues"] if earlier else []) + [
                {"queue": choice.queue, "group": choice.group, "node": choice.node, "predicted": choice.predicted,
                 "score": choice.score, "runner_up": choice.runner_up, "runner_up_score": choice.runner_up_score}
                for choice in choices]}
        while len(self._explanations) > limits.placement_explanations_max:
            self._explanations.popitem(last=False)
        return choices

    async def _balance_leaders(self) -> None:
        """On the leader, at most once per limits.leader_transfer_s: move one group's leadership off a degraded node,
        to the healthy voter leading the least predicted load; or else from the node that leads the most predicted
        load to the least loaded of the group's voters (rocket.ml.placement.leader_transfer), never a degraded one.
        The group's leader does it (StorageMembers "transfer"); the next heartbeats tell who leads. Controller-mode
        groups are left out, degraded or not: the controller names their master."""
        now = trio.current_time()
        if now - self._last_transfer < limits.leader_transfer_s or self._moving:
            return
        now_ms = self.clock.wall_ms()
        voters = {group: members.voters for group, members in self.metadata.groups.items()
                  if not members.learners and members.control is None}
        queues_in, _ = self._queue_counts()
        loads = [GroupLoad(group, self.leaders.get(group, 0),
                           self._predict(("group", group), now_ms, max(1, queues_in[group])), 0)
                 for group in voters]
        degraded = self.degraded()
        nodes = [load.node for load in self.loads() if load.available and load.node not in degraded]
        transfer = degraded_leader_transfer(loads, voters, nodes, degraded) or leader_transfer(loads, voters, nodes)
        if transfer is None:
            return
        group, target = transfer
        self._last_transfer = now
        leader = self.leaders.get(group)
        info = self.metadata.nodes.get(leader)
        if info is None:
            return
        try:
            await self.peers.call(Address.parse(info.address), "StorageMembers",
                                  {"group": group, "action": "transfer", "node": target})
        except RocketError as error:
            log.info("group %d: leadership transfer from node %d to node %d: %s", group, leader, target, error)
            return
        log.info("group %d: leadership moves from node %d to node %d %s", group, leader, target,
                 "off a degraded node" if leader in degraded else "to even out the predicted load")
        self.leaders[group] = target

    async def _add_queues_here(self, spec: TopicSpec, queues: int) -> None:
        if spec.name.startswith(KV_PREFIX):
            raise RocketError(Code.BAD_REQUEST, f"bucket {spec.bucket!r} keeps its {spec.queues} shards: its keys "
                              "hash onto them")
        if queues <= spec.queues:
            raise RocketError(Code.BAD_REQUEST, f"topic {spec.name!r} has {spec.queues} queues; queues can only be "
                              f"added, got {queues}")
        if queues > limits.queues_per_topic_max:
            raise RocketError(Code.BAD_REQUEST, f"queues must be 1..{limits.queues_per_topic_max}, got {queues}")
        voters = {group: self.metadata.groups[group].voters for group in self.metadata.class_groups(spec.storage_class)}
        choices = self._place(spec, spec.name, spec.queues, queues - spec.queues, voters)
        await self._propose({"op": "add_queues", "name": spec.name, "from_queues": spec.queues,
                             "queue_groups": [choice.group for choice in choices]})

    async def placement_explain(self, request: dict) -> dict:
        return await self._on_leader("PlacementExplain", request, self._explain_here)

    async def _explain_here(self, request: dict) -> dict:
        spec = self.metadata.topic(request["topic"])
        recorded = self._explanations.get(spec.name)
        rows = {row["queue"]: row for row in (recorded["queues"] if recorded else [])}
        queues = [rows.get(queue) or {"queue": queue, "group": spec.group_of(queue), "node": 0, "predicted": -1.0,
                                      "score": -1.0, "runner_up": 0, "runner_up_score": -1.0}
                  for queue in range(spec.queues)]
        note = "" if recorded and len(rows) == spec.queues else (
            "queues without scores were placed before this nameserver led"
            + ("" if spec.queue_groups else ", by a hash onto the topic's groups"))
        return {"topic": spec.name, "predictor": recorded["predictor"] if recorded else "",
                "model": self.model_state, "placed_ms": recorded["placed_ms"] if recorded else 0,
                "queues": queues, "note": note}
