"""Telemetry (issue 30): the node's metrics registry (registry.py), the Avro spool its samples go to (spool.py), the
shipper that moves them to the object store (ship.py), and the task that runs them (runner.py)."""
