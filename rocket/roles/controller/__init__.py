"""The standalone controller role (RIP-44): role.py's ControllerRole holds its calls over its own Raft group, whose
state machine is machine.py's ControllerMachine; the controller's decisions are the nameservers' Controller's.
"""

from rocket.roles.controller.role import ControllerRole

__all__ = ["ControllerRole"]
