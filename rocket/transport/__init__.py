"""How calls travel, between clients and nodes and between nodes: the Channel interface, the dispatcher (rpc.py) and
the transports that carry its calls (TCP, HTTP/2, HTTP/1.1) and Raft's links. Every method is defined once, in
rpc.METHODS, and served over TCP and HTTP/2 alike: the transports only move bytes.
"""

__all__ = ["background", "channel", "grpc_wire", "h2_client", "h2_server", "http1", "links", "listen", "peer_auth",
           "pool", "rpc", "tcp", "tcp_client", "tls"]
