"""Apache RocketMQ 5's gRPC API (apache.rocketmq.v2.MessagingService), served on the HTTP/2 listener.

proxy.py maps the calls onto the dispatcher (call framing, routes), with one part per family: sending.py,
receiving.py, pulling.py and telemetry.py, each over the Bridge they share (bridge.py: the dispatcher, the protobuf
modules, the topic cache, statuses and messages translated). protocol.py holds the codes and the protobuf modules. With auth on,
signature.py (pure) verifies each call's signature and authorization.py says what the call needs of the policies.
"""

from rocket.gateway.rocketmq.proxy import rocketmq_services

__all__ = ["rocketmq_services"]
