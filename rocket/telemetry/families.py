"""The metric families of the node's Prometheus endpoint beyond the registry's own histograms (issue 34): node,
Raft groups, storage groups, topics, consumer groups, tier, MQTT and KV. Each is a collector read at scrape time from
counters the components keep anyway; none adds work per message."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

LEADER_ONLY = " Exported by the leader of each storage group, for its queues: sum over nodes."

# The one list of these families: the collectors take their help from it, and examples/grafana/rocket.json is checked
# against it. Label cardinality stays bounded by what an operator names (topics, consumer groups, RPC methods) and by
# the groups on the node; per-queue series are only there with the node's config key `metrics_per_queue = true`. A
# topic's produced totals, backlog and lags live on the leaders of its queues' storage groups: each node exports them
# for the groups it leads, so summing over nodes counts every queue once (LEADER_ONLY).
# name (counters without _total) -> (kind, help)
CATALOGUE: dict[str, tuple[str, str]] = {
    # node
    "rocket_node_info": ("gauge", "1, labelled with this node's id, roles and rocket's version"),
    "rocket_node_draining": ("gauge", "1 while the node drains for shutdown"),
    # Raft
    "rocket_raft_groups": ("gauge", "Raft groups hosted on this node, by this node's state in them (a "
                           "pre-candidate counts as candidate)"),
    "rocket_raft_group_commit_index": ("gauge", "The last entry this node knows committed, per group it hosts"),
    "rocket_raft_group_applied_index": ("gauge", "The last entry this node applied, per group it hosts"),
    # topics
    "rocket_topic_produced_messages": ("counter", "Messages produced to the topic since its queues began."
                                       + LEADER_ONLY),
    "rocket_topic_produced_bytes": ("counter", "Bytes of batches produced to the topic since its queues began."
                                    + LEADER_ONLY),
    "rocket_topic_read_messages": ("counter", "Messages this node's replicas returned to reads of the topic since the "
                                   "node started (any replica may serve reads: sum over nodes)"),
    "rocket_topic_read_bytes": ("counter", "Bytes of batches this node's replicas returned to reads of the topic "
                                "since the node started (sum over nodes)"),
    "rocket_topic_backlog_messages": ("gauge", "Messages of the topic its slowest consumer group has not committed, "
                                      "summed over the queues some group committed on." + LEADER_ONLY),
    "rocket_topic_queues": ("gauge", "Queues of the topic that hold messages, in the storage groups this node leads"),
    # consumer groups
    "rocket_consumer_group_lag_messages": ("gauge", "Messages of the topic the consumer group has not committed, "
                                           "summed over the queues it committed on." + LEADER_ONLY),
    # per queue: only with metrics_per_queue = true
    "rocket_queue_produced_messages": ("counter", "Messages produced to the queue since it began (only with "
                                       "metrics_per_queue)." + LEADER_ONLY),
    "rocket_queue_backlog_messages": ("gauge", "Messages of the queue its slowest consumer group has not committed "
                                      "(only with metrics_per_queue)." + LEADER_ONLY),
    # tier
    "rocket_tier_uploaded_pieces": ("counter", "Pieces this node offloaded to the object store"),
    "rocket_tier_uploaded_bytes": ("counter", "Bytes this node offloaded to the object store"),
    "rocket_tier_upload_failures": ("counter", "Offloads that failed (retried later)"),
    "rocket_tier_swept_objects": ("counter", "Objects deleted from the object store that no manifest lists (expired "
                                             "or orphaned)"),
    "rocket_tier_cold_read_batches": ("counter", "Batches read from offloaded pieces"),
    "rocket_tier_cold_cache_hits": ("counter", "Batches read from offloaded pieces whose bytes were in the cache"),
    "rocket_tier_cold_gets": ("counter", "Ranged GETs of the object store for cold reads"),
    "rocket_tier_cold_fetched_bytes": ("counter", "Bytes fetched from the object store for cold reads"),
    "rocket_tier_cache_bytes": ("gauge", "Bytes of fetched ranges the node keeps on disk for cold reads"),
    "rocket_tier_cache_evictions": ("counter", "Ranges dropped from the cold reads' cache for room or idleness"),
    # MQTT
    "rocket_mqtt_connections": ("gauge", "Open MQTT connections on this broker, by state: served (by a task of their "
                                "own) or parked (idle, waiting in the parking's epoll set)"),
    # KV
    "rocket_kv_txns": ("counter", "KV transactions applied on this node as their group's leader"),
    "rocket_kv_operations": ("counter", "Operations of the KV transactions' branches that ran, by kind (put, "
                             "delete, delete_prefix, get), on this leader"),
    "rocket_kv_reads": ("counter", "KV reads this node served, by kind (get, range, count, digest, export)"),
    "rocket_kv_shards": ("gauge", "KV shards in the storage groups this node leads"),
    # auth and client quotas
    "rocket_auth_users": ("gauge", "Users this node enforces (with auth on)"),
    "rocket_auth_policies": ("gauge", "Policies this node enforces (with auth on)"),
    "rocket_auth_refusals": ("counter", "Calls and sign-ins this node refused, by code (UNAUTHENTICATED, "
                             "PERMISSION_DENIED), since it started"),
    "rocket_quota_throttled_calls": ("counter", "Client calls this broker throttled for being over a quota"),
    "rocket_quota_throttled_seconds": ("counter", "The throttle times this broker gave, summed"),
}
STATES = ("leader", "follower", "candidate")


def _family(name: str, labels: list[str], values: Iterable[tuple[list[str], float]]) -> Metric:
    kind, documentation = CATALOGUE[name]
    found = (CounterMetricFamily if kind == "counter" else GaugeMetricFamily)(name, documentation, labels=labels)
    for label_values, value in values:
        found.add_metric(label_values, value)
    return found


def node_metrics(node_id: int, roles: Iterable[str], version: str, draining: Callable[[], bool]
                 ) -> Callable[[], Iterable[Metric]]:
    info = [str(node_id), ",".join(roles), version]

    def collect():
        yield _family("rocket_node_info", ["node", "roles", "version"], [(info, 1.0)])
        yield _family("rocket_node_draining", [], [([], float(draining()))])
    return collect


def raft_state_metrics(host) -> Callable[[], Iterable[Metric]]:
    """Per state, the groups of a Raft host (rocket.raft.host.RaftHost); per group, its commit and applied entry."""

    def collect():
        states = dict.fromkeys(STATES, 0)
        commits, applied = [], []
        for group, hosted in sorted(host.groups.items()):
            role = hosted.core.role.name.lower()
            states["candidate" if role == "pre_candidate" else role] += 1
            commits.append(([str(group)], hosted.core.commit))
            applied.append(([str(group)], hosted.applied))
        yield _family("rocket_raft_groups", ["state"], [([state], count) for state, count in states.items()])
        yield _family("rocket_raft_group_commit_index", ["group"], commits)
        yield _family("rocket_raft_group_applied_index", ["group"], applied)
    return collect


def store_metrics(meter, leads: Callable[[int], bool], per_queue: bool = False) -> Callable[[], Iterable[Metric]]:
    """Topics, consumer groups and (per_queue) queues from a rocket.store.meter.QueueMeter; leads(group) tells
    whether this node leads a storage group."""

    def collect():
        meter.update()
        led: dict[int, bool] = {}

        def is_led(group: int) -> bool:
            if group not in led:
                led[group] = leads(group)
            return led[group]
        topics: dict[str, list[int]] = {}
        read: dict[str, list[int]] = {}
        for (topic, group), sums in meter.topics.items():
            reads = read.setdefault(topic, [0, 0])
            reads[0] += sums[2]
            reads[1] += sums[3]
            if is_led(group):
                found = topics.setdefault(topic, [0, 0, 0, 0])
                found[0] += sums[0]
                found[1] += sums[1]
                found[2] += sums[4]
                found[3] += sums[5]
        lags: dict[tuple[str, str], int] = {}
        for (consumer_group, topic, group), (lag, _) in meter.lags.items():
            if is_led(group):
                lags[(consumer_group, topic)] = lags.get((consumer_group, topic), 0) + lag
        names = sorted(topics)
        yield _family("rocket_topic_produced_messages", ["topic"], [([topic], topics[topic][0]) for topic in names])
        yield _family("rocket_topic_produced_bytes", ["topic"], [([topic], topics[topic][1]) for topic in names])
        yield _family("rocket_topic_backlog_messages", ["topic"], [([topic], topics[topic][2]) for topic in names])
        yield _family("rocket_topic_queues", ["topic"], [([topic], topics[topic][3]) for topic in names])
        yield _family("rocket_topic_read_messages", ["topic"], [([topic], read[topic][0]) for topic in sorted(read)])
        yield _family("rocket_topic_read_bytes", ["topic"], [([topic], read[topic][1]) for topic in sorted(read)])
        yield _family("rocket_consumer_group_lag_messages", ["consumer_group", "topic"],
                      [(list(key), lag) for key, lag in sorted(lags.items())])
        if per_queue:
            queues = sorted((key, seen) for key, seen in meter.queues.items() if is_led(seen.group))
            yield _family("rocket_queue_produced_messages", ["topic", "queue"],
                          [([topic, str(queue)], seen.produced_messages) for (topic, queue), seen in queues])
            yield _family("rocket_queue_backlog_messages", ["topic", "queue"],
                          [([topic, str(queue)], seen.backlog) for (topic, queue), seen in queues])
    return collect


def tier_metrics(offloader, cold) -> Callable[[], Iterable[Metric]]:
    """The storage role's offloader (rocket.roles.storage.offload.Offloader) and cold reader (or None)."""

    def collect():
        yield _family("rocket_tier_uploaded_pieces", [], [([], offloader.uploaded_pieces)])
        yield _family("rocket_tier_uploaded_bytes", [], [([], offloader.uploaded_bytes)])
        yield _family("rocket_tier_upload_failures", [], [([], offloader.failures)])
        yield _family("rocket_tier_swept_objects", [], [([], offloader.swept_objects)])
        if cold is not None:
            yield _family("rocket_tier_cold_read_batches", [], [([], cold.batches_read)])
            yield _family("rocket_tier_cold_cache_hits", [], [([], cold.cache_hits)])
            yield _family("rocket_tier_cold_gets", [], [([], cold.gets)])
            yield _family("rocket_tier_cold_fetched_bytes", [], [([], cold.fetched_bytes)])
            if cold.cache is not None:
                yield _family("rocket_tier_cache_bytes", [], [([], cold.cache.bytes)])
                yield _family("rocket_tier_cache_evictions", [], [([], cold.cache.evicted)])
    return collect


def access_metrics(access, quotas) -> Callable[[], Iterable[Metric]]:
    """With auth on, the node's rocket.access.Access (else None); on brokers, its rocket.quotas.Quotas (else None)."""

    def collect():
        if access is not None:
            yield _family("rocket_auth_users", [], [([], len(access.users))])
            yield _family("rocket_auth_policies", [], [([], sum(map(len, access.policies.values())))])
            yield _family("rocket_auth_refusals", ["code"], [([code], count) for code, count in
                                                            sorted(access.refusals.items())])
        if quotas is not None:
            yield _family("rocket_quota_throttled_calls", [], [([], quotas.throttled)])
            yield _family("rocket_quota_throttled_seconds", [], [([], quotas.throttled_s)])
    return collect


def mqtt_metrics(gateway) -> Callable[[], Iterable[Metric]]:
    """A broker's rocket.gateway.mqtt.server.MqttGateway."""

    def collect():
        parked = len(gateway.parking) if gateway.parking is not None else 0
        yield _family("rocket_mqtt_connections", ["state"], [(["served"], gateway.open_connections - parked),
                                                             (["parked"], parked)])
    return collect


def kv_metrics(storage, leads: Callable[[int], bool]) -> Callable[[], Iterable[Metric]]:
    """The storage role's KV part's counts (rocket.roles.storage.kv.KeyValues), and the shards of the groups this node
    leads."""

    def collect():
        counts = dict(storage.kv_counts)
        yield _family("rocket_kv_txns", [], [([], counts.pop("txns", 0))])
        yield _family("rocket_kv_operations", ["op"], [([op], count) for op, count in sorted(counts.items())])
        yield _family("rocket_kv_reads", ["op"], [([op], count) for op, count in sorted(storage.kv_reads.items())])
        led = sum(1 for group, *_ in storage.store.machine.kv_shards.values() if leads(group))
        yield _family("rocket_kv_shards", [], [([], led)])
    return collect

