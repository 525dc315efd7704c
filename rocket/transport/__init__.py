"""How calls travel, between clients and nodes and between nodes: the Channel interface, the dispatcher (rpc.py,
with its method table, guard and metering) and the transports that carry its calls (TCP, HTTP/2, HTTP/1.1) and
Raft's links. Every method is defined once, in methods.METHODS: the transports only move bytes.
"""

__all__ = ["background", "channel", "grpc_wire", "guard", "h2_client", "h2_server", "http1", "lifecycle", "links",
           "listen", "metering", "methods", "peer_auth", "pool", "rpc", "tcp", "tcp_client", "tls"]
