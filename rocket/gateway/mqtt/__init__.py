"""MQTT 3.1.1 and 5.0 for devices (issue 57): codec.py is the protocol's packets, sans I/O; the gateway that maps
them onto the broker's methods comes next."""

__all__ = ["codec"]
