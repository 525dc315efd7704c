"""The standalone controller (RIP-44, `rocket run --role controller`) on separate processes: three controllers on a Raft
group of their own, three nameservers and two storage nodes pointing at them, a broker, and writers producing through
the broker all along. (1) Every controller is killed -9 and restarted, then the busiest master is killed: the
restarted controllers, with their state from their own log, elect the other replica. (2) One controller stays down
while the busiest master is killed: the other two elect. (3) Every nameserver is killed -9, then the busiest master:
the controllers still elect, the survivor takes writes through the broker on its cached routes, and once the
nameservers are back their routes show the new masters. At the end every acknowledged message is consumed, intact, at
its acknowledged offset. A second test moves a running cluster from the embedded controller to a standalone one.

Run with -s to see the figures. Node logs are in the test's tmp_path (node<N>.log; controllers 31-33, nameservers 1-3,
storage nodes 11 and 12, broker 21).
"""

from __future__ import annotations

import collections
import time

import trio

from rocket.client import Admin, connect
from rocket.errors import RocketError
from rocket.roles.peers import RETRYABLE
from tests.integration.controller_cluster import (
    BROKER, STORAGE, ControllerCluster, create_topic, described, in_sync, kill_busiest_master, stop_writers, totals,
    wait_in_sync)
from tests.integration.test_cluster import Writers, verify_acknowledged
from tests.integration.test_controller_mode import queues_by_group, wait_writers

CONTROLLERS = (31, 32, 33)
ELECTED_WAIT_S_MAX = 30.0


async def controller_groups(cluster: ControllerCluster) -> dict:
    """The controllers' groups, as the first controller that answers gives them (a follower asks its leader; a
    group electing a leader is asked again)."""
    with trio.fail_after(ELECTED_WAIT_S_MAX):
        while True:
            for node in cluster.controllers.values():
                if node.process is None or node.process.poll() is not None:
                    continue
                try:
                    async with connect(node.server) as channel:
                        return await channel.call("ControllerGroups", {})
                except RocketError as error:
                    if error.code not in RETRYABLE:
                        raise
            await trio.sleep(0.2)


async def failover_without_nameservers(cluster: ControllerCluster, writers: Writers, queues: list[int]) -> dict:
    """Every nameserver killed -9, then the busiest master: the controllers elect the other replica of each of its
    groups, every writer is acknowledged again through the broker, and once the nameservers are back they route to
    the new masters. The victim restarts and rejoins every group's SyncStateSet."""
    before = await controller_groups(cluster)
    masters = collections.Counter(group["master"] for group in before["groups"])
    victim = max(STORAGE, key=lambda node: masters.get(node, 0))
    survivor = next(node for node in STORAGE if node != victim)
    for node in cluster.nameservers.values():
        node.kill()
    await trio.sleep(1)
    killed_at = trio.current_time()
    cluster.storage[victim].kill()
    with trio.fail_after(ELECTED_WAIT_S_MAX):
        while True:
            after = await controller_groups(cluster)
            if all(group["master"] != victim for group in after["groups"]):
                break
            await trio.sleep(0.1)
    elected_s = trio.current_time() - killed_at
    assert all(group["master"] == survivor and group["master_epoch"] > old["master_epoch"]
               for group, old in zip(after["groups"], before["groups"])), (before, after)
    resumed_s = await wait_writers(writers, queues, killed_at, "a failover while the nameservers are down")
    cluster.storage[victim].start()
    await cluster.storage[victim].wait_ready()
    for node in cluster.nameservers.values():
        node.start()
    for node in cluster.nameservers.values():
        await node.wait_ready()
    return {"victim": victim, "survivor": survivor, "elected_s": elected_s, "resumed_s": resumed_s,
            "elections": len(after["elections"]) - len(before["elections"])}


async def test_a_standalone_controller_fails_groups_over_without_its_peers_or_the_nameservers(tmp_path):
    cluster = ControllerCluster(tmp_path, controllers=CONTROLLERS)
    started = time.monotonic()
    try:
        await cluster.start()
        async with connect(cluster.broker.server) as channel:
            admin = Admin(channel)
            assert in_sync(await create_topic(admin))
            queue_groups = await cluster.queue_groups()
            queues, _ = queues_by_group(queue_groups)
            print(f"\ncluster up after {time.monotonic() - started:.1f} s; logs in {tmp_path}", flush=True)
            writers = Writers({BROKER: cluster.broker.server})
            async with trio.open_nursery() as writing:
                for queue in queues:
                    writing.start_soon(writers.write, queue, 0)
                await trio.sleep(2)
                # (1) every controller killed and restarted: the state is its own log's
                with trio.fail_after(ELECTED_WAIT_S_MAX):  # each group registered by its replicas' heartbeats
                    while True:
                        registered = await controller_groups(cluster)
                        if sorted(group["group"] for group in registered["groups"]) == sorted(set(queue_groups)):
                            break
                        await trio.sleep(0.2)
                for node in cluster.controllers.values():
                    node.kill()
                for node in cluster.controllers.values():
                    node.start()
                for node in cluster.controllers.values():
                    await node.wait_ready()
                restarted = await controller_groups(cluster)
                assert restarted["groups"] == registered["groups"], (registered, restarted)
                failover = await kill_busiest_master(cluster, writers, admin, queues, queue_groups)
                print(f"controllers killed -9 and restarted; then the kill -9 of master {failover.victim}: every "
                      f"writer acknowledged again after {failover.failover_s:.2f} s, new masters seen (through the "
                      f"nameservers' mirror) after {failover.elected_s:.2f} s", flush=True)
                # (2) one controller down: the other two elect
                cluster.controllers[CONTROLLERS[0]].kill()
                failover = await kill_busiest_master(cluster, writers, admin, queues, queue_groups)
                print(f"controller {CONTROLLERS[0]} down; the kill -9 of master {failover.victim}: every writer "
                      f"acknowledged again after {failover.failover_s:.2f} s", flush=True)
                cluster.controllers[CONTROLLERS[0]].start()
                await cluster.controllers[CONTROLLERS[0]].wait_ready()
                # (3) no nameserver at all
                outage = await failover_without_nameservers(cluster, writers, queues)
                print(f"nameservers down; the kill -9 of master {outage['victim']}: the controllers elected node "
                      f"{outage['survivor']} after {outage['elected_s']:.2f} s, every writer acknowledged again "
                      f"after {outage['resumed_s']:.2f} s", flush=True)
                with trio.fail_after(ELECTED_WAIT_S_MAX):  # the nameservers back, their routes name the new masters
                    while True:
                        try:
                            if all(group["master"] == outage["survivor"]
                                   for group in (await described(admin))["groups"]):
                                break
                        except Exception:  # noqa: BLE001 (the nameservers still electing a leader)
                            pass
                        await trio.sleep(0.2)
                await wait_in_sync(admin)
                await stop_writers(writers, queues)
        assert not cluster.died(), cluster.died()
        result = await verify_acknowledged(writers, cluster.broker.server, tmp_path)
    finally:
        cluster.kill()
    print(totals(result, writers, started), flush=True)
    assert result["acknowledged"] > 1000


async def test_a_running_cluster_moves_from_the_embedded_controller_to_a_standalone_one(tmp_path):
    """Under load: three controllers start, then every nameserver and storage node restarts, one at a time, with
    controllers set; the groups register with the word they had, and the next failover is the standalone
    controllers' election (their log says so, the nameservers' does not). Nothing acknowledged is lost."""
    cluster = ControllerCluster(tmp_path)
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
                members = cluster.add_controllers(CONTROLLERS)
                for node in cluster.controllers.values():
                    await node.wait_ready()
                for node in [*cluster.nameservers.values(), *cluster.storage.values()]:
                    node.environment = {**node.environment, "ROCKET_CONTROLLERS": members}
                    node.kill()
                    node.start()
                    await node.wait_ready()
                    await trio.sleep(2)  # a heartbeat or two before the next: the group keeps a master meanwhile
                await wait_in_sync(admin)
                failover = await kill_busiest_master(cluster, writers, admin, queues, queue_groups)
                elected_by = [node.node_id for node in [*cluster.controllers.values(), *cluster.nameservers.values()]
                              if "is master at epoch" in node.log_path.read_text()]
                assert elected_by and set(elected_by) <= set(CONTROLLERS), elected_by
                print(f"\nmoved to standalone controllers under load; then the kill -9 of master {failover.victim}: "
                      f"every writer acknowledged again after {failover.failover_s:.2f} s, elected by controller "
                      f"{elected_by}", flush=True)
                await stop_writers(writers, queues)
        assert not cluster.died(), cluster.died()
        result = await verify_acknowledged(writers, cluster.broker.server, tmp_path)
    finally:
        cluster.kill()
    print(totals(result, writers, started), flush=True)
    assert result["acknowledged"] > 1000
