"""Limits of messaging: timers (delay topics), transactions, consumer groups, pop consumption and produce's
queue choice."""

from rocket.errors import invariant
from rocket.limits.units import KiB, MiB

timer_tick_s = 0.1  # how often a group leader looks for due timers: delivery is this precise, and better than 1 s
# A loop that sleeps until it has work (due timers, expiring keys, controller-mode groups) looks again at least this
# often anyway: for work that came without a wake-up (a group whose leadership moved here).
idle_recheck_s = 1.0
timer_delay_s_max = 400 * 86_400  # the furthest delivery time accepted: a year and then some, as users ask
timer_batches_cached_bytes_max = 64 * MiB  # decoded timer batches kept: one batch's timers fall due over time
timer_fire_messages_max = 10_000  # due timers one group delivers per round, so a backlog is worked off in bounded steps
transaction_check_poll_s = 1.0  # how often a broker looks for transactions to check back, for a producer listening
checks_config_max = 1000  # transaction_checks_max and rocketmq_max_attempts: more is a typo, not a policy
group_member_expiry_s = 6.0  # a member that has not heartbeaten (polled) this long leaves the group
group_heartbeat_s = 1.0  # how often a pull consumer heartbeats, from its polls
group_members_max = 1024  # members of one consumer group on one topic; more is a runaway client
group_member_keys_max = 100_000  # (consumer group, topic) pairs with live members on one node; more is a runaway
# Queues whose last append time a storage node keeps, to stamp its queues' appends monotonically; the least recently
# appended goes first, its time folded into one floor that every queue's next stamp stays above.
append_stamp_queues_max = 100_000
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

invariant(pop_attempts_default <= checks_config_max, "the default rocketmq_max_attempts is one a config may set")
invariant(len(pop_retry_backoff_s) <= group_retry_backoff_steps_max, "rocket's default backoff is one a group may set")
