"""Every limit in rocket, each with the reason it exists; relations are asserted at import. A new limit goes here with
one line saying why, its unit then `_max`, `_min` or `_default` last in its name, and its relations to the others
asserted at the bottom; tests/unit/test_limits.py checks all three.
"""

from rocket.errors import invariant

KiB = 1024
MiB = 1024 * KiB
GiB = 1024 * MiB

# Batches: the unit of work on the hot path.
batch_bytes_max = 8 * MiB  # one batch is one log record and one RPC body; bounds memory per request
batch_messages_max = 1_000_000  # a count larger than this is a corrupt or hostile header
message_bytes_max = 4 * MiB  # a single message must fit in a batch with room for its header
key_bytes_max = 1 * KiB  # keys are hashed and indexed, not payload
tag_bytes_max = 255  # tags are summarised and filtered on; RocketMQ keeps them short too
properties_bytes_max = 64 * KiB  # properties are decoded for SQL filters; keep that cheap

# Frames on the wire.
frame_bytes_max = batch_bytes_max * 4 // 3 + 64 * KiB  # one batch plus envelope, even base64-encoded in JSON
method_name_bytes_max = 128  # method names are short identifiers
in_flight_requests_per_connection_max = 256  # pipelining depth before the reader stops reading
connections_max = 4096  # open client connections per listener; file descriptors are finite
# A TLS client that has not finished its handshake by then is dropped: a slow or silent one holds a connection slot
# (limits.connections_max), and a handshake takes a few round trips, milliseconds even across regions.
tls_handshake_s_max = 10.0
stream_items_queued_max = 8  # server-stream items waiting for the socket before the producer blocks
http2_streams_per_connection_max = 128  # concurrent HTTP/2 streams per connection (SETTINGS)
tcp_receive_bytes = 256 * KiB  # one read from a TCP connection: many small frames; a large one goes to its own buffer
tcp_send_buffers_max = 64  # buffers per sendmsg, well under IOV_MAX (1024)
frame_joined_bytes_max = 4 * KiB  # a frame with a body this small (no attachment) is encoded into one buffer
frame_shared_buffer_bytes_max = 64 * KiB  # larger frames are received into their own buffer: one copy, no memmove
# A server's large frame gets a buffer this many times what arrived, grown by this factor as it fills (frames.py):
# a claimed length costs nothing until its bytes come, and the copies as it grows add at most 1/(factor - 1) of it.
frame_buffer_growth = 4
# ... or the whole frame, when that is at most this much more: a 1 MiB batch's frame (a few dozen bytes over 1 MiB),
# begun with a read of tcp_receive_bytes, gets one buffer, not a second one and a copy
frame_buffer_slack_bytes = 64 * KiB
frame_spare_buffers_max = 3  # a reusing decoder's buffers: a response being decoded, one pulled ahead, one arriving
http2_receive_bytes = 1 * MiB  # one read from an HTTP/2 connection: a whole DATA frame of ours at a time
# HTTP/2 receive windows. The server gives a stream's window back as its body arrives, up to the body's bound, and
# the connection's only while the connection holds less than http2_connection_held_bytes_max of partly received
# bodies (past it, only its fullest stream gets window, so that one completes and frees its bytes).
http2_stream_window_bytes = 1 * MiB  # a stream's initial window: 64 KiB stalls bulk produce; bigger lets each stream hold more
http2_connection_window_bytes = 8 * http2_stream_window_bytes  # what a client may send on a connection before it hears back
# Partly received request bodies and unread gRPC input one HTTP/2 connection makes the server hold, bytes, before the
# server stops giving it connection window for any but its fullest stream. A connection then holds at most this, plus
# its connection window, plus one body, plus what its other streams' windows still allow (at most a stream window each).
http2_connection_held_bytes_max = 16 * MiB
# The same over all HTTP/2 connections of a node, bytes: past it the connection holding most has its fullest stream
# reset (ENHANCE_YOUR_CALM), until the node holds less. Many hostile connections cannot grow the node past it.
http2_held_bytes_max = 256 * MiB
http2_idle_s_default = 120.0  # an HTTP/2 connection with no open stream this long gets GOAWAY and is closed (slowloris)
# A request body (or one gRPC message) not complete this long after it began gets RST_STREAM (CANCEL): a slow or
# stalled sender holds its bytes no longer. gRPC streams between messages (telemetry, long polls) are not timed.
http2_request_s_default = 60.0
http2_timeout_s_min = 0.1  # the bounds of http2_idle_s and http2_request_s a config may set: shorter is a typo ...
http2_timeout_s_max = 86_400.0  # ... and so is longer than a day
http2_watch_s_max = 1.0  # an HTTP/2 connection looks at its timeouts at least this often: they are that precise
http2_frame_bytes_max = 1 * MiB  # our SETTINGS_MAX_FRAME_SIZE: fewer, larger DATA frames, less per-frame Python work
http2_goodbye_timeout_s = 1.0  # a closing connection waits this long to deliver GOAWAY to a peer that may not read
header_text_chars_max = 1024  # grpc-message and rocket-message: proxies and clients drop very long header values
grpc_message_bytes_max = frame_bytes_max  # one gRPC message, either way: the RPC body bound
grpc_buffered_bytes_max = 2 * grpc_message_bytes_max  # a gRPC stream's unread input, so a peer cannot fill memory
grpc_timeout_s_max = 24 * 3600.0  # a longer grpc-timeout is treated as none worth tracking

# Store.
segment_bytes_default = 256 * MiB  # a sealed segment is the tier's upload unit
log_write_bytes_max = MiB  # a commit log writes a round in calls of at most this many bytes (see CommitLog._write)
segment_bytes_min = 1 * MiB  # smaller segments would turn every batch into a file
segment_bytes_max = 4 * GiB  # the largest segment_bytes a config may set: more is a typo, not a wish
log_record_bytes_max = batch_bytes_max + 64 * KiB  # a log record is one batch plus its routing header
log_reader_fds_max = 64  # open read descriptors on sealed segments; older ones are reopened on demand
direct_log_chunk_bytes = 8 * MiB  # a direct log's cached tail comes in chunks of this size, reused once out of the cache
direct_log_spare_chunks_max = 2  # chunks kept for reuse: a fresh one is zeroed and faulted in page by page
store_sync_s = 1.0  # how often the store's unsynced LevelDB writes are synced in the background
group_commit_bytes_max = 4 * MiB  # one fdatasync covers at most this much, bounding ack latency
group_commit_records_max = 100_000  # and at most this many records per flush
append_queue_bytes_max = 256 * MiB  # appends waiting for a flush before producers are held back
append_queue_wait_s_max = 30.0  # a producer held back longer than this gets OVERLOADED instead of waiting forever
index_replay_records_per_write_max = 10_000  # replay writes the index in chunks so recovery memory stays bounded
read_bytes_max = 8 * MiB  # one pull returns at most this many bytes of batches (or one larger batch)
# Charged against a read's bytes for each batch besides its own: its queue, offset and length (JSON's keys at most
# 60 bytes), so that a pull of many tiny batches fits a frame as a pull of big ones does.
read_batch_overhead_bytes = 64
pull_wait_ms_max = 60_000  # longest long-poll a client may ask for
queues_per_topic_max = 1024  # dev-mode topics; cluster topics spread queues over groups
topic_name_bytes_max = 249  # Kafka's limit; names become file and key prefixes
group_name_bytes_max = 249  # consumer group names become key prefixes too
topics_max = 100_000  # metadata held in memory by the nameserver
filter_expression_bytes_max = 4 * KiB  # a filter is parsed per subscription; longer ones are hostile
filter_skipped_batches_max = 10_000  # batches a filtered read skips by their tag summary before it answers
filters_cached_max = 1024  # compiled filters a broker keeps: subscriptions repeat their expression
error_excerpt_chars_max = 200  # error messages quote what they refuse, but not a 4 KiB filter or path in full
filter_nesting_max = 64  # parentheses and NOT nest at most this deep, so parsing never exhausts the stack
storage_groups_max = 100_000  # Raft groups in one cluster: a node holds 10,000, a cluster a million queues
nodes_max = 1_000  # nodes one cluster registers: a heartbeat of a new node past it is refused, so callers cannot grow
# the metadata and the nameservers' per-node maps (heartbeats, versions, health windows) without end

# Raft.
raft_tick_s = 0.1  # one Raft tick; elections take 10-20 ticks, heartbeats every tick
raft_tick_s_min = 0.01  # the shortest raft_tick_s a config may set: shorter ticks spend the node on timers
raft_tick_s_max = 10.0  # the longest: elections would take minutes
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
raft_wal_segment_bytes_max = 4 * GiB  # the largest wal_segment_bytes a config may set: more is a typo, not a wish
wal_direct_cached_bytes_default = 64 * MiB  # a direct WAL's newest bytes, kept in memory for reads
wal_cached_bytes_max = 2**50  # the largest wal_cached_bytes a config may set: more is a typo
malloc_mmap_threshold_bytes = 32 * MiB  # a node's allocations below this come from malloc's heap (glibc's most) ...
malloc_trim_threshold_bytes = 256 * MiB  # ... and up to this much freed memory stays in each malloc arena: warm pages
malloc_pretouch_bytes = 128 * MiB  # touched at start and kept: a node's first big blocks reuse it, no fresh pages
malloc_pretouch_slice_bytes = 1 * MiB  # touched at a time, after the ready line: a first request waits for one slice at most
# CPython's cyclic collector in `rocket run` (node.tune_collector): a young collection once this many more container
# objects live than at the last one (CPython's default, 700, collected a node's round objects before they were freed,
# and promoted them: 4-10% of a node's CPU under load went to collections, full ones of 40 ms among them)
gc_young_objects = 50_000
gc_older_collections = 20  # young (then middle-aged) collections between two of the next generation
wal_reclaim_s = 5.0  # how often a storage node looks for WAL segments nothing needs any more
wal_reclaim_window_segments = 4  # the oldest segments whose live share decides whether live batches move forward
wal_live_fraction_max = 0.5  # ... when at most this share of them is live: copying costs at most what it frees
wal_rescan_s = 60.0  # a pinned oldest segment is scanned again after this long, or once local data went
raft_wal_segments_max = 8  # sealed WAL segments before a checkpoint rewrites live groups and drops the rest
# ... or WAL bytes since the last checkpoint, whatever the segment size: a restart reads them all, so this bounds
# its replay (about 1 s cold at 250 MB/s on this disk), while a checkpoint, which snapshots every group, stays rare.
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

# Key-value buckets (RIP-22).
kv_key_bytes_max = 4 * KiB  # keys are LevelDB keys and travel in every event and range page
kv_value_bytes_max = 1 * MiB  # a value is one field of one Raft entry; larger state belongs in a topic
kv_txn_bytes_max = 4 * MiB  # keys and values of one transaction: one Raft entry, replicated and applied at once
kv_batch_txns_max = 256  # transactions a broker sends a group's leader at once (one Raft entry), as they came together
kv_txn_ops_max = 128  # compares plus operations of one transaction: one Raft entry applied at once (etcd's default)
kv_range_keys_default = 1000  # keys of one range page when the caller names no limit
kv_range_keys_max = 10_000  # keys of one range page: bounds a response and the time one read holds a shard
kv_range_bytes_max = 4 * MiB  # bytes of keys and values of one range page, so a page of big values fits a frame
kv_shards_max = 256  # shards of one bucket; each is a storage group's share
kv_history_max = 64  # revisions kept per key (NATS KV's bound too)
kv_events_kept_default = 100_000  # revisions of a shard kept for watches that resume; older ones get COMPACTED
kv_watch_events_max = 1000  # events of one watch read: bounds what a slow watcher makes the server hold
kv_watch_wait_ms_max = 30_000  # how long one watch read waits for new events before it answers empty
kv_delete_prefix_keys_max = 1000  # keys one delete_prefix command removes; the broker repeats it until none is left
kv_expire_keys_max = 256  # expired keys one expiry pass proposes deleting, per group
kv_expire_scan_s = 0.25  # how often a group's leader looks for keys past their TTL
kv_ttl_s_max = 10 * 365 * 86_400  # a TTL beyond ten years is a mistake, not a lease
kv_export_idle_s = 60.0  # an export's LevelDB snapshot is let go when no page was asked for this long
kv_exports_max = 16  # exports open at once on a storage node: each pins a LevelDB snapshot (old files stay)

# Timers (delay topics).
timer_tick_s = 0.1  # how often a group leader looks for due timers: delivery is this precise, and better than 1 s
# A loop that sleeps until it has work (due timers, expiring keys, controller-mode groups) looks again at least this
# often anyway: for work that came without a wake-up (a group whose leadership moved here).
idle_recheck_s = 1.0
timer_delay_s_max = 400 * 86_400  # the furthest delivery time accepted: a year and then some, as users ask
timer_batches_cached_bytes_max = 64 * MiB  # decoded timer batches kept: one batch's timers fall due over time
timer_fire_messages_max = 10_000  # due timers one group delivers per round, so a backlog is worked off in bounded steps

transaction_check_poll_s = 1.0  # how often a broker looks for transactions to check back, for a producer listening
transaction_s_min = 0.1  # the bounds of transaction_timeout_s and transaction_check_s a config may set ...
transaction_s_max = 86_400.0  # ... a tenth of a second to a day; outside them is a typo, not a policy
checks_config_max = 1000  # transaction_checks_max and rocketmq_max_attempts: more is a typo, not a policy

# Consumer groups (pull, clustering mode).
group_member_expiry_s = 6.0  # a member that has not heartbeaten (polled) this long leaves the group
group_heartbeat_s = 1.0  # how often a pull consumer heartbeats, from its polls
group_members_max = 1024  # members of one consumer group on one topic; more is a runaway client
group_member_keys_max = 100_000  # (consumer group, topic) pairs with live members on one node; more is a runaway
# Queues whose last append time a storage node keeps, to stamp its queues' appends monotonically; the least recently
# appended goes first, its time folded into one floor that every queue's next stamp stays above.
append_stamp_queues_max = 100_000

# Pop (simple) consumption.
pop_in_flight_per_queue_max = 100_000  # messages of one queue in flight for one group: state kept per message
pop_messages_max = 1024  # messages one receive hands out
pop_attempts_default = 16  # deliveries before a message goes to the dead-letter queue (RocketMQ's maxReconsumeTimes)
pop_invisible_s_max = 12 * 3600  # the longest a received message stays invisible (RocketMQ allows 12 hours)
pop_invisible_s_min = 1.0  # the shortest: a receiver gets a moment to process before the message may reappear
pop_wake_s_min = 0.05  # a waiting receive looks again at least this far apart, though a reappearance is due sooner
# RocketMQ's retry schedule (its delay levels from 1 s): the invisible time after the nth failed delivery.
pop_retry_backoff_s = (1, 5, 10, 30, 60, 120, 180, 240, 300, 360, 420, 480, 540, 600, 1200, 1800, 3600, 7200)
# Consumer-group settings (max attempts, retry backoff, consume mode, FIFO) in the nameservers' metadata (RIP-18).
consumer_groups_max = 10_000  # groups with settings in one cluster: every metadata snapshot carries them all
group_retry_backoff_steps_max = 64  # steps of a group's retry backoff: RocketMQ's delay levels are 18; more is a typo
group_settings_cache_s = 5.0  # a broker reads a group's settings at most this often: an update is in force within it
group_settings_cache_entries_max = 4096  # bounds a broker's cache of group settings; the oldest entry goes first
round_robin_topics_max = 100_000  # a broker's per-topic queue rotations (produce, receive); one dropped starts at queue 0
produce_sticky_batches = 64  # produces to any queue a broker sends to one queue before the next, unless one is answered first
produce_sticky_bytes = 256 * KiB  # a batch this big to any queue moves the next ones to the next queue at once

# RocketMQ gRPC gateway.
rocketmq_receive_answer_margin_s = 1.0  # a long poll answers "not found" this long before the client's deadline expires
rocketmq_receive_slice_s = 5.0  # a long poll asks the broker in slices, each within the broker's storage retries
rocketmq_receive_wait_s_default = 20.0  # RocketMQ's default long-polling timeout, when a request names none
rocketmq_invisible_s_default = 30.0  # RocketMQ's default invisible duration, when a request names none
rocketmq_topic_cache_s = 5.0  # topic types and queue counts are read at most this often per topic (sends need them)
rocketmq_telemetry_topics_max = 256  # transaction topics one Telemetry stream has check-backs forwarded for
rocketmq_topic_cache_entries_max = 4096  # bounds the topic cache; the oldest entry goes first
rocketmq_receive_messages_default = 32  # messages a RocketMQ consumer receives at once, told in its settings
rocketmq_pull_messages_max = 1024  # messages in one PullMessage answer, whatever batch_size asks
rocketmq_pull_bytes_max = 4 * MiB  # bytes read for one PullMessage answer
rocketmq_send_attempts_max = 3  # tries of one send a RocketMQ producer makes, told in its settings: few, as brokers
rocketmq_send_backoff_s_min = 0.01  # ... retry storage themselves; its first wait between tries, later ones double ...
rocketmq_send_backoff_s_max = 1.0  # ... up to this (RocketMQ's own defaults: 3 tries, 10 ms doubling to 1 s)
# A RocketMQ 5 client signs only its x-mq-date-time (MQv2-HMAC-SHA1), and apache/rocketmq's proxy never bounds it:
# neither ACL 1.0 (PlainAccessResource) nor 2.0 (DefaultAuthenticationContextBuilder) checks the time. The Java,
# Python, Go and C# clients format their LOCAL time with a literal Z (only C++ and Node.js sign UTC), so the window
# must admit every zone in use, UTC-12 to UTC+14, on top of a clock error; it still bounds a captured header's replay.
rocketmq_signature_clock_error_s_max = 15 * 60.0  # a signer's clock may be off this far (AWS SigV4's 15 minutes)
# x-mq-date-time may be this far after the gateway's clock (a client at UTC+14) ...
rocketmq_signature_ahead_s_max = 14 * 3600.0 + rocketmq_signature_clock_error_s_max
rocketmq_signature_behind_s_max = 12 * 3600.0 + rocketmq_signature_clock_error_s_max  # ... or this far before (UTC-12)
http1_header_bytes_max = 16 * KiB  # an HTTP/1.1 request's line and headers; longer ones get 431
http1_body_bytes_max = 64 * KiB  # an HTTP/1.1 request's body (the pages served take none); more gets 413
http1_idle_s = 60.0  # an HTTP/1.1 connection with no request for this long is closed (scrapers keep theirs alive)
cluster_secret_chars_min = 16  # a shorter cluster secret is guessable
hello_skew_s = 60.0  # a signed hello (PeerHello, Authenticate) is refused this far from the receiver's clock (NTP)
hello_nonces_max = 100_000  # hello nonces remembered per kind to refuse replays, within twice the skew
user_name_chars_max = 64  # a user's name (its access key)
users_max = 10_000  # users in the metadata: every node holds them all
policies_max = 100_000  # policies in the metadata: every node holds them all, and checks a user's on each call
acl_refresh_s = 1.0  # a node asks for users, policies and quotas again this soon after a failed ask, or while none
acl_recheck_s = 30.0  # ... and this often without a heartbeat saying the metadata changed (which asks at once)
acl_first_wait_s_max = 15.0  # a starting node waits this long for its first users before it says ready regardless
auth_failures_per_minute_max = 30  # refused sign-ins from one source in a minute before it is refused unheard
auth_failures_logged_per_minute = 5  # refusals logged per source and minute; the rest are counted in one line
auth_failure_sources_max = 10_000  # sources whose refusals are counted; the oldest is forgotten first
quotas_max = 10_000  # client quotas in the metadata (user:, user:*, topic: entities): every broker holds them all
quota_buckets_max = 100_000  # token buckets a broker keeps (per user or topic and rate); the least recently used goes
quota_burst_s = 1.0  # a bucket holds this many seconds of its rate: a quiet client may burst that much
quota_throttle_s_max = 30.0  # one answer's throttle time at most (Kafka caps it at its quota window): debt beyond waits
quota_idle_s = 60.0  # a bucket unused this long is full again, as a new one would be: it is dropped
tcp_sniff_bytes = 6  # a connection's first bytes that tell rocket's frames from remoting's (gateway/remoting/codec.py)
tcp_sniff_s_max = 60.0  # a connection that sends fewer bytes than that for this long is closed
# A request frame's first byte to its last, counting only the server's waiting (tcp_frame_s): a slow-sending peer
# (slowloris) holds a connection and a frame's buffer. The largest frame (frame_bytes_max) needs 1.5 Mbit/s for 60 s.
tcp_frame_s_default = 60.0
tcp_frame_s_min = 0.1  # a config's shortest: a loaded node may pause this long between two reads of one frame
tcp_frame_s_max = 3600.0  # ... and its longest: more is no limit
# A TCP connection with no call in flight (a long poll and a stream are calls) this long is closed (tcp_idle_s): its
# slot (connections_max) and socket go back. Pools and failover channels reconnect on their next call.
tcp_idle_s_default = 900.0
tcp_idle_s_min = 0.1  # a config's shortest (tests); a real one is minutes
tcp_idle_s_max = 7 * 86_400.0  # ... and its longest: more is no limit
# Frames not yet whole, held by all a listener's TCP connections together (FrameDecoder.held_bytes); past it the
# connection holding the most is closed (OVERLOADED). 24 of the largest frames arriving at once fit.
tcp_partial_frames_bytes_max = 256 * MiB
remoting_frame_bytes_max = 16 * MiB  # one remoting frame (RocketMQ's own limit): a batch send of 4 MiB messages fits
remoting_header_bytes_max = 64 * 1024 - 1  # a remoting header; longer ones are refused, which keeps the protocols apart
remoting_in_flight_per_connection_max = 256  # requests of one remoting connection served at once (pulls wait)
remoting_topic_cache_s = 5.0  # topic queue counts and live brokers are read at most this often for routes
remoting_topic_cache_entries_max = 4096  # bounds the gateway's topic cache; the oldest entry goes first
remoting_member_refresh_s = 2.0  # connected consumers kept in their groups, and pulled offsets written, this often
remoting_pull_messages_max = 1024  # messages in one pull answer, whatever maxMsgNums asks
remoting_pull_bytes_max = 4 * MiB  # bytes read for one pull answer
remoting_reconsume_times_default = 16  # RocketMQ's maxReconsumeTimes, when a send-back names none
remoting_lock_expiry_s = 60.0  # an orderly consumer's queue lock lapses unless renewed (RocketMQ's rebalance lock)
remoting_transaction_topics_max = 256  # transaction topics whose checks one broker forwards to remoting producers
remoting_locks_max = 100_000  # queue locks one broker holds
remoting_client_groups_max = 10_000  # producer and consumer groups, each, with clients connected to one broker
remoting_unwritten_offsets_keys_max = 100_000  # (group, topic) pairs of pulled offsets a broker holds before they are written
remoting_query_scan_messages_max = 100_000  # messages one QUERY_MESSAGE reads looking for a key (no key index)

# Cluster.
replication_max = 7  # replicas of one group a config may ask for: each is a full copy and a vote
node_heartbeat_s = 1.0  # how often a node reports itself and its load to the nameservers
assignment_ask_s_min = 0.01  # a storage node asked about a group it lacks asks the nameservers at most this often
assignment_wait_s_max = 2.0  # such a call waits this long for the answer, then fails UNAVAILABLE (the broker retries)
node_suspect_s = 3.0  # a node silent this long is suspect: nothing new is placed on it
node_down_s = 10.0  # a node silent this long is down
leader_wait_s_max = 10.0  # a call that needs a leader waits this long for an election before UNAVAILABLE
leader_poll_s = 0.05  # how often such a call looks again
route_ttl_s = 10.0  # a broker refreshes a cached route at least this often, and at once on errors
route_retry_s = 1.0  # ... but while no nameserver answers, it serves the route it has and asks again this often
follower_read_lag_entries_max = 16  # a follower this close to its leader's commit serves reads as a read replica
storage_call_s_max = 8.0  # one storage call (an append waits for a quorum) before the broker tries another replica
storage_append_wait_s_max = 6.0  # an append waits this long to be applied, then the broker retries elsewhere
storage_retry_s_max = 15.0  # a broker retries a storage call on other replicas for at most this long
storage_retry_backoff_s_min = 0.05  # the broker's first wait before trying a group's replicas again; later ones double
storage_retry_backoff_s_max = 0.5  # ... up to this, so a new leader (or master) is found within half a second of its election
storage_silent_s = 10.0  # a storage node that left a call unanswered is asked last by the broker's calls for this long ...
storage_silent_probe_s = 1.0  # ... and given this long to answer: a cut-off leader costs its groups' writers a second,
# not a storage call's timeout each, while the others elect a new one (a write it took is then sent again, numbered)
membership_poll_s = 0.1  # how often a leader looks whether a learner caught up before promoting it
replica_move_retry_s = 0.2  # a nameserver's pause before asking a group's replicas again for a membership change
learner_catch_up_s_max = 5.0  # a promotion waits this long for the learner to catch up, then the mover retries
member_change_s_max = 30.0  # one step of a replica move (on the group's leader) before the move is retried
replica_moves_max = 4  # replica moves the nameserver runs at once: recovery must not swamp the cluster
# The least-loaded placement score, in replicas: a node's hosted replicas count one each, and these add to them.
placement_lead_replicas = 0.5  # a group led weighs half a replica more: the leader serves its writes and most reads
placement_replica_bytes = 64 * GiB  # stored bytes that weigh as much as one replica, so full disks fill last
placement_free_disk_bytes_min = 10 * GiB  # a node with less free disk than this (and some reported) ...
placement_low_disk_replicas = 4.0  # ... weighs this many replicas more: new groups go elsewhere while others can take them
placement_node_weight = 0.5  # queue placement: a group's leader's load (all it leads) weighs half as much as its own
# Controller mode (RIP-44): two-replica groups whose master a controller in the nameservers names.
controller_check_s = 0.25  # how often the nameserver leader looks for controller-mode masters whose heartbeats lapsed
controller_lapse_s = 2.5  # a master silent this long is replaced (from its SyncStateSet): 2.5 missed heartbeats
controller_orphan_heartbeat_s = 0.25  # a node whose controller-mode replica's master went silent heartbeats this often
controller_sync_state_s = 0.2  # how often a master asks the controller for the SyncStateSet changes it wants
model_poll_s = 30.0  # how often a nameserver reads the forecast model again: a new one is in use within this
model_stale_s = 14 * 86_400.0  # a model trained longer ago than this no longer places queues (the fallback does)
placement_explanations_max = 10_000  # topics whose last placement the leader can explain, newest kept
leader_group_bytes_s = 64 * KiB  # leader balancing: a led group weighs this many bytes/s more than its predicted load
leader_balance_ratio = 0.1  # ... nodes within this share of their mean led load are balanced (Kafka: 10%) ...
leader_balance_bytes_s = 128 * KiB  # ... as are nodes within this many bytes/s of each other (2 idle groups)
leader_transfer_s = 2.0  # at most one leadership transfer this often: a transfer pauses the group's writes briefly
load_history_steps = 90  # minutes of traffic per group and topic the nameserver keeps for the forecaster (it reads 60)
load_share_steps = 5  # minutes of its history the leader keeps for a nameserver that did not take them yet
# Storage classes (issue 32): named pools of storage groups, in Raft or controller mode (RIP-44).
storage_classes_max = 64  # classes in one cluster: each is a pool of groups an operator tells apart by name
storage_class_name_bytes_max = 64  # a class's name is carried in every group's info and shown in tables
ha_lag_s_default = 5.0  # a slave further behind its master than this leaves the sync state set
ha_lag_s_min = 0.5  # ... at least: shorter, one slow fsync or pause would shrink the set and stall acks
ha_lag_s_max = 3600.0  # ... at most: a slave an hour behind is no copy to fail over to
elections_kept_max = 200  # the metadata's last controller elections, for describe: every snapshot carries them
# Unhealthy nodes (issue 31): the nameserver leader judges each storage node once per window, from its heartbeats.
health_window_s_default = 10.0  # one judgement per node this often: enough fsyncs and calls in it for a p99 and a rate
health_window_s_min = 1.0  # a config's shortest window: it spans at least one heartbeat of every node
health_window_s_max = 600.0  # ... and its longest: a node slower than this to judge is judged too late to help
health_fsync_p99_s_min = 0.005  # a window's fsync p99 above this may be a slow disk (an SSD syncs in 0.1-2 ms) ...
health_fsync_peer_ratio = 4.0  # ... when it is also this many times the other storage nodes' median p99 (not a slow cluster)
health_fsyncs_min = 20  # a window with fewer fsyncs than this has no p99 to tell: a p99 of three is noise ...
health_fsyncs_few = 5  # ... but from this many on, their median stands for it (a disk slow enough to sync rarely)
health_error_rate_max = 0.2  # a node that fails more than this share of the calls other nodes make to it is unhealthy ...
health_calls_min = 20  # ... if they made this many at least in the window
health_degrade_windows = 3  # unhealthy windows in a row before a node is degraded: one slow window is not a fault
health_recover_windows = 6  # healthy windows in a row before a degraded node returns: twice as long, so it cannot flap
health_move_after_s_default = 600.0  # a node degraded this long has its replicas moved to healthy nodes (a slow disk that lasts)
health_move_after_s_min = 0.0  # 0: at once (tests, and operators who would rather move than wait)
health_move_after_s_max = 7 * 86_400.0  # a longer wait is no policy: pin the node or drain it

# Tier (object store).
object_key_bytes_max = 1 * KiB  # S3's limit for a key (UTF-8); the same keys must work on every backend
object_key_segment_bytes_max = 255  # NAME_MAX: each '/'-separated segment is a file name on the local store
object_bytes_max = 5 * GiB  # S3's limit for a single-part PUT; the tier does no multipart upload
list_objects_max = 1_000_000  # list() returns one list in memory; a prefix holding more is listed in parts
local_store_threads_max = 8  # file operations one local store runs at once; a few keep one disk busy, more only queue
s3_attempts_max = 8  # tries of one S3 call before UNAVAILABLE; with backoff this rides out a restart
s3_retry_s_max = 30.0  # one S3 call, all its tries and waits included, ends by then (UNAVAILABLE)
s3_backoff_s_min = 0.1  # the first wait between tries; later waits double, with full jitter
s3_backoff_s_max = 5.0  # no single wait is longer, so a recovered S3 is noticed soon
s3_connect_timeout_s = 5.0  # a TCP (and TLS) connect to S3 that takes longer counts as a failed try
s3_read_timeout_s = 30.0  # a socket read that waits longer counts as a failed try (S3 itself cuts at ~20 s idle)
s3_list_page_keys = 1000  # keys asked for per ListObjectsV2 page; S3 returns at most 1000
s3_connections_max = 16  # pooled HTTP connections to S3 per store; the offloader and cold reads share them
s3_close_s_max = 5.0  # closing the client (its connection pool) takes at most this long, even when cancelled
tier_piece_bytes_default = 64 * MiB  # an offloaded piece: big enough that PUT overhead vanishes, small enough to re-upload
tier_piece_bytes_min = 1 * KiB  # tests offload tiny pieces; smaller ones would make one object per batch
tier_piece_bytes_max = 1 * GiB  # a piece is built in memory before its PUT
tier_piece_age_s_default = 600.0  # a quiet queue's data is offloaded after this long even if below the piece size
tier_local_retention_s_default = 3 * 86_400.0  # a topic's data stays on local disk this long once offloaded
tier_scan_s = 1.0  # how often a group leader looks for data to offload, expire or drop locally
tier_topics_refresh_s = 5.0  # how often the offloader refreshes topic retention settings from the nameservers
tier_retention_check_s = tier_topics_refresh_s  # the longest a queue's retentions wait to be looked at: they may change
tier_backoff_s_max = 30.0  # after a failed upload a queue waits up to this long (doubling) before trying again
tier_uploads_per_scan_max = 64  # pieces one scan uploads, so a backlog is worked off in bounded steps
tier_pieces_per_queue_max = 1_000_000  # manifest entries of one queue kept in memory and in every snapshot
retention_s_max = 100 * 365 * 86_400  # a retention longer than a century is a typo
cold_cache_bytes_max = 64 * MiB  # fetched ranges of tiered objects a node keeps for cold reads (LRU)
cold_read_ahead_bytes = 4 * MiB  # a cold read fetches at least this much of a piece, so the next reads hit the cache
cold_index_cache_entries_max = 4096  # sidecar indexes kept decoded (LRU): one per piece read recently

# Telemetry (the learning loop): samples spooled on local disk as Avro files, shipped to the object store.
telemetry_interval_s_default = 10.0  # how often a node samples its metrics into the spool
telemetry_interval_s_min = 0.05  # a shorter interval is a typo: each sample looks at every group and moved queue
telemetry_flush_s_max = 5.0  # on shutdown the last sample is spooled and shipped within this; the rest after a restart
telemetry_file_age_s = 60.0  # an open spool file is closed, and so becomes shippable, once this old ...
telemetry_file_bytes_max = 4 * MiB  # ... or once this big
telemetry_spool_bytes_max = 64 * MiB  # a node's spool files together; beyond it the oldest closed files are dropped
telemetry_ship_interval_s = telemetry_file_age_s  # how often the shipper looks for closed files: one closes that often
telemetry_ship_retry_s_max = 300.0  # after failed passes the shipper's wait doubles up to this, so an outage costs little

# Client.
producer_linger_ms_default = 5  # how long a producer waits to fill a batch
producer_batch_bytes_default = 1 * MiB  # bytes after which a producer sends a batch at once
producer_in_flight_batches_max = 64  # batches sent and not yet acknowledged, per producer
# Idempotent produce (store/producers.py): what a storage group remembers of each producer, per queue.
producer_sequences_kept_max = producer_in_flight_batches_max  # the last batches' answers: a retry of any batch in flight
# finds its own; one older than these gets UNKNOWN_SEQUENCE
producer_states_per_group_max = 10_000  # (producer, queue) pairs a storage group remembers; past it the least recently
# used is forgotten (its retries would be stored again), so state is bounded however many producers come and go
producer_state_idle_s_max = 86_400  # a producer silent this long on a queue is forgotten (Kafka's producer.id.expiration)
consumer_pull_bytes_default = 4 * MiB  # bytes a consumer asks for per pull: many batches per round trip
consumer_wait_ms_default = 1000  # how long a consumer's pull waits on empty queues before it polls again
simple_invisible_s_default = 30.0  # RocketMQ's default invisible duration for a received message
simple_receive_messages_default = 32  # messages one SimpleConsumer.receive asks for (RocketMQ's receive batch)
simple_receive_wait_s_default = 5.0  # how long one receive waits for messages to arrive
simple_listener_tasks_default = 16  # messages a push-style listener handles at once
connect_timeout_s = 5.0  # a peer that does not accept a connection by then counts as down
request_timeout_s_default = 30.0  # an RPC without an answer by then fails with TIMEOUT

# The command line.
send_first_batch_bytes = 64 * KiB  # rocket send's first batch for each queue: a short file still reaches every queue
bench_topic_retention_s = 60.0  # what a bench topic made up for one run keeps, once the run is over
bench_probe_bytes_min = 256 * MiB  # the disk probe beside a bench writes at least this much, for a steady figure ...
bench_probe_bytes_max = 4 * GiB  # ... and at most this much (or what the bench sends, between the two)

# Shutdown.
shutdown_grace_s = 10.0  # SIGTERM drains for at most this long before cancelling
shutdown_grace_s_max = 3600.0  # the longest shutdown_grace_s a config may set: an hour; more is a typo

invariant(message_bytes_max < batch_bytes_max, "a message must fit in a batch")
invariant(batch_bytes_max < frame_bytes_max, "a batch must fit in a frame")
invariant(16 * KiB <= http2_frame_bytes_max < 16 * MiB, "RFC 9113 allows SETTINGS_MAX_FRAME_SIZE from 2^14 to 2^24 - 1")
invariant(http2_frame_bytes_max <= http2_stream_window_bytes <= http2_connection_window_bytes < 2**31,
          "a full DATA frame fits a stream's window, a stream's window the connection's, both under RFC 9113's 2^31 - 1")
invariant(http2_connection_window_bytes >= 65_535, "the connection window is only raised from RFC 9113's initial 65,535")
invariant(http2_stream_window_bytes <= frame_bytes_max <= http2_connection_held_bytes_max,
          "a body larger than a stream's window completes as its window is given back, and one body fits a connection's hold")
invariant(http2_connection_held_bytes_max + http2_connection_window_bytes + frame_bytes_max
          + http2_streams_per_connection_max * http2_stream_window_bytes <= http2_held_bytes_max,
          "one connection at its worst stays under the node's bound: only many connections reach it")
invariant(http2_timeout_s_min <= min(http2_idle_s_default, http2_request_s_default)
          and max(http2_idle_s_default, http2_request_s_default) <= http2_timeout_s_max,
          "the default HTTP/2 timeouts are ones a config may set")
invariant(http2_watch_s_max <= http2_request_s_default, "timeouts are looked at well within their length")
invariant(grpc_message_bytes_max + 5 + http2_stream_window_bytes <= grpc_buffered_bytes_max,
          "a gRPC stream's unread input holds a whole message and the window a client may still send past it")
invariant(max(read_bytes_max, batch_bytes_max) * 4 // 3 + 64 * KiB <= frame_bytes_max, "a pull response fits a frame")
invariant(segment_bytes_min <= segment_bytes_default <= segment_bytes_max, "segment sizes are ordered")
invariant(batch_bytes_max < segment_bytes_min * 16, "a batch fits in a segment")
invariant(producer_batch_bytes_default <= batch_bytes_max, "producer batches fit the server limit")
invariant(producer_sequences_kept_max >= producer_in_flight_batches_max,
          "a storage group remembers the answer of every batch a producer may have in flight")
invariant(consumer_pull_bytes_default <= read_bytes_max, "a consumer's pull asks no more than one read returns")
invariant(consumer_wait_ms_default <= pull_wait_ms_max, "a consumer's default wait is one the broker allows")
invariant(simple_invisible_s_default <= pop_invisible_s_max, "the default invisible time is one storage allows")
invariant(simple_receive_messages_default <= pop_messages_max, "a default receive is one pop")
invariant(send_first_batch_bytes <= producer_batch_bytes_default, "rocket send's first batches are smaller ones")
invariant(bench_probe_bytes_min <= bench_probe_bytes_max, "the bench's disk probe bounds are ordered")
invariant(rocketmq_signature_ahead_s_max >= 14 * 3600 and rocketmq_signature_behind_s_max >= 12 * 3600,
          "RocketMQ 5 clients that sign local time labelled Z would be refused in some zones (UTC-12 to UTC+14)")
invariant(raft_heartbeat_ticks < raft_election_ticks, "elections take longer than heartbeats (Config.validate)")
invariant(raft_first_election_ticks < raft_election_ticks, "a new group's first voter asks before the others time out")
invariant(raft_liveness_scan_ticks <= 2 * raft_election_ticks, "the scan runs within the silence (two election timeouts) that wakes a quiet group")
invariant(raft_message_bytes_max <= raft_payload_bytes_max, "an append message of small entries fits one RaftStep payload")
invariant(raft_payload_bytes_max * 4 // 3 + 64 * KiB <= frame_bytes_max, "a Raft payload fits a frame, even in JSON")
invariant(raft_entry_bytes_max <= raft_wal_segment_bytes_min // 4, "one entry fits a WAL record")
invariant(snapshot_chunk_bytes_max * 4 // 3 + 64 * KiB <= frame_bytes_max, "a snapshot fetch fits a frame, even in JSON")
invariant(raft_wal_segment_bytes_min <= raft_wal_segment_bytes_default <= raft_wal_segment_bytes_max, "WAL segment sizes are ordered")
invariant(raft_catch_up_log_bytes_max < raft_wal_replay_bytes_max, "the log a checkpoint rewrites for a group leaves room before the next")
invariant(rocketmq_receive_slice_s < storage_retry_s_max and rocketmq_receive_slice_s * 1000 <= pull_wait_ms_max,
          "a RocketMQ receive's slice is one broker long poll, which ends within the broker's storage retries")
invariant(rocketmq_receive_wait_s_default * 1000 <= pull_wait_ms_max, "RocketMQ's default long poll is one rocket allows")
invariant(rocketmq_invisible_s_default <= pop_invisible_s_max, "RocketMQ's default invisible time is one rocket allows")
invariant(rocketmq_receive_messages_default <= pop_messages_max, "a RocketMQ receive batch is one pop")
invariant(rocketmq_send_backoff_s_min <= rocketmq_send_backoff_s_max, "RocketMQ send backoff bounds are ordered")
invariant(raft_tick_s_min <= raft_tick_s <= raft_tick_s_max, "the default tick is one a config may set")
invariant(shutdown_grace_s <= shutdown_grace_s_max, "the default grace is one a config may set")
invariant(pop_attempts_default <= checks_config_max, "the default rocketmq_max_attempts is one a config may set")
invariant(node_heartbeat_s < node_suspect_s < node_down_s, "liveness states are ordered")
invariant(storage_append_wait_s_max < storage_call_s_max < storage_retry_s_max, "a storage call ends before its retries")
invariant(tier_piece_bytes_min <= tier_piece_bytes_default <= tier_piece_bytes_max, "piece sizes are ordered")
invariant(tier_piece_bytes_max <= object_bytes_max, "a piece is one object")
invariant(read_bytes_max <= cold_cache_bytes_max, "a cold read fits the cache")
invariant(telemetry_file_bytes_max < telemetry_spool_bytes_max, "the spool holds closed files besides the open one")
invariant(telemetry_ship_interval_s <= telemetry_ship_retry_s_max, "a failed pass never shortens the shipper's wait")
invariant(MiB <= malloc_pretouch_slice_bytes <= malloc_pretouch_bytes, "the heap is touched in whole slices of 1 MiB blocks")
invariant(MiB < malloc_mmap_threshold_bytes and malloc_pretouch_bytes < malloc_trim_threshold_bytes,
          "the pretouched blocks come from malloc's heap and stay there once freed")
invariant(kv_value_bytes_max + kv_key_bytes_max < kv_range_bytes_max <= read_bytes_max, "one key and its value fit a range page, and a page fits a response")
invariant(kv_range_keys_default <= kv_range_keys_max, "the default range page is one the server allows")
invariant(kv_watch_events_max <= kv_events_kept_default, "a watch read returns fewer events than a shard keeps")
invariant(kv_value_bytes_max + kv_key_bytes_max < kv_txn_bytes_max < raft_entry_bytes_max, "a put fits a transaction, a transaction one Raft entry")
invariant(health_window_s_min <= health_window_s_default <= health_window_s_max, "the default health window is one a config may set")
invariant(health_window_s_min >= node_heartbeat_s, "a health window holds a heartbeat of every node")
invariant(1 <= health_fsyncs_few < health_fsyncs_min, "a window's median needs fewer fsyncs than its p99")
invariant(health_degrade_windows < health_recover_windows, "a degraded node returns more slowly than it left: no flapping")
invariant(node_heartbeat_s < controller_lapse_s < node_down_s, "a master is replaced after missed heartbeats, before it is down")
invariant(ha_lag_s_min <= ha_lag_s_default <= ha_lag_s_max, "the default sync lag is one a class may set")
invariant(route_retry_s < route_ttl_s, "a route kept through a nameserver outage is asked for again within its life")
invariant(controller_orphan_heartbeat_s < node_heartbeat_s, "a replica without a master asks sooner, not later")
invariant(len(pop_retry_backoff_s) <= group_retry_backoff_steps_max, "rocket's default backoff is one a group may set")
invariant(connect_timeout_s <= tls_handshake_s_max <= tcp_sniff_s_max,
          "a node's own handshake (within connect_timeout_s) ends before a listener drops it, and a TLS client gets no "
          "longer than a plain one to send its first bytes")
invariant(quota_throttle_s_max + quota_burst_s <= quota_idle_s,
          "a bucket idle for quota_idle_s has repaid its deepest debt and refilled: dropping it changes nothing")
invariant(tcp_frame_s_min <= tcp_frame_s_default <= tcp_frame_s_max, "the default frame time is one a config may set")
invariant(tcp_idle_s_min <= tcp_idle_s_default <= tcp_idle_s_max, "the default idle time is one a config may set")
invariant(tcp_idle_s_default >= 10 * pull_wait_ms_max / 1000 and tcp_idle_s_default >= 10 * http1_idle_s,
          "an idle client connection lives well past a long poll's gap and an HTTP/1.1 keep-alive: reconnects stay rare")
invariant(tcp_partial_frames_bytes_max >= 16 * frame_bytes_max and tcp_partial_frames_bytes_max >= 64 * tcp_receive_bytes,
          "many producers' largest frames arrive at once without one being closed")
invariant(disk_reserve_bytes >= 2 * raft_entry_bytes_max + disk_floor_bytes, "a batch that passed the free-space check, and the "
          "bookkeeping after it, fit in the reserve")
invariant(disk_full_retry_s_min <= disk_full_retry_s_max <= disk_probe_s * 4, "retries of a refused write back off "
          "to about as often as the disk is looked at")
invariant(raft_idle_ticks <= raft_election_ticks and raft_liveness_scan_ticks <= 2 * raft_election_ticks,
          "while idle, a node hears each peer's liveness heartbeat at least twice in the 2 election timeouts after "
          "which a scan counts it silent")
invariant(idle_recheck_s < controller_lapse_s, "a controller-mode group's lapsed master is seen by the controller's "
          "idle recheck before its lapse counts")
