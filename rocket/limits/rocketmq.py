"""RocketMQ compatibility: the gRPC (5.x) and remoting gateways' defaults and bounds, several of them
RocketMQ's own."""

from rocket.errors import invariant
from rocket.limits.units import MiB

rocketmq_receive_answer_margin_s = 1.0  # a long poll answers "not found" this long before the client's deadline expires
rocketmq_receive_slice_s = 5.0  # a long poll asks the broker in slices, each within the broker's storage retries
rocketmq_receive_wait_s_default = 20.0  # RocketMQ's default long-polling timeout, when a request names none
rocketmq_invisible_s_default = 30.0  # RocketMQ's default invisible duration, when a request names none
rocketmq_telemetry_topics_max = 256  # transaction topics one Telemetry stream has check-backs forwarded for
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
remoting_frame_bytes_max = 16 * MiB  # one remoting frame (RocketMQ's own limit): a batch send of 4 MiB messages fits
remoting_header_bytes_max = 64 * 1024 - 1  # a remoting header; longer ones are refused, which keeps the protocols apart
remoting_in_flight_per_connection_max = 256  # requests of one remoting connection served at once (pulls wait)
# Every gateway (gRPC, remoting, MQTT) reads a topic's type, queue count and brokers at most this often (its sends and
# routes need them) ...
gateway_topic_cache_s = 5.0
gateway_topic_cache_entries_max = 4096  # ... in one cache per gateway of this many topics; the oldest entry goes first
gateway_tail_retry_s = 5.0  # a topic's watch for new data (gateway/reads.py Tails) whose call failed goes again after this
remoting_member_refresh_s = 2.0  # connected consumers kept in their groups, and pulled offsets written, this often
remoting_pull_messages_max = 1024  # messages in one pull answer, whatever maxMsgNums asks
remoting_pull_bytes_max = 4 * MiB  # bytes read for one pull answer
remoting_reconsume_times_default = 16  # RocketMQ's maxReconsumeTimes, when a send-back names none
remoting_lock_expiry_s = 60.0  # an orderly consumer's queue lock lapses unless renewed (RocketMQ's rebalance lock)
remoting_transaction_topics_max = 256  # transaction topics whose checks one broker forwards to remoting producers
remoting_locks_max = 100_000  # orderly consumers' queue locks one storage node holds (its groups', lapsed ones swept first)
remoting_client_groups_max = 10_000  # producer and consumer groups, each, with clients connected to one broker
remoting_unwritten_offsets_keys_max = 100_000  # (group, topic) pairs of pulled offsets a broker holds before they are written
remoting_kv_list_keys_max = 10_000  # keys one GET_KVLIST_BY_NAMESPACE answers; past that it says to use rocket kv ls
# A pull's minOffset and maxOffset (the queue's bounds, for the client's lag figures) are read with DescribeTopic at
# most this often per topic on each broker; maxOffset is at least where the pull ended.
remoting_queue_bounds_s = 1.0
# A Zstandard body is inflated this many compressed bytes at a time (its decompressor takes no output bound): a piece
# this small inflates to a few MiB at most (blocks of at most 128 KiB), so a bomb is stopped near the message limit.
remoting_zstd_feed_bytes = 256

invariant(rocketmq_signature_ahead_s_max >= 14 * 3600 and rocketmq_signature_behind_s_max >= 12 * 3600,
          "RocketMQ 5 clients that sign local time labelled Z would be refused in some zones (UTC-12 to UTC+14)")
invariant(rocketmq_send_backoff_s_min <= rocketmq_send_backoff_s_max, "RocketMQ send backoff bounds are ordered")
