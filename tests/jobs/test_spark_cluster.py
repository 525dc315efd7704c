"""The learning loop on a real Spark cluster (issue 56): a standalone master and two workers on 127.0.0.1, started
with PySpark's own bin/spark-class, train both models through `rocket cluster train --master spark://...`, which hands
the jobs to spark-submit. They read the telemetry from a node's S3 tier (moto) with rocket's own client and publish
there; the models equal those the same jobs train on the local session (local[1]) from a local copy of the same
telemetry, and each is promoted. Then once more through Hadoop's s3a:// connector, as a deployment without
--tier-config reads the store."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
import time
import tomllib
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

pyspark = pytest.importorskip("pyspark")
pytestmark = pytest.mark.slow

from jobs import tier, train_health, train_placement  # noqa: E402
from jobs.tier import tier_of  # noqa: E402
from rocket.transport.listen import free_ports  # noqa: E402
from tests.integration.test_tier_objectstore import SAFE_ENVIRONMENT, MotoServer  # noqa: E402
from tests.jobs.test_train_health import write_data  # noqa: E402

SAMPLE = Path(__file__).parent / "data" / "tier"  # test_jobs.py's: a real dev node's telemetry
SPARK_CLASS = Path(pyspark.__file__).parent / "bin" / "spark-class"
PLACEMENT_ARGS = "--horizon-steps 2 --max-iter 8 --max-depth 3"
HEALTH_ARGS = "--max-iter 10"
VOLATILE = {"model_version", "trained_at_ms", "decided_at_ms"}  # the time of a run
# hadoop-aws and the AWS SDK it was built with, which ./test fetches into $ROCKET_S3A_JARS (no Maven on the test
# machines: the jars come from the sdist of sagemaker_pyspark, which bundles Apache's).
S3A_JARS = ("hadoop-aws-3.3.1.jar", "aws-java-sdk-bundle-1.11.901.jar")
# hadoop-aws 3.3.1 under PySpark's newer Hadoop, whose defaults it cannot read: numbers where those say "60s", and the
# SDK v1 credential provider where they name v2's. A deployment would take the hadoop-aws of Spark's own Hadoop
# (spark-submit --packages org.apache.hadoop:hadoop-aws:<version>) and need none of these.
S3A_OLDER_HADOOP = {"threads.keepalivetime": "60", "connection.establish.timeout": "5000",
                    "connection.timeout": "200000", "multipart.purge.age": "86400", "connection.ttl": "300000",
                    "connection.acquisition.timeout": "60000", "connection.idle.time": "60000",
                    "connection.request.timeout": "0", "multipart.size": "67108864",
                    "multipart.threshold": "134217728", "block.size": "33554432", "readahead.range": "65536",
                    "aws.credentials.provider": "org.apache.hadoop.fs.s3a.SimpleAWSCredentialsProvider"}


@pytest.fixture(scope="module")
def standalone(tmp_path_factory):
    """A standalone master and two one-core workers on 127.0.0.1; the master's URL, once both workers joined."""
    base = tmp_path_factory.mktemp("spark-cluster")
    port, master_ui, *worker_uis = free_ports(4)
    env = os.environ | SAFE_ENVIRONMENT | {"SPARK_LOCAL_IP": "127.0.0.1", "SPARK_LOG_DIR": str(base),
                                           "SPARK_NO_DAEMONIZE": "1", "PYSPARK_PYTHON": sys.executable}
    url = f"spark://127.0.0.1:{port}"
    logs = [open(base / f"{name}.log", "wb") for name in ("master", "worker1", "worker2")]
    processes = [subprocess.Popen([str(SPARK_CLASS), "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                                   "--port", str(port), "--webui-port", str(master_ui)],
                                  env=env, stdout=logs[0], stderr=subprocess.STDOUT)]
    try:
        for number, ui in enumerate(worker_uis, 1):
            processes.append(subprocess.Popen(
                [str(SPARK_CLASS), "org.apache.spark.deploy.worker.Worker", url, "--host", "127.0.0.1", "--cores", "1",
                 "--memory", "1g", "--webui-port", str(ui), "--work-dir", str(base / f"work{number}")],
                env=env, stdout=logs[number], stderr=subprocess.STDOUT))
        deadline = time.monotonic() + 120
        while True:
            assert all(process.poll() is None for process in processes), (base / "master.log").read_text()
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{master_ui}/json/", timeout=5) as answer:
                    if json.load(answer).get("aliveworkers") == 2:
                        break
            except OSError:
                pass
            assert time.monotonic() < deadline, "the workers did not join the master in 120 s"
            time.sleep(0.5)
        yield url
    finally:
        for process in processes:
            process.terminate()
        for process in processes:
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()
        for log in logs:
            log.close()


@pytest.fixture(scope="module")
def telemetry(tmp_path_factory) -> tuple[Path, Path, Path]:
    """One tier holding the sample node's telemetry and the health windows; the fault runs to train and test on."""
    base = tmp_path_factory.mktemp("telemetry")
    shutil.copytree(SAMPLE, base / "tier")
    write_data(base, reporters=(91, 92))
    return base / "tier", base / "train.jsonl", base / "test.jsonl"


@pytest.fixture(scope="module")
def s3_node(tmp_path_factory, telemetry) -> Iterator[Path]:
    """A node's config naming an S3 tier (moto, with a key prefix as S3 tiers have), holding the telemetry."""
    base = tmp_path_factory.mktemp("s3")
    server = MotoServer(free_ports(1)[0], base / "moto.log")
    server.buckets = ["tier"]
    server.start()
    config = base / "storage1.toml"
    config.write_text(f'tier_backend = "s3"\ntier_s3_endpoint = "{server.url}"\ntier_s3_bucket = "tier"\n'
                      'tier_s3_prefix = "prod"\n')
    saved = dict(os.environ)
    os.environ.update(SAFE_ENVIRONMENT)
    try:
        local, s3 = tier_of(str(telemetry[0]), None), tier_of(None, str(config))
        assert local is not None and s3 is not None
        shipped = tier.keys(local, "telemetry/")
        tier.put(s3, {f"prod/{key}": data for key, data in tier.fetch(local, shipped)})
        yield config
    finally:
        os.environ.clear()
        os.environ.update(saved)
        server.stop()


def train(master: str, where: list[str], telemetry: tuple[Path, Path, Path], env: dict[str, str] | None = None
          ) -> subprocess.CompletedProcess:
    _, labels, test_labels = telemetry
    done = subprocess.run([sys.executable, "-m", "rocket", "cluster", "train", "--master", master, "--partitions", "2",
                           *where, "--labels", str(labels), "--test-labels", str(test_labels),
                           "--placement-args", PLACEMENT_ARGS, "--health-args", HEALTH_ARGS],
                          capture_output=True, text=True, timeout=600,
                          env=os.environ | SAFE_ENVIRONMENT | {"COLUMNS": "200"} | (env or {}))
    assert done.returncode == 0, done.stdout + done.stderr
    return done


@pytest.fixture(scope="module")
def on_cluster(standalone, telemetry, s3_node) -> subprocess.CompletedProcess:
    """Both models trained on the cluster from the node's S3 tier, through --tier-config, and published there."""
    return train(standalone, ["--tier-config", str(s3_node)], telemetry)


def published(store, name: str, prefix: str = "") -> tuple[dict, dict]:
    latest, decision = (tier.get(store, f"{prefix}models/{name}/{file}") for file in ("latest.json", "decision.json"))
    assert latest is not None and decision is not None
    return json.loads(latest), json.loads(decision)


def assert_same(ours: object, theirs: object, where: str = "") -> None:
    """Equal but for the run's time; floats to 1e-9 (Spark sums a partition's figures in its own order)."""
    if isinstance(ours, dict) and isinstance(theirs, dict):
        assert set(ours) == set(theirs), where
        for key in set(ours) - VOLATILE:
            assert_same(ours[key], theirs[key], f"{where}.{key}")
    elif isinstance(ours, list) and isinstance(theirs, list):
        assert len(ours) == len(theirs), where
        for index, (one, other) in enumerate(zip(ours, theirs)):
            assert_same(one, other, f"{where}[{index}]")
    elif isinstance(ours, float) and isinstance(theirs, float) and not (math.isnan(ours) and math.isnan(theirs)):
        assert ours == pytest.approx(theirs, rel=1e-9, abs=1e-12), where
    elif not (isinstance(ours, float) and isinstance(theirs, float)):
        assert ours == theirs, where


def test_both_models_train_on_a_standalone_cluster_as_they_do_locally(spark, on_cluster, telemetry, s3_node,
                                                                       tmp_path, monkeypatch):
    print(on_cluster.stdout)
    # The same jobs on the local session (tests/jobs/conftest.py), on the local copy of the telemetry.
    tier_dir, labels, test_labels = (str(path) for path in telemetry)
    local = str(tmp_path / "local")
    placement_args = train_placement.parse(["--telemetry", tier_dir, "--models", local, *PLACEMENT_ARGS.split()])
    health_args = train_health.parse(["--telemetry", tier_dir, "--models", local, "--labels", labels, "--test-labels",
                                      test_labels, *HEALTH_ARGS.split()])
    locally = {"forecast": train_placement.run(spark, placement_args).decision,
               "health": train_health.run(spark, health_args, train_health.load_labels(labels),
                                          train_health.load_labels(test_labels)).decision}
    for name, value in SAFE_ENVIRONMENT.items():
        monkeypatch.setenv(name, value)
    s3, local_store = tier_of(None, str(s3_node)), tier_of(local, None)
    for name in ("forecast", "health"):
        cluster_model, cluster_decision = published(s3, name, "prod/")  # where the node's nameservers read it
        local_model, local_decision = published(local_store, name)
        assert_same(cluster_model, local_model, name)
        assert cluster_model["model_version"].split("-")[1] == local_model["model_version"].split("-")[1]  # the trees'
        assert local_decision == locally[name]
        for decision, model in ((cluster_decision, cluster_model), (local_decision, local_model)):
            assert decision["promoted"] and decision["reason"] == "no model was served"
            assert decision["model_version"] == model["model_version"]
        assert (f"{name}: model {cluster_model['model_version']} promoted: no model was served"
                in on_cluster.stdout)


def test_the_jobs_read_and_publish_through_s3a_as_with_the_tier_config(standalone, on_cluster, telemetry, s3_node,
                                                                        tmp_path, monkeypatch):
    """spark-submit configured as a deployment would (spark-defaults.conf in SPARK_CONF_DIR: the connector's jars and
    the store's endpoint), the jobs given s3a:// URLs: they read the node's telemetry and publish both models under
    another prefix, equal to those --tier-config's round published."""
    jars = [Path(os.environ.get("ROCKET_S3A_JARS", "/nonexistent")) / name for name in S3A_JARS]
    if not all(jar.is_file() for jar in jars):
        if os.environ.get("CI") == "true":
            pytest.fail(f"no {' and '.join(S3A_JARS)} in $ROCKET_S3A_JARS: ./test fetches them")
        pytest.skip("hadoop-aws is not fetched (./test puts it in $ROCKET_S3A_JARS)")
    endpoint = tomllib.loads(s3_node.read_text())["tier_s3_endpoint"]
    settings = {"endpoint": endpoint, "path.style.access": "true", "connection.ssl.enabled": "false",
                "access.key": SAFE_ENVIRONMENT["AWS_ACCESS_KEY_ID"],
                "secret.key": SAFE_ENVIRONMENT["AWS_SECRET_ACCESS_KEY"]} | S3A_OLDER_HADOOP
    conf = tmp_path / "conf"
    conf.mkdir()
    (conf / "spark-defaults.conf").write_text(f"spark.jars {','.join(map(str, jars))}\n" + "".join(
        f"spark.hadoop.fs.s3a.{key} {value}\n" for key, value in settings.items()))
    through_s3a = train(standalone, ["--telemetry", "s3a://tier/prod", "--models", "s3a://tier/s3a"], telemetry,
                        env={"SPARK_CONF_DIR": str(conf)})
    for name, value in SAFE_ENVIRONMENT.items():
        monkeypatch.setenv(name, value)
    s3 = tier_of(None, str(s3_node))
    for name in ("forecast", "health"):
        model, decision = published(s3, name, "s3a/")
        assert_same(model, published(s3, name, "prod/")[0], name)
        assert decision["promoted"] and decision["reason"] == "no model was served"
        assert f"{name}: model {model['model_version']} promoted: no model was served" in through_s3a.stdout
