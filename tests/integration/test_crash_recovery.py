"""A real `rocket run` killed with SIGKILL mid-produce loses nothing it acknowledged."""

from __future__ import annotations

import pytest
import trio

from rocket.client import connect, open_consumer
from rocket.errors import RocketError
from rocket.model import Message, queue_for_key
from rocket.serde import batch as batch_codec

TOTAL = 100_000
QUEUES = 8
CHUNK = 500


def make_message(seq: int) -> Message:
    return Message(f"body-{seq}-".encode() + bytes(seq % 97), key=f"user-{seq % 997}", tag=f"t{seq % 5}",
                   properties={"seq": str(seq), "region": "eu" if seq % 2 else "us"})


def check_intact(message: Message) -> int:
    seq = int(message.properties["seq"])
    expected = make_message(seq)
    assert (message.body, message.key, message.tag, message.properties) == (
        expected.body, expected.key, expected.tag, expected.properties)
    return seq


async def produce(server: str, seqs_by_queue: dict[int, list[int]], sent: set[int],
                  acked: dict[int, tuple[int, int]], kill_after: int | None, kill) -> None:
    """One sequential stream per queue (so per-queue order is the send order); kill the server midway."""
    async with connect(server) as channel:

        async def one_queue(queue: int, seqs: list[int]) -> None:
            for start in range(0, len(seqs), CHUNK):
                chunk = seqs[start:start + CHUNK]
                encoded = batch_codec.encode([make_message(seq) for seq in chunk], 1_700_000_000_000)
                sent.update(chunk)
                try:
                    reply = await channel.call("Produce", {"topic": "orders", "queue": queue, "batch": encoded})
                except RocketError:
                    return  # the server died with this batch in flight: it was never acknowledged
                for index, seq in enumerate(chunk):
                    acked[seq] = (queue, reply["base_offset"] + index)
                if kill_after is not None and len(acked) >= kill_after:
                    kill()

        async with trio.open_nursery() as nursery:
            for queue, seqs in seqs_by_queue.items():
                nursery.start_soon(one_queue, queue, seqs)


async def consume_all(server: str, group: str, limit: int | None = None) -> list[Message]:
    async with connect(server, serde="avro") as channel, open_consumer(channel, "orders", group, start="earliest",
                                                                       wait_ms=300) as consumer:
        received: list[Message] = []
        while limit is None or len(received) < limit:
            messages = await consumer.poll(limit=None if limit is None else limit - len(received))
            if not messages:
                break
            received.extend(messages)
            await consumer.commit()
        return received


@pytest.mark.parametrize("direct", [False, True], ids=["page-cache", "direct-io"])
async def test_sigkill_mid_produce_then_consume_exactly_once(server_process, monkeypatch, direct):
    """Every acknowledged message is consumed exactly once per group, in queue order, intact, across kill -9s,
    whether the WAL is written through the page cache or with O_DIRECT."""
    monkeypatch.setenv("ROCKET_WAL_DIRECT_IO", str(direct).lower())
    server = server_process().start()
    async with connect(server.server) as channel:
        await channel.call("CreateTopic", {"topic": "orders", "queues": QUEUES})
    by_queue: dict[int, list[int]] = {queue: [] for queue in range(QUEUES)}
    for seq in range(TOTAL):
        by_queue[queue_for_key(make_message(seq).key, QUEUES)].append(seq)
    sent: set[int] = set()
    acked: dict[int, tuple[int, int]] = {}
    await produce(server.server, by_queue, sent, acked, kill_after=TOTAL // 3, kill=server.kill)
    acked_before_kill = len(acked)
    assert TOTAL // 3 <= acked_before_kill < TOTAL

    server.start()  # same data directory: recovery runs
    rest = {queue: [seq for seq in seqs if seq not in sent] for queue, seqs in by_queue.items()}
    await produce(server.server, rest, sent, acked, kill_after=None, kill=None)

    first = await consume_all(server.server, "billing")
    seen: dict[int, tuple[int, int]] = {}
    for message in first:
        seq = check_intact(message)
        assert seq not in seen, f"message {seq} delivered twice"
        seen[seq] = (message.queue, message.offset)
    for seq, position in acked.items():
        assert seen.get(seq) == position, f"acknowledged message {seq} at {position} was not consumed there"
    for queue in range(QUEUES):
        in_queue = [m for m in first if m.queue == queue]
        assert [m.offset for m in in_queue] == list(range(len(in_queue)))
        seqs = [int(m.properties["seq"]) for m in in_queue]
        assert seqs == sorted(seqs), f"queue {queue} out of send order"

    # A second group consumes part, commits, the server is killed, and it resumes without loss or repeats.
    part = await consume_all(server.server, "audit", limit=len(first) // 2)
    server.kill()
    server.start()
    remainder = await consume_all(server.server, "audit")
    assert sorted(int(m.properties["seq"]) for m in part + remainder) == sorted(seen)
    again = await consume_all(server.server, "billing")
    assert again == []
    assert "no O_DIRECT" not in server.log_path.read_text()


async def test_sigterm_drains_and_keeps_every_acknowledgement(server_process):
    """SIGTERM during a produce stream exits cleanly and promptly; everything acknowledged is there after restart."""
    server = server_process().start()
    async with connect(server.server) as channel:
        await channel.call("CreateTopic", {"topic": "orders", "queues": QUEUES})
    by_queue = {queue: [] for queue in range(QUEUES)}
    for seq in range(40_000):
        by_queue[queue_for_key(make_message(seq).key, QUEUES)].append(seq)
    sent: set[int] = set()
    acked: dict[int, tuple[int, int]] = {}
    status: list[int] = []

    def terminate():
        if not status:
            status.append(server.terminate(timeout_s=30))

    await produce(server.server, by_queue, sent, acked, kill_after=10_000, kill=terminate)
    assert status == [0], "a graceful stop exits with status 0"
    server.start()
    seen = {int(m.properties["seq"]): (m.queue, m.offset) for m in await consume_all(server.server, "g")}
    assert all(seen.get(seq) == position for seq, position in acked.items())


def test_damage_in_the_log_stops_startup_with_a_clear_error(server_process, tmp_path):
    """A torn tail of the WAL is cut back at restart; damage before good records stops startup with CORRUPT_DATA."""
    import subprocess
    import sys

    server = server_process().start()
    trio.run(fill_topic, server.server)
    server.kill()
    segment = sorted((server.data_dir / "raft").glob("*.log"))[-1]
    size = segment.stat().st_size
    before = segment.read_bytes()
    torn = b"\x47\x4c\x4b\x52" + bytes(100)  # a torn, half-written record
    with open(segment, "r+b") as file:
        file.seek(size)
        file.write(torn)
    server.start()
    server.kill()
    # Cut back to the last good record; the restarted node may have appended good records since (a new leader's
    # empty entry, applied before the kill or not, writes one).
    after = segment.read_bytes()
    assert after[:size] == before and after[size:size + len(torn)] != torn
    with open(segment, "r+b") as file:
        file.seek(size // 2)
        file.write(b"\x00\x01\x02\x03")
    result = subprocess.run([sys.executable, "-m", "rocket", "run", "--data-dir", str(server.data_dir),
                             "--listen", "127.0.0.1:0", "--http2-listen", "off"], capture_output=True, timeout=60)
    assert result.returncode == 1
    assert b"CORRUPT_DATA" in result.stderr and segment.name.encode() in result.stderr


async def fill_topic(server: str) -> None:
    async with connect(server) as channel:
        await channel.call("CreateTopic", {"topic": "orders", "queues": 2})
        for index in range(20):
            batch = batch_codec.encode([make_message(index * 10 + i) for i in range(10)], 1_700_000_000_000)
            await channel.call("Produce", {"topic": "orders", "queue": index % 2, "batch": batch})


WIDE_QUEUES = 1024  # a commit of every queue's offset: some 30 KiB of LevelDB writes per storage group


async def commit_wide(channel, round_number: int) -> None:
    await channel.call("CommitOffsets", {"group": "wide", "topic": "wide", "offsets": [
        {"queue": queue, "offset": round_number * 10 + queue} for queue in range(WIDE_QUEUES)]})


async def test_sigkill_after_many_wide_commits_loses_nothing(server_process):
    """A node killed with SIGKILL after many syncs of its LevelDB (once a second) restarts from LevelDB and the WAL:
    every acknowledged message is read back at its offset, a consumer group resumes where it committed, and the
    last commit of a wide topic holds on every queue."""
    server = server_process().start()
    async with connect(server.server) as channel:
        await channel.call("CreateTopic", {"topic": "orders", "queues": QUEUES})
        await channel.call("CreateTopic", {"topic": "wide", "queues": WIDE_QUEUES})
    by_queue: dict[int, list[int]] = {queue: [] for queue in range(QUEUES)}
    for seq in range(20_000):
        by_queue[queue_for_key(make_message(seq).key, QUEUES)].append(seq)
    sent: set[int] = set()
    acked: dict[int, tuple[int, int]] = {}
    first_half = {queue: seqs[:len(seqs) // 2] for queue, seqs in by_queue.items()}
    await produce(server.server, first_half, sent, acked, kill_after=None, kill=None)
    part = await consume_all(server.server, "audit", limit=len(acked) // 2)

    rounds = 0
    async with connect(server.server) as channel:
        started = trio.current_time()
        while trio.current_time() < started + 3:  # the background sync runs once a second
            rounds += 1
            await commit_wide(channel, rounds)
        rest = {queue: seqs[len(seqs) // 2:] for queue, seqs in by_queue.items()}
        await produce(server.server, rest, sent, acked, kill_after=None, kill=None)
        rounds += 1
        await commit_wide(channel, rounds)
    assert len(acked) == 20_000
    server.kill()

    server.start()
    assert not (server.data_dir / "storage" / "log").exists()  # the store keeps no log of its own
    seen = {check_intact(message): (message.queue, message.offset) for message in await consume_all(server.server, "billing")}
    assert seen == acked
    remainder = await consume_all(server.server, "audit")
    assert sorted(int(m.properties["seq"]) for m in part + remainder) == sorted(acked)
    async with connect(server.server) as channel:
        offsets = (await channel.call("FetchOffsets", {"group": "wide", "topic": "wide"}))["offsets"]
    assert {entry["queue"]: entry["offset"] for entry in offsets} == {
        queue: rounds * 10 + queue for queue in range(WIDE_QUEUES)}
    assert "rebuilding" not in server.log_path.read_text()
