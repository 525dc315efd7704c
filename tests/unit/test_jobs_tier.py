"""jobs/tier.py: the training jobs reach an object store through rocket's own client, the one a node's config names
or a local directory's, and read the telemetry and write the models where the node keeps them (tier_key)."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from jobs import tier
from jobs.tier import resolve, tier_of


def test_a_local_directory_or_a_node_config_names_the_store(tmp_path):
    local = tier_of(str(tmp_path), None)
    assert local is not None and local.tier_backend == "local" and local.tier_directory == tmp_path
    assert tier_of(f"file://{tmp_path}", None) == local
    assert tier_of("s3a://bucket/root", None) is None  # Hadoop's to reach
    config = tmp_path / "storage1.toml"
    config.write_text('tier_backend = "s3"\ntier_s3_bucket = "tier"\ntier_s3_prefix = "prod"\n')
    s3 = tier_of(str(tmp_path / "ignored"), str(config))
    assert s3 is not None and (s3.tier_backend, s3.tier_s3_bucket) == ("s3", "tier")
    assert s3.tier_key("models/forecast/latest.json") == "prod/models/forecast/latest.json"
    assert local.tier_key("telemetry/") == "telemetry/"


@pytest.mark.parametrize("text, message", [('tier_backend = "off"\n', "tier_backend = off names no object store"),
                                           ('tier_backend = "tape"\n', "tier_backend"),
                                           ("not toml [", "storage1.toml")])
def test_a_config_that_names_no_store_is_one_line(tmp_path, text, message):
    config = tmp_path / "storage1.toml"
    config.write_text(text)
    with pytest.raises(SystemExit) as stopped:
        tier_of(None, str(config))
    assert str(stopped.value).startswith(f"--tier-config {config}: ") and message in str(stopped.value)
    with pytest.raises(SystemExit, match="missing.toml does not exist"):
        tier_of(None, str(tmp_path / "missing.toml"))


def test_objects_go_through_the_store_and_come_back_in_the_order_asked(tmp_path):
    store = tier_of(str(tmp_path), None)
    assert store is not None
    objects = {f"telemetry/v1/node=1/date=2026-12-07/{n}.avro": bytes([n]) * (n + 1) for n in range(20)}
    tier.put(store, objects)
    assert tier.get(store, "telemetry/v1/node=1/date=2026-12-07/3.avro") == b"\x03" * 4
    assert tier.get(store, "models/forecast/latest.json") is None
    assert tier.keys(store, "telemetry/") == sorted(objects)
    wanted = list(reversed(sorted(objects)))
    assert list(tier.fetch(store, wanted)) == [(key, objects[key]) for key in wanted]
    assert list(tier.fetch(store, [])) == []
    gone = "telemetry/v1/node=1/date=2026-12-07/gone.avro"  # listed, then deleted by retention
    assert list(tier.fetch(store, [wanted[0], gone])) == [(wanted[0], objects[wanted[0]])]


def test_telemetry_and_models_default_to_the_configs_store(tmp_path):
    config = tmp_path / "storage1.toml"
    config.write_text(f'tier_backend = "local"\ntier_directory = "{tmp_path / "tier"}"\n')
    parser = argparse.ArgumentParser()
    args = argparse.Namespace(telemetry=None, models="/elsewhere", tier_config=str(config))
    resolve(parser, args)
    assert args.telemetry.tier_directory == Path(tmp_path / "tier") and args.models == "/elsewhere"
    for given, needed in ((argparse.Namespace(telemetry=None, models="m", tier_config=None), True),
                          (argparse.Namespace(telemetry="t", models=None, tier_config=None), True)):
        with pytest.raises(SystemExit):
            resolve(parser, given, needed)
    features_only = argparse.Namespace(telemetry=None, models="m", tier_config=None)
    resolve(parser, features_only, telemetry_needed=False)
    assert features_only.telemetry is None
