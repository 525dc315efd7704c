"""Telemetry (issue 30): the node's metrics registry (registry.py) and its Prometheus families (families.py), the
Avro spool its samples go to (spool.py), the shipper that moves them to the object store under
telemetry/v1/node=N/date=D/ (ship.py), and the task that runs them (runner.py)."""

__all__ = ["families", "registry", "runner", "ship", "spool"]
