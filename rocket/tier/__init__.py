"""Tiered storage: the ObjectStore interface and its backends (a local directory; S3 and compatibles).

objectstore.py is the interface, local.py the directory, s3.py S3 through aiobotocore and trio-asyncio. cold.py reads
offloaded pieces, with a cache; the offloader that writes them is roles/storage/offload.py.
The S3 backend imports aiobotocore and trio-asyncio, so it is loaded only when first named.
"""

from rocket.tier.local import LocalDirectoryStore
from rocket.tier.objectstore import ObjectInfo, ObjectStore, check_key, check_prefix

__all__ = ["LocalDirectoryStore", "ObjectInfo", "ObjectStore", "S3ObjectStore", "check_key", "check_prefix",
           "open_s3_store"]


def __getattr__(name: str):
    if name in ("S3ObjectStore", "open_s3_store"):
        from rocket.tier import s3

        return getattr(s3, name)
    raise AttributeError(f"module 'rocket.tier' has no attribute {name!r}")
