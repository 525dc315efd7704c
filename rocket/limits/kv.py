"""Limits of the key-value buckets (RIP-22)."""

from rocket.errors import invariant
from rocket.limits.units import KiB, MiB

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

invariant(kv_range_keys_default <= kv_range_keys_max, "the default range page is one the server allows")
invariant(kv_watch_events_max <= kv_events_kept_default, "a watch read returns fewer events than a shard keeps")
