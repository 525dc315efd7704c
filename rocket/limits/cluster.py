"""Limits of the cluster: heartbeats, routes, storage calls, replica moves, placement, the controller (RIP-44),
storage classes and node health."""

from rocket.errors import invariant
from rocket.limits.units import GiB, KiB

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
handover_wait_s = 30.0  # a handover waits this long for its target to join the SyncStateSet (it must catch up first)
controller_lapse_s = 2.5  # a master silent this long is replaced (from its SyncStateSet): 2.5 missed heartbeats
controller_orphan_heartbeat_s = 0.25  # a node whose controller-mode replica's master went silent heartbeats this often
controller_sync_state_s = 0.2  # how often a master asks the controller for the SyncStateSet changes it wants
model_poll_s = 30.0  # how often a nameserver reads the forecast model again: a new one is in use within this
model_stale_s = 14 * 86_400.0  # a model trained longer ago than this no longer places queues (the fallback does)
placement_explanations_max = 10_000  # topics whose last placement the leader can explain, newest kept
leader_group_bytes_s = 64 * KiB  # leader balancing: a led group weighs this many bytes/s more than its predicted load
leader_balance_ratio = 0.1  # ... nodes within this share of their mean led load are balanced (Kafka: 10%) ...
leader_balance_bytes_s = 128 * KiB  # ... as are nodes within this many bytes/s of each other (2 idle groups)
leader_error_share = 0.5  # ... and a transfer must narrow the gap by this share of the model's group error (RMSE)
leader_transfer_s = 2.0  # at most one leadership transfer this often: a transfer pauses the group's writes briefly
rebalance_moves_per_hour_default = 60.0  # balancing moves (leaderships, replica counts) an hour may make: an hour's
# worth at once, then one a minute; a load that swings faster than that is no node's to take (PD: schedule limits)
# The PD-style baseline (TiKV PD's hot-region scheduler): moves by the flow each group carries now, with tolerances.
hot_follower_share = 0.3  # a follower's load per byte/s of its group, against the leader's 1 (it appends and fsyncs)
hot_tolerance_ratio = 1.05  # a source is above the nodes' mean load by this factor, a target below it by the same
hot_decrease_ratio = 0.95  # a move must leave the hotter of its two nodes at most this share of the source's load
# The forecast planner (forecast_move): the PD-style search on forecast load, each move paying for itself.
plan_payback_s = 3 * 86_400.0  # a move's gain (bytes/s off the hotter node) over this long must cover its cost in bytes
plan_leader_stall_s = 2.0  # a leadership transfer costs this many seconds of the group's writes (held in its stall)
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
health_fsync_p99_s_min = 0.005  # a window's fsync p99 above this may be a slow disk (an SSD syncs in 0.1-2 ms) ...
health_fsync_peer_ratio = 4.0  # ... when it is also this many times the other storage nodes' median p99 (not a slow cluster)
health_fsyncs_min = 20  # a window with fewer fsyncs than this has no p99 to tell: a p99 of three is noise ...
health_fsyncs_few = 5  # ... but from this many on, their median stands for it (a disk slow enough to sync rarely)
health_error_rate_max = 0.2  # a node that fails more than this share of the calls other nodes make to it is unhealthy ...
health_calls_min = 20  # ... if they made this many at least in the window
health_degrade_windows = 3  # unhealthy windows in a row before a node is degraded: one slow window is not a fault
health_recover_windows = 6  # healthy windows in a row before a degraded node returns: twice as long, so it cannot flap

invariant(node_heartbeat_s < node_suspect_s < node_down_s, "liveness states are ordered")
invariant(storage_append_wait_s_max < storage_call_s_max < storage_retry_s_max, "a storage call ends before its retries")
invariant(health_window_s_min >= node_heartbeat_s, "a health window holds a heartbeat of every node")
invariant(1 <= health_fsyncs_few < health_fsyncs_min, "a window's median needs fewer fsyncs than its p99")
invariant(health_degrade_windows < health_recover_windows, "a degraded node returns more slowly than it left: no flapping")
invariant(node_heartbeat_s < controller_lapse_s < node_down_s, "a master is replaced after missed heartbeats, before it is down")
invariant(ha_lag_s_min <= ha_lag_s_default <= ha_lag_s_max, "the default sync lag is one a class may set")
invariant(route_retry_s < route_ttl_s, "a route kept through a nameserver outage is asked for again within its life")
invariant(controller_orphan_heartbeat_s < node_heartbeat_s, "a replica without a master asks sooner, not later")
