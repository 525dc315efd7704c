"""The storage role: the Raft groups this node hosts, over the node's store. role.py's StorageRole routes each call to
a part, one per concern; gate.py checks that a call's group is hosted, or led, here.
"""

from rocket.roles.storage.gate import NotHosted
from rocket.roles.storage.role import StorageRole

__all__ = ["NotHosted", "StorageRole"]
