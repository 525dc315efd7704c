"""`rocket cluster train`: the learning loop's jobs (jobs/train_placement.py, jobs/train_health.py) through Spark's
spark-submit, on local[*] or a cluster's master, once or every --every. A job serves its model only when it beats the
served one (jobs/models.py); each prints its decision."""

from __future__ import annotations

import importlib.util
import os
import shlex
import sys
import time
from pathlib import Path
from typing import Annotated, Optional

import trio
import typer
from rich.markup import escape

from rocket.cli.common import REFUSED, err, fail, out, runs_client, usage_error
from rocket.errors import RocketError
from rocket.model import parse_duration_s

STDERR_TAIL_LINES = 15  # of a failed job's output (Spark's log among it), shown under its error


def find_spark_submit(given: Path | None) -> str:
    """spark-submit: the one given, else $SPARK_HOME's, else the one pyspark bundles (found without importing it)."""
    if given is not None:
        if not given.is_file():
            usage_error(f"--spark-submit {given}: no such file")
        return str(given)
    candidates = [Path(os.environ["SPARK_HOME"]) / "bin" / "spark-submit"] if os.environ.get("SPARK_HOME") else []
    spec = importlib.util.find_spec("pyspark")
    if spec is not None and spec.submodule_search_locations:
        candidates.append(Path(list(spec.submodule_search_locations)[0]) / "bin" / "spark-submit")
    for candidate in candidates:
        if candidate.is_file():
            return str(candidate)
    usage_error("spark-submit not found: set SPARK_HOME, pip install 'rocket[ml]' (PySpark), or give --spark-submit")


def job_file(name: str) -> str:
    """The job's script (jobs/<name>.py), where this rocket's jobs package is, found without importing it."""
    spec = importlib.util.find_spec("jobs")
    path = Path(list(spec.submodule_search_locations)[0]) / f"{name}.py" if spec and spec.submodule_search_locations \
        else None
    if path is None or not path.is_file():
        usage_error(f"the training job jobs/{name}.py is not installed beside rocket")
    return str(path)


def job_commands(spark_submit: str, master: str, partitions: int | None, telemetry: str | None, models: str | None,
                 tier_config: Path | None, labels: Path | None, test_labels: Path | None, placement_args: str,
                 health_args: str) -> list[tuple[str, list[str]]]:
    """(name, argv) of each job a round runs: the forecast always, the health model when there are fault runs."""
    submit = [spark_submit, "--master", master]
    if partitions is not None:
        submit += ["--conf", f"spark.sql.shuffle.partitions={partitions}",
                   "--conf", f"spark.default.parallelism={partitions}"]
    data: list[str] = []
    for option, value in (("--tier-config", tier_config), ("--telemetry", telemetry), ("--models", models)):
        data += [option, str(value)] if value else []
    commands = [("forecast", [*submit, job_file("train_placement"), *data, *shlex.split(placement_args)])]
    if labels is not None:
        held_out = ["--test-labels", str(test_labels)] if test_labels is not None else []
        commands.append(("health", [*submit, job_file("train_health"), *data, "--labels", str(labels), *held_out,
                                    *shlex.split(health_args)]))
    return commands


async def run_round(commands: list[tuple[str, list[str]]]) -> bool:
    """Run each job in turn, printing what it prints; say how a failed one ended. True when all succeeded."""
    env = os.environ | {"PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}
    succeeded = True
    for name, argv in commands:
        began = time.monotonic()
        result = await trio.run_process(argv, capture_stdout=True, capture_stderr=True, check=False, env=env)
        for line in result.stdout.decode(errors="replace").splitlines():
            out.print(escape(line), highlight=False, soft_wrap=True)
        if result.returncode == 0:
            out.print(f"{name}: trained in {time.monotonic() - began:.0f} s", highlight=False)
            continue
        succeeded = False
        for line in result.stderr.decode(errors="replace").splitlines()[-STDERR_TAIL_LINES:]:
            err.print(f"[dim]{escape(line)}[/dim]", highlight=False, soft_wrap=True)
        err.print(f"[red]error:[/red] {name}: the job failed (exit {result.returncode}) after "
                  f"{time.monotonic() - began:.0f} s", highlight=False)
    return succeeded


@runs_client
async def cluster_train(
        tier_config: Annotated[Optional[Path], typer.Option(
            "--tier-config", help="A node's config file: the jobs read the telemetry from, and publish the models to, "
            "the object store it names (tier_backend), as the node does.")] = None,
        telemetry: Annotated[Optional[str], typer.Option(
            "--telemetry", help="The telemetry nodes ship, if not in --tier-config's store: an object store's root or "
            "its telemetry/ prefix (a directory, or a Hadoop URL such as s3a://bucket).")] = None,
        models: Annotated[Optional[str], typer.Option(
            "--models", help="The object store root the models are published under (models/<name>/), if not "
            "--tier-config's store.")] = None,
        labels: Annotated[Optional[Path], typer.Option(
            "--labels", help="Fault runs (benchmarks/faults.py's JSON lines): the health model is trained only "
            "with them.")] = None,
        test_labels: Annotated[Optional[Path], typer.Option(
            "--test-labels", help="Fault runs to hold out for the health model.")] = None,
        master: Annotated[str, typer.Option(
            "--master", help="Spark's master: local[*], local[N], or a cluster's URL (spark://HOST:7077).")
        ] = "local[*]",
        every: Annotated[Optional[str], typer.Option(
            "--every", help="Train again every DURATION (24h, 90m), until stopped; a failed round is reported and "
            "the next one runs.")] = None,
        partitions: Annotated[Optional[int], typer.Option(
            "--partitions", min=1, help="Spark's shuffle partitions and parallelism (a few per core).")] = None,
        placement_args: Annotated[str, typer.Option(
            "--placement-args", help="More options for jobs/train_placement.py, as one string.")] = "",
        health_args: Annotated[str, typer.Option(
            "--health-args", help="More options for jobs/train_health.py, as one string.")] = "",
        spark_submit: Annotated[Optional[Path], typer.Option(
            "--spark-submit", help="The spark-submit to use (default: $SPARK_HOME's, else PySpark's).")] = None,
) -> None:
    """Train the placement forecast (and the health model, given --labels) on Spark; a model serves only when it
    beats the served one on this round's held-out data."""
    try:
        period_s = parse_duration_s(every) if every is not None else None
    except RocketError as error:
        usage_error(f"--every: {error.message}")
    if period_s is not None and period_s <= 0:
        usage_error("--every: must be longer than nothing")
    for option, path in (("--tier-config", tier_config), ("--labels", labels), ("--test-labels", test_labels)):
        if path is not None and not path.is_file():
            usage_error(f"{option} {path}: no such file")
    if test_labels is not None and labels is None:
        usage_error("--test-labels needs --labels")
    if tier_config is None and not (telemetry and models):
        usage_error("give --tier-config (a node's config, naming its object store), or --telemetry and --models")
    try:
        commands = job_commands(find_spark_submit(spark_submit), master, partitions, telemetry, models, tier_config,
                                labels, test_labels, placement_args, health_args)
    except ValueError as error:  # shlex: an unclosed quote
        usage_error(f"--placement-args or --health-args: {error}")
    if labels is None:
        out.print("health: not trained (no --labels: the fault runs it learns from)", highlight=False)
    while True:
        began = time.monotonic()
        succeeded = await run_round(commands)
        if period_s is None:
            if not succeeded:
                fail("training failed (above: the failed job's last lines)", REFUSED)
            return
        wait_s = max(0.0, period_s - (time.monotonic() - began))
        out.print(f"round {'done' if succeeded else 'failed'}; the next in {wait_s:,.0f} s", highlight=False)
        await trio.sleep(wait_s)
