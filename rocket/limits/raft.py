"""Limits of Raft and the disk under it: ticks, logs, snapshots, the WAL, the memory allocator and a full disk."""

from rocket.errors import invariant
from rocket.limits.data import batch_bytes_max
from rocket.limits.units import GiB, KiB, MiB

raft_tick_s = 0.1  # one Raft tick; elections take 10-20 ticks, heartbeats every tick
raft_election_ticks = 10  # Config.election_ticks: ticks without a leader before a pre-vote
raft_first_election_ticks = 2  # a group that never held an election (a new one): its first voter asks this often
raft_heartbeat_ticks = 3  # a leader heartbeats three times per election timeout, not ten: thousands of groups
raft_quiesce_ticks = 20  # ticks without work before a leader quiets its group (no ticks, no heartbeats)
raft_liveness_scan_ticks = 10  # how often a node looks for quiet groups whose leader went silent: 1 s at 0.1 s ticks
# While every group a node hosts is quiet, its ticker wakes this many ticks apart (woken at once by a group's work),
# and the node's liveness heartbeats go out as seldom: an idle node then costs a few wake-ups a second, not dozens.
raft_idle_ticks = 10
raft_peers_refresh_ticks = 50  # how often a node recomputes its peer nodes from its groups: membership changes slowly
raft_append_messages_in_flight_max = 64  # Config: append messages sent to one follower and not yet answered
raft_entries_per_message_max = 256  # Config: entries in one append message, so a lagging follower catches up in steps
raft_message_bytes_max = 1 * MiB  # Config: entry bytes in one append message (at least one entry is always sent)
raft_log_entries_max = 2_000  # applied entries a group keeps before it snapshots and compacts its log
raft_log_bytes_max = 16 * MiB  # applied bytes a group keeps in memory before it snapshots and compacts its log
# ... unless they are less than 1/ratio of its last snapshot: a big state (KV) is then written whole at most once per
# that much log, so snapshots write at most ratio times what entries do, and the log held is at most 1/ratio of it.
raft_snapshot_log_ratio = 8
raft_catch_up_log_bytes_max = 4 * raft_log_bytes_max  # log a leader keeps, past its compaction bound, for a follower catching up ...
raft_catch_up_heard_s = 30.0  # ... that answered a heartbeat this recently (installing a big snapshot silences it for seconds)
raft_entry_bytes_max = batch_bytes_max + 64 * KiB  # one proposal: a produce batch and its routing header
raft_round_wait_bytes_max = 512 * KiB  # a node's proposals wait for the fsync that runs until this many bytes wait
raft_wal_segment_bytes_default = 64 * MiB  # WAL segment size: records (entry chunks) are kept under a quarter
raft_wal_segment_bytes_min = 33 * MiB  # ... and the biggest entry must fit such a quarter
wal_direct_cached_bytes_default = 64 * MiB  # a direct WAL's newest bytes, kept in memory for reads
malloc_mmap_threshold_bytes = 32 * MiB  # a node's allocations below this come from malloc's heap (glibc's most) ...
malloc_trim_threshold_bytes = 256 * MiB  # ... and up to this much freed memory stays in each malloc arena: warm pages
malloc_pretouch_bytes = 128 * MiB  # touched at start and kept: a node's first big blocks reuse it, no fresh pages
malloc_pretouch_slice_bytes = 1 * MiB  # touched at a time, after the ready line: a first request waits for one slice at most
# CPython's cyclic collector in `rocket run` (node.tune_collector): a young collection once this many more container
# objects live than at the last one (CPython's default, 700, collected a node's round objects before they were freed,
# and promoted them: benchmarks/RESULTS.md, "The request path and the collector")
gc_young_objects = 50_000
gc_older_collections = 20  # young (then middle-aged) collections between two of the next generation
wal_reclaim_s = 5.0  # how often a storage node looks for WAL segments nothing needs any more
wal_reclaim_window_segments = 4  # the oldest segments whose live share decides whether live batches move forward
wal_live_fraction_max = 0.5  # ... when at most this share of them is live: copying costs at most what it frees
wal_rescan_s = 60.0  # a pinned oldest segment is scanned again after this long, or once local data went
raft_wal_segments_max = 8  # sealed WAL segments before a checkpoint rewrites live groups and drops the rest
# ... or WAL bytes since the last checkpoint, whatever the segment size: a restart reads them all, so this bounds
# its replay, while a checkpoint, which snapshots every group, stays rare.
raft_wal_replay_bytes_max = 256 * MiB
# Free space a node keeps on its data disk: below it, new data (produce, KV puts) is refused with DISK_FULL, so that a
# batch already past the check, and what the node must still write (votes, offsets commits, checkpoints), fit.
disk_reserve_bytes = 32 * MiB
# ... and below this much, every proposal is refused (offsets commits, metadata): what is applied must still fit the
# store's LevelDB, which a full disk would fail in the middle of an apply.
disk_floor_bytes = 8 * MiB
disk_probe_s = 0.5  # a node looks at its data disk's free space at most this often, at Raft ticks (idle: each second)
disk_full_retry_s_min = 0.05  # a WAL write refused for want of space (ENOSPC) is tried again after this, doubling ...
disk_full_retry_s_max = 1.0  # ... up to this: a freed disk is used within a second, and a full one costs no busy loop
raft_outbox_payloads_max = 256  # payloads queued for one peer; beyond this they are dropped, as by a network
raft_payload_bytes_max = 4 * MiB  # one RaftStep payload; a round's messages to a peer are split to fit
raft_link_reconnect_s = 0.2  # pause before reconnecting to a peer that is down
raft_link_silent_s = 5.0  # a link whose posts the peer left unacknowledged this long reconnects (a host gone silently)
snapshot_chunk_bytes_max = 1 * MiB  # one chunk of a group snapshot: what a machine holds at once, and one fetch of its file
snapshot_fetch_attempts_max = 10  # fetches of a snapshot file failing in a row before a replica gives up; Raft sends it again
snapshot_served_keep_s = 30.0  # a snapshot file a replica read this recently outlives its group's next snapshot
snapshot_fetch_retry_s = 0.5  # pause before a failed fetch of a snapshot file is resumed, so a lost peer is not hammered

invariant(raft_heartbeat_ticks < raft_election_ticks, "elections take longer than heartbeats (Config.validate)")
invariant(raft_first_election_ticks < raft_election_ticks, "a new group's first voter asks before the others time out")
invariant(raft_liveness_scan_ticks <= 2 * raft_election_ticks, "the scan runs within the silence (two election timeouts) that wakes a quiet group")
invariant(raft_message_bytes_max <= raft_payload_bytes_max, "an append message of small entries fits one RaftStep payload")
invariant(raft_entry_bytes_max <= raft_wal_segment_bytes_min // 4, "one entry fits a WAL record")
invariant(raft_catch_up_log_bytes_max < raft_wal_replay_bytes_max, "the log a checkpoint rewrites for a group leaves room before the next")
invariant(MiB <= malloc_pretouch_slice_bytes <= malloc_pretouch_bytes, "the heap is touched in whole slices of 1 MiB blocks")
invariant(MiB < malloc_mmap_threshold_bytes and malloc_pretouch_bytes < malloc_trim_threshold_bytes,
          "the pretouched blocks come from malloc's heap and stay there once freed")
invariant(disk_reserve_bytes >= 2 * raft_entry_bytes_max + disk_floor_bytes, "a batch that passed the free-space check, and the "
          "bookkeeping after it, fit in the reserve")
invariant(disk_full_retry_s_min <= disk_full_retry_s_max <= disk_probe_s * 4, "retries of a refused write back off "
          "to about as often as the disk is looked at")
invariant(raft_idle_ticks <= raft_election_ticks and raft_liveness_scan_ticks <= 2 * raft_election_ticks,
          "while idle, a node hears each peer's liveness heartbeat at least twice in the 2 election timeouts after "
          "which a scan counts it silent")
