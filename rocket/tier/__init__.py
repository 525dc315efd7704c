"""Tiered storage: the ObjectStore interface (objectstore.py) and its backends, a local directory (local.py), S3 and
compatibles (s3.py), Azure Blob (azure.py), GCS (gcs.py) and HDFS (hdfs.py), the remote ones loaded when named;
cold.py reads offloaded pieces, with a cache (the offloader that writes them is roles/storage/offload.py)."""

from rocket.tier.local import LocalDirectoryStore
from rocket.tier.objectstore import ObjectInfo, ObjectStore, check_key, check_prefix

__all__ = ["LocalDirectoryStore", "ObjectInfo", "ObjectStore", "S3ObjectStore", "check_key", "check_prefix",
           "open_s3_store", "azure", "cold", "gcs", "hdfs", "local", "objectstore", "s3"]


def __getattr__(name: str):
    if name in ("S3ObjectStore", "open_s3_store"):
        from rocket.tier import s3

        return getattr(s3, name)
    raise AttributeError(f"module 'rocket.tier' has no attribute {name!r}")
