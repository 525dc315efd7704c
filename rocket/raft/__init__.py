"""Replication: one multi-raft host per node (host.py, with its round loop, planner and compaction), on one WAL
(wal.py, with snapshots.py's files beside it), with two cores: Raft (core.py, shaped like etcd-raft: no I/O) and
controller mode (controlled.py, RIP-44), whose ControlledCore argues why nothing acknowledged is lost."""

__all__ = ["host", "wal"]
