"""The broker role: stateless, it speaks the client protocol and carries the message semantics.

role.py wires one mixin per concern. What the modules' own docstrings do not say:
- routes.py serves its cached routes stale while no nameserver answers. A storage node that left a call unanswered
  is asked last by every call for limits.storage_silent_s (a partitioned or hung leader), and given only
  limits.storage_silent_probe_s to answer. DISK_FULL is retried on a group's other replicas. Round-robin turns are
  kept per topic, for the limits.round_robin_topics_max most recently used.
- produce.py numbers the batches of clients that number none with the broker's own producer id. A produce (and a KV put,
  kv.py) whose group this node leads is parked with the storage role in this process (the data plane, rocket/parked.py);
  a produce for another node's leader goes on the open channel to it without a task (routes.py, _parking, _park_storage
  and _forward_parked). Without either it is a task, which takes the turn the parked attempt left untaken. Produces to
  any queue (-1) stick to one queue until one of them is answered (Kafka's sticky partitioner, _produce_queue), so that
  one group's Raft round carries the batches sent meanwhile.
- admin.py's GroupSettings is what gateways call for a consumer group's settings. Receive takes a group's max
  attempts over the request's.
- kv.py parks a KvPut or a KvGet as produce parks an append (routes.py, _parking and _park_storage): with the
  storage role here when this node leads the key's shard, else on the open channel to the shard's leader (a leader
  merges the parked puts of a round into one Raft entry, and serves a get at once while its lease holds:
  roles/storage/kv.py). Without a cached route or an open channel, a put is a task, and the task path sends a
  group's writes in batches, one StorageKvTxn call out at a time per group. It merges ranges across shards, and
  follows watches with tasks in the broker's nursery.
"""

from rocket.roles.broker.role import Broker

__all__ = ["Broker"]
