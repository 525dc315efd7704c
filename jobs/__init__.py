"""rocket's offline jobs (PySpark): telemetry to feature tables, and the models trained on them (issue 30).

jobs/ imports rocket (the features and the model format are rocket.ml's); rocket never imports jobs or pyspark.
"""
