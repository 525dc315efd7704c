"""The storage role: the Raft groups this node hosts, over the node's store."""

from rocket.roles.storage.role import NotHosted, StorageRole

__all__ = ["NotHosted", "StorageRole"]
