"""Storage classes on running nodes (issue 32): a dev-mode node lists the default class, refuses a controller-mode
class it has too few storage nodes for and bad settings in one line, and places a topic of a class only on that
class's groups; three nodes make a controller-mode class whose groups carry the controller's master and sync state
set to routes, assignments and the cluster status."""

from __future__ import annotations

import pytest
import trio

from rocket.client import Admin, connect, open_consumer, open_producer
from rocket.client.kv import KV
from rocket.errors import Code, RocketError
from rocket.model import Message
from rocket.transport.listen import free_ports
from tests.integration.test_cluster import Node, cluster_status


async def refusal(call) -> RocketError:
    with pytest.raises(RocketError) as refused:
        await call
    return refused.value


@pytest.mark.parametrize("serde", ["json", "avro", "lane"])
async def test_dev_mode_lists_the_raft_class_and_refuses_what_it_cannot_hold(node, serde):
    async with connect(f"127.0.0.1:{node.tcp_port}", serde=serde) as channel:
        admin = Admin(channel)
        [raft] = await admin.storage_classes()
        assert (raft["name"], raft["mode"], raft["groups"]) == ("raft", "raft", [])  # no topic yet: no group
        await admin.create_topic("plain", 4)
        [raft] = await admin.storage_classes()
        assert raft["groups"] and all(group["mode"] == "raft" for group in raft["groups"])

        short = await refusal(admin.create_storage_class("gold", "controller", replicas=2))
        assert short.code == Code.UNAVAILABLE
        assert short.message == "storage class 'gold' needs 2 storage nodes up for its 2 replicas; 1 is up"
        for call, says in [
            (admin.create_storage_class("gold", "paxos"), "mode must be one of raft, controller, got 'paxos'"),
            (admin.create_storage_class("gold", "controller", replicas=1), "needs 2..7 replicas"),
            (admin.create_storage_class("gold", "controller", min_in_sync_replicas=3), "min_in_sync_replicas must"),
            (admin.create_storage_class("gold", "controller", ha_max_lag_s=0.0), "ha_max_lag_s must be"),
            (admin.create_storage_class("bad name!", "raft", replicas=1), "storage class name 'bad name!'"),
            (admin.create_storage_class("raft", "raft", replicas=1), "storage class 'raft' exists"),
            (admin.create_topic("t", 1, storage_class="gold"), "storage class 'gold' does not exist"),
            (admin.storage_classes("gold"), "storage class 'gold' does not exist"),
        ]:
            refused = await refusal(call)
            assert refused.code == Code.BAD_REQUEST and says in refused.message, refused
        assert [entry["name"] for entry in await admin.storage_classes()] == ["raft"]


async def test_a_topic_of_a_class_lives_on_that_class_s_groups_only(node):
    """A raft-mode class fits one storage node: its topics' queues (and queues added later) go to its two groups,
    and the default class's topics never do."""
    async with connect(f"127.0.0.1:{node.tcp_port}") as channel:
        admin = Admin(channel)
        await admin.create_topic("plain", 8)
        made = await admin.create_storage_class("fast", "raft", replicas=1, groups=2)
        fast = [group["id"] for group in made["groups"]]
        assert len(fast) == 2 and all(group["storage_class"] == "fast" for group in made["groups"])
        spec = await admin.create_topic("quick", 4, storage_class="fast")
        assert spec.storage_class == "fast"
        route = await channel.call("GetRoute", {"topic": "quick"})
        assert set(route["queue_groups"]) == set(fast) and route["topic"]["storage_class"] == "fast"
        await admin.create_topic("later", 8)
        for name in ("plain", "later"):
            placed = set((await channel.call("GetRoute", {"topic": name}))["queue_groups"])
            assert placed and not placed & set(fast), name
        await admin.update_topic("quick", queues=6)
        assert set((await channel.call("GetRoute", {"topic": "quick"}))["queue_groups"]) <= set(fast)

        async with open_producer(channel, "quick") as producer:
            await producer.send_many([Message(b"%d" % number, key=str(number)) for number in range(60)])
        async with open_consumer(channel, "quick", "g", start="earliest", wait_ms=0) as consumer:
            bodies = [message.body for message in await consumer.poll()]
            while more := await consumer.poll():
                bodies += [message.body for message in more]
        assert sorted(bodies) == sorted(b"%d" % number for number in range(60))

        [described] = await admin.storage_classes("fast")
        assert [group["id"] for group in described["groups"]] == fast and described["elections"] == []
        listed = {entry["name"]: entry for entry in await admin.storage_classes()}
        assert list(listed) == ["raft", "fast"] and not {group["id"] for group in listed["raft"]["groups"]} & set(fast)
        assert (await admin.describe_topic("quick"))[0].storage_class == "fast"


async def test_three_nodes_make_a_controller_class_whose_masters_reach_routes_and_status(tmp_path):
    """Its groups' masters are the routes' leaders; node 3 drained, the Raft groups' replicas leave it, and so do the
    controller groups': each is handed over if node 3 masters it, and replaced on the node left."""
    ports = free_ports(3)
    nameservers = ",".join(f"{node}@127.0.0.1:{port}" for node, port in zip((1, 2, 3), ports))
    environment = {"ROCKET_STORAGE_GROUPS": "3", "ROCKET_REPLICATION": "2"}
    nodes = [Node(node, port, nameservers, tmp_path, environment=environment) for node, port in zip((1, 2, 3), ports)]
    try:
        for node in nodes:
            node.start()
        for node in nodes:
            await node.wait_ready()
        servers = [node.server for node in nodes]
        async with connect(",".join(servers)) as channel:
            admin = Admin(channel)
            with trio.fail_after(30):  # until every storage node has been heard from
                while not (status := await cluster_status(servers)) or sum(
                        entry["state"] == "up" for entry in status["nodes"]) < 3:
                    await trio.sleep(0.2)
            await admin.create_topic("plain", 8)
            made = await admin.create_storage_class("gold", "controller", replicas=2, groups=4,
                                                    min_in_sync_replicas=2, ha_max_lag_s=3.0)
            assert made["mode"] == "controller" and len(made["groups"]) == 4
            for group in made["groups"]:
                assert len(group["voters"]) == 2 and group["master"] == group["voters"][0] == group["leader"]
                assert sorted(group["sync_state_set"]) == sorted(group["voters"])
                assert (group["master_epoch"], group["sync_state_set_epoch"]) == (1, 1)
                assert (group["min_in_sync_replicas"], group["ha_max_lag_s"]) == (2, 3.0)
            masters = {group["id"]: group["master"] for group in made["groups"]}
            voters = {group["id"]: group["voters"] for group in made["groups"]}
            assert any(3 in members for members in voters.values())
            await admin.create_topic("orders", 8, storage_class="gold")
            kv = KV(channel)  # a bucket's shards on the controller's groups: linearizable reads confirmed by the SSS
            await kv.create_bucket("cfg", shards=2, storage_class="gold")
            assert set((await channel.call("GetRoute", {"topic": "%KV%cfg"}))["queue_groups"]) <= set(masters)
            revision = await kv.put("cfg", "mode", b"fast")
            assert (await kv.get("cfg", "mode")).value == b"fast" and revision >= 1
            assert (await refusal(kv.create_bucket("other", storage_class="tin"))).message == (
                "storage class 'tin' does not exist")
            route = await channel.call("GetRoute", {"topic": "orders"})
            assert set(route["queue_groups"]) <= set(masters)
            assert {group["id"]: group["leader"] for group in route["groups"]} == {
                group: master for group, master in masters.items() if group in route["queue_groups"]}
            status = await admin.cluster_status()
            gold = {group["id"]: group for group in status["groups"] if group["storage_class"] == "gold"}
            assert set(gold) == set(masters) and all(group["mode"] == "controller" for group in gold.values())
            listed = {entry["name"]: entry for entry in await admin.storage_classes()}
            assert listed["raft"]["replicas"] == 2 and len(listed["gold"]["groups"]) == 4
            assert any(3 in group["voters"] for group in listed["raft"]["groups"])

            await admin.drain_node(3)
            with trio.fail_after(90):
                while any(3 in group["voters"] + group["learners"] + group.get("sync_state_set", [])
                          for group in [*(await admin.storage_classes("raft"))[0]["groups"],
                                        *(await admin.storage_classes("gold"))[0]["groups"]]):
                    await trio.sleep(0.5)
            [after] = await admin.storage_classes("gold")
            for group in after["groups"]:
                assert sorted(group["voters"]) == sorted(group["sync_state_set"]) == [1, 2], group
                assert group["master"] == masters[group["id"]] or masters[group["id"]] == 3, (group, masters)
            assert (await kv.get("cfg", "mode")).value == b"fast"
    finally:
        for node in nodes:
            node.kill()
