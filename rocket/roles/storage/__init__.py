"""The storage role: the Raft groups this node hosts, over the node's store.

role.py wires one mixin per concern. What the modules' own docstrings do not say:
- replicas.py saves the assignment (assignment.py) whenever its groups or nodes change, written whole (a temporary,
  fsync, rename, directory fsync), and hosts its groups from it at start: a node restarted while no nameserver
  answers rejoins its groups and is ready. For controller-mode groups it takes the controller's word from the
  assignment, sends the masters' SyncStateSet requests, and heartbeats every limits.controller_orphan_heartbeat_s
  (0.25 s) while a replica's master is silent.
- appends.py refuses produce, and kv.py KV puts, with DISK_FULL while the host's disk_refusal is set; offsets
  commits and acks go on, from the reserve. kv.py also serves exports.
- Every per-key map that clients can grow has a bound in limits.py, or a comment saying what bounds it. For example,
  append times are kept for at most limits.append_stamp_queues_max queues, the least recently appended dropped into
  a floor.
"""

from rocket.roles.storage.role import NotHosted, StorageRole

__all__ = ["NotHosted", "StorageRole"]
