"""Tiered storage throughput in one run against each backend's emulator on 127.0.0.1 (moto's S3 server, Azurite,
fake-gcs-server, the tests' WebHDFS server): hot (local) reads, offload, cold reads (from the store) and the same cold
reads again (from the node's cache of pieces), beside the store's own throughput through rocket's client of it:
parallel puts of as many bytes, and parallel gets of the pieces offloaded.

    python benchmarks/tier.py --megabytes 64 [--backends s3,azure,gcs,hdfs]

Offload MB/s counts from the start of produce to the moment every byte is in the tier (offload runs while
producing), so it is a lower bound. Cold reads start once local data was dropped, with a cold cache. The raw figures
use --parallel calls at once (8), pieces of the size the node cuts (8 MiB).
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

from rocket.client import Admin, connect  # noqa: E402
from rocket.model import Message  # noqa: E402
from rocket.serde import batch as batch_codec  # noqa: E402
from rocket.transport.listen import free_ports  # noqa: E402
from tests.conftest import ServerProcess  # noqa: E402
from tests.integration.test_tier_objectstore import PROXY_VARIABLES, SAFE_ENVIRONMENT, MotoServer  # noqa: E402
from tests.integration.azurite import Azurite  # noqa: E402
from tests.integration.gcs_server import FakeGcsServer  # noqa: E402
from tests.integration.webhdfs_server import WebHdfsServer  # noqa: E402

QUEUES = 4
PIECE_BYTES = 8 << 20


async def produce(server: str, megabytes: int) -> int:
    body = os.urandom(1024)
    batch = batch_codec.encode([Message(body) for _ in range(1024)], int(time.time() * 1000))  # 1 MiB
    async with connect(server) as channel:
        for index in range(megabytes):
            await channel.call("Produce", {"topic": "bench", "queue": index % QUEUES, "batch": batch})
    return megabytes * len(batch)


async def read_all(server: str) -> int:
    total = 0
    async with connect(server) as channel:
        positions = {queue: 0 for queue in range(QUEUES)}
        while True:
            response = await channel.call("Pull", {"topic": "bench", "queues": [
                {"queue": queue, "offset": offset} for queue, offset in positions.items()],
                "max_bytes": 4 << 20, "wait_ms": 0})
            if not response["batches"]:
                return total
            for batch in response["batches"]:
                total += len(batch["batch"])
            positions = {entry["queue"]: entry["offset"] for entry in response["next_offsets"]}


async def rows(server: str) -> list[dict]:
    async with connect(server) as channel:
        return (await Admin(channel).tier_status("bench"))[0][1]


async def wait_for(server: str, condition) -> None:
    while not condition(await rows(server)):
        await trio.sleep(0.1)


async def measure(server: str, megabytes: int) -> dict:
    async with connect(server) as channel:
        await Admin(channel).create_topic("bench", QUEUES)
        await Admin(channel).update_topic("bench", retention_s=0, local_retention_s=0)
    started = time.perf_counter()
    produced = await produce(server, megabytes)
    await wait_for(server, lambda found: all(row["pending_bytes"] == 0 for row in found))
    offload_s = time.perf_counter() - started
    started = time.perf_counter()
    hot = await read_all(server)
    hot_s = time.perf_counter() - started
    async with connect(server) as channel:
        await Admin(channel).update_topic("bench", local_retention_s=1)
    await wait_for(server, lambda found: all(row["local_offset"] == row["next_offset"] for row in found))
    started = time.perf_counter()
    cold = await read_all(server)
    cold_s = time.perf_counter() - started
    started = time.perf_counter()
    cached = await read_all(server)
    cached_s = time.perf_counter() - started
    assert hot == cold == cached == produced, (hot, cold, cached, produced)
    megabyte = 1e6
    result = {"bytes": produced, "hot_read_mb_s": hot / hot_s / megabyte,
              "offload_mb_s": produced / offload_s / megabyte, "cold_read_mb_s": cold / cold_s / megabyte,
              "cached_read_mb_s": cached / cached_s / megabyte}
    result["offload_to_hot"] = result["offload_mb_s"] / result["hot_read_mb_s"]
    result["cold_to_hot"] = result["cold_read_mb_s"] / result["hot_read_mb_s"]
    result["cached_to_hot"] = result["cached_read_mb_s"] / result["hot_read_mb_s"]
    return result


async def raw(open_store, parallel: int) -> dict:
    """The store's own throughput through rocket's client of it: parallel gets of every piece offloaded, then parallel
    puts of as many bytes under other keys."""
    async with open_store() as store:
        pieces = [info for info in await store.list("") if info.key.endswith(".seg")]
        limiter = trio.CapacityLimiter(parallel)
        got = 0

        async def get(key: str) -> None:
            nonlocal got
            async with limiter:
                got += len(await store.get(key))

        started = time.perf_counter()
        async with trio.open_nursery() as nursery:
            for info in pieces:
                nursery.start_soon(get, info.key)
        get_s = time.perf_counter() - started
        data = os.urandom(PIECE_BYTES)

        async def put(number: int) -> None:
            async with limiter:
                await store.put(f"raw/{number:06d}", data)

        count = max(1, got // PIECE_BYTES)
        started = time.perf_counter()
        async with trio.open_nursery() as nursery:
            for number in range(count):
                nursery.start_soon(put, number)
        put_s = time.perf_counter() - started
    return {"raw_get_mb_s": got / get_s / 1e6, "raw_put_mb_s": count * PIECE_BYTES / put_s / 1e6, "pieces": len(pieces)}


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


def run_backend(backend: str, megabytes: int, parallel: int) -> dict:
    with tempfile.TemporaryDirectory() as directory:
        base = Path(directory)
        server, settings, open_store = emulator(backend, base)
        config = base / "rocket.toml"
        config.write_text(f'{settings}tier_piece_bytes = {PIECE_BYTES}\ntier_piece_age_s = 0.5\n')
        node = ServerProcess(base / "data", base / "server.log").start(extra=("--config", str(config)))
        try:
            result = trio.run(measure, node.server, megabytes)
        finally:
            node.kill()
        try:
            result |= trio.run(raw, open_store, parallel)
        finally:
            server.stop()
    result["offload_to_raw_put"] = result["offload_mb_s"] / result["raw_put_mb_s"]
    result["cold_to_raw_get"] = result["cold_read_mb_s"] / result["raw_get_mb_s"]
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--megabytes", type=int, default=64)
    parser.add_argument("--backends", default="s3,azure,gcs,hdfs")
    parser.add_argument("--parallel", type=int, default=8, help="calls at once of the raw puts and gets")
    parser.add_argument("--out", type=Path, default=None, help="write the results (JSON) here too")
    arguments = parser.parse_args()
    for variable in PROXY_VARIABLES:
        os.environ.pop(variable, None)
    os.environ.update(SAFE_ENVIRONMENT)
    results = {}
    for backend in arguments.backends.split(","):
        results[backend] = run_backend(backend, arguments.megabytes, arguments.parallel)
        print(json.dumps({backend: results[backend]}), flush=True)
    if arguments.out is not None:
        arguments.out.write_text(json.dumps({"megabytes": arguments.megabytes, "parallel": arguments.parallel,
                                             "results": results}, indent=2) + "\n")
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
