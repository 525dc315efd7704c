"""The WAL is reclaimed: a real `rocket run` whose topic keeps one second of data locally deletes the WAL
segments once their batches are offloaded and dropped, copies forward the one batch that still pins the
oldest segment (a pending timer), and after a SIGKILL serves every message byte for byte (from the tier)
and still delivers the timer."""

from __future__ import annotations

import random
import time
from pathlib import Path

import pytest
import trio

from rocket import limits
from rocket.client import Admin, connect, open_consumer, open_producer
from rocket.model import Message
from rocket.serde import batch as batch_codec

SEGMENT = limits.raft_wal_segment_bytes_min
QUEUES = 2
BATCHES = 170  # per queue, of 1 MiB: enough for a checkpoint (limits.raft_wal_replay_bytes_max of WAL) and more
MESSAGES_PER_BATCH = 64


def body(queue: int, seq: int) -> bytes:
    return random.Random(queue * 1_000_000 + seq).randbytes(16 * 1024)


def wal_segments(data_dir: Path) -> dict[int, int]:
    """The WAL's segments and their sizes; one reclaimed between the listing and its stat is gone already."""
    found = {}
    for path in (data_dir / "raft").glob("*.log"):
        try:
            found[int(path.stem)] = path.stat().st_size
        except FileNotFoundError:
            continue
    return found


async def consume_all(server: str, topic: str, count: int, timeout_s: float) -> list[Message]:
    found: list[Message] = []
    async with connect(server) as channel, open_consumer(channel, topic, "check", start="earliest",
                                                         wait_ms=500) as consumer:
        with trio.move_on_after(timeout_s):
            while len(found) < count:
                found.extend(await consumer.poll())
    return found


# 4 MiB: reads of the WAL go to the disk; direct: written past the page cache, its newest 4 MiB read from memory
@pytest.mark.parametrize("wal_settings", ["wal_cached_bytes = 0", f"wal_cached_bytes = {4 * limits.MiB}",
                                          f"wal_cached_bytes = {4 * limits.MiB}\nwal_direct_io = true"])
async def test_dropped_local_data_frees_wal_segments_and_loses_nothing(server_process, tmp_path, wal_settings):
    config = tmp_path / "rocket.toml"
    config.write_text(f"wal_segment_bytes = {SEGMENT}\ntier_piece_bytes = {4 * limits.MiB}\n"
                      f"tier_piece_age_s = 0.3\ntier_local_retention_s = 1.0\n{wal_settings}\n")
    node = server_process(tmp_path / "data").start(extra=("--config", str(config)))
    due_ms = int(time.time() * 1000) + 30_000  # the writes and the reclaim before the kill took 10 s on a slow day
    async with connect(node.server) as channel:
        admin = Admin(channel)
        await admin.create_topic("later", 1, "delay")
        await admin.create_topic("orders", QUEUES)
        async with open_producer(channel, "later") as producer:
            timer = await producer.send(Message(b"the timer", key="t", deliver_at_ms=due_ms))
        for start in range(0, BATCHES * MESSAGES_PER_BATCH, MESSAGES_PER_BATCH):
            for queue in range(QUEUES):
                batch = batch_codec.encode([Message(body(queue, seq)) for seq in range(start, start + MESSAGES_PER_BATCH)],
                                           int(time.time() * 1000))
                await channel.call("Produce", {"topic": "orders", "queue": queue, "batch": batch})
    written = sum(wal_segments(node.data_dir).values())  # reclaim may have begun: the checkpoint mark says it may
    assert QUEUES * BATCHES * limits.MiB > limits.raft_wal_replay_bytes_max
    assert (node.data_dir / "raft" / "replay-from").exists(), "no checkpoint was taken"

    with trio.move_on_after(90):
        while 0 in wal_segments(node.data_dir) or sum(wal_segments(node.data_dir).values()) > 3 * SEGMENT:
            await trio.sleep(0.5)
    segments = wal_segments(node.data_dir)
    assert 0 not in segments and sum(segments.values()) <= 3 * SEGMENT, (written, segments)
    assert time.time() * 1000 < due_ms, "the timer fired before the WAL was reclaimed: make it later"

    node.kill()
    node.start(extra=("--config", str(config)))
    messages = await consume_all(node.server, "orders", QUEUES * BATCHES * MESSAGES_PER_BATCH, 120)
    for queue in range(QUEUES):
        mine = [message for message in messages if message.queue == queue]
        assert [message.offset for message in mine] == list(range(BATCHES * MESSAGES_PER_BATCH))
        assert all(message.body == body(queue, message.offset) for message in mine)
    [fired] = await consume_all(node.server, "later", 1, 90)
    assert (fired.body, fired.key, fired.timestamp_ms) == (b"the timer", "t", due_ms)
    assert "no O_DIRECT" not in node.log_path.read_text()
    assert time.time() * 1000 >= due_ms and timer.offset == 0
