"""The nameserver role: the metadata Raft group (topics, assignments, nodes) and the calls that change it. role.py's
Nameserver holds the calls over group.py's MetadataGroup and wires its parts, each with its own state: acl.py,
classes.py, consumer_groups.py, controller.py, forecasts.py, health.py and queues.py. metadata.py is the state machine.
"""

from rocket.roles.nameserver.role import Nameserver

__all__ = ["Nameserver"]
