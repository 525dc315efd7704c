"""Telemetry (issue 30): the node's metrics registry (registry.py), the Avro spool its samples go to (spool.py), the
shipper that moves them to the object store (ship.py), and the task that runs them (runner.py).

The registry is fed by counters the components keep (the Raft host's fsyncs and WAL bytes, the listeners' Traffic,
queue stats) and by histograms observed once per fsync or peer call. Its samples are TelemetrySample records:
counters with their rates, histograms as each interval's p50 and p99, and per-queue traffic on the group's leader
only. families.py adds the families of issue 34 (node, Raft groups by state, topics, consumer-group lag, tier, KV);
a topic's sums come from store/meter.py. The spool is bounded Avro container files in data_dir/telemetry, rotated by
age and size. Files are shipped under telemetry/v1/node=N/date=D/.
"""
