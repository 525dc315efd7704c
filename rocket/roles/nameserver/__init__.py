"""The nameserver role: the metadata Raft group (topics, assignments, nodes) and the calls that change it. role.py's
Nameserver holds the calls over group.py's MetadataGroup; acl.py, consumer_groups.py and controller.py are parts of
their own, and classes.py, queues.py and health.py mixins of Nameserver. metadata.py is the state machine.
"""

from rocket.roles.nameserver.role import Nameserver

__all__ = ["Nameserver"]
