"""The nameserver role: the metadata Raft group (topics, assignments, nodes) and the calls that change it. role.py's
Nameserver holds the calls over group.py's MetadataGroup and wires its parts (acl, classes, consumer_groups, controller
or remote_controller, deletes, forecasts, health, queues), each with its own state. metadata.py is the state machine.
"""

from rocket.roles.nameserver.role import Nameserver

__all__ = ["Nameserver", "control", "controller", "group", "metadata"]  # the modules the standalone controller shares
