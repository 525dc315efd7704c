"""Tiered storage on the example cluster (examples/cluster: 3 nameservers, 3 storage nodes holding 8 Raft groups of
three replicas, 2 brokers) offloading to moto's S3 server through the fault proxy (503 SlowDown and 500 answers,
resets after the store applied a put, stalls, slow bandwidth), while writers produce through both brokers and the
storage node leading the most groups is killed with -9 mid-offload and restarted. Every acknowledged message reads
back, once and in order, from the store after local data went; no object is left that no piece names; with the
store down a cold read is UNAVAILABLE, and it resumes."""

from __future__ import annotations

import collections
import sys
from pathlib import Path

import pytest
import trio

from rocket.client import Admin, connect
from rocket.errors import Code, RocketError
from tests.integration.test_cluster import Writers, verify_acknowledged, wait_all_groups_led
from tests.integration.test_tier import PREFIX, tier_rows
from tests.integration.test_tier_faults import FAULTY, no_orphans, store  # noqa: F401 (a fixture)
from tests.integration.test_tier_objectstore import only_local_network  # noqa: F401 (a fixture)

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from kill_loop import (LED_TIMEOUT_S, READY_TIMEOUT_S, STORAGE_GROUPS, make_cluster, of_kind,  # noqa: E402
                       start_cluster, status_servers)

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(sys.flags.dev_mode, reason="aiohttp rejects moto's duplicate Server header in -X dev")]

QUEUES = 8


def tiered(rows: list[dict]) -> bool:
    """Every queue offloaded whole, and its local data gone."""
    return len(rows) == QUEUES and all(row["pending_bytes"] == 0 and row["local_offset"] == row["next_offset"]
                                       for row in rows)


async def test_the_example_cluster_offloads_through_a_failing_store_and_a_kill_loses_nothing(tmp_path, store):
    moto, proxy = store
    bucket = moto.create_bucket()
    proxy.faults(**FAULTY)
    nodes = make_cluster(tmp_path)
    for node in nodes.values():
        node.environment.update({"ROCKET_TIER_BACKEND": "s3", "ROCKET_TIER_S3_ENDPOINT": proxy.url,
                                 "ROCKET_TIER_S3_BUCKET": bucket, "ROCKET_TIER_S3_PREFIX": PREFIX,
                                 "ROCKET_TIER_PIECE_BYTES": "65536", "ROCKET_TIER_PIECE_AGE_S": "0.5"})
    brokers = [node.server for node in of_kind(nodes, "broker")]
    storage = {node.node_id for node in of_kind(nodes, "storage")}
    try:
        await start_cluster(nodes, QUEUES)
        async with connect(brokers[0]) as channel:
            await Admin(channel).update_topic("orders", local_retention_s=1)
        writers = Writers({node.node_id: node.server for node in of_kind(nodes, "broker")})
        async with trio.open_nursery() as writing:
            for queue in range(QUEUES):
                writing.start_soon(writers.write, queue, queue)
            with trio.fail_after(60):  # pieces are going to the store under its faults
                while not any(row["pieces"] for row in await tier_rows(brokers[0])):
                    await trio.sleep(0.2)
            status = await wait_all_groups_led(status_servers(nodes), storage, LED_TIMEOUT_S, groups=STORAGE_GROUPS)
            victim = nodes[collections.Counter(group["leader"] for group in status["groups"]).most_common(1)[0][0]]
            victim.kill()  # mid-offload: pieces put and not yet in a manifest, manifests half replicated
            await trio.sleep(1.0)
            victim.start()
            await victim.wait_ready(READY_TIMEOUT_S)
            await trio.sleep(3.0)  # writes on, the restarted node back in its groups
            writers.stop.set()
        await wait_all_groups_led(status_servers(nodes), storage, LED_TIMEOUT_S, groups=STORAGE_GROUPS)
        with trio.fail_after(180):
            while not tiered(rows := await tier_rows(brokers[1])):
                await trio.sleep(0.5)
        counts = proxy.faults()["counts"]
        assert counts["errors"] > 0 and counts["resets"] > 0, counts  # the faults were met
        assert sum(row["pieces"] for row in rows) > QUEUES, rows
        await no_orphans(moto, bucket, brokers[1])

        proxy.faults(down=True)  # no node has read any piece back yet: none is in a cache
        async with connect(brokers[0]) as channel:
            with trio.fail_after(60), pytest.raises(RocketError) as down:
                await channel.call("Pull", {"topic": "orders", "queues": [{"queue": 0, "offset": 0}],
                                            "max_bytes": 1 << 20, "wait_ms": 0})
        assert down.value.code == Code.UNAVAILABLE and "object store" in down.value.message, down.value
        proxy.faults(down=False)
        checked = await verify_acknowledged(writers, brokers[1], tmp_path)
        assert checked["acknowledged"] > 0, checked
        print(f"tier on the example cluster: {checked['acknowledged']} acknowledged, {checked['batches']} batches, "
              f"{sum(row['pieces'] for row in rows)} pieces; faults {counts}; victim {victim.name}")
        died = [node.name for node in nodes.values() if node.exited_by_itself() is not None]
        assert died == [], f"nodes exited by themselves: {died}"
    finally:
        for node in nodes.values():
            node.kill()
