"""A dev node whose data disk fills answers DISK_FULL, keeps serving reads, takes writes again once space is freed
without a restart, and after kill -9 still holds every acknowledged message exactly once."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest
import trio

from rocket import limits
from rocket.client import connect, open_consumer
from rocket.errors import Code, RocketError
from rocket.model import Message
from rocket.serde import batch as batch_codec

QUEUES = 4
PER_BATCH = 100
FILESYSTEM_MIB = 96


@pytest.fixture
def small_disk(tmp_path):
    """A tmpfs of FILESYSTEM_MIB mounted at tmp_path/disk; skipped where mounting is not permitted."""
    mount_point = tmp_path / "disk"
    mount_point.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={FILESYSTEM_MIB}m", "tmpfs", str(mount_point)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {done.stderr.strip()}")
    yield mount_point
    subprocess.run(["umount", "-l", str(mount_point)], capture_output=True)


def batch_of(first_seq: int) -> bytes:
    messages = [Message(f"m{seq}-".encode() + bytes(1000), properties={"seq": str(seq)})
                for seq in range(first_seq, first_seq + PER_BATCH)]
    return batch_codec.encode(messages, 1_700_000_000_000)


async def produce_until_refused(channel, acked: dict[int, tuple[int, int]], next_seq: int,
                                batches_max: int) -> tuple[int, RocketError | None]:
    """Produce batches until one is refused (returned) or batches_max went through."""
    for number in range(batches_max):
        queue = number % QUEUES
        try:
            reply = await channel.call("Produce", {"topic": "orders", "queue": queue, "batch": batch_of(next_seq)})
        except RocketError as error:
            return next_seq + PER_BATCH, error
        for index in range(PER_BATCH):
            acked[next_seq + index] = (queue, reply["base_offset"] + index)
        next_seq += PER_BATCH
    return next_seq, None


async def read_all(server: str, group: str) -> dict[int, tuple[int, int]]:
    """Every message of the topic, read from the start by a fresh consumer group; fails on a repeat."""
    seen: dict[int, tuple[int, int]] = {}
    async with connect(server) as channel, open_consumer(channel, "orders", group, start="earliest",
                                                         wait_ms=300) as consumer:
        while messages := await consumer.poll():
            for message in messages:
                seq = int(message.properties["seq"])
                assert seq not in seen, f"message {seq} read twice"
                assert message.body == f"m{seq}-".encode() + bytes(1000)
                seen[seq] = (message.queue, message.offset)
    return seen


def fill(path: Path, leave_bytes: int) -> None:
    """Write a filler file until the file system has about leave_bytes free."""
    status = os.statvfs(path.parent)
    size = max(0, status.f_bavail * status.f_frsize - leave_bytes)
    with open(path, "wb") as file:
        file.truncate(0)
        for _ in range(size // (1 << 20)):
            file.write(bytes(1 << 20))


async def test_full_disk_refuses_writes_keeps_reads_and_resumes(server_process, small_disk):
    """DISK_FULL on produce, reads intact meanwhile, produce again after space is freed (same process), and
    every acknowledged message exactly once after a kill -9 and restart."""
    server = server_process(small_disk / "data").start()
    fill(small_disk / "ballast", leave_bytes=limits.disk_reserve_bytes + 24 * limits.MiB)  # room for ~20 MiB of data
    acked: dict[int, tuple[int, int]] = {}
    async with connect(server.server) as channel:
        await channel.call("CreateTopic", {"topic": "orders", "queues": QUEUES})
        next_seq, refused = await produce_until_refused(channel, acked, 0, batches_max=2_000)
        assert refused is not None and refused.code == Code.DISK_FULL, refused
        assert "full" in refused.message and "\n" not in refused.message
        assert len(acked) >= 10_000  # the disk filled with data, not at once

        # Something else takes the rest of the disk: writes are refused, reads go on, the node stays up.
        fill(small_disk / "filler", leave_bytes=0)
        await trio.sleep(2 * limits.disk_probe_s)
        next_seq, refused = await produce_until_refused(channel, acked, next_seq, batches_max=3)
        assert refused is not None and refused.code == Code.DISK_FULL
        assert await read_all(server.server, "while-full") == acked

        # Space returns: the same process takes writes again.
        (small_disk / "filler").unlink()
        (small_disk / "ballast").unlink()
        deadline = time.monotonic() + 10
        while True:
            before = len(acked)
            next_seq, refused = await produce_until_refused(channel, acked, next_seq, batches_max=5)
            if len(acked) > before:
                break
            assert time.monotonic() < deadline, f"writes not taken again after space returned: {refused}"
            await trio.sleep(limits.disk_probe_s)
    assert server.process.poll() is None

    server.kill()
    server.start()
    seen = await read_all(server.server, "after-restart")
    for seq, position in acked.items():
        assert seen.get(seq) == position, f"acknowledged message {seq} at {position} is not there"
    # Refused batches were never acknowledged; none of them shows up either (each was refused before its proposal).
    assert set(seen) == set(acked)


async def test_a_full_storage_node_hands_its_leaderships_over_and_the_cluster_keeps_writing(small_disk, tmp_path):
    """Three nodes, one of whose data disk fills (a filler file under the reserve): it hands over every group it
    leads and leads none while full, writers never stop, and nothing acknowledged is lost or stored twice."""
    from rocket.transport.listen import free_ports
    from tests.integration.test_cluster import Node, Writers, cluster_status, verify_acknowledged, \
        wait_all_groups_led

    groups, ids = 6, (1, 2, 3)
    ports = free_ports(len(ids))
    nameservers = ",".join(f"{node}@127.0.0.1:{port}" for node, port in zip(ids, ports))
    environment = {"ROCKET_STORAGE_GROUPS": str(groups), "ROCKET_REPLICATION": "3"}
    nodes = {node: Node(node, port, nameservers, tmp_path, environment=environment) for node, port in zip(ids, ports)}
    full = nodes[1]
    full.data_dir = small_disk / "data"
    servers = [node.server for node in nodes.values()]
    try:
        for node in nodes.values():
            node.start()
        for node in nodes.values():
            await node.wait_ready()
        async with connect(servers[1]) as channel:
            await channel.call("CreateTopic", {"topic": "orders", "queues": 8}, timeout_s=30)
        await wait_all_groups_led(servers, set(ids), timeout_s=30, groups=groups)
        writers = Writers({node: nodes[node].server for node in (2, 3)})
        async with trio.open_nursery() as nursery:
            for index, queue in enumerate((0, 2, 4, 6)):
                nursery.start_soon(writers.write, queue, index)
            await trio.sleep(2)
            room = os.statvfs(small_disk).f_bavail * os.statvfs(small_disk).f_frsize
            with open(small_disk / "filler", "wb") as filler:  # leaves half the reserve free
                os.posix_fallocate(filler.fileno(), 0, max(1, room - limits.disk_reserve_bytes // 2))
            filled_at = trio.current_time()
            with trio.fail_after(20):
                while True:  # the node's next heartbeats hand its groups over, and the nameservers lead none back
                    status = await cluster_status(servers[1:])
                    if status is not None and len(status["groups"]) == groups and all(
                            group["leader"] in (2, 3) for group in status["groups"]):
                        break
                    await trio.sleep(0.2)
            handed_over_s = trio.current_time() - filled_at
            acked_before = len(writers.acks)
            await trio.sleep(3)
            assert len(writers.acks) > acked_before, "writers stalled while one node's disk was full"
            status = await cluster_status(servers[1:])
            assert all(group["leader"] != 1 for group in status["groups"]), status["groups"]
            (small_disk / "filler").unlink()
            await trio.sleep(2)
            writers.stop.set()
            with trio.fail_after(30):
                while writers.done < 4:
                    await trio.sleep(0.1)
        assert full.exited_by_itself() is None, full.log_path.read_text()[-3000:]
        result = await verify_acknowledged(writers, servers[1], tmp_path)
        print(f"full node handed its leaderships over in {handed_over_s:.1f} s; acknowledged {result['acknowledged']},"
              f" duplicates {result['duplicates']}, writer errors {dict(writers.errors)}")
        assert result["acknowledged"] > 0 and result["duplicates"] == 0
    finally:
        for node in nodes.values():
            node.kill()
