"""The families of issue 34 on fake components: the queue meter's sums follow only what changed, leaders alone
export a topic's produced totals, backlog and lags, per-queue series only when asked; and the Grafana dashboard
in examples/ uses no metric the registry lacks."""

from __future__ import annotations

import json
import re
from pathlib import Path
from types import SimpleNamespace

from rocket.raft.types import Role
from rocket.store.meter import QueueMeter
from rocket.store.values import QueueStats
from rocket.telemetry import families
from rocket.telemetry.registry import Telemetry
from rocket.telemetry.runner import raft_metrics, traffic_metrics

DASHBOARD = Path(__file__).parents[2] / "examples" / "grafana" / "rocket.json"
MACHINE_DEPENDENT = {"rocket_cpu_throttled_seconds", "rocket_cpu_steal_seconds"}  # only where /proc and cgroups tell


class FakeStore:
    def __init__(self, offsets=()):
        self.machine = SimpleNamespace(queues={}, kv_shards={("settings", 0): [1, 7, 1], ("other", 0): [2, 3, 1]})
        self.index = SimpleNamespace(all_offsets=lambda: iter(offsets))
        self.changed: set = set()
        self.fsyncs = 0


def fake_host(roles: dict[int, Role], leads: set[int]):
    groups = {group: SimpleNamespace(core=SimpleNamespace(role=role, commit=10 * group), applied=10 * group - 1)
              for group, role in roles.items()}
    return SimpleNamespace(groups=groups, leads=lambda group: group in leads, lagging=lambda group: {2: 3},
                           rounds=SimpleNamespace(fsyncs=4), wal=SimpleNamespace(log=SimpleNamespace(end_position=0)))


def samples(collect) -> dict[tuple, float]:
    return {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in collect() for sample in family.samples}


def test_topic_sums_follow_the_queues_that_changed_and_only_leaders_export_them():
    store = FakeStore(offsets=[("billing", "orders", 0, 4)])  # committed before this node started
    queues = store.machine.queues
    queues[("orders", 0)] = QueueStats(next_offset=10, bytes=100, group=1)
    queues[("orders", 1)] = QueueStats(next_offset=5, bytes=50, group=2)  # led by another node
    meter = QueueMeter(store)
    collect = families.store_metrics(meter, lambda group: group == 1)
    found = samples(collect)
    assert found[("rocket_topic_produced_messages_total", (("topic", "orders"),))] == 10
    assert found[("rocket_topic_backlog_messages", (("topic", "orders"),))] == 6
    assert found[("rocket_consumer_group_lag_messages", (("consumer_group", "billing"), ("topic", "orders")))] == 6
    assert not [key for key in found if key[0].startswith("rocket_queue_")]
    # an append and a commit since: only those queues are looked at again
    queues[("orders", 0)].next_offset, queues[("orders", 0)].bytes = 15, 150
    queues[("orders", 0)].committed = {"billing": 15, "audit": 12}
    queues[("orders", 0)].out_messages = 11
    queues[("orders", 2)] = QueueStats(next_offset=1, bytes=9, group=1)
    store.changed = {("orders", 0), ("orders", 2)}
    found = samples(collect)
    assert found[("rocket_topic_produced_messages_total", (("topic", "orders"),))] == 16
    assert found[("rocket_topic_produced_bytes_total", (("topic", "orders"),))] == 159
    assert found[("rocket_topic_read_messages_total", (("topic", "orders"),))] == 11
    assert found[("rocket_topic_queues", (("topic", "orders"),))] == 2
    assert found[("rocket_topic_backlog_messages", (("topic", "orders"),))] == 3  # the slowest group, audit
    assert found[("rocket_consumer_group_lag_messages", (("consumer_group", "billing"), ("topic", "orders")))] == 0
    assert found[("rocket_consumer_group_lag_messages", (("consumer_group", "audit"), ("topic", "orders")))] == 3
    assert store.changed == set()
    del queues[("orders", 2)]  # a queue gone: its share goes, and a topic of no queue has no series
    store.changed = {("orders", 2)}
    assert samples(collect)[("rocket_topic_queues", (("topic", "orders"),))] == 1
    per_queue = samples(families.store_metrics(meter, lambda group: group == 1, per_queue=True))
    assert per_queue[("rocket_queue_produced_messages_total", (("queue", "0"), ("topic", "orders")))] == 15
    assert ("rocket_queue_produced_messages_total", (("queue", "1"), ("topic", "orders"))) not in per_queue


def test_raft_groups_by_state_and_kv_shards_of_led_groups():
    host = fake_host({1: Role.LEADER, 2: Role.FOLLOWER, 3: Role.PRE_CANDIDATE}, leads={1})
    found = samples(families.raft_state_metrics(host))
    assert [found[("rocket_raft_groups", (("state", state),))] for state in families.STATES] == [1, 1, 1]
    assert found[("rocket_raft_group_commit_index", (("group", "2"),))] == 20
    storage = SimpleNamespace(kv_counts={"txns": 3, "put": 4}, kv_reads={"get": 2}, store=FakeStore())
    kv = samples(families.kv_metrics(storage, host.leads))
    assert kv[("rocket_kv_txns_total", ())] == 3 and kv[("rocket_kv_operations_total", (("op", "put"),))] == 4
    assert kv[("rocket_kv_shards", ())] == 1


def full_registry(tmp_path) -> Telemetry:
    """A registry with every collector node_telemetry adds, over fakes."""
    telemetry = Telemetry(1, tmp_path)
    host = fake_host({1: Role.LEADER}, leads={1})
    store = FakeStore()
    store.machine.queues[("orders", 0)] = QueueStats(next_offset=1, bytes=1, group=1, committed={"g": 0})
    telemetry.add_collector(raft_metrics(host, store))
    telemetry.add_collector(traffic_metrics(SimpleNamespace(received_bytes=1, sent_bytes=2)))
    telemetry.add_collector(families.node_metrics(1, ["storage"], "0", lambda: False))
    telemetry.add_collector(families.raft_state_metrics(host))
    telemetry.add_collector(families.store_metrics(QueueMeter(store), host.leads, per_queue=True))
    offloader = SimpleNamespace(uploaded_pieces=0, uploaded_bytes=0, failures=0, swept_objects=0)
    cold = SimpleNamespace(batches_read=0, cache_hits=0, gets=0, fetched_bytes=0,
                           cache=SimpleNamespace(bytes=0, evicted=0))
    telemetry.add_collector(families.tier_metrics(offloader, cold))
    storage = SimpleNamespace(kv_counts={"txns": 0}, kv_reads={}, store=store)
    telemetry.add_collector(families.kv_metrics(storage, host.leads))
    access = SimpleNamespace(users={"alice": None}, policies={"alice": [None, None]}, refusals={"PERMISSION_DENIED": 3})
    telemetry.add_collector(families.access_metrics(access, SimpleNamespace(throttled=2, throttled_s=0.5)))
    telemetry.add_collector(families.mqtt_metrics(SimpleNamespace(open_connections=3, parking=[None, None])))
    return telemetry


def test_every_family_is_catalogued_with_prometheus_names(tmp_path):
    names = {family.name: family.type for family in full_registry(tmp_path).registry.collect()}
    ours = {name for name in names if name.startswith("rocket_")}
    added = ours & set(families.CATALOGUE)
    assert added == set(families.CATALOGUE)  # each catalogued family is collected
    for name in ours:
        assert not name.endswith("_total"), name  # prometheus_client adds it to counters
        assert not re.search(r"_(ms|millis|milliseconds|kb|mb)\b", name), name  # base units
    assert {"process_cpu_seconds", "process_resident_memory_bytes", "python_info"} <= set(names)


def test_the_grafana_dashboard_uses_only_metrics_the_registry_has(tmp_path):
    dashboard = json.loads(DASHBOARD.read_text())
    assert 36 <= dashboard["schemaVersion"] <= 41
    variables = {variable["name"]: variable for variable in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    expressions = [target["expr"] for panel in dashboard["panels"] for target in panel.get("targets", [])]
    expressions += [variable["definition"] for variable in variables.values() if "definition" in variable]
    assert len(expressions) >= 20
    names = re.compile(r"\b((?:rocket|process|python)_[a-z0-9_]+)")
    used = {re.sub(r"_(bucket|count|sum|total)$", "", name)
            for expression in expressions for name in names.findall(expression)}
    known = {family.name for family in full_registry(tmp_path).registry.collect()} | MACHINE_DEPENDENT
    assert used - known == set()
    for wanted in ("rocket_topic_produced_messages", "rocket_consumer_group_lag_messages", "rocket_rpc_seconds",
                   "rocket_rpc_errors", "rocket_raft_groups", "rocket_fsync_seconds", "rocket_tier_uploaded_bytes",
                   "process_cpu_seconds", "process_resident_memory_bytes"):
        assert wanted in used, wanted
    assert all(panel["datasource"]["uid"] == "${datasource}" for panel in dashboard["panels"] if "targets" in panel)
    assert any("histogram_quantile(0.99" in expression and "rocket_rpc_seconds_bucket" in expression
               for expression in expressions)


def test_rocket_tops_quantile_agrees_with_the_samplers():
    from rocket.cli.top import quantile
    from rocket.telemetry.registry import bucket_quantile

    bounds = [0.001, 0.01, 0.1, float("inf")]
    for cumulative in ([0, 10, 10, 10], [3, 5, 9, 10], [0, 0, 0, 5], [0, 0, 0, 0]):
        assert quantile(0.99, list(zip(bounds, cumulative))) == bucket_quantile(0.99, bounds, cumulative)
