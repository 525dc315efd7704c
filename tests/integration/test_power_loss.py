"""Power loss, not just kill -9: a dev node on a lazy slowfs (benchmarks/slowfs.py), killed mid-produce while its
file system drops every write not fsynced, keeps every acknowledged message, once, in order, where it was
acknowledged. The cycles are benchmarks/power_loss.py's; ROCKET_POWER_LOSS_CYCLES runs more than CI's 5."""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path

import pytest

from tests.conftest import skip_module_without_fuse

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import power_loss  # noqa: E402

skip_module_without_fuse("the lazy slowfs")

CYCLES = int(os.environ.get("ROCKET_POWER_LOSS_CYCLES", "5"))


@pytest.mark.parametrize("direct", [False, True], ids=["page-cache", "direct-io"])
def test_power_loss_keeps_every_acknowledged_message(tmp_path, direct):
    """Each cycle kills the node at a random moment and drops its unsynced writes; afterwards nothing acknowledged
    is lost, moved, repeated or reordered, and the crashes did drop data (the test is not vacuous)."""
    tally = power_loss.run(tmp_path, CYCLES, queues=4, direct_io=direct)
    assert tally.cycles == CYCLES and tally.acknowledged > 0
    assert sum(crash["bytes_dropped"] for crash in tally.crashes) > 0
    assert (tally.lost, tally.misplaced, tally.duplicated, tally.reordered) == (0, 0, 0, 0)
    assert "no O_DIRECT" not in (tmp_path / "node.log").read_text()


def test_a_node_that_skips_fdatasync_is_caught(tmp_path, monkeypatch):
    """The same cycles find acknowledged messages lost when the node's fdatasync does nothing (the WAL's group
    commit then acknowledges what only the page cache holds), which kill -9 alone would never show."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text("import os\nos.fdatasync = lambda descriptor: None\n")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(site), *filter(None, [os.environ.get("PYTHONPATH")])]))
    tally = power_loss.run(tmp_path / "work", 2, queues=2, seed=7)
    assert tally.acknowledged > 0 and tally.lost > 0


CLUSTER_CYCLES = int(os.environ.get("ROCKET_POWER_LOSS_CLUSTER_CYCLES", "3"))
CLUSTER_GROUPS = 8


async def test_cluster_power_loss_one_node_at_a_time_then_all(tmp_path):
    """Three all-role nodes, each on a lazy slowfs of its own, under writers that fail over: each cycle kills one
    node at a random moment and drops its unsynced writes, then restarts it; the last cycle does so to all three at
    once. Every acknowledged message is then consumed intact at its offset, in per-queue order (resends after an
    unknown outcome may repeat a batch)."""
    import random

    import trio

    from rocket.client import connect
    from rocket.transport.listen import free_ports
    from tests.integration.test_cluster import QUEUES, WRITER_QUEUES, Node, Writers, verify_acknowledged, \
        wait_all_groups_led

    import faults

    nodes_ids = (1, 2, 3)
    ports = free_ports(len(nodes_ids))
    nameservers = ",".join(f"{node}@127.0.0.1:{port}" for node, port in zip(nodes_ids, ports))
    environment = {"ROCKET_STORAGE_GROUPS": str(CLUSTER_GROUPS), "ROCKET_REPLICATION": "3"}
    nodes = {node: Node(node, port, nameservers, tmp_path, environment=environment)
             for node, port in zip(nodes_ids, ports)}
    chooser = random.Random()
    with contextlib.ExitStack() as stack:
        controls = {}
        for node in nodes.values():
            controls[node.node_id] = stack.enter_context(power_loss.lazy_disk(tmp_path / f"fs{node.node_id}"))
            node.data_dir = tmp_path / f"fs{node.node_id}" / "mount" / "data"
        for node in nodes.values():
            stack.callback(node.kill)
            node.start()
        for node in nodes.values():
            await node.wait_ready()
        servers = [node.server for node in nodes.values()]
        async with connect(servers[0]) as channel:
            await channel.call("CreateTopic", {"topic": "orders", "queues": QUEUES}, timeout_s=30)
        await wait_all_groups_led(servers, set(nodes), timeout_s=30, groups=CLUSTER_GROUPS)
        writers = Writers({node.node_id: node.server for node in nodes.values()})
        dropped = []
        async with trio.open_nursery() as nursery:
            for index, queue in enumerate(WRITER_QUEUES):
                nursery.start_soon(writers.write, queue, index)
            for cycle in range(CLUSTER_CYCLES + 1):
                await trio.sleep(chooser.uniform(0.5, 2.0))
                victims = [nodes_ids[cycle % len(nodes_ids)]] if cycle < CLUSTER_CYCLES else list(nodes_ids)
                for victim in victims:
                    nodes[victim].kill()
                for victim in victims:
                    dropped.append(await trio.to_thread.run_sync(faults.crash_slowfs, controls[victim]))
                print(f"cycle {cycle + 1}: nodes {victims} lost power; their disks dropped "
                      f"{sum(each['bytes_dropped'] for each in dropped[-len(victims):])} bytes; "
                      f"{sum(len(ack.seqs) for ack in writers.acks)} acknowledged so far", flush=True)
                for victim in victims:
                    nodes[victim].start()
                for victim in victims:
                    await nodes[victim].wait_ready()
            await wait_all_groups_led(servers, set(nodes), timeout_s=30, groups=CLUSTER_GROUPS)
            await trio.sleep(1)
            writers.stop.set()
        result = await verify_acknowledged(writers, servers[0], tmp_path)
        print(f"cluster power loss: {CLUSTER_CYCLES} + 1 cycles; acknowledged {result['acknowledged']}, duplicates "
              f"{result['duplicates']}, never acknowledged but kept {result['never_acknowledged']}",
              flush=True)
        assert result["acknowledged"] > 0 and sum(each["bytes_dropped"] for each in dropped) > 0
        assert result["duplicates"] == 0, result["duplicated_batches"]  # resends are numbered: stored once
