"""The Spark side of the learning loop: a session, and the telemetry nodes shipped, decoded in the executors.

Telemetry objects are `telemetry/v1/node=<id>/date=<YYYY-MM-DD>/<first_ms>-<last_ms>-<records>.avro` in a node's
object store (rocket/telemetry/ship.py). Read as files from a LocalDirectoryStore (dev mode: DATA_DIR/tier), each is
the Avro bytes then a 24-byte footer (MD5, magic: rocket/tier/local.py); from S3 it is the Avro bytes alone. Given a
node's config, the executors fetch them from its object store with rocket's own client (jobs/tier.py). Spark's Avro
reader is not bundled with pyspark, so fastavro decodes each object inside the executors.
"""

from __future__ import annotations

import fnmatch
import hashlib
import io
import logging
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

from jobs import tier
from rocket.config import NodeConfig
from rocket.telemetry.ship import KEY_PREFIX_DEFAULT, KEY_VERSION
from rocket.tier.local import FOOTER_BYTES, FOOTER_MAGIC

log = logging.getLogger("jobs")

OBJECTS_GLOB = f"{KEY_VERSION}/node=*/date=*/*.avro"  # rocket.telemetry.ship's layout
MASTER_DEFAULT = "local[*]"
ROOT = Path(__file__).resolve().parents[1]  # the tree holding jobs/ and rocket/

# The settings of every session: no UI, and on a local master nothing listens beyond this machine and the
# partitions are few (tasks are what cost on one machine).
CONF = {"spark.ui.enabled": "false", "spark.ui.showConsoleProgress": "false", "spark.sql.session.timeZone": "UTC"}
LOCAL_CONF = {"spark.driver.host": "127.0.0.1", "spark.driver.bindAddress": "127.0.0.1",
              "spark.sql.shuffle.partitions": "2", "spark.default.parallelism": "2"}


def session(master: str | None = None, app: str = "rocket-jobs", conf: dict[str, str] | None = None):
    """A SparkSession on master: local[*] unless given, or under spark-submit the --master it was given (and its
    --conf over the defaults here)."""
    try:
        from pyspark import SparkConf
        from pyspark.sql import SparkSession
    except ImportError:
        raise SystemExit("rocket's jobs run on Spark: pip install 'rocket[ml]' (PySpark and numpy; Spark needs "
                         "Java 17)") from None

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # local executors run this interpreter, rocket on it
    submitted = SparkConf() if "PYSPARK_GATEWAY_PORT" in os.environ else None  # under spark-submit: what it was given
    if master is None and submitted is not None:
        master = submitted.get("spark.master", None)
    master = master or MASTER_DEFAULT
    local = master.startswith("local")
    if local:
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")  # read as the JVM starts (unless spark-submit did)
    # The executors import rocket and jobs: from this tree, unless they are installed.
    paths = [str(ROOT), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    settings = {**CONF, "spark.executorEnv.PYTHONPATH": os.pathsep.join(dict.fromkeys(paths)),
                **(LOCAL_CONF if local else {}), **(conf or {})}
    if submitted is not None:  # spark-submit's --conf wins over these defaults (not over conf, the caller's)
        settings = {key: value for key, value in settings.items() if key in (conf or {}) or not submitted.contains(key)}
    builder = SparkSession.builder.appName(app).master(master)
    for key, value in settings.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    return spark


def objects_glob(spark, telemetry_path: str) -> str:
    """The glob of the telemetry objects under telemetry_path: the telemetry/ prefix itself, or a tier root (an
    object store's root, holding telemetry/). Any Hadoop file system: a local path, file://, s3a://."""
    base = telemetry_path.rstrip("/")
    jvm = spark.sparkContext._jvm
    hadoop_path = jvm.org.apache.hadoop.fs.Path(base + "/telemetry/v1")
    file_system = hadoop_path.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration())
    if file_system.exists(hadoop_path):
        base += "/telemetry"
    return f"{base}/{OBJECTS_GLOB}"


def decode_object(path: str, data: bytes) -> tuple[str, list[dict] | None, str | None]:
    """(path, its TelemetrySample records, None), or (path, None, why) for an object that is not one: a footer whose
    MD5 does not match, or bytes that are not an Avro container of samples. Runs in the executors."""
    import fastavro

    if len(data) >= FOOTER_BYTES and data.endswith(FOOTER_MAGIC):
        body, digest = data[:-FOOTER_BYTES], data[-FOOTER_BYTES:-len(FOOTER_MAGIC)]
        if hashlib.md5(body).digest() != digest:
            return path, None, "fails its MD5 checksum"
        data = body
    try:
        records = list(fastavro.reader(io.BytesIO(data)))
    except Exception as error:  # fastavro raises many kinds on garbage; any of them means the object is unreadable
        return path, None, f"not an Avro file of samples: {type(error).__name__}: {error}"[:300]
    for record in records:
        if not {"time_ms", "node", "metric", "labels", "value"} <= record.keys():
            return path, None, "its records are not TelemetrySamples"
    return path, records, None


@dataclass
class Loaded:
    """What load_telemetry read: the samples, and the objects it skipped (path, why)."""

    samples: object  # RDD[dict]
    objects: int = 0
    corrupt: list[tuple[str, str]] = field(default_factory=list)
    glob: str = ""


def load_telemetry(spark, telemetry: str | NodeConfig) -> Loaded:
    """Every sample under telemetry: a path (see objects_glob) Hadoop's file system reads, or the telemetry/ prefix
    of the object store a node config names (jobs.tier: the executors fetch the objects with rocket's own client).
    Corrupt objects are skipped, counted and logged, not fatal: one torn file must not stop a day's training."""
    sc = spark.sparkContext
    if isinstance(telemetry, NodeConfig):
        prefix = telemetry.tier_key(KEY_PREFIX_DEFAULT)  # where its nodes ship it
        glob = f"{telemetry.tier_backend}:{prefix}{OBJECTS_GLOB}"
        found = [key for key in tier.keys(telemetry, f"{prefix}{KEY_VERSION}/")
                 if fnmatch.fnmatchcase(key, f"{prefix}{OBJECTS_GLOB}")]
        if not found:
            raise SystemExit(f"no telemetry objects in the {telemetry.tier_backend} object store ({glob})")
        partitions = max(sc.defaultParallelism * 4, -(-len(found) // tier.PARTITION_OBJECTS_MAX))
        files = sc.parallelize(found, min(len(found), partitions)).mapPartitions(
            lambda keys: tier.fetch(telemetry, keys))
    else:
        glob = objects_glob(spark, telemetry)
        files = sc.binaryFiles(glob)
    try:
        decoded = files.map(lambda item: decode_object(*item)).persist()
        summary = decoded.map(lambda item: (item[0], item[2])).collect()  # small: one row per object
    except Exception as error:  # py4j wraps the JVM's "Input path does not match"
        if "matches 0 files" in str(error) or "does not exist" in str(error) or "not match" in str(error):
            raise SystemExit(f"no telemetry objects under {telemetry} ({glob})") from None
        raise
    corrupt = sorted((path, why) for path, why in summary if why is not None)
    for path, why in corrupt:
        log.warning("telemetry: skipping %s: %s", path, why)
    samples = decoded.flatMap(lambda item: item[1] or ())
    return Loaded(samples=samples, objects=len(summary), corrupt=corrupt, glob=glob)


def load_samples(spark, telemetry_path: str):
    """RDD[dict] of the TelemetrySample records under telemetry_path (corrupt objects skipped: load_telemetry
    says which)."""
    return load_telemetry(spark, telemetry_path).samples
