"""The nameserver role: the metadata Raft group (topics, assignments, nodes) and the calls that change it. role.py's
Nameserver holds the calls over group.py's MetadataGroup; acl.py, classes.py, consumer_groups.py, controller.py,
forecasts.py and queues.py are parts of their own, health.py a mixin of Nameserver. metadata.py is the state machine.
"""

from rocket.roles.nameserver.role import Nameserver

__all__ = ["Nameserver"]
