"""MQTT 3.1.1 and 5.0 for devices (issue 57): the gateway (server.py, connection.py, delivery.py, batcher.py) maps
packets (packets.py, read and written sans I/O by codec.py) onto the broker's methods (mapping.py), with sessions and
retained messages in KV (session.py); idle connections wait without a task of their own (parking.py)."""

__all__ = ["batcher", "codec", "connection", "delivery", "mapping", "packets", "parking", "server", "session"]
