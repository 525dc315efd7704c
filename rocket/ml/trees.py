"""Gradient-boosted tree ensembles as the Spark jobs export them (jobs/models.py): the checks a model file must pass
and the weighted sum of its trees' leaves (ensemble_sum). Pure: the forecaster (forecast.py) and the node-health
model (health.py) score with it."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence

TREE_DEPTH_MAX = 32  # deeper is not a tree Spark's GBT grows (maxDepth <= 30), so a corrupt file
TREES_MAX = 10_000


class ModelError(ValueError):
    """A model file this node cannot use, with one line saying why."""


def describe_decision(document: object) -> str:
    """A training's decision (jobs/models.py, models/<name>/decision.json, parsed) in one line: the new model,
    promoted or refused, and why; ModelError if it is not one."""
    if not isinstance(document, dict) or not isinstance(document.get("promoted"), bool):
        raise ModelError("not a training decision")
    verdict = "promoted" if document["promoted"] else "refused"
    return f"model {document.get('model_version')} {verdict}: {document.get('reason')}"


def finite(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def parse(text: str | bytes) -> object:
    """A model file's JSON, or ModelError."""
    try:
        return json.loads(text)
    except (ValueError, UnicodeDecodeError) as error:
        raise ModelError(f"not JSON: {error}") from None


def check_header(document: object, model_format: str, version: int, features: Sequence[str]) -> None:
    """Raise ModelError unless document is an object of this format and version, over exactly these features in
    this order, with a model_version and metrics: what every model file has."""
    if not isinstance(document, dict):
        raise ModelError("a model is a JSON object")
    if document.get("format") != model_format or document.get("format_version") != version:
        raise ModelError(f"format {document.get('format')!r} version {document.get('format_version')!r}; this node "
                         f"reads {model_format!r} version {version}")
    if document.get("features") != list(features):
        raise ModelError(f"its features {document.get('features')!r} are not this node's {list(features)!r}")
    if not isinstance(document.get("model_version"), str) or not document["model_version"]:
        raise ModelError("model_version must be a non-empty string")
    if not isinstance(document.get("metrics"), dict):
        raise ModelError("metrics must be an object")


def check_trees(trees: object, features: int, where: str = "trees") -> None:
    """Raise ModelError unless trees is a list of 1..TREES_MAX well-formed trees over `features` features. A tree is
    {"weight": w, "root": node}; a node is {"feature": index, "threshold": t, "left": node, "right": node} (left when
    x[feature] <= t), or a leaf {"value": v}."""
    if not isinstance(trees, list) or not 1 <= len(trees) <= TREES_MAX:
        raise ModelError(f"{where} must be a list of 1..{TREES_MAX} trees")
    for number, tree in enumerate(trees):
        if not isinstance(tree, dict) or not finite(tree.get("weight")):
            raise ModelError(f"{where}[{number}]: a tree is an object with a finite weight")
        _check_node(tree.get("root"), f"{where}[{number}]", 0, features)


def _check_node(node: object, where: str, depth: int, features: int) -> None:
    if depth > TREE_DEPTH_MAX:
        raise ModelError(f"{where}: deeper than {TREE_DEPTH_MAX}")
    if not isinstance(node, dict):
        raise ModelError(f"{where}: a node is an object")
    if "value" in node:
        if not finite(node["value"]) or len(node) != 1:
            raise ModelError(f"{where}: a leaf is {{\"value\": a finite number}}")
        return
    feature = node.get("feature")
    if not isinstance(feature, int) or isinstance(feature, bool) or not 0 <= feature < features:
        raise ModelError(f"{where}: feature must be an index below {features}, got {feature!r}")
    if not finite(node.get("threshold")) or set(node) != {"feature", "threshold", "left", "right"}:
        raise ModelError(f"{where}: a split is {{feature, threshold, left, right}} with a finite threshold")
    _check_node(node["left"], where, depth + 1, features)
    _check_node(node["right"], where, depth + 1, features)


def ensemble_sum(trees: Sequence[tuple[float, dict]], features: Sequence[float]) -> float:
    """The weighted sum of the leaves that features reach, over (weight, root) pairs."""
    total = 0.0
    for weight, node in trees:
        while "value" not in node:
            node = node["left"] if features[node["feature"]] <= node["threshold"] else node["right"]
        total += weight * node["value"]
    return total
