"""Tiered storage: the ObjectStore interface (objectstore.py); backends local.py, s3.py, azure.py, gcs.py, hdfs.py
(the remote ones loaded when named, sharing retries.py); cold.py reads offloaded pieces, keeping what it fetched on
disk (cache.py). The offloader that writes the pieces is roles/storage/offload.py."""

from rocket.tier.local import LocalDirectoryStore
from rocket.tier.objectstore import ObjectInfo, ObjectStore, check_key, check_prefix

__all__ = ["LocalDirectoryStore", "ObjectInfo", "ObjectStore", "S3ObjectStore", "check_key", "check_prefix",
           "open_s3_store", "azure", "cache", "cold", "gcs", "hdfs", "local", "objectstore", "retries", "s3"]


def __getattr__(name: str):
    if name in ("S3ObjectStore", "open_s3_store"):
        from rocket.tier import s3

        return getattr(s3, name)
    raise AttributeError(f"module 'rocket.tier' has no attribute {name!r}")
