"""Deleting a big topic: how long `Admin.delete_topic(force=True)` takes, and when its bytes leave the disk. A dev node
(`python -m rocket run`, started on free ports as benchmarks/restart.py starts it) on a temporary data directory; a
topic of --queues queues; --gb GiB produced to it (1 KiB messages in batches of --batch-kib KiB, pipelined by the
client's producer); the local tier (a dev node's default backend, data_dir/tier) given --offload-wait-s to take
every full piece; the data directory measured (the blocks its files use, as `du`, and apart: the WAL's segments, the
Raft snapshots, the local tier, the store's indexes, and the bytes of files the node deleted but still holds open,
which the disk has not got back); then the delete timed (the call alone, on an open connection); then the directory
measured every --poll-s until the deleted topic's bytes are freed or --free-timeout-s passed, and then until it
stops shrinking (--settle-s). All along, from before the delete, the node is pinged every 50 ms: a stall of its event
loop (the delete's or the reclaim's work done in it) shows as a slow answer.

    PYTHONPATH=. python benchmarks/delete.py [--gb 1] [--free-timeout-s 300] [--fill-after-s 30] [--fill-mib-s 20]
        [--data-parent /tmp] [--keep-data] [--out benchmarks/results/delete.json]

Freed means: the directory (deleted-but-open files included), less the WAL bytes written after the delete (the
filler's below, the delete's own entries, checkpoints), is below its size before the produce plus --freed-fraction-left
(default 10%) of the bytes produced. Not "the size before plus 10%" of it: an empty node's directory is some tens of
KB, and the WAL's active segment (never deleted, rocket/disk/commitlog.py delete_before) alone exceeds that.

When the WAL is reclaimed (rocket/roles/storage/reclaim.py): every limits.wal_reclaim_s the storage role deletes the
sealed segments below the lowest of the Raft floor (the checkpoint mark, raft/replay-from, and the lowest unapplied
entry) and of the first batch the store's index still refers to. The delete takes the topic's batches out of the
index, so what is left to pin the segments is the checkpoint mark: a checkpoint comes only from the Raft round loop,
once limits.raft_wal_replay_bytes_max (256 MiB) of WAL or limits.raft_wal_segments_max sealed segments were written
since the last one (rocket/raft/rounds.py, _round). An idle node so keeps the WAL written since its last checkpoint
(up to 256 MiB and the active segment) for ever. Hence the filler: if the bytes are not freed --fill-after-s after the
delete (with no new data meanwhile), new data goes in at --fill-mib-s, to a fresh topic of one queue at a time that is
deleted once it holds --fill-chunk-mib, so that nothing the filler wrote stays referenced by the index (its WAL bytes
are not counted against the freeing, above). --fill-after-s -1: no filler. The report says whether it was needed and
how much it wrote. The sizes seen, the checkpoint mark at each look, and the node's "WAL: deleted" log lines go to the
JSON.

Last line: `delete: gb=G delete_s=X freed_s=Y before=B after=A`, freed_s counted from the end of the delete call
("none" if not freed in time), B the directory just before the delete, A the directory (filler's WAL included) at the
moment freed (or at the timeout).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import trio

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from restart import Node  # noqa: E402

from rocket import limits  # noqa: E402
from rocket.client import Admin, connect, open_producer  # noqa: E402
from rocket.client.bench import percentile  # noqa: E402
from rocket.model import Message  # noqa: E402
from rocket.serde import batch as batch_codec  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results" / "delete.json"
TOPIC = "delete-bench"
FILLER = "delete-filler"
MiB = 1 << 20
PROBE_S = 0.05  # between two pings of the node
STALL_S = 0.25  # a ping answered later than this is listed
STOP_WAIT_S = 30.0
RECLAIM_LINE = re.compile(r"^(\S+ \S+) .*WAL: deleted (\d+) segments below position (\d+)")


def usage(path: Path) -> tuple[int, int]:
    """(bytes of blocks used, as du counts them; apparent bytes) of the files under path (a file deleted meanwhile
    counts as gone)."""
    used = apparent = 0
    for directory, _, files in os.walk(path):
        for name in files:
            try:
                found = os.lstat(os.path.join(directory, name))
            except FileNotFoundError:
                continue
            used += found.st_blocks * 512
            apparent += found.st_size
    return used, apparent


def deleted_open_bytes(pid: int, data_dir: Path) -> int:
    """Blocks of the files under data_dir that the process deleted but still holds open: not yet freed on disk."""
    seen, total = set(), 0
    prefix = str(data_dir)
    try:
        descriptors = os.listdir(f"/proc/{pid}/fd")
    except FileNotFoundError:
        return 0
    for descriptor in descriptors:
        try:
            target = os.readlink(f"/proc/{pid}/fd/{descriptor}")
            if not (target.startswith(prefix) and target.endswith(" (deleted)")):
                continue
            found = os.stat(f"/proc/{pid}/fd/{descriptor}")
        except FileNotFoundError:
            continue
        if (found.st_dev, found.st_ino) not in seen:
            seen.add((found.st_dev, found.st_ino))
            total += found.st_blocks * 512
    return total


def sizes(node: Node, since: int | None = None) -> dict:
    """The data directory now: du of it all and of its parts, the WAL's segments, its end position and checkpoint
    mark, and (since given) the WAL bytes written after position since."""
    data = node.data_dir
    used, apparent = usage(data)
    raft = data / "raft"
    segments = []  # (start position, stat)
    for segment in raft.glob("*.log"):
        try:
            segments.append((int(segment.stem), segment.stat()))
        except (FileNotFoundError, ValueError):
            continue
    mark = raft / "replay-from"
    try:
        replay_from = int.from_bytes(mark.read_bytes()[:8], "little")
    except FileNotFoundError:
        replay_from = 0
    found = {"data": used, "data_apparent": apparent,
             "wal": sum(stat.st_blocks * 512 for _, stat in segments), "wal_segments": len(segments),
             "wal_first": min((start for start, _ in segments), default=0),
             "wal_end": max((start + stat.st_size for start, stat in segments), default=0),
             "replay_from": replay_from, "snapshots": usage(raft / "snapshots")[0], "tier": usage(data / "tier")[0],
             "storage": usage(data / "storage")[0],
             "deleted_open": deleted_open_bytes(node.process.pid, data) if node.process else 0}
    if since is not None:
        found["wal_since"] = sum(max(0, start + stat.st_size - max(start, since)) for start, stat in segments)
    return found


def on_disk(measured: dict) -> int:
    """What the directory still takes from the disk: its files, and those deleted but held open."""
    return measured["data"] + measured["deleted_open"]


def residue(measured: dict) -> int:
    """What the directory takes from the disk, less the WAL written after the delete (the filler's, the delete's own
    entries, checkpoints): what is left of the directory as it was when the topic was deleted."""
    return on_disk(measured) - measured.get("wal_since", 0)


def mib(count: float) -> str:
    return f"{count / MiB:.1f}MiB"


def encoded_batch(message_bytes: int, batch_bytes: int) -> bytes:
    """One batch of batch_bytes of message_bytes messages, each body random (the disk sees no repeated block)."""
    count = max(1, batch_bytes // message_bytes)
    bodies = os.urandom(count * message_bytes)
    return batch_codec.encode([Message(bodies[i * message_bytes:(i + 1) * message_bytes]) for i in range(count)],
                              int(time.time() * 1000))


async def produce(server: str, topic: str, total_bytes: int, encoded: bytes) -> tuple[int, float]:
    """total_bytes (rounded up to whole batches) to topic, spread over its queues; (bytes, seconds), the clock
    running from the first send to the last acknowledgement."""
    batches = math.ceil(total_bytes / len(encoded))
    async with connect(server) as channel, open_producer(channel, topic) as producer:
        started = time.perf_counter()
        for _ in range(batches):
            await producer.send_encoded(encoded)
        await producer.flush()
        return batches * len(encoded), time.perf_counter() - started


async def fill(server: str, encoded: bytes, rate_bytes_s: float, chunk_bytes: int, state: dict) -> None:
    """New data at rate_bytes_s to a fresh topic of one queue at a time, deleted once it holds chunk_bytes: the WAL
    grows (and so comes to a checkpoint) while nothing the filler wrote stays referenced."""
    async with connect(server) as channel:
        admin = Admin(channel)
        started = trio.current_time()
        while True:
            state["topics"] += 1
            name = f"{FILLER}-{state['topics']}"
            await admin.create_topic(name, 1)
            async with open_producer(channel, name) as producer:
                for _ in range(max(1, chunk_bytes // len(encoded))):
                    await trio.sleep_until(started + state["bytes"] / rate_bytes_s)
                    await producer.send_encoded(encoded)
                    state["bytes"] += len(encoded)
            await admin.delete_topic(name, force=True)


async def probe(server: str, origin: float, seen: list[tuple[float, float]]) -> None:
    """Ping the node every PROBE_S (a call its event loop answers at once): (sent at, from origin; seconds to the
    answer), so that a node busy in its event loop (a long synchronous step) shows."""
    async with connect(server) as channel:
        while True:
            sent = time.perf_counter()
            await channel.call("Ping", {})
            seen.append((round(sent - origin, 3), round(time.perf_counter() - sent, 4)))
            await trio.sleep(PROBE_S)


def stalls(seen: list[tuple[float, float]]) -> dict:
    """The pings' answer times: the slowest, when it was sent, and those over STALL_S."""
    if not seen:
        return {}
    at, worst = max(seen, key=lambda found: found[1])
    return {"pings": len(seen), "max_s": worst, "max_at_s": at,
            "p99_s": percentile([took for _, took in seen], 99),
            "over": [[sent, took] for sent, took in seen if took > STALL_S]}


async def delete_and_wait(node: Node, arguments, threshold: int, encoded: bytes, since: int) -> dict:
    """Time the delete, then look every --poll-s until the directory, less the WAL written after position since
    (where the WAL ended before the delete), falls below threshold, and then until it stops shrinking (--settle-s);
    start the filler if that takes long. The node is pinged all along."""
    pings: list[tuple[float, float]] = []
    samples: list[dict] = []
    filler = {"bytes": 0, "topics": 0, "started_s": None}
    freed_s = settled_s = None
    last_print = -math.inf
    async with trio.open_nursery() as nursery:
        started = time.perf_counter()
        nursery.start_soon(probe, node.server, started, pings)
        async with connect(node.server) as channel:
            started = time.perf_counter()
            await Admin(channel).delete_topic(TOPIC, force=True)
            returned = time.perf_counter()
        delete_s = returned - started
        print(f"delete_topic(force=True) returned in {delete_s:.3f} s; waiting for the directory to fall below "
              f"{mib(threshold)}", flush=True)
        after_call = sizes(node, since)
        filling = trio.CancelScope()

        async def fill_until_freed() -> None:
            with filling:
                await fill(node.server, encoded, arguments.fill_mib_s * MiB, arguments.fill_chunk_mib * MiB, filler)

        smallest, smallest_at = math.inf, 0.0
        while True:
            elapsed = time.perf_counter() - returned
            measured = sizes(node, since)
            samples.append({"t_s": round(elapsed, 2), "filler_bytes": filler["bytes"], **measured})
            left = residue(measured)
            if left < smallest - MiB:
                smallest, smallest_at = left, elapsed
            if freed_s is None and left < threshold:
                freed_s = elapsed
                filling.cancel()
                print(f"  {elapsed:6.1f} s: freed ({mib(left)} left); looking on until it stops shrinking",
                      flush=True)
            if freed_s is not None and elapsed - smallest_at >= arguments.settle_s:
                settled_s = smallest_at
                break
            if elapsed >= arguments.free_timeout_s:
                break
            if (freed_s is None and arguments.fill_after_s >= 0 and filler["started_s"] is None
                    and elapsed >= arguments.fill_after_s):
                filler["started_s"] = round(elapsed, 2)
                print(f"  {elapsed:6.1f} s: not freed with no new data; filler starts ({arguments.fill_mib_s} MiB/s "
                      f"to topics deleted every {arguments.fill_chunk_mib} MiB)", flush=True)
                nursery.start_soon(fill_until_freed)
            if elapsed - last_print >= 5:
                last_print = elapsed
                print(f"  {elapsed:6.1f} s: data {mib(measured['data'])} (WAL {mib(measured['wal'])} in "
                      f"{measured['wal_segments']} segments from {mib(measured['wal_first'])}, of it written since "
                      f"the delete {mib(measured['wal_since'])}; tier {mib(measured['tier'])}; deleted-open "
                      f"{mib(measured['deleted_open'])}): left {mib(left)}; checkpoint mark at "
                      f"{mib(measured['replay_from'])}, WAL end {mib(measured['wal_end'])}; filler "
                      f"{mib(filler['bytes'])}", flush=True)
            await trio.sleep(arguments.poll_s)
        nursery.cancel_scope.cancel()
    at_freed = next((sample for sample in samples if sample["t_s"] == round(freed_s, 2)), samples[-1]) \
        if freed_s is not None else samples[-1]
    settled = next((sample for sample in samples if sample["t_s"] >= round(settled_s, 2)), samples[-1]) \
        if settled_s is not None else samples[-1]
    return {"delete_s": round(delete_s, 3), "freed_s": None if freed_s is None else round(freed_s, 2),
            "freed_s_from_delete_start": None if freed_s is None else round(freed_s + delete_s, 2),
            "settled_s": None if settled_s is None else round(settled_s, 2),
            "after_call": after_call, "after": {key: value for key, value in at_freed.items() if key != "t_s"},
            "settled": {key: value for key, value in settled.items() if key != "t_s"},
            "filler_needed": filler["started_s"] is not None, "filler": filler,
            "ping": stalls(pings), "samples": samples}


async def offloaded(server: str, timeout_s: float) -> float:
    """Wait until the local tier took every full piece of the topic (a queue's data pending offload is less than a
    piece, which waits for limits.tier_piece_age_s_default), as a big topic at rest would have; the seconds waited."""
    started = time.perf_counter()
    async with connect(server) as channel:
        with trio.move_on_after(timeout_s):
            while True:
                [(_, rows)] = await Admin(channel).tier_status(TOPIC)
                if all(row["pending_bytes"] < limits.tier_piece_bytes_default for row in rows):
                    break
                await trio.sleep(0.5)
    return time.perf_counter() - started


async def prepare(server: str, queues: int) -> None:
    async with connect(server) as channel:
        await Admin(channel).create_topic(TOPIC, queues)


def reclaim_lines(log_path: Path) -> list[dict]:
    found = []
    for line in log_path.read_text(errors="replace").splitlines():
        match = RECLAIM_LINE.search(line)
        if match:
            found.append({"at": match.group(1), "segments": int(match.group(2)), "below": int(match.group(3))})
    return found


def stop(node: Node) -> None:
    """SIGTERM and wait; SIGKILL if it does not exit in time."""
    if node.process is None or node.process.poll() is not None:
        return
    node.process.terminate()
    try:
        node.process.wait(STOP_WAIT_S)
    except subprocess.TimeoutExpired:
        node.kill()


def run(arguments, run_directory: Path) -> dict:
    node = Node(run_directory / "data", run_directory / "node.log")
    encoded = encoded_batch(arguments.message_bytes, arguments.batch_kib * 1024)
    try:
        node.start()
        print(f"node ready on {node.server}, data in {node.data_dir}", flush=True)
        trio.run(prepare, node.server, arguments.queues)
        time.sleep(1)  # the node touches its heap after the ready line; the topic's first entries land
        empty = sizes(node)
        total = int(arguments.gb * (1 << 30))
        produced, produce_s = trio.run(produce, node.server, TOPIC, total, encoded)
        print(f"produced {mib(produced)} in {produce_s:.1f} s: {produced / produce_s / MiB:.1f} MiB/s", flush=True)
        offload_s = trio.run(offloaded, node.server, arguments.offload_wait_s) if arguments.offload_wait_s > 0 else 0.0
        before = sizes(node)
        print(f"after {offload_s:.1f} s for the offload: data {mib(before['data'])}: WAL {mib(before['wal'])} in "
              f"{before['wal_segments']} segments ({mib(before['wal_end'] - before['replay_from'])} since the last "
              f"checkpoint), tier {mib(before['tier'])}, snapshots {mib(before['snapshots'])}, storage "
              f"{mib(before['storage'])} (empty: {mib(empty['data'])})", flush=True)
        threshold = on_disk(empty) + int(arguments.freed_fraction_left * produced)
        waited = trio.run(delete_and_wait, node, arguments, threshold, encoded, before["wal_end"])
    finally:
        stop(node)
    return {"machine": platform.node(), "python": platform.python_version(),
            "started": time.strftime("%Y-%m-%dT%H:%M:%S"),
            "arguments": {key: str(value) if isinstance(value, Path) else value
                          for key, value in vars(arguments).items()},
            "limits": {"wal_reclaim_s": limits.wal_reclaim_s,
                       "raft_wal_replay_bytes_max": limits.raft_wal_replay_bytes_max,
                       "raft_wal_segments_max": limits.raft_wal_segments_max,
                       "raft_wal_segment_bytes_default": limits.raft_wal_segment_bytes_default},
            "batch_bytes": len(encoded), "produced_bytes": produced, "produce_s": round(produce_s, 2),
            "produce_mib_s": round(produced / produce_s / MiB, 1), "offload_wait_s": round(offload_s, 1),
            "wal_since_checkpoint_at_delete": before["wal_end"] - before["replay_from"], "empty": empty,
            "before": before,
            "freed_threshold": threshold, **waited, "reclaims": reclaim_lines(node.log_path)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gb", type=float, default=1.0, help="GiB produced to the topic deleted")
    parser.add_argument("--queues", type=int, default=8)
    parser.add_argument("--message-bytes", type=int, default=1024)
    parser.add_argument("--batch-kib", type=int, default=256)
    parser.add_argument("--offload-wait-s", type=float, default=120.0, help="before the delete, wait at most this "
                        "long for the local tier to take every full piece (0: do not wait)")
    parser.add_argument("--free-timeout-s", type=float, default=300.0)
    parser.add_argument("--poll-s", type=float, default=0.5)
    parser.add_argument("--settle-s", type=float, default=12.0, help="once freed, look on until the directory has "
                        "not shrunk by a MiB for this long (more than limits.wal_reclaim_s)")
    parser.add_argument("--freed-fraction-left", type=float, default=0.10, help="freed once at most this share of "
                        "the bytes produced is left above the directory's size before the produce")
    parser.add_argument("--fill-after-s", type=float, default=30.0, help="start the filler if not freed this long "
                        "after the delete (-1: never)")
    parser.add_argument("--fill-mib-s", type=float, default=20.0)
    parser.add_argument("--fill-chunk-mib", type=int, default=8)
    parser.add_argument("--data-parent", type=Path, default=None)
    parser.add_argument("--keep-data", action="store_true", help="keep the data dir (the node log always stays)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    arguments = parser.parse_args(argv)
    run_directory = Path(tempfile.mkdtemp(prefix="rocket-delete-", dir=arguments.data_parent)).resolve()
    started = time.perf_counter()
    try:
        result = run(arguments, run_directory)
    finally:
        if not arguments.keep_data:
            shutil.rmtree(run_directory / "data", ignore_errors=True)
        print(f"node log in {run_directory / 'node.log'}", flush=True)
    result["run_s"] = round(time.perf_counter() - started, 1)
    arguments.out.parent.mkdir(parents=True, exist_ok=True)
    arguments.out.write_text(json.dumps(result, indent=1) + "\n")
    before, after = result["before"], result["after"]
    print(f"produce {mib(result['produced_bytes'])} in {result['produce_s']} s ({result['produce_mib_s']} MiB/s); "
          f"delete call {result['delete_s']} s; "
          + (f"freed {result['freed_s']} s after it" if result["freed_s"] is not None else
             f"not freed within {arguments.free_timeout_s:g} s: {mib(residue(after))} left")
          + "; filler " + ("off" if arguments.fill_after_s < 0 else f"needed: {mib(result['filler']['bytes'])}"
                           if result["filler_needed"] else "not needed") + "; "
          f"before {mib(on_disk(before))} (WAL {mib(before['wal'])}, "
          f"{mib(result['wal_since_checkpoint_at_delete'])} of it since the last checkpoint; tier "
          f"{mib(before['tier'])}), after "
          f"{mib(on_disk(after))} (WAL {mib(after['wal'])}, of it written since the delete {mib(after['wal_since'])}, "
          f"tier {mib(after['tier'])}; left of the directory before: {mib(residue(after))}); empty "
          f"{mib(on_disk(result['empty']))}; wrote {arguments.out}", flush=True)
    settled, ping = result["settled"], result["ping"]
    print((f"settled {result['settled_s']} s after the delete" if result["settled_s"] is not None else "at the end")
          + f": {mib(residue(settled))} left of the directory before "
          f"(WAL {mib(settled['wal'])} in {settled['wal_segments']} segments, checkpoint mark at "
          f"{mib(settled['replay_from'])}); the node's slowest ping {ping.get('max_s')} s, sent "
          f"{ping.get('max_at_s')} s after the delete began, {len(ping.get('over', []))} over {STALL_S} s", flush=True)
    freed = "none" if result["freed_s"] is None else f"{result['freed_s']}"
    print(f"delete: gb={arguments.gb:g} delete_s={result['delete_s']} freed_s={freed} before={mib(on_disk(before))} "
          f"after={mib(on_disk(after))}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
