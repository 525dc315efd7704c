"""Apache RocketMQ 5's gRPC API (apache.rocketmq.v2.MessagingService), served on the HTTP/2 listener."""

from rocket.gateway.rocketmq.proxy import rocketmq_services

__all__ = ["rocketmq_services"]
