"""The broker role: stateless, it speaks the client protocol and carries the message semantics. role.py's Broker
routes each method to one part (admin, produce, pull, pop, groups, kv); the parts share routes.py's Routes.
"""

from rocket.roles.broker.role import Broker

__all__ = ["Broker"]
