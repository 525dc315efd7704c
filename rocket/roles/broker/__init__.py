"""The broker role: stateless, it speaks the client protocol and carries the message semantics."""

from rocket.roles.broker.role import Broker

__all__ = ["Broker"]
