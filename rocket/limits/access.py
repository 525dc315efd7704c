"""Limits of sign-in, users, policies (ACL) and client quotas."""

from rocket.errors import invariant

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

invariant(quota_throttle_s_max + quota_burst_s <= quota_idle_s,
          "a bucket idle for quota_idle_s has repaid its deepest debt and refilled: dropping it changes nothing")
