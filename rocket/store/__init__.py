"""The storage state machine and its shell, for every storage group a node hosts.

A storage group's Raft log is its commit log: a batch is written once, inside its Raft entry in the node's WAL.
commands.py holds the entry payloads, decoded into typed commands (Append, CommitOffsets, Cancel, Rearm, PopCommand,
TierCommand, and the KV's Txn). machine.py is StorageMachine, pure: apply(group, entries, positions) returns results
and Effects (records to log, index changes, queues to wake), with one handler per command type, plus snapshot and
restore. store.py is the thin shell: it persists Effects in the store's own log (records.py, unsynced) and in
LevelDB (queue_index.py), wakes long polls, and handles backfill, sync and close. replay.py is recovery, with one
handler per record kind. reads.py (reads within a byte budget), timers.py (due timers) and reclaim.py (WAL reclaim)
are mixins of Store. meter.py is the store's numbers for /metrics. producers.py (idempotent produce), manifest.py
(the tier manifest and its commands), pop.py (pop consumption state) and values.py (the value types) are pure.
kv.py decides KV transactions (pure): compares, puts, deletes, prefix deletes, gets, and the expiry of keys whose
TTL passed by the leader's clock carried in the command; one revision per change, per shard. kv_index.py keeps the
KV state on a LevelDB of its own (storage/kv). Controller-mode groups run the same state machine over their own core.

Checkpoints. A sync checkpoints the store's log once it grew by limits.store_log_checkpoint_bytes: the log is
synced, then LevelDB (QueueIndex.sync), and the log's segments below both are deleted. So at open an index ahead
of a cut log is kept (the newer state), and one that needs the deleted log is refused. Replay starts where the index
reached, at or past the last checkpoint, where the log now starts.

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
