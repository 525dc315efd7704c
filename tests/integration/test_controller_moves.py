"""Replacing a controller-mode (RIP-44) group's replica on separate processes: three nameservers (the embedded
controller, or with three standalone controllers beside them), three storage nodes, a broker, a class of two replicas and three groups, and writers producing through
the broker all along. The storage node mastering the most groups is drained: each group it masters is handed over,
and each of its replicas is replaced by one on the third node, which joins the SyncStateSet before the drained one
leaves it (rocket cluster drain: the nameservers' replica moves). The writers keep being acknowledged, and every
acknowledged message is consumed, intact, at its acknowledged offset.

Run with -s to see the figures. Node logs are in the test's tmp_path (node<N>.log; nameservers 1-3, storage nodes
11-13, broker 21, standalone controllers 31-33).
"""

from __future__ import annotations

import collections
import time

import pytest
import trio

from rocket.client import Admin, connect
from tests.integration.controller_cluster import (BROKER, ControllerCluster, create_topic, described, stop_writers,
                                                  totals)
from tests.integration.test_cluster import Writers, verify_acknowledged
from tests.integration.test_controller_mode import queues_by_group, wait_writers

STORAGE = (11, 12, 13)
DRAIN_WAIT_S_MAX = 120.0


def replicas(storage_class: dict) -> collections.Counter:
    return collections.Counter(node for group in storage_class["groups"] for node in group["voters"])


@pytest.mark.parametrize("controllers", [(), (31, 32, 33)], ids=["embedded", "standalone"])
async def test_a_drained_nodes_controller_mode_replicas_are_replaced_under_load(tmp_path, controllers):
    cluster = ControllerCluster(tmp_path, storage=STORAGE, controllers=controllers)
    started = time.monotonic()
    try:
        await cluster.start()
        async with connect(cluster.broker.server) as channel:
            admin = Admin(channel)
            await create_topic(admin)
            queue_groups = await cluster.queue_groups()
            queues, _ = queues_by_group(queue_groups)
            writers = Writers({BROKER: cluster.broker.server})
            async with trio.open_nursery() as writing:
                for queue in queues:
                    writing.start_soon(writers.write, queue, 0)
                await trio.sleep(2)
                before = await described(admin)
                masters = collections.Counter(group["master"] for group in before["groups"])
                drained = max(STORAGE, key=lambda node: (masters[node], replicas(before)[node], node))
                moved = {group["id"] for group in before["groups"] if drained in group["voters"]}
                print(f"\ncluster up after {time.monotonic() - started:.1f} s; draining node {drained}, a replica of "
                      f"groups {sorted(moved)} (master of "
                      f"{sorted(group['id'] for group in before['groups'] if group['master'] == drained)}); logs in "
                      f"{tmp_path}", flush=True)
                drain_at = trio.current_time()
                await admin.drain_node(drained)
                with trio.fail_after(DRAIN_WAIT_S_MAX):
                    while True:
                        after = await described(admin)
                        if all(drained not in group["voters"] + group["learners"]
                               and sorted(group["sync_state_set"]) == sorted(group["voters"])
                               for group in after["groups"]):
                            break
                        await trio.sleep(0.5)
                drained_s = trio.current_time() - drain_at
                for group in after["groups"]:
                    assert len(group["voters"]) == 2 and group["master"] in group["voters"], group
                    if group["id"] in moved:
                        old = next(entry for entry in before["groups"] if entry["id"] == group["id"])
                        assert set(group["voters"]) - set(old["voters"]) and not group["learners"], (old, group)
                resumed_s = await wait_writers(writers, queues, trio.current_time(), "after the drain")
                print(f"node {drained} drained: its replicas of {len(moved)} groups replaced and both replicas in "
                      f"every group's SyncStateSet after {drained_s:.2f} s; writers acknowledged after "
                      f"{resumed_s:.2f} s more", flush=True)
                await stop_writers(writers, queues)
        assert not cluster.died(), cluster.died()
        result = await verify_acknowledged(writers, cluster.broker.server, tmp_path)
    finally:
        cluster.kill()
    print(totals(result, writers, started), flush=True)
    assert result["acknowledged"] > 1000
