"""The nameserver role: the metadata Raft group (topics, assignments, nodes) and the calls that change it."""

from rocket.roles.nameserver.role import Nameserver

__all__ = ["Nameserver"]
