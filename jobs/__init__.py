"""rocket's offline jobs (PySpark): telemetry to feature tables, and the models trained on them (issue 30).

jobs/ imports rocket (the features and the model format are rocket.ml's); rocket never imports jobs or pyspark.

spark.py opens the session (local[*] unless spark-submit gives a master) and reads the telemetry objects with
binaryFiles, decoded with fastavro in the executors; a corrupt object is skipped and counted. features.py writes the
Parquet tables queues/, groups/ and nodes/, per minute. train_placement.py (the load forecaster, under
models/forecast/) and train_health.py (the node-health model, under models/health/) train, check their export
against Spark's own predictions, and put the model to the object store; models.py is what both share. health_data.py
turns the node-health windows the nameserver notes in its telemetry, and benchmarks/faults.py's labels, into
training data (pure, called in the executors).
"""
