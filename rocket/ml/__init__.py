"""Placement and health scoring: pure cores that take loads and return decisions.

placement.py: the Placement interface and least-loaded scoring of replicas, place_queues (new queues onto the groups
with the lowest predicted load), and the leadership transfers the nameserver balances with. load.py: the traffic
history in one-minute steps, and the predictors (the model, or the last ten minutes without one). forecast.py: the
forecaster's features, model file and scorer. trees.py: the tree ensembles both models are made of.

health.py: node health. NodeWindow is what the nameserver measured of a node in one window. FEATURES and
health_features are defined once: the Spark job calls them in its executors, the nameserver to score. Behind the
Scorer interface are the threshold baseline (fsync p99 against the peers' median, call error rate) and ModelScorer,
the trained model (HealthModel: per fault kind a tree ensemble and a probability threshold). HealthJudge degrades a
node after N unhealthy windows and returns it after M healthy ones, only on evidence of what degraded it, with fewer
than half the nodes degraded, and with operators' pins.
"""
