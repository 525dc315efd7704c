"""Limits of messages and batches, and of the store: its commit logs, group commit, reads, names and filters."""

from rocket.errors import invariant
from rocket.limits.units import GiB, KiB, MiB

batch_bytes_max = 8 * MiB  # one batch is one log record and one RPC body; bounds memory per request
batch_messages_max = 1_000_000  # a count larger than this is a corrupt or hostile header
message_bytes_max = 4 * MiB  # a single message must fit in a batch with room for its header
key_bytes_max = 1 * KiB  # keys are hashed and indexed, not payload
tag_bytes_max = 255  # tags are summarised and filtered on; RocketMQ keeps them short too
properties_bytes_max = 64 * KiB  # properties are decoded for SQL filters; keep that cheap
segment_bytes_default = 256 * MiB  # a sealed segment is the tier's upload unit
log_write_bytes_max = MiB  # a commit log writes a round in calls of at most this many bytes (see CommitLog._write)
segment_bytes_min = 1 * MiB  # smaller segments would turn every batch into a file
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
read_replicas_max = 4  # learners a topic may ask each of its storage groups to keep for its reads
topic_name_bytes_max = 249  # Kafka's limit; names become file and key prefixes
namespace_bytes_max = 64  # a namespace prefixes every name in it: NAMESPACE%topic must still fit a topic's limit
group_name_bytes_max = 249  # consumer group names become key prefixes too
topics_max = 100_000  # metadata held in memory by the nameserver
# A deleted topic's groups refuse appends to its name (a produce that raced the delete) until it is made again, or
# this long: far past a broker's cached route (route_ttl_s) and a produce's retries.
topic_tombstone_s = 600
topic_delete_retry_s = 5  # the nameserver leader retries a delete a storage group did not answer
# A topic moving to another storage class: its queues are copied in reads of this many bytes, in rounds while
# producers still write to the old groups, until a round leaves less than class_move_tail_bytes per queue to copy
# once the old groups are sealed (produces wait for that: the move's stall). The old groups drop their copies this
# long after the switch, so that a broker's cached route (route_ttl_s) reads them until it learns the new one.
class_move_read_bytes = 4 * MiB
class_move_tail_bytes = 256 * KiB  # what is left to copy of a queue when the old groups are sealed: the stall's part
class_move_drop_grace_s = 15.0  # past route_ttl_s: brokers with the old route still read the old groups meanwhile
request_id_bytes_max = 128  # a create's request id, kept in the metadata: a client's random 16 bytes in hex need 32
create_requests_kept_max = 10_000  # creates' request ids the metadata remembers (a retry gets the first answer)
filter_expression_bytes_max = 4 * KiB  # a filter is parsed per subscription; longer ones are hostile
filter_skipped_batches_max = 10_000  # batches a filtered read skips by their tag summary before it answers
find_messages_max = 1024  # messages one FindMessages answers, whatever its limit asks
key_index_step_bytes = 1 * MiB  # batches the key indexer reads and indexes in one step, in the node's idle time
key_index_scan_entries_max = 10_000  # index entries one key indexer step looks through for batches to index
# The key indexer, caught up with every queue still appended to, rests this long: its next steps then each take up
# that much of the appends, not a step (a LevelDB scan) per idle moment; lookups read whole what it has not reached
key_index_rest_s = 0.1
find_batches_max = 256  # batches one key lookup on a storage node reads (those its key index names) before it answers
filters_cached_max = 1024  # compiled filters a broker keeps: subscriptions repeat their expression
error_excerpt_chars_max = 200  # error messages quote what they refuse, but not a 4 KiB filter or path in full
filter_nesting_max = 64  # parentheses and NOT nest at most this deep, so parsing never exhausts the stack
storage_groups_max = 100_000  # Raft groups in one cluster: a node holds 10,000, a cluster a million queues
nodes_max = 1_000  # nodes one cluster registers: a heartbeat of a new node past it is refused, so callers cannot grow
# the metadata and the nameservers' per-node maps (heartbeats, versions, health windows) without end

invariant(message_bytes_max < batch_bytes_max, "a message must fit in a batch")
invariant(batch_bytes_max < segment_bytes_min * 16, "a batch fits in a segment")
