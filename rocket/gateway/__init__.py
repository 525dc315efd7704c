"""Protocol adapters onto the dispatcher: they translate other protocols and carry no semantics of their own.
rocketmq/ serves RocketMQ 5's gRPC API on the HTTP/2 listener, remoting/ the classic remoting protocol on the TCP port,
console/ the web console on the HTTP/1.1 listener, mqtt/ MQTT on its own port; both RocketMQ gateways share
properties.py, and reads.py and buckets.py (KV) serve several.
"""

__all__ = ["buckets", "console", "mqtt", "properties", "reads", "remoting", "rocketmq"]
