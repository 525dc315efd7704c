"""Apache RocketMQ 5's gRPC API (apache.rocketmq.v2.MessagingService), served on the HTTP/2 listener: proxy.py maps
the calls onto the dispatcher, with one part per family (sending, receiving, pulling, telemetry) over the Bridge they
share; with auth on, signature.py verifies each call and authorization.py says what it needs of the policies.
"""

from rocket.gateway.rocketmq.proxy import rocketmq_services

__all__ = ["rocketmq_services"]
