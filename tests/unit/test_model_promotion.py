"""A trained model replaces the served one only when it beats it on the run's held-out data (jobs/models.py's
decide), and nameservers show the last decision beside the model in use (rocket cluster status, cluster health)."""

from __future__ import annotations

import json

import pytest

from jobs.models import decide
from rocket import limits
from rocket.ml.trees import ModelError, describe_decision
from rocket.roles.nameserver.forecasts import read_training, with_training
from rocket.tier.local import LocalDirectoryStore

NOW_MS = 1_796_000_000_000


def document(version: str, trained_at_ms: int = NOW_MS, **metrics) -> dict:
    return {"model_version": version, "metrics": {"trained_at_ms": trained_at_ms, **metrics}}


def served(version: str = "old", trained_at_ms: int = NOW_MS - 86_400_000) -> bytes:
    return json.dumps(document(version, trained_at_ms)).encode()


def scores(old: float | None, new: float | None = None):
    """A scorer of model files: the served one ("old") scores old, the new one new."""
    return lambda text: {"old": old, "v1": old, "v2": new, "new": new}[json.loads(text)["model_version"]]


def test_a_first_model_is_promoted_without_a_contest():
    decision = decide(document("new", rmse=5.0), None, "rmse", True, scores(1.0))
    assert decision["promoted"] and decision["reason"] == "no model was served"
    assert decision["model_version"] == "new" and decision["decided_at_ms"] == NOW_MS and decision["score"] == 5.0


@pytest.mark.parametrize("new, old, promoted", [(4.0, 5.0, True), (5.0, 5.0, False), (6.0, 5.0, False)])
def test_lower_is_better_promotes_only_a_strictly_better_model(new, old, promoted):
    decision = decide(document("new", rmse=new + 0.5), served(), "rmse", True, scores(old, new))
    assert decision["promoted"] is promoted
    assert (decision["served_version"], decision["served_score"], decision["score"]) == ("old", old, new)
    assert decision["reason"] == (f"rmse {new:.6g} on held-out data {'beats' if promoted else 'does not beat'} the "
                                  f"served model's {old:.6g}")


@pytest.mark.parametrize("new, old, promoted", [(0.9, 0.8, True), (0.8, 0.9, False), (None, 0.5, False),
                                                (0.3, None, True), (None, None, False), (0.4, float("nan"), True)])
def test_higher_is_better_and_an_undefined_score_is_the_worst(new, old, promoted):
    assert decide(document("new", f1=0.99), served(), "f1", False, scores(old, new))["promoted"] is promoted


def test_a_served_model_that_is_unreadable_stale_or_unscorable_is_replaced():
    unreadable = decide(document("new", rmse=9.0), b"{not json", "rmse", True, scores(1.0))
    assert unreadable["promoted"] and unreadable["reason"].startswith("the served model is unreadable (JSONDecodeError")
    no_metrics = decide(document("new", rmse=9.0), b'{"model_version": "x"}', "rmse", True, scores(1.0))
    assert no_metrics["promoted"] and "unreadable (KeyError" in no_metrics["reason"]
    stale_ms = NOW_MS - int(limits.model_stale_s * 1000) - 86_400_000
    stale = decide(document("new", rmse=9.0), served(trained_at_ms=stale_ms), "rmse", True, scores(1.0))
    assert stale["promoted"] and stale["reason"] == "the served model is stale: trained 15.0 days before this one"

    def unscorable(text: bytes) -> float:
        raise ModelError("it forecasts 10 steps ahead, these rows 2")

    other = decide(document("new", rmse=9.0), served(), "rmse", True, unscorable)
    assert other["promoted"] and other["served_version"] == "old" and other["served_score"] is None
    assert other["reason"] == ("the served model cannot be scored on these rows: it forecasts 10 steps ahead, these "
                               "rows 2")


def test_a_decision_reads_as_one_line_and_anything_else_is_refused():
    decision = decide(document("v2", rmse=6.0), served("v1"), "rmse", True, scores(5.0, 6.0))
    assert describe_decision(json.loads(json.dumps(decision))) == (
        "model v2 refused: rmse 6 on held-out data does not beat the served model's 5")
    for bad in ([], {"promoted": "yes"}, {"model_version": "v2"}, None):
        with pytest.raises(ModelError, match="not a training decision"):
            describe_decision(bad)


async def test_nameservers_read_the_decision_beside_the_model(tmp_path):
    key = "models/health/latest.json"
    async with LocalDirectoryStore(tmp_path) as objects:
        assert await read_training(objects, key, "health model's training", "known") == ""
        assert await read_training(None, key, "health model's training", "known") == ""
        decision = decide(document("v3", f1=0.95), served("v2"), "f1", False,
                          lambda text: {"v2": 0.9, "v3": 0.95}[json.loads(text)["model_version"]])
        await objects.put("models/health/decision.json", json.dumps(decision).encode())
        line = await read_training(objects, key, "health model's training", "")
        assert line == "model v3 promoted: f1 0.95 on held-out data beats the served model's 0.9"
        assert with_training("model v3", line) == f"model v3; last training: {line}"
        assert with_training("no model", "") == "no model"
        await objects.put("models/health/decision.json", b"[1, 2]")
        assert await read_training(objects, key, "", "") == (
            "its decision file is unreadable (not a training decision)")
