"""Read replicas (issue 53) with real `rocket run` processes on 127.0.0.1: three all-role nodes, a topic on them
given two read replicas per group with the CLI, placed once two storage-only nodes join; writers, a tailing consumer
(long polls) and a pop consumer running while each read replica's node in turn is killed with SIGKILL and restarted. The consumer sees every acknowledged message, each
queue's offsets one after another (none before it was committed, none going backwards), and the read replicas served
reads (their /metrics). Node logs are in the test's tmp_path."""

from __future__ import annotations

import collections
import contextlib
import os
import subprocess
import sys
import urllib.request

import trio

from rocket.client import connect
from rocket.client.consumer import Consumer
from rocket.client.simple import SimpleConsumer
from rocket.errors import Code, RocketError
from rocket.transport.listen import free_ports
from tests.integration.test_cluster import (ROOT, SEQ_SPAN, Node, Writers, cluster_status, running,
                                           verify_acknowledged)

QUEUES = 4
GROUPS = 2  # per 3 storage nodes: the 5 make 4


class MeteredNode(Node):
    """A node that also serves /metrics on its own HTTP/1.1 port."""

    def __init__(self, node_id: int, port: int, http_port: int, nameservers: str, base, roles: str):
        super().__init__(node_id, port, nameservers, base, roles,
                         {"ROCKET_STORAGE_GROUPS": str(GROUPS), "ROCKET_REPLICATION": "3"})
        self.http_port = http_port

    def command(self) -> list[str]:
        return super().command() + ["--http-listen", f"127.0.0.1:{self.http_port}"]

    def read_messages(self, topic: str) -> float:
        """rocket_topic_read_messages of the topic: what this node's replicas returned to reads."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.http_port}/metrics", timeout=10) as answer:
            text = answer.read().decode()
        return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                   if line.startswith(f'rocket_topic_read_messages_total{{topic="{topic}"}}'))


def rocket_cli(*arguments: str) -> str:
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    done = subprocess.run([sys.executable, "-m", "rocket", *arguments], capture_output=True, text=True, timeout=60,
                          cwd=ROOT, env={**os.environ, "PYTHONPATH": path, "COLUMNS": "200"})
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


async def readers_of(servers: list[str], want: int, timeout_s: float) -> dict[int, list[int]]:
    """Wait until every group of the topic holds want read replicas, each within 200 entries of its leader; group ->
    readers."""
    async with connect(",".join(servers)) as channel:
        route = await channel.call("GetRoute", {"topic": "orders"})
    groups = set(route["queue_groups"])
    with trio.fail_after(timeout_s):
        while True:
            status = await cluster_status(servers)
            mine = [group for group in (status or {"groups": []})["groups"] if group["id"] in groups]
            if len(mine) == len(groups) and all(
                    len(group["readers"]) == want and not any(lag["entries"] > 200 for lag in group["lagging"])
                    for group in mine):
                return {group["id"]: group["readers"] for group in mine}
            await trio.sleep(0.3)


def served_since_restart(nodes: dict, readers: list[int]) -> list[float]:
    return [nodes[node].read_messages("orders") for node in readers]


def acknowledged(writers: Writers) -> set[tuple[int, int]]:
    return {(ack.queue, ack.base_offset + index) for ack in writers.acks for index in range(len(ack.seqs))}


def test_read_replicas_serve_tail_reads_through_kills(tmp_path):
    node_ids = (1, 2, 3, 4, 5)
    ports = free_ports(2 * len(node_ids))
    nameservers = ",".join(f"{node}@127.0.0.1:{ports[node - 1]}" for node in (1, 2, 3))
    nodes = {node: MeteredNode(node, ports[node - 1], ports[len(node_ids) + node - 1], nameservers, tmp_path,
                               "all" if node <= 3 else "storage") for node in node_ids}
    with running({node: nodes[node] for node in (1, 2, 3)}), contextlib.ExitStack() as stack:
        servers = [nodes[node].server for node in (1, 2, 3)]
        created = rocket_cli("topic", "create", "orders", "--queues", str(QUEUES), "--read-replicas", "2",
                             "--server", servers[0])
        assert "2 read replicas per group" in created, created
        for node in (4, 5):  # the nodes where the topic's groups (on nodes 1-3) can have read replicas
            stack.callback(nodes[node].kill)
            nodes[node].start()
        readers = trio.run(readers_of, servers, 2, 60)
        readers_nodes = sorted({node for group in readers.values() for node in group})
        status = rocket_cli("cluster", "status", "--groups", "--server", servers[1])
        assert "readers" in status, status

        async def scenario() -> tuple[dict, dict[int, list[int]], set[tuple[int, int]], Writers]:
            writers = Writers({node: nodes[node].server for node in (1, 2, 3)})
            offsets: dict[int, list[int]] = collections.defaultdict(list)
            popped: set[tuple[int, int]] = set()
            tail_done, popped_all = trio.Event(), trio.Event()

            async def tail() -> None:
                async with connect(",".join(servers)) as channel:
                    consumer = Consumer(channel, "orders", "tail", start="earliest", wait_ms=500)
                    await consumer.open()
                    idle = 0
                    while idle < 6 or not writers.stop.is_set() or writers.done < QUEUES:
                        messages = await consumer.poll()
                        idle = 0 if messages else idle + 1
                        for message in messages:
                            offsets[message.queue].append(message.offset)
                tail_done.set()

            async def pop() -> None:
                """A pop (simple) consumer, whose waits for new messages the replicas and read replicas serve."""
                async with connect(",".join(servers)) as channel:
                    receiver = SimpleConsumer(channel, "orders", "popper", invisible_s=60)
                    while not (writers.done == QUEUES and acknowledged(writers) <= popped):
                        messages = await receiver.receive(512, wait_s=1)
                        popped.update((message.queue, message.offset) for message in messages)
                        try:
                            await receiver.ack(*messages)
                        except RocketError as error:
                            if error.code != Code.NOT_FOUND:
                                raise
                popped_all.set()

            async with trio.open_nursery() as nursery:
                for queue in range(QUEUES):
                    nursery.start_soon(writers.write, queue, queue)
                nursery.start_soon(tail)
                nursery.start_soon(pop)
                await trio.sleep(4)
                for node in readers_nodes:  # under reads; one at a time, so that every group keeps a quorum
                    nodes[node].kill()
                    await trio.sleep(3)
                    nodes[node].start()
                    await nodes[node].wait_ready()
                    await readers_of(servers, 2, 60)
                # Reads come back to each restarted read replica (a broker asks a node that went silent last,
                # for limits.storage_silent_s).
                with trio.fail_after(60):
                    while not all(await trio.to_thread.run_sync(served_since_restart, nodes, readers_nodes)):
                        await trio.sleep(0.5)
                writers.stop.set()
                with trio.fail_after(120):
                    await tail_done.wait()
                with trio.fail_after(120):
                    await popped_all.wait()
            return await verify_acknowledged(writers, servers[2], tmp_path), offsets, popped, writers

        report, offsets, popped, writers = trio.run(scenario)
        assert report["acknowledged"] > 0
        for queue in range(QUEUES):
            seen = offsets[queue]
            assert seen == list(range(len(seen))), f"queue {queue}: the tail consumer saw offsets out of order"
            acked = {seq for seq in report["acked"] if seq // SEQ_SPAN == queue}
            assert len(seen) >= len(acked), f"queue {queue}: tailed {len(seen)} of {len(acked)} acknowledged"
        assert acknowledged(writers) <= popped  # the pop consumer ran until it had them all
        served = {node: nodes[node].read_messages("orders") for node in readers_nodes}  # since its restart
        print(f"read replicas {readers}; messages each served to reads since its restart {served}; "
              f"{report['acknowledged']} acknowledged, {report['duplicates']} duplicates", flush=True)
        assert all(count > 0 for count in served.values()), served
