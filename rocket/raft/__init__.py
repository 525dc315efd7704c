"""Replication: one multi-raft host per node, on one WAL, with two cores.

core.py is the Raft core, shaped like etcd-raft (step, tick, ready, advance; no I/O); what its leader knows of each
follower is progress.py's ProgressTracker, a type of its own (etcd's tracker). controlled.py is the controller-mode core (RIP-44), a subclass of it.
types.py is their vocabulary and codec.py their messages. wal.py is the node's WAL, and snapshots.py the groups'
snapshot files in snapshots/ beside it: the WAL, the core and InstallSnapshot carry only a descriptor. host.py is
the engine's interface (rocket.replication.Engine); snapshot files are served to and fetched from other nodes with
RaftSnapshotChunk, resumable. rounds.py is the host's round loop, compaction.py its log compaction.

Rounds (rounds.py says how they run). Proposals wait in a buffer per group, each with its parked slot
(rocket/parked.py), and a round proposes each group's buffer at once (RaftCore.propose_many: one append per
follower); on_round hooks (the storage role's KV merge) run first. A parked proposal's deadline is swept each tick.
While every group is quiet the ticker wakes every limits.raft_idle_ticks ticks, and at once when one wakes. A direct
WAL's rounds, and a round refused for space, are written by a worker
thread, not the event loop's. That a leader's appends carry only a commit durable rounds justify is the Raft thesis,
10.2.1. A quiet group is not ticked until traffic comes, or its leader is gone. A checkpoint is taken after
limits.raft_wal_segments_max sealed segments or limits.raft_wal_replay_bytes_max bytes of WAL since the last one,
whichever comes first, so that a restart's replay stays bounded.

Elections. A group whose only voter is this node leads as soon as it is added (restarted), and as a follower it
campaigns on its next tick: no election timeout. A new group (one that never held an election) has a first voter,
the voters in turn by group number, that asks for votes every limits.raft_first_election_ticks until one is held,
while the others wait out the usual timeout.

A full disk is an operating error. A round the WAL refuses (ENOSPC) is written again, with backoff, until space
returns: its cores were advanced, so it cannot fail, and nothing of it but a leader's appends is sent before its
fsync. A checkpoint refused is put off. A look at the data disk's free space at ticks (at most every
limits.disk_probe_s) sets disk_refusal under limits.disk_reserve_bytes and clears it when space returns, without a
restart; under limits.disk_floor_bytes every proposal is refused with DISK_FULL.

Compaction. A KV shard's snapshot can be gigabytes, so a group compacts its log only once the log since its last
snapshot is 1/8 of that snapshot's size (limits.raft_snapshot_log_ratio). A leader holds compaction back (up to
limits.raft_catch_up_log_bytes_max of log) while a follower that answers heartbeats is far behind (installing a
snapshot, or catching up after one), and keeps a snapshot file a replica read in the last 30 s past the next
snapshot: a new replica then catches up under heavy writes.

Controller mode (RIP-44). A group's storage class chooses its core; both run on the same host. With core.py a
majority commits and the voters elect. With controlled.py, a controller in the nameservers' metadata
(roles/nameserver/controller.py; its state in metadata.py: per group the master, master_epoch, the SyncStateSet and
sync_state_set_epoch) names the master, and every member of the SyncStateSet must hold an entry before it is
acknowledged. The storage node learns the controller's word from its heartbeat's answer (roles/storage/replicas.py,
_control_of), and as master asks the controller for SyncStateSet changes (_sync_states_forever,
ControllerAlterSyncStateSet). The state machine (store/), the storage role's handlers and the broker do not know
which core a group has: a proposal, a read barrier, "who leads" and "who lags" mean the same on both
(replication.Engine).

Why nothing acknowledged is lost, and why a master cut off from the controller is fenced. One invariant carries it:
every member of the controller's SyncStateSet holds every acknowledged entry.
1. A master acknowledges an entry only once every member of its SyncStateSet holds it durably (persist before send:
   a slave's answer comes after its fsync), and, while a change of the set is asked of the controller, every member
   of the requested set too (the union). This is the fix of apache/rocketmq#5663, where an expansion was applied by
   the controller, its answer lost, and the master went on acknowledging with the old, smaller set.
2. The controller's set changes in two ways only. (a) A master's request, applied only when it names the current
   master_epoch and sync_state_set_epoch (else FENCED): a shrink keeps members who hold everything; a joining
   replica held everything committed when the master asked, and by (1) every later acknowledgement waited for it.
   (b) An election, which picks the new master from the set (so it holds everything, by the invariant) and makes the
   set that master alone, at the next epochs.
3. The fence. A master changes its own set only on the controller's answer. One that cannot reach the controller
   therefore keeps every member it had, and the controller's set is always that set or the one it asked for, until
   an election; an elected successor is a member of it. Before the successor learns it is master, whatever the old
   master acknowledges the successor holds, and keeps: its log becomes the group's. Once it knows, it answers the old
   master's appends with its newer epoch, which deposes it: no acknowledgement without it. So the old master never
   acknowledges alone behind the controller's back, and two masters never acknowledge in the same epoch (the
   controller gives each epoch one master).
4. A slave that meets a new master truncates only past the last entry both logs agree on (the epoch handshake), and
   never below its commit: committed entries are in every later master's log, by the invariant.
5. An unclean election (`--unclean-election`, from outside the set, when no member is up) breaks the invariant on
   purpose; it is recorded with the offsets that may be lost.

The price of the fence: while the controller is unreachable, a master still serves, but cannot drop a slave that
stopped answering, so its writes wait for that slave (ha_max_lag_s passes, the request fails, and writes stall)
until the controller is back or the slave returns. A restarted master keeps its whole durable log (entries past its
commit included) and re-replicates them before new ones are committed; offsets are given at apply, in log order, on
every replica alike, so no two messages share an offset after such a restart (apache/rocketmq#7689).
"""
