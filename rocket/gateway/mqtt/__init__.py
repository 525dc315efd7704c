"""MQTT 3.1.1 and 5.0 for devices (issue 57): packets.py holds the protocol's packets, codec.py reads and writes them,
sans I/O; the gateway that maps them onto the broker's methods comes next."""

__all__ = ["codec", "packets"]
