"""The storage role: the Raft groups this node hosts, over the node's store. role.py's StorageRole wires one mixin per
concern, and checks that a call's group is hosted, or led, here.
"""

from rocket.roles.storage.role import NotHosted, StorageRole

__all__ = ["NotHosted", "StorageRole"]
