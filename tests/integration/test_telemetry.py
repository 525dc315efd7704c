"""A real `rocket run` samples its metrics into Avro files and ships them to its object store (issue 30, part 1):
traffic produced and consumed shows up per queue, with rates, and the node's fsyncs, WAL, CPU and memory with it."""

from __future__ import annotations

import collections

import trio

from rocket.client import connect, open_consumer
from rocket.client.simple import SimpleConsumer
from rocket.model import Message
from rocket.serde import batch as batch_codec
from rocket.telemetry.ship import read_samples
from rocket.tier.local import LocalDirectoryStore

MESSAGES = 3_000


async def test_a_node_ships_telemetry_of_its_traffic_to_the_object_store(server_process, monkeypatch):
    monkeypatch.setenv("ROCKET_TELEMETRY_INTERVAL_S", "0.25")
    server = server_process().start()
    async with connect(server.server) as channel:
        await channel.call("CreateTopic", {"topic": "orders", "queues": 2})
        for start in range(0, MESSAGES, 500):
            batch = batch_codec.encode([Message(b"x" * 100) for _ in range(500)], 1_700_000_000_000)
            await channel.call("Produce", {"topic": "orders", "queue": 0, "batch": batch})
            await trio.sleep(0.1)  # spread over several samples, so that rates show
    received = 0
    async with connect(server.server) as channel, open_consumer(channel, "orders", "g", start="earliest",
                                                                wait_ms=200) as consumer:
        while messages := await consumer.poll():
            received += len(messages)
            await consumer.commit()
    assert received == MESSAGES
    async with connect(server.server) as channel:  # a receive hands out 10 messages of a batch of 30
        await channel.call("CreateTopic", {"topic": "jobs", "queues": 1})
        batch = batch_codec.encode([Message(b"y" * 100) for _ in range(30)], 1_700_000_000_000)
        await channel.call("Produce", {"topic": "jobs", "queue": 0, "batch": batch})
        popped = await SimpleConsumer(channel, "jobs", "workers").receive(10)
        assert len(popped) == 10
    await trio.sleep(0.6)
    assert server.terminate() == 0  # a graceful stop ships the open file

    async with LocalDirectoryStore(server.data_dir / "tier") as objects:
        shipped = await objects.list("telemetry/")
        assert shipped, "no telemetry file reached the object store"
        assert all(info.key.startswith("telemetry/v1/node=1/date=") for info in shipped), shipped
        records = [record for info in shipped for record in read_samples(await objects.get(info.key))]
    by_metric = collections.defaultdict(list)
    for record in records:
        assert record["node"] == 1
        by_metric[record["metric"]].append(record)
    for metric in ("process_cpu_seconds_total", "process_resident_memory_bytes", "rocket_disk_free_bytes",
                   "rocket_fsync_seconds_p99", "rocket_fsync_seconds_max", "rocket_heartbeat_seconds",
                   "rocket_group_leader", "rocket_cpu_steal_seconds_total"):
        assert metric in by_metric, (metric, sorted(by_metric))

    def last(metric: str, **labels) -> dict:
        found = [record for record in by_metric[metric] if labels.items() <= record["labels"].items()]
        assert found, (metric, labels)
        return max(found, key=lambda record: record["time_ms"])

    assert last("rocket_fsyncs_total")["value"] > 0
    assert last("rocket_wal_written_bytes_total")["value"] > MESSAGES * 100
    assert last("rocket_received_bytes_total")["value"] > MESSAGES * 100
    assert last("rocket_sent_bytes_total")["value"] > MESSAGES * 100
    assert last("rocket_queue_in_messages_total", topic="orders", queue="0")["value"] == MESSAGES
    assert last("rocket_queue_out_messages_total", topic="orders", queue="0")["value"] == MESSAGES
    assert last("rocket_queue_out_messages_total", topic="jobs", queue="0")["value"] == 10
    assert last("rocket_queue_backlog_messages", topic="orders", queue="0")["value"] == 0  # all consumed, committed
    rates = [record["rate"] for record in by_metric["rocket_queue_in_messages_total"]
             if record["labels"]["topic"] == "orders" and record["rate"] is not None]
    assert rates and max(rates) > 0, "no rate for the produced queue"
    assert sum(rate for rate in rates) > 0
    group = last("rocket_queue_in_messages_total", topic="orders", queue="0")["labels"]["group"]
    assert last("rocket_group_in_messages_total", group=group)["value"] >= MESSAGES
    assert not list((server.data_dir / "telemetry").glob("*.avro")), "the spool was not emptied on a graceful stop"
