"""A topic moved between storage classes under load, on separate processes: three nameservers, four storage nodes, a
broker, topic "orders" in the default (Raft) class on nodes 11 and 12, the controller-mode class "pair" on nodes 13
and 14 (a node keeps one copy of a queue, so a topic moves to groups on other nodes), and writers producing to every
queue through the broker all along. `rocket topic update orders --storage-class pair` moves it, with storage node 11
killed with -9 and restarted as it starts, and a second update moves it back, with the nameserver leader killed so.
Every acknowledged message is consumed, intact, at its acknowledged offset (offsets and order stay, nothing is stored
twice); a consumer group's committed offsets, a pop consumer's position and its dead letters, and an orderly
consumer's queue locks move with the topic; and each old group drops its copy.

Run with -s to see the figures: each move's time, and its stall (the longest a produce waited while it switched).
Node logs are in the test's tmp_path (node<N>.log; nameservers 1-3, storage nodes 11-14, broker 21).
"""

from __future__ import annotations

import dataclasses
import re
import subprocess
import sys
import time

import trio

from rocket.client import Admin, SimpleConsumer, connect
from rocket.errors import Code, RocketError
from tests.integration.controller_cluster import (BROKER, GROUPS, NAMESERVERS, QUEUES, STORAGE_CLASS,
                                                  ControllerCluster, log_times, stop_writers, totals)
from tests.integration.test_cluster import Writers, cluster_status, verify_acknowledged

MOVE_WAIT_S_MAX = 60.0
COMMITTED = 3  # the offset consumer group "billing" commits on every queue before the moves
SEALED = re.compile(r"appends waited ([0-9.]+) s")


@dataclasses.dataclass
class Moved:
    """One move's figures: from the CLI call to the switch, the longest a produce sent meanwhile waited (and one sent
    in as long a time just before), how long the old groups were sealed before the switch (the nameserver leader's
    log), and from the switch to the old groups' drop."""

    storage_class: str
    switched_s: float
    stall_s: float
    before_s: float
    sealed_s: float
    dropped_s: float

    def __str__(self) -> str:
        return (f"to {self.storage_class}: switched after {self.switched_s:.2f} s; the longest produce meanwhile took "
                f"{self.stall_s * 1000:.0f} ms ({self.before_s * 1000:.0f} ms before it); the old groups were sealed "
                f"{self.sealed_s * 1000:.0f} ms before the switch; they dropped their copies {self.dropped_s:.1f} s "
                "after it")


async def move(cluster: ControllerCluster, writers: Writers, storage_class: str, kill_leader: bool = False,
               kill: int = 0) -> Moved:
    """Move "orders" to storage_class with the CLI, and wait until its old groups dropped it (one more "moved; its
    old groups" line in the nameservers' logs). kill_leader: the CLI only starts it (--no-wait), the nameserver
    leader is killed with -9 at once and restarted, and the next leader finishes it; kill: so is that storage
    node."""
    done_before = len(logged(cluster, "moved; its old groups"))
    started = trio.current_time()
    ran = await trio.to_thread.run_sync(lambda: subprocess.run(
        [sys.executable, "-m", "rocket", "topic", "update", "orders", "--storage-class", storage_class, "--server",
         cluster.broker.server, *(["--no-wait"] if kill_leader or kill else [])],
        capture_output=True, text=True, timeout=MOVE_WAIT_S_MAX))
    assert ran.returncode == 0 and f"{'moving' if kill_leader or kill else 'moved'} to storage class " \
        f"{storage_class}" in ran.stdout, ran
    if kill_leader or kill:
        victim = cluster.storage[kill] if kill else \
            cluster.nameservers[(await cluster_status([cluster.broker.server]))["nameserver_leader"]]
        victim.kill()
        victim.start()
        async with connect(cluster.broker.server) as channel:
            with trio.fail_after(MOVE_WAIT_S_MAX):
                await Admin(channel).wait_moved("orders", storage_class)
    switched = trio.current_time()
    stall = max((ack.at - ack.sent_at for ack in writers.acks if ack.sent_at >= started), default=0.0)
    before = max((ack.at - ack.sent_at for ack in writers.acks
                  if started - (switched - started) <= ack.sent_at < started), default=0.0)
    with trio.fail_after(MOVE_WAIT_S_MAX):
        while len(logged(cluster, "moved; its old groups")) <= done_before:
            await trio.sleep(0.5)
    sealed = SEALED.search(logged(cluster, "appends waited")[done_before])
    assert sealed is not None
    return Moved(storage_class, switched - started, stall, before, float(sealed.group(1)),
                 trio.current_time() - switched)


def logged(cluster: ControllerCluster, pattern: str) -> list[str]:
    """The nameservers' log lines that hold pattern, in time order."""
    return [line for _, line in sorted(found for node in NAMESERVERS
                                       for found in log_times(cluster.nameservers[node].log_path, pattern))]


async def start_apart(cluster: ControllerCluster) -> None:
    """Start the cluster (storage nodes 11-14) with class "pair" on nodes 13 and 14 and topic "orders" in the Raft
    class on nodes 11 and 12: the class is made while only 13 and 14 run, and the Raft pool (2 groups of 2 replicas)
    once 11 and 12 joined, on the least loaded nodes."""
    cluster.broker.environment["ROCKET_STORAGE_GROUPS"] = "1"  # every node's: the pool is 2 groups on 4 nodes
    for node in (*cluster.nameservers.values(), cluster.broker, cluster.storage[13], cluster.storage[14]):
        node.start()
    await wait_up(cluster, (13, 14))
    async with connect(cluster.broker.server) as channel:
        admin = Admin(channel)
        await admin.create_storage_class(STORAGE_CLASS, "controller", replicas=2, groups=GROUPS)
        for node in (11, 12):
            cluster.storage[node].start()
        await wait_up(cluster, (11, 12, 13, 14))
        await admin.create_topic("orders", QUEUES)


async def pop_some(channel) -> dict[int, tuple[int, int]]:
    """Pop consumer group "audit" receives and acks messages, and sends one to its dead letters; returns per queue
    where its done messages end and its dead letters, once nothing of it is in flight."""
    consumer = SimpleConsumer(channel, "orders", "audit")
    received = []
    while len(received) < 100:
        received += await consumer.receive(32, wait_s=1.0)
    await consumer.dead_letter(received[0])
    await consumer.ack(*received[1:])
    rows = await Admin(channel).describe_group("orders", "audit")
    assert not any(row["in_flight"] for row in rows) and sum(row["dead_letters"] for row in rows) == 1, rows
    return {row["queue"]: (row["pop_done_before"], row["dead_letters"]) for row in rows}


async def held(cluster: ControllerCluster, group: int) -> list[int]:
    """Bytes of each queue of "orders" the group holds, as its leader (node 13 or 14) answers."""
    for node in (13, 14):
        async with connect(cluster.storage[node].server) as channel:
            try:
                answer = await channel.call("StorageQueues", {"group": group, "topic": "orders",
                                                              "queues": list(range(QUEUES))})
            except RocketError as error:
                if error.code != Code.UNAVAILABLE:
                    raise
                continue
        return [queue["bytes"] for queue in answer["queues"]]
    raise AssertionError(f"neither node 13 nor 14 leads group {group}")


async def wait_up(cluster: ControllerCluster, storage: tuple[int, ...], timeout_s: float = 60.0) -> None:
    with trio.fail_after(timeout_s):
        while True:
            status = await cluster_status([cluster.broker.server])
            if status is not None and {entry["id"] for entry in status["nodes"] if entry["state"] == "up"} >= \
                    set(storage):
                return
            await trio.sleep(0.2)


async def test_a_topic_moves_to_a_controller_class_and_back_under_load(tmp_path):
    cluster = ControllerCluster(tmp_path, storage=(11, 12, 13, 14))
    started = time.monotonic()
    try:
        await start_apart(cluster)
        async with connect(cluster.broker.server) as channel:
            admin = Admin(channel)
            raft_groups = set(await cluster.queue_groups())
            pair_groups = {group["id"] for group in (await admin.storage_classes(STORAGE_CLASS))[0]["groups"]}
            writers = Writers({BROKER: cluster.broker.server})
            async with trio.open_nursery() as writing:
                for queue in range(QUEUES):
                    writing.start_soon(writers.write, queue, 0)
                await trio.sleep(2)
                offsets = [{"queue": queue, "offset": COMMITTED} for queue in range(QUEUES)]
                await channel.call("CommitOffsets", {"group": "billing", "topic": "orders", "offsets": offsets})
                audit = await pop_some(channel)
                lock = {"topic": "orders", "group": "sorted", "queues": [0, 1]}
                assert (await channel.call("LockQueues", {**lock, "client": "one"}))["queues"] == [0, 1]
                print(f"\ncluster up after {time.monotonic() - started:.1f} s; logs in {tmp_path}", flush=True)
                print(await move(cluster, writers, STORAGE_CLASS, kill=11), flush=True)
                assert set(await cluster.queue_groups()) <= pair_groups
                # an orderly consumer's locks moved with the topic: still its own, refused to another
                assert (await channel.call("LockQueues", {**lock, "client": "two"}))["queues"] == []
                assert (await channel.call("LockQueues", {**lock, "client": "one"}))["queues"] == [0, 1]
                print(await move(cluster, writers, "raft", kill_leader=True), flush=True)
                assert set(await cluster.queue_groups()) <= raft_groups
                await trio.sleep(1)
                await stop_writers(writers, list(range(QUEUES)))
            assert (await channel.call("LockQueues", {**lock, "client": "two"}))["queues"] == []
            assert (await channel.call("LockQueues", {**lock, "client": "one"}))["queues"] == [0, 1]
            fetched = await channel.call("FetchOffsets", {"group": "billing", "topic": "orders"})
            assert sorted((entry["queue"], entry["offset"]) for entry in fetched["offsets"]) == \
                [(queue, COMMITTED) for queue in range(QUEUES)]
            after = {row["queue"]: row for row in await admin.describe_group("orders", "audit")}
            assert {queue: (row["pop_done_before"], row["dead_letters"]) for queue, row in after.items()} == audit
        for group in pair_groups:  # the old groups of the move back hold nothing of the topic
            assert await held(cluster, group) == [0] * QUEUES
        assert not cluster.died(), cluster.died()
        result = await verify_acknowledged(writers, cluster.broker.server, tmp_path)
    finally:
        cluster.kill()
    print(totals(result, writers, started), flush=True)
    assert result["acknowledged"] > 1000 and result["duplicates"] == 0, result["duplicated_batches"]
