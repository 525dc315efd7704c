"""What the training jobs share about the models they export: Spark's trees in rocket.ml.trees' format, a model's
version, and putting its JSON under an object store's root (models/<name>/<version>.json and .../latest.json).
"""

from __future__ import annotations

import hashlib
import json
from datetime import datetime


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


def write_model(spark, models: str, prefix: str, document: dict) -> list[str]:
    """Put the model under models (an object store's root) as <prefix><version>.json and <prefix>latest.json (prefix
    like "models/forecast/"). A local directory is written through LocalDirectoryStore, so it has the footer a node
    reads; any other Hadoop path (s3a://bucket: S3 objects have no footer) through Hadoop's file system."""
    assert prefix.endswith("/") and not prefix.startswith("/"), prefix
    data = json.dumps(document, indent=1).encode()
    keys = [f"{prefix}{document['model_version']}.json", f"{prefix}latest.json"]
    scheme = models.split("://", 1)[0] if "://" in models else ""
    if scheme in ("", "file"):
        import trio

        from rocket.tier.local import LocalDirectoryStore

        async def put() -> None:
            async with LocalDirectoryStore(models.removeprefix("file://")) as store:
                for key in keys:
                    await store.put(key, data)

        trio.run(put)
    else:
        jvm = spark.sparkContext._jvm
        for key in keys:
            path = jvm.org.apache.hadoop.fs.Path(f"{models.rstrip('/')}/{key}")
            stream = path.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration()).create(path, True)
            try:
                stream.write(bytearray(data))
            finally:
                stream.close()
    return keys
