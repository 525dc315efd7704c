"""Placement and health scoring: pure cores that take loads and return decisions. placement.py places replicas and
queues and balances leaders, on load.py's predictions (forecast.py's model when there is one); health.py judges
storage nodes. Both models are trees.py's ensembles, with features defined once for the Spark jobs and the node."""

__all__ = ["forecast", "health", "load", "placement", "trees"]
