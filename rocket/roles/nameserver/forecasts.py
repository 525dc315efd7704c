"""The load history that storage nodes' heartbeats bring, shared with the other nameservers, and the forecast model
that predicts it for queue placement and leader balancing (issue 30). A part of Nameserver.
"""

from __future__ import annotations

import collections
import logging

import trio

from rocket import limits
from rocket.clock import Clock
from rocket.config import NodeConfig
from rocket.errors import Code, RocketError
from rocket.ml.forecast import STEP_MS, Forecaster, ModelError
from rocket.ml.load import LoadHistory, ModelPredictor, Predictor, RecentPredictor
from rocket.ml.trees import describe_decision, parse
from rocket.model import Address
from rocket.roles.peers import Peers
from rocket.serde.typed import Empty, LoadShareRequest, NodeLoad
from rocket.tier.objectstore import ObjectStore

log = logging.getLogger("rocket.nameserver")

MODEL_KEY = "models/forecast/latest.json"


async def read_model(objects: ObjectStore | None, key: str, what: str) -> tuple[bool, bytes | None]:
    """(readable, the file or None where there is none) of a model in the object store; not readable (logged)
    when the store failed: keep what was in use."""
    if objects is None:
        return True, None
    try:
        return True, await objects.get(key)
    except RocketError as error:
        if error.code == Code.NOT_FOUND:
            return True, None
        log.warning("%s: cannot read %s (%s); keeping what was in use", what, key, error)
        return False, None


async def read_training(objects: ObjectStore | None, model_key: str, what: str, known: str) -> str:
    """The last training's decision beside a model (models/<name>/decision.json, jobs/models.py) in one line: ""
    when there is none, known when the store failed."""
    readable, text = await read_model(objects, model_key.removesuffix("latest.json") + "decision.json", what)
    if not readable:
        return known
    if text is None:
        return ""
    try:
        return describe_decision(parse(text))
    except ModelError as error:
        return f"its decision file is unreadable ({error})"


def with_training(state: str, training: str) -> str:
    """A model's state, and the last training's decision when there is one: what `rocket cluster status` and
    `rocket cluster health` show."""
    return f"{state}; last training: {training}" if training else state


class Forecasts:
    """Each storage group's and topic's bytes in, in one-minute steps (rocket.ml.load.LoadHistory), and the predictor
    of their next hour. The leader records what heartbeats report (each group's leader counts its bytes in) and
    sends it to the other nameservers, so that a new leader has the same history.

    Every nameserver follows the forecast model in the object store (`models/forecast/latest.json`, which the
    Spark job writes), read again every limits.model_poll_s. It is used while it is valid, fresh, and no worse on
    its held-out data than the last-value forecast (its metrics say); otherwise placement falls back to the
    recent load (RecentPredictor) and logs why, once per change. `cluster status` shows which (model_state)."""

    def __init__(self, config: NodeConfig, clock: Clock, peers: Peers, members: dict[int, Address],
                 objects: ObjectStore | None):
        self.node_id = config.node_id
        self.clock = clock
        self.peers = peers
        self.members = members  # nameserver node -> its address
        self.objects = objects  # the node's object store, where models are (None: never a model)
        self.history = LoadHistory()
        # Other nameserver -> (series, step) -> bytes recorded here that it has not taken yet: the series times
        # limits.load_share_steps bound each (older steps are dropped, share).
        self._unshared: dict[int, collections.Counter] = {}
        self.predictor: Predictor = RecentPredictor()
        self.model_state = "no model"  # what `rocket cluster status` shows, with the last training's decision
        self.training = ""  # the last training's decision (read_training)
        self._model_text: bytes | None = None
        self._predicted_for: tuple = ()  # (step, predictor) the cached predictions are of
        self._predicted: dict[tuple, float] = {}
        self._model_key = config.tier_key(MODEL_KEY)

    # ---- the history ---------------------------------------------------------------------------------

    def record(self, load: NodeLoad) -> None:
        """On the leader: a heartbeat's bytes into the history, and into what the other nameservers are sent."""
        now_ms = self.clock.wall_ms()
        step = now_ms // STEP_MS
        reports = [(("group", entry.group), entry.bytes) for entry in load.group_bytes_in]
        reports += [(("topic", entry.topic), entry.bytes) for entry in load.topic_bytes_in]
        others = [member for member in self.members if member != self.node_id]
        for series, count in reports:
            self.history.add(series, now_ms, count)
            if count > 0:
                for member in others:
                    self._unshared.setdefault(member, collections.Counter())[series, step] += count

    async def share(self) -> None:
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

    async def load_share(self, request: LoadShareRequest) -> Empty:
        """On the other nameservers: the leader's history of its last interval (or, on a new leader, what the old one
        recorded in its last, which only it heard)."""
        for entry in request.steps:
            series = ("group", entry.group) if entry.kind == "group" else ("topic", entry.topic)
            self.history.add(series, entry.step * STEP_MS, entry.bytes)
        return Empty()

    # ---- the model -----------------------------------------------------------------------------------

    async def follow_model(self) -> None:
        """Take the model file if it changed; refuse it, or a stale one, for the fallback, saying why once. The
        history drops the steps past its window."""
        self.history.forget_before(self.clock.wall_ms())
        self.training = await read_training(self.objects, self._model_key, "forecast model's training", self.training)
        readable, text = await read_model(self.objects, self._model_key, "forecast model")
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

    def _use(self, predictor: Predictor, state: str, text: bytes | None) -> None:
        if state != self.model_state:
            report = log.warning if "refused" in state or "stale" in state else log.info
            report("queue placement: %s; placing by %s", state, predictor.name)
        self.predictor, self.model_state, self._model_text = predictor, state, text

    def predict(self, series: tuple, now_ms: int, members: int) -> float:
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
