"""The node-health model's data (issue 31), shared by jobs/train_health.py and benchmarks/health_eval.py. Pure
Python, no pyspark: the job calls it inside its executors.

- Windows: the nameserver leader notes every window it judges in its telemetry, one record per NodeWindow field
  (metric `rocket_health_window_<field>`, label `target`: the judged node; time_ms: the window's end). `windows()`
  turns a reporter's records of one time back into the NodeWindows the scorer saw.
- Labels: benchmarks/faults.py appends one JSON line per fault run: {"kind", "node", "node_id", "severity",
  "start_ms", "end_ms"}. `window_label()` says what a window of a node was: a fault kind, "healthy", or None where it
  straddles a fault's start or end (neither: left out of training and of scoring).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable
from pathlib import Path

from rocket.ml.health import KINDS, WINDOW_FIELDS, WINDOW_METRIC, NodeWindow
HEALTHY = "healthy"
INT_FIELDS = {field.name for field in dataclasses.fields(NodeWindow) if field.type in ("int", int)}


@dataclasses.dataclass(frozen=True, slots=True)
class Label:
    kind: str  # of rocket.ml.health.KINDS, or "control" (no fault)
    node_id: int
    severity: float
    start_ms: int
    end_ms: int


def read_labels(path: str | Path) -> list[Label]:
    labels = []
    for number, line in enumerate(Path(path).read_text().splitlines(), 1):
        if not line.strip():
            continue
        entry = json.loads(line)
        if entry["kind"] not in (*KINDS, "control"):
            raise ValueError(f"{path}:{number}: unknown fault kind {entry['kind']!r}")
        labels.append(Label(entry["kind"], int(entry["node_id"]), float(entry["severity"]), int(entry["start_ms"]),
                            int(entry["end_ms"])))
    return labels


def is_window_record(record: dict) -> bool:
    return record["metric"].startswith(WINDOW_METRIC) and "target" in record["labels"]


def windows(records: Iterable[dict]) -> list[NodeWindow]:
    """The NodeWindows of one judgement (one reporter's window records of one time_ms), by node."""
    fields: dict[int, dict] = {}
    for record in records:
        name = record["metric"][len(WINDOW_METRIC):]
        if name in WINDOW_FIELDS and name != "node":
            value = record["value"]
            fields.setdefault(int(record["labels"]["target"]), {})[name] = int(value) if name in INT_FIELDS else value
    return [NodeWindow(node, **values) for node, values in sorted(fields.items())]


def window_label(window: NodeWindow, labels: list[Label]) -> str | None:
    """The kind of the fault the window's node was under for the whole window, "healthy" where no fault (of any
    node: a fault elsewhere is the others' peer, and healthy) touched it, None where a fault on it began or ended
    inside the window."""
    began_ms = window.at_ms - int(window.seconds * 1000)
    for label in labels:
        if label.node_id != window.node or label.kind == "control":
            continue
        if label.start_ms <= began_ms and window.at_ms <= label.end_ms:
            return label.kind
        if began_ms < label.end_ms and label.start_ms < window.at_ms:
            return None
    return HEALTHY
