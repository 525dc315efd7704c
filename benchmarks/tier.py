"""Tiered storage throughput in one run against each backend's emulator on 127.0.0.1 (moto's S3 server, Azurite,
fake-gcs-server, the tests' WebHDFS server): hot (local) reads, offload, cold reads (from the store) and a range read
again (from the node's cache on disk), beside the store's own throughput through rocket's client of it: parallel puts
of as many bytes, and parallel ranged gets of the pieces offloaded.

    python benchmarks/tier.py --megabytes 256 [--backends s3,azure,gcs,hdfs]

Offload is measured on a backlog, as Kafka's and Redpanda's catch-up figures are: the node produces with its tier
off, restarts with it on, and offload MB/s counts from the restarted node's readiness to every byte in the store (its
first scan and elections included). The produce-to-tier lag of a live stream is a latency, bound by the piece's age
and the scan interval, not by the store. Cold reads start once local data was dropped, with an empty cache; then
--cached-megabytes of the topic are read into the cache, then read REPEATS times from it, each time beside as many
megabytes of a second topic whose data is local (hot), in the same process: the two alternate, so that the
machine's noise falls on both alike. The raw figures use --parallel calls at once (8, as many as the offloader's
uploads, limits.tier_uploads_parallel): puts of pieces of the size the node cuts (--piece-megabytes, 8), as many
bytes as the topic holds, just before the offload and again after it (raw_put_mb_s is their mean: the machine's
noise swung one measure 2x), and gets of the ranges a cold read fetches (limits.cold_read_ahead_bytes). The topic has 8 queues: the offloader uploads each
queue's pieces in order.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import trio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rocket import limits  # noqa: E402
from rocket.client import Admin, connect  # noqa: E402
from rocket.errors import Code, RocketError  # noqa: E402
from rocket.model import Message  # noqa: E402
from rocket.serde import batch as batch_codec  # noqa: E402
from rocket.transport.listen import free_ports  # noqa: E402
from tests.conftest import ServerProcess  # noqa: E402
from tests.integration.test_tier_objectstore import PROXY_VARIABLES, SAFE_ENVIRONMENT, MotoServer  # noqa: E402
from tests.integration.azurite import Azurite  # noqa: E402
from tests.integration.gcs_server import FakeGcsServer  # noqa: E402
from tests.integration.webhdfs_server import WebHdfsServer  # noqa: E402

QUEUES = 8
REPEATS = 10  # of the range read hot, and from the cache


async def produce(server: str, megabytes: int, topic: str = "bench") -> int:
    body = os.urandom(1024)
    batch = batch_codec.encode([Message(body) for _ in range(1024)], int(time.time() * 1000))  # 1 MiB
    async with connect(server) as channel:
        for index in range(megabytes):
            await channel.call("Produce", {"topic": topic, "queue": index % QUEUES, "batch": batch})
    return megabytes * len(batch)


async def read_all(server: str, megabytes_max: int | None = None, topic: str = "bench") -> int:
    """Read the topic from its start, every queue at once; stop at its end or after megabytes_max (for each queue,
    its share)."""
    total = 0
    queue_max = None if megabytes_max is None else (megabytes_max << 20) // QUEUES
    async with connect(server) as channel:
        positions = {queue: 0 for queue in range(QUEUES)}
        read = dict.fromkeys(positions, 0)
        while positions:
            response = await channel.call("Pull", {"topic": topic, "queues": [
                {"queue": queue, "offset": offset} for queue, offset in positions.items()],
                "max_bytes": 4 << 20, "wait_ms": 0})
            if not response["batches"]:
                return total
            for batch in response["batches"]:
                total += len(batch["batch"])
                read[batch["queue"]] += len(batch["batch"])
            positions = {entry["queue"]: entry["offset"] for entry in response["next_offsets"]
                         if queue_max is None or read[entry["queue"]] < queue_max}
    return total


async def rows(server: str) -> list[dict]:
    async with connect(server) as channel:
        return (await Admin(channel).tier_status("bench"))[0][1]


async def wait_for(server: str, condition) -> None:
    """Until condition holds of every queue's row (a node just restarted may not list them all yet)."""
    while True:
        try:
            found = await rows(server)
        except RocketError as error:
            if error.code != Code.UNAVAILABLE:
                raise
        else:
            if len(found) == QUEUES and condition(found):
                return
        await trio.sleep(0.1)


async def fill(server: str, megabytes: int) -> tuple[int, float]:
    """Create the topic and produce to it, the tier off: (bytes produced, hot read MB/s of it all)."""
    async with connect(server) as channel:
        await Admin(channel).create_topic("bench", QUEUES)
        await Admin(channel).update_topic("bench", retention_s=0, local_retention_s=0)
    produced = await produce(server, megabytes)
    started = time.perf_counter()
    hot = await read_all(server)
    hot_s = time.perf_counter() - started
    assert hot == produced, (hot, produced)
    return produced, hot / hot_s / 1e6


async def range_reads_mb_s(server: str, megabytes: int, topics: tuple[str, ...]) -> list[float]:
    """MB/s of reading each topic's first megabytes, REPEATS times over, the topics in turn (one read lasts a few
    tens of ms)."""
    seconds, total = dict.fromkeys(topics, 0.0), dict.fromkeys(topics, 0)
    for _ in range(REPEATS):
        for topic in topics:
            started = time.perf_counter()
            total[topic] += await read_all(server, megabytes, topic)
            seconds[topic] += time.perf_counter() - started
    return [total[topic] / seconds[topic] / 1e6 for topic in topics]


async def offload_and_read(server: str, produced: int, cached_megabytes: int) -> dict:
    """On the node restarted with its tier on: offload the backlog, drop local data, read it all cold, then read
    cached_megabytes of it cold (fetched into the cache) and again, REPEATS times (from the cache), each time beside
    as many of a topic kept local (hot)."""
    started = time.perf_counter()
    await wait_for(server, lambda found: all(row["pending_bytes"] == 0 for row in found))
    offload_s = time.perf_counter() - started
    async with connect(server) as channel:
        await Admin(channel).update_topic("bench", local_retention_s=1)
    await wait_for(server, lambda found: all(row["local_offset"] == row["next_offset"] for row in found))
    started = time.perf_counter()
    cold = await read_all(server)
    cold_s = time.perf_counter() - started
    assert cold == produced, (cold, produced)
    ranged = await read_all(server, cached_megabytes)  # the range, into the cache (the whole read went through it)
    async with connect(server) as channel:
        await Admin(channel).create_topic("hot", QUEUES)  # the default local retention: its data stays local
    await produce(server, cached_megabytes, "hot")
    await trio.sleep(2)  # its offload (tier_piece_age_s) is over before the reads: it stays local
    hot_range, cached = await range_reads_mb_s(server, cached_megabytes, ("hot", "bench"))
    return {"offload_mb_s": produced / offload_s / 1e6, "cold_read_mb_s": cold / cold_s / 1e6,
            "hot_range_read_mb_s": hot_range, "cached_read_mb_s": cached, "cached_bytes": ranged}


async def raw_put_mb_s(open_store, parallel: int, piece_bytes: int, total_bytes: int, prefix: str) -> float:
    """The store's own put throughput through rocket's client of it: parallel puts of pieces of piece_bytes, as many
    as make total_bytes, under prefix."""
    async with open_store() as store:
        limiter = trio.CapacityLimiter(parallel)
        data = os.urandom(piece_bytes)

        async def put(number: int) -> None:
            async with limiter:
                await store.put(f"{prefix}/{number:06d}", data)

        count = max(1, total_bytes // piece_bytes)
        started = time.perf_counter()
        async with trio.open_nursery() as nursery:
            for number in range(count):
                nursery.start_soon(put, number)
        return count * piece_bytes / (time.perf_counter() - started) / 1e6


async def raw(open_store, parallel: int, piece_bytes: int) -> dict:
    """The store's own throughput through rocket's client of it: parallel ranged gets of every piece offloaded, in
    ranges of the cold reads' size (limits.cold_read_ahead_bytes), then parallel puts of as many bytes under other
    keys."""
    async with open_store() as store:
        pieces = [info for info in await store.list("") if info.key.endswith(".seg")]
        limiter = trio.CapacityLimiter(parallel)
        got = 0

        async def get(key: str, start: int, end: int) -> None:
            nonlocal got
            async with limiter:
                got += len(await store.get(key, start, end))

        started = time.perf_counter()
        async with trio.open_nursery() as nursery:
            for info in pieces:
                for start in range(0, info.size, limits.cold_read_ahead_bytes):
                    nursery.start_soon(get, info.key, start, min(info.size, start + limits.cold_read_ahead_bytes))
        get_s = time.perf_counter() - started
    return {"raw_get_mb_s": got / get_s / 1e6, "pieces": len(pieces),
            "raw_put_after_mb_s": await raw_put_mb_s(open_store, parallel, piece_bytes, got, "raw-after")}


def emulator(backend: str, base: Path):
    """(the emulator started, the node's tier settings, a function opening rocket's client of the store)."""
    name = "bench-tier"
    if backend == "s3":
        from rocket.tier.s3 import open_s3_store
        server = MotoServer(free_ports(1)[0], base / "moto.log").start()
        bucket = server.create_bucket()
        return server, (f'tier_backend = "s3"\ntier_s3_endpoint = "{server.url}"\ntier_s3_bucket = "{bucket}"\n'), \
            lambda: open_s3_store(bucket, endpoint_url=server.url, path_style=True, access_key_id="testing",
                                  secret_access_key="testing", region="us-east-1")
    if backend == "azure":
        from rocket.tier.azure import open_azure_store
        server = Azurite(base / "azurite", base / "azurite.log").start()
        server.create_container(name)
        os.environ["AZURE_STORAGE_CONNECTION_STRING"] = server.connection_string
        return server, f'tier_backend = "azure"\ntier_azure_container = "{name}"\n', \
            lambda: open_azure_store(name, connection_string=server.connection_string)
    if backend == "gcs":
        from rocket.tier.gcs import open_gcs_store
        server = FakeGcsServer(free_ports(1)[0], base / "fake-gcs.log").start()
        server.create_bucket(name)
        return server, f'tier_backend = "gcs"\ntier_gcs_bucket = "{name}"\ntier_gcs_endpoint = "{server.endpoint}"\n', \
            lambda: open_gcs_store(name, endpoint_url=server.endpoint, anonymous=True)
    from rocket.tier.hdfs import open_hdfs_store
    server = WebHdfsServer(base / "webhdfs", base / "webhdfs.log")
    server.start()
    return server, f'tier_backend = "hdfs"\ntier_hdfs_url = "{server.url}"\ntier_hdfs_root = "/{name}"\n', \
        lambda: open_hdfs_store(server.url, root=f"/{name}")


def run_backend(backend: str, megabytes: int, cached_megabytes: int, parallel: int, piece_bytes: int) -> dict:
    with tempfile.TemporaryDirectory() as directory:
        base = Path(directory)
        server, settings, open_store = emulator(backend, base)
        tier_off, tier_on = base / "tier-off.toml", base / "tier-on.toml"
        tier_off.write_text('tier_backend = "off"\n')
        tier_on.write_text(f'{settings}tier_piece_bytes = {piece_bytes}\ntier_piece_age_s = 0.5\n')
        node = ServerProcess(base / "data", base / "server.log").start(extra=("--config", str(tier_off)))
        try:
            produced, hot_mb_s = trio.run(fill, node.server, megabytes)
        finally:
            node.terminate()
        raw_put_before = trio.run(raw_put_mb_s, open_store, parallel, piece_bytes, produced, "raw-before")
        node = ServerProcess(base / "data", base / "server.log").start(extra=("--config", str(tier_on)))
        try:
            result = {"bytes": produced, "hot_read_mb_s": hot_mb_s}
            result |= trio.run(offload_and_read, node.server, produced, cached_megabytes)
        finally:
            node.kill()
        try:
            result |= trio.run(raw, open_store, parallel, piece_bytes)
        finally:
            server.stop()
    result["cold_to_hot"] = result["cold_read_mb_s"] / result["hot_read_mb_s"]
    result["cached_to_hot"] = result["cached_read_mb_s"] / result["hot_range_read_mb_s"]
    result["raw_put_mb_s"] = (raw_put_before + result["raw_put_after_mb_s"]) / 2  # just before offload, and after
    result["offload_to_raw_put"] = result["offload_mb_s"] / result["raw_put_mb_s"]
    result["cold_to_raw_get"] = result["cold_read_mb_s"] / result["raw_get_mb_s"]
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--megabytes", type=int, default=256)
    parser.add_argument("--cached-megabytes", type=int, default=32,
                        help="the range read twice cold: it fits the node's cache (limits.cold_cache_bytes_max)")
    parser.add_argument("--backends", default="s3,azure,gcs,hdfs")
    parser.add_argument("--parallel", type=int, default=8, help="calls at once of the raw puts and gets")
    parser.add_argument("--piece-megabytes", type=int, default=8, help="tier_piece_bytes, and the raw puts' size")
    parser.add_argument("--out", type=Path, default=None, help="write the results (JSON) here too")
    arguments = parser.parse_args()
    for variable in PROXY_VARIABLES:
        os.environ.pop(variable, None)
    os.environ.update(SAFE_ENVIRONMENT)
    results = {}
    for backend in arguments.backends.split(","):
        results[backend] = run_backend(backend, arguments.megabytes, arguments.cached_megabytes, arguments.parallel,
                                       arguments.piece_megabytes << 20)
        print(json.dumps({backend: results[backend]}), flush=True)
    if arguments.out is not None:
        settings = {key: getattr(arguments, key) for key in ("megabytes", "cached_megabytes", "parallel",
                                                             "piece_megabytes")}
        arguments.out.write_text(json.dumps({**settings, "results": results}, indent=2) + "\n")
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
