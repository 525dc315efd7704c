"""`rocket cluster train` hands each job to spark-submit with the options it was given, prints what the jobs print,
and says which job failed and how (a fake spark-submit here; tests/jobs/test_spark_cluster.py runs the real one)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

FAKE = """#!/bin/sh
echo "$@" >> "{calls}"
case "$*" in *train_health*) echo "health: model=h1 f1=0.9"; exit {health_exit};; esac
echo "forecast: model=f1 rmse=3.0"
echo "forecast: model f1 promoted: no model was served"
"""


def train(tmp_path: Path, *args: str, health_exit: int = 0) -> tuple[subprocess.CompletedProcess, list[str]]:
    calls = tmp_path / "calls"
    submit = tmp_path / "spark-submit"
    submit.write_text(FAKE.format(calls=calls, health_exit=health_exit))
    submit.chmod(0o755)
    done = subprocess.run([sys.executable, "-m", "rocket", "cluster", "train", "--spark-submit", str(submit),
                           "--telemetry", "s3a://telemetry", "--models", str(tmp_path / "models"), *args],
                          capture_output=True, text=True, timeout=60, env=os.environ | {"COLUMNS": "200"})
    return done, calls.read_text().splitlines() if calls.exists() else []


def test_each_job_goes_to_spark_submit_with_its_options(tmp_path):
    labels = tmp_path / "runs.jsonl"
    labels.write_text("{}\n")
    done, calls = train(tmp_path, "--master", "spark://127.0.0.1:7077", "--partitions", "4", "--labels", str(labels),
                        "--placement-args", "--horizon-steps 2 --max-iter '8'", "--health-args", "--max-iter 5")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[:2] == ["forecast: model=f1 rmse=3.0",
                                            "forecast: model f1 promoted: no model was served"]
    assert "health: model=h1 f1=0.9" in done.stdout
    submit = "--master spark://127.0.0.1:7077 --conf spark.sql.shuffle.partitions=4 --conf spark.default.parallelism=4"
    data = f"--telemetry s3a://telemetry --models {tmp_path / 'models'}"
    jobs = Path(__file__).resolve().parents[2] / "jobs"
    assert calls == [f"{submit} {jobs / 'train_placement.py'} {data} --horizon-steps 2 --max-iter 8",
                     f"{submit} {jobs / 'train_health.py'} {data} --labels {labels} --max-iter 5"]


def test_without_labels_only_the_forecast_trains(tmp_path):
    done, calls = train(tmp_path)
    assert done.returncode == 0, done.stderr
    assert "health: not trained (no --labels" in done.stdout
    assert len(calls) == 1 and calls[0].startswith("--master local[*] ") and "train_placement.py" in calls[0]


def test_a_failed_job_is_named_and_the_command_fails(tmp_path):
    labels = tmp_path / "runs.jsonl"
    labels.write_text("{}\n")
    done, calls = train(tmp_path, "--labels", str(labels), health_exit=3)
    assert done.returncode == 1 and len(calls) == 2
    assert "error: health: the job failed (exit 3)" in done.stderr
    assert done.stderr.strip().splitlines()[-1] == "error: training failed (above: the failed job's last lines)"


@pytest.mark.parametrize("args, message", [
    (["--every", "soon"], "error: --every: duration 'soon': expected a number and a unit"),
    (["--every", "0h"], "error: --every: must be longer than nothing"),
    (["--labels", "/nonexistent.jsonl"], "error: --labels /nonexistent.jsonl: no such file"),
    (["--placement-args", "'open"], "error: --placement-args or --health-args: No closing quotation"),
])
def test_bad_options_are_one_line_usage_errors(tmp_path, args, message):
    done, calls = train(tmp_path, *args)
    assert done.returncode == 2 and done.stderr.startswith(message) and not calls, done.stderr


def test_the_stores_come_from_a_node_config_or_both_paths(tmp_path):
    config = tmp_path / "storage1.toml"
    config.write_text('tier_backend = "s3"\ntier_s3_bucket = "tier"\n')
    submit = tmp_path / "spark-submit"
    submit.write_text(FAKE.format(calls=tmp_path / "calls", health_exit=0))
    submit.chmod(0o755)
    done = subprocess.run([sys.executable, "-m", "rocket", "cluster", "train", "--spark-submit", str(submit),
                           "--tier-config", str(config)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "calls").read_text().split("train_placement.py ")[1].split() == ["--tier-config", str(config)]
    for args in ([], ["--telemetry", "t"], ["--models", "m"]):
        done = subprocess.run([sys.executable, "-m", "rocket", "cluster", "train", "--spark-submit", str(submit),
                               *args], capture_output=True, text=True, timeout=60)
        assert done.returncode == 2 and done.stderr.startswith("error: give --tier-config (a node's config, naming "
                                                               "its object store), or --telemetry and --models")
    done = subprocess.run([sys.executable, "-m", "rocket", "cluster", "train", "--tier-config", str(tmp_path / "no")],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and done.stderr.startswith(f"error: --tier-config {tmp_path / 'no'}: no such file")


def test_a_missing_spark_submit_is_a_usage_error(tmp_path):
    done = subprocess.run([sys.executable, "-m", "rocket", "cluster", "train", "--spark-submit", str(tmp_path / "no"),
                           "--telemetry", "t", "--models", "m"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and done.stderr.startswith(f"error: --spark-submit {tmp_path / 'no'}: no such file")


def test_every_trains_again_and_a_failed_round_does_not_stop_it(tmp_path):
    labels = tmp_path / "runs.jsonl"
    labels.write_text("{}\n")
    submit, calls = tmp_path / "spark-submit", tmp_path / "calls"
    submit.write_text(FAKE.format(calls=calls, health_exit=1))
    submit.chmod(0o755)
    process = subprocess.Popen([sys.executable, "-m", "rocket", "cluster", "train", "--spark-submit", str(submit),
                                "--telemetry", "t", "--models", "m", "--labels", str(labels), "--every", "100ms"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        for _ in range(600):
            if calls.exists() and len(calls.read_text().splitlines()) >= 6:  # three rounds of two jobs
                break
            time.sleep(0.05)
        assert process.poll() is None, process.communicate()
    finally:
        process.terminate()
    stdout, stderr = process.communicate(timeout=30)
    assert stdout.count("round failed; the next in") >= 2 and stderr.count("error: health: the job failed") >= 2
