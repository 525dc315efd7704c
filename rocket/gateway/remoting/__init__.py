"""Apache RocketMQ's classic remoting protocol (4.x and 5.x remoting clients, ali-ons, mqadmin basics) onto the
broker's methods.

It is served on the TCP port: transport/tcp.py hands a connection over by its first bytes
(codec.looks_like_remoting). codec.py (frames, headers, request and response codes) and messages.py (message
layouts, ids, delay levels) are pure; server.py runs the connections. One part per concern: naming.py (routes),
producing.py, consuming.py, clients.py, admin.py, over the Bridge they share (bridge.py: the dispatcher, the topic
cache, lookups of queues and messages). With auth on, signature.py (pure) and authorization.py check each
request.
"""

from rocket.gateway.remoting.codec import looks_like_remoting
from rocket.gateway.remoting.server import RemotingGateway

__all__ = ["RemotingGateway", "looks_like_remoting"]
