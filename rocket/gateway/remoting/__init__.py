"""Apache RocketMQ's classic remoting protocol (4.x and 5.x remoting clients, mqadmin) onto the broker's methods."""

from rocket.gateway.remoting.codec import looks_like_remoting
from rocket.gateway.remoting.server import RemotingGateway

__all__ = ["RemotingGateway", "looks_like_remoting"]
