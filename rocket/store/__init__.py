"""The storage state machine and its shell, for every storage group a node hosts.

A storage group's Raft log is its commit log: a batch is written once, inside its Raft entry in the node's WAL.
commands.py holds the entry payloads, decoded into typed commands (Append, CommitOffsets, Cancel, Rearm, PopCommand,
TierCommand, and the KV's Txn). machine.py is StorageMachine, pure: apply(group, entries, positions) returns results
and Effects (index changes, queues to wake), with one handler per command type, plus snapshot and restore.
store.py is the thin shell: it persists Effects in LevelDB (queue_index.py), wakes long polls, and handles backfill,
sync and close. replay.py loads the machine's state from the index at open, and replays once the store's own log
that earlier builds kept (records.py is that log's format). reads.py (reads within a byte budget) and timers.py (due
timers) are mixins of Store; reclaim.py (WAL reclaim) is a part of it of its own, Store.reclaim. meter.py is the
store's numbers for /metrics.
producers.py (idempotent produce), manifest.py (the tier manifest and its commands), pop.py (pop consumption state)
and values.py (the value types) are pure.
kv.py decides KV transactions (pure): compares, puts, deletes, prefix deletes, gets, and the expiry of keys whose
TTL passed by the leader's clock carried in the command; one revision per change, per shard. kv_index.py keeps the
KV state on a LevelDB of its own (storage/kv). Controller-mode groups run the same state machine over their own core.

One log. The WAL is the only log: the store writes LevelDB without sync, one atomic write per Raft round that names
the entry each group applied. A power cut takes LevelDB back to its last synced write, and the groups apply again
from the WAL what came after (the Raft host re-applies from its snapshot, and the machine skips what it holds). So
the WAL may drop an entry only once LevelDB holds it durably: the Raft host syncs the store (Store.sync) before it
writes a snapshot, and WAL reclaim syncs it before it deletes a segment. What is not in a group's log (backfilled
batches, batches moved forward, settled timer batches forgotten) is redone if a power cut loses it.

Snapshots. GroupMachine is one group's replication.StateMachine. Its snapshot is a sequence of chunks (about
limits.snapshot_chunk_bytes_max each): the store's head (the machine's JSON), then the group's KV records, read
through a LevelDB snapshot. It is taken in the event loop's thread at one applied index, and iterated in the Raft
host's snapshot worker thread while the group goes on applying, so it holds a copy, not live state. The Raft host
writes the chunks to a snapshot file; restore gets back the same chunks, read from the file.

Idempotent produce. A produced batch's entry starts with its producer's id and sequence (commands.SEQUENCED_COMMAND),
written only once every other replica's Raft link said a schema version that applies it (Engine.replicas_speak; in a
rolling upgrade the older replicas could not). Each apply writes a PRODUCERS record for the index's rows.

To add a kind of replicated state: a command in commands.py, a handler in machine.py that returns Effects, and, if
it needs persisting beyond the existing records, a record kind in records.py with its replay handler in replay.py.
"""
