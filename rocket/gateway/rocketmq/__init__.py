"""Apache RocketMQ 5's gRPC API (apache.rocketmq.v2.MessagingService), served on the HTTP/2 listener.

proxy.py maps the calls onto the dispatcher (call framing, routes), with one mixin per family: sending.py,
receiving.py, pulling.py and telemetry.py. protocol.py holds the codes and the protobuf modules. With auth on,
signature.py (pure) verifies each call's signature and authorization.py says what the call needs of the policies.
"""

from rocket.gateway.rocketmq.proxy import rocketmq_services

__all__ = ["rocketmq_services"]
