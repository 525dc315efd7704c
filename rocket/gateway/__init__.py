"""Protocol adapters onto the dispatcher, with no semantics of their own: rocketmq/ (gRPC, on HTTP/2), remoting/ (the
TCP port), console/ (HTTP/1.1), mqtt/ (its own port); reads.py, properties.py and buckets.py serve several."""

__all__ = ["buckets", "console", "mqtt", "properties", "reads", "remoting", "rocketmq"]
