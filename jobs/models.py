"""What the training jobs share about the models they export: Spark's trees in rocket.ml.trees' format, a model's
version, and publishing its JSON under an object store's root: models/<name>/<version>.json always, and
.../latest.json (the one nodes serve) only when it beats the served model on this run's held-out data (decide).
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable
from datetime import datetime

from jobs import tier
from jobs.tier import tier_of
from rocket import limits
from rocket.config import NodeConfig


class TrainError(RuntimeError):
    """The data cannot train a model, or the export does not predict what Spark does."""


def export_tree(java_node) -> dict:
    """A Spark tree node (through py4j) in rocket.ml.trees' format."""
    kind = java_node.getClass().getSimpleName()
    if kind == "LeafNode":
        return {"value": float(java_node.prediction())}
    if kind != "InternalNode":
        raise TrainError(f"a tree node of class {kind}")
    split_ = java_node.split()
    if split_.getClass().getSimpleName() != "ContinuousSplit":
        raise TrainError(f"a split of class {split_.getClass().getSimpleName()}: only continuous features are known")
    return {"feature": int(split_.featureIndex()), "threshold": float(split_.threshold()),
            "left": export_tree(java_node.leftChild()), "right": export_tree(java_node.rightChild())}


def export_trees(model, shrink: float = 1.0) -> list[dict]:
    """The trees of a fitted Spark GBT model (regressor or classifier), their weights times shrink."""
    return [{"weight": float(weight) * shrink, "root": export_tree(tree._java_obj.rootNode())}
            for tree, weight in zip(model.trees, model.treeWeights)]


def model_version(trees: object, now: datetime) -> str:
    """<UTC time>-<8 hex digits of the trees>: sorts by time, and two models of the same trees share the digest."""
    digest = hashlib.sha256(json.dumps(trees, sort_keys=True).encode()).hexdigest()[:8]
    return f"{now.strftime('%Y%m%dT%H%M%SZ')}-{digest}"


def decide(document: dict, served: bytes | None, metric: str, lower_is_better: bool,
           score: Callable[[bytes], float | None]) -> dict:
    """Whether the new model (document) takes the served one's place: only when it beats it on the held-out data of
    this run, where score(a model file) scores both by the same code (raising ValueError, ModelError among them,
    when it cannot). A model is promoted without a contest when none is served, or the served one is unreadable,
    stale (nodes no longer use it) or not scorable on these rows. Returns the decision's record (decision.json)."""
    metrics = document["metrics"]
    decision = {"model_version": document["model_version"], "decided_at_ms": metrics["trained_at_ms"],
                "metric": metric, "score": metrics.get(metric), "served_version": None, "served_score": None}

    def decided(promoted: bool, reason: str) -> dict:
        return decision | {"promoted": promoted, "reason": reason}

    if served is None:
        return decided(True, "no model was served")
    try:
        document_served = json.loads(served)
        decision["served_version"] = str(document_served["model_version"])
        trained_at_ms = int(document_served["metrics"]["trained_at_ms"])
    except (ValueError, KeyError, TypeError) as error:
        return decided(True, f"the served model is unreadable ({type(error).__name__}: {error})")
    age_s = (metrics["trained_at_ms"] - trained_at_ms) / 1000
    if age_s > limits.model_stale_s:
        return decided(True, f"the served model is stale: trained {age_s / 86_400:.1f} days before this one")
    try:
        decision["served_score"] = score(served)
    except ValueError as error:
        return decided(True, f"the served model cannot be scored on these rows: {error}")
    decision["score"] = score(json.dumps(document).encode())  # as the served one is, not as Spark did

    def worst(value: float | None) -> float:  # an undefined score (F1 of nothing found) is the worst
        return value if value is not None and math.isfinite(value) else (math.inf if lower_is_better else -math.inf)

    new, old = worst(decision["score"]), worst(decision["served_score"])
    if (new < old) if lower_is_better else (new > old):
        return decided(True, f"{metric} {new:.6g} on held-out data beats the served model's {old:.6g}")
    return decided(False, f"{metric} {new:.6g} on held-out data does not beat the served model's {old:.6g}")


def read_object(spark, models: str | NodeConfig, key: str) -> bytes | None:
    """The object under models (an object store: a node config's, a local directory, or a Hadoop URL's root) at key,
    or None when there is none."""
    store = models if isinstance(models, NodeConfig) else tier_of(models, None)
    if store is not None:
        return tier.get(store, key)
    assert isinstance(models, str)  # a Hadoop URL
    jvm = spark.sparkContext._jvm
    path = jvm.org.apache.hadoop.fs.Path(f"{models.rstrip('/')}/{key}")
    file_system = path.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration())
    if not file_system.exists(path):
        return None
    stream = file_system.open(path)
    try:
        return bytes(jvm.org.apache.commons.io.IOUtils.toByteArray(stream))
    finally:
        stream.close()


def publish(spark, models: str | NodeConfig, prefix: str, document: dict, metric: str, lower_is_better: bool,
            score: Callable[[bytes], float | None]) -> dict:
    """Put the model under models as <prefix><version>.json; make it <prefix>latest.json too when it beats the served
    one (decide); record the decision as <prefix>decision.json (the last, which nameservers show) and
    <prefix>decisions/<version>.json. Returns the decision."""
    if isinstance(models, NodeConfig):  # where the node's nameservers read it
        prefix = models.tier_key(prefix)
    decision = decide(document, read_object(spark, models, f"{prefix}latest.json"), metric, lower_is_better, score)
    version = document["model_version"]
    model = json.dumps(document, indent=1).encode()
    record = json.dumps(decision, indent=1).encode()
    objects = {f"{prefix}{version}.json": model}
    if decision["promoted"]:
        objects[f"{prefix}latest.json"] = model
    objects |= {f"{prefix}decisions/{version}.json": record, f"{prefix}decision.json": record}
    write_objects(spark, models, objects)
    return decision


def write_objects(spark, models: str | NodeConfig, objects: dict[str, bytes]) -> None:
    """Put each key's bytes under models, in order: through rocket's own client when it is a node config's store or
    a local directory (LocalDirectoryStore, with the footer a node reads), else through Hadoop's file system
    (s3a://bucket: S3 objects have no footer)."""
    store = models if isinstance(models, NodeConfig) else tier_of(models, None)
    if store is not None:
        tier.put(store, objects)
        return
    assert isinstance(models, str)  # a Hadoop URL
    jvm = spark.sparkContext._jvm
    for key, data in objects.items():
        path = jvm.org.apache.hadoop.fs.Path(f"{models.rstrip('/')}/{key}")
        stream = path.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration()).create(path, True)
        try:
            stream.write(bytearray(data))
        finally:
            stream.close()
