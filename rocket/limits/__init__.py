"""Every limit in rocket, each with the reason it exists, in one module per subsystem; all are read as `limits.x`.
A new limit goes in its subsystem's module with one line saying why, its unit then `_max`, `_min` or `_default` last
in its name, and its relations to the others asserted below; tests/unit/test_limits.py checks all three."""

from rocket.errors import invariant
from rocket.limits.units import *
from rocket.limits.data import *
from rocket.limits.wire import *
from rocket.limits.raft import *
from rocket.limits.kv import *
from rocket.limits.messaging import *
from rocket.limits.rocketmq import *
from rocket.limits.mqtt import *
from rocket.limits.access import *
from rocket.limits.cluster import *
from rocket.limits.tier import *
from rocket.limits.client import *

__all__ = ["units", "data", "wire", "raft", "kv", "messaging", "rocketmq", "mqtt", "access", "cluster", "tier", "client"]

# Relations across subsystems; each module asserts its own.
invariant(batch_bytes_max < frame_bytes_max, "a batch must fit in a frame")
invariant(max(read_bytes_max, batch_bytes_max) * 4 // 3 + 64 * KiB <= frame_bytes_max, "a pull response fits a frame")
invariant(producer_batch_bytes_default <= batch_bytes_max, "producer batches fit the server limit")
invariant(consumer_pull_bytes_default <= read_bytes_max, "a consumer's pull asks no more than one read returns")
invariant(consumer_wait_ms_default <= pull_wait_ms_max, "a consumer's default wait is one the broker allows")
invariant(simple_invisible_s_default <= pop_invisible_s_max, "the default invisible time is one storage allows")
invariant(simple_receive_messages_default <= pop_messages_max, "a default receive is one pop")
invariant(raft_payload_bytes_max * 4 // 3 + 64 * KiB <= frame_bytes_max, "a Raft payload fits a frame, even in JSON")
invariant(snapshot_chunk_bytes_max * 4 // 3 + 64 * KiB <= frame_bytes_max, "a snapshot fetch fits a frame, even in JSON")
invariant(rocketmq_receive_slice_s < storage_retry_s_max and rocketmq_receive_slice_s * 1000 <= pull_wait_ms_max,
          "a RocketMQ receive's slice is one broker long poll, which ends within the broker's storage retries")
invariant(rocketmq_receive_wait_s_default * 1000 <= pull_wait_ms_max, "RocketMQ's default long poll is one rocket allows")
invariant(rocketmq_invisible_s_default <= pop_invisible_s_max, "RocketMQ's default invisible time is one rocket allows")
invariant(rocketmq_receive_messages_default <= pop_messages_max, "a RocketMQ receive batch is one pop")
invariant(mqtt_idle_recheck_s > mqtt_invisible_s, "an idle subscription's recheck is a safety, not its redeliveries' clock")
invariant(pop_invisible_s_min <= mqtt_invisible_s <= pop_invisible_s_max, "MQTT's invisible time is one storage allows")
invariant(mqtt_receive_messages_max <= pop_messages_max, "an MQTT receive is one pop")
invariant(mqtt_client_id_bytes_max <= kv_key_bytes_max, "a client id is a key of the sessions' bucket")
invariant(mqtt_packet_bytes_max + mqtt_message_overhead_bytes <= min(message_bytes_max, batch_bytes_max // 2),
          "a PUBLISH is a message, alone in a batch at most")
invariant(read_bytes_max + cold_read_ahead_bytes <= cold_cache_bytes_min, "a cold read and its read-ahead fit the cache")
invariant(2 * cold_get_s_max < storage_call_s_max, "a cold read gives up on the object store (index, then data) before "
          "the broker gives up on the storage node: the reader gets UNAVAILABLE, not a TIMEOUT")
invariant(class_move_tail_bytes <= class_move_read_bytes <= batch_bytes_max,
          "a moving queue's copy is read in pieces, each one Raft entry (at most one batch more than asked for)")
invariant(class_move_drop_grace_s > route_ttl_s, "a moving topic's old groups keep its data past brokers' old routes")
invariant(kv_value_bytes_max + kv_key_bytes_max < kv_range_bytes_max <= read_bytes_max, "one key and its value fit a range page, and a page fits a response")
invariant(kv_value_bytes_max + kv_key_bytes_max < kv_txn_bytes_max < raft_entry_bytes_max, "a put fits a transaction, a transaction one Raft entry")
invariant(connect_timeout_s <= tls_handshake_s_max <= tcp_sniff_s_max,
          "a node's own handshake (within connect_timeout_s) ends before a listener drops it, and a TLS client gets no "
          "longer than a plain one to send its first bytes")
invariant(tcp_idle_s_default >= 10 * pull_wait_ms_max / 1000 and tcp_idle_s_default >= 10 * http1_idle_s,
          "an idle client connection lives well past a long poll's gap and an HTTP/1.1 keep-alive: reconnects stay rare")
invariant(idle_recheck_s < controller_lapse_s, "a controller-mode group's lapsed master is seen by the controller's "
          "idle recheck before its lapse counts")
