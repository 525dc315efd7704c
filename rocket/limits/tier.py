"""Limits of the tier (object stores, pieces, retention, cold reads) and of telemetry's spool and shipper."""

from rocket.errors import invariant
from rocket.limits.units import GiB, KiB, MiB, TiB

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
tier_piece_age_s_default = 600.0  # a quiet queue's data is offloaded after this long even if below the piece size
tier_local_retention_s_default = 3 * 86_400.0  # a topic's data stays on local disk this long once offloaded
tier_scan_s = 1.0  # how often a group leader looks for data to offload, expire or drop locally
tier_first_scan_poll_s = 0.1  # until a storage node first leads a group, how often its offloader looks (a restart)
tier_topics_refresh_s = 5.0  # how often the offloader refreshes topic retention settings from the nameservers
tier_retention_check_s = tier_topics_refresh_s  # the longest a queue's retentions wait to be looked at: they may change
tier_backoff_s_max = 30.0  # after a failed upload a queue waits up to this long (doubling) before trying again
tier_uploads_per_scan_max = 64  # pieces one scan uploads, so a backlog is worked off in bounded steps
tier_uploads_parallel = 8  # queues a leader uploads pieces of at once (each queue's in order): the store's bandwidth
tier_built_bytes_max = 1 * GiB  # of pieces held in memory, built and not yet stored; past it none is built ahead
tier_builds_parallel = 1  # pieces built at once (CPU: CRCs, MD5): one finishes, and starts uploading, soonest
tier_pieces_per_queue_max = 1_000_000  # manifest entries of one queue kept in memory and in every snapshot
retention_s_max = 100 * 365 * 86_400  # a retention longer than a century is a typo
cold_cache_bytes_default = 1 * GiB  # tier_cache_bytes: the disk a node gives the ranges of tiered objects it fetched
cold_cache_bytes_min = 64 * MiB  # a smaller cache thrashes under a few consumers reading ahead
cold_cache_bytes_max = 64 * TiB  # a larger one is a typo
cold_cache_idle_s_max = 86_400.0  # a cached range unread this long goes, so a finished replay frees its disk
cold_cache_sweep_s = 60.0  # how often the cache looks for idle ranges
cold_read_ahead_bytes = 4 * MiB  # a cold read fetches at least this much of a piece, so the next reads hit the cache
cold_get_s_max = 3.0  # a cold read's fetch from the store, retries included, before UNAVAILABLE: a reader hears why
cold_index_cache_entries_max = 4096  # sidecar indexes kept decoded (LRU): one per piece read recently
telemetry_interval_s_default = 10.0  # how often a node samples its metrics into the spool
telemetry_interval_s_min = 0.05  # a shorter interval is a typo: each sample looks at every group and moved queue
telemetry_flush_s_max = 5.0  # on shutdown the last sample is spooled and shipped within this; the rest after a restart
telemetry_file_age_s = 60.0  # an open spool file is closed, and so becomes shippable, once this old ...
telemetry_file_bytes_max = 4 * MiB  # ... or once this big
telemetry_spool_bytes_max = 64 * MiB  # a node's spool files together; beyond it the oldest closed files are dropped
telemetry_ship_interval_s = telemetry_file_age_s  # how often the shipper looks for closed files: one closes that often
telemetry_ship_retry_s_max = 300.0  # after failed passes the shipper's wait doubles up to this, so an outage costs little

invariant(telemetry_file_bytes_max < telemetry_spool_bytes_max, "the spool holds closed files besides the open one")
invariant(telemetry_ship_interval_s <= telemetry_ship_retry_s_max, "a failed pass never shortens the shipper's wait")
invariant(cold_cache_bytes_min <= cold_cache_bytes_default <= cold_cache_bytes_max,
          "the default cache is one a node may set")
invariant(cold_cache_sweep_s < cold_cache_idle_s_max, "idle ranges go within a sweep of their idle time")
invariant(tier_first_scan_poll_s < tier_scan_s, "a restarted node looks for its backlog sooner than a scan would")
