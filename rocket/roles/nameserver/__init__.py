"""The nameserver role: the metadata Raft group (topics, assignments, nodes) and the calls that change it.

role.py holds the calls (heartbeats, replica placement and moves, drains). group.py is the metadata group as the
parts reach it (propose, run on the leader, read). acl.py, consumer_groups.py and controller.py are parts of their own
over it; classes.py, queues.py and health.py are still mixins of the role:
- metadata.py is the metadata state machine (pure). It also holds users and policies, and the last elections of
  controller-mode groups; consumer-group settings are keyed by group name.
- acl.py: users and policies. It answers nodes' MetaAclState, and makes a cluster's first user, `admin`, when auth is
  on.
- consumer_groups.py: consumer-group settings (brokers read them through roles/broker/admin.py).
- classes.py: storage classes (issue 32). A topic's queues go only to its class's groups. Controller-mode groups are
  neither moved nor leader-balanced here: the controller keeps their members and names their master.
- controller.py: the controller of RIP-44, on the leader. Unclean elections happen only where the class allows
  them. Masters change their SyncStateSet with ControllerAlterSyncStateSet.
- queues.py: queue placement. A model refused (invalid or stale) has its reason logged and shown in `cluster status`,
  and `cluster placement --explain` explains a choice. It also creates the default class's storage groups as
  storage nodes join (`storage_groups` per `replication` nodes up), and balances leadership: one group at a time,
  from the node leading the most predicted load to the group's least loaded voter
  (rocket.ml.placement.leader_transfer), and off degraded nodes first (degraded_leader_transfer).
- health.py: storage node health (issue 31). A node's window also holds the p99 of the calls made to it, the CPU it
  was denied and its Raft lag. The health model in the object store (`models/health/latest.json`) scores it; the
  threshold does when there is no model, or it is refused or stale, or it fails on a window. Every judged window is
  noted in the node's telemetry for the training job. A degraded node's replicas move away after
  `health_move_after_s`. Operators pin nodes with `cluster health`.
"""

from rocket.roles.nameserver.role import Nameserver

__all__ = ["Nameserver"]
