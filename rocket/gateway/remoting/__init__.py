"""Apache RocketMQ's classic remoting protocol (4.x and 5.x remoting clients, ali-ons, mqadmin basics) onto the
broker's methods, on the TCP port: server.py runs the connections, codec.py and messages.py are pure, and one part per
concern (naming, producing, consuming, clients, admin) shares the Bridge (bridge.py).
"""

from rocket.gateway.remoting.codec import looks_like_remoting
from rocket.gateway.remoting.server import RemotingGateway

__all__ = ["RemotingGateway", "looks_like_remoting"]
