"""Tiered storage throughput in one run against moto's S3 server on 127.0.0.1: hot (local) reads, offload,
and cold reads (from S3), each reported as MB/s and as a ratio to the hot reads.

    python benchmarks/tier.py --megabytes 64

Offload MB/s counts from the start of produce to the moment every byte is in the tier (offload runs while
producing), so it is a lower bound. Cold reads start once local data was dropped, with a cold cache.
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

QUEUES = 4


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
    assert hot == cold == produced, (hot, cold, produced)
    megabyte = 1e6
    result = {"bytes": produced, "hot_read_mb_s": hot / hot_s / megabyte, "offload_mb_s": produced / offload_s / megabyte,
              "cold_read_mb_s": cold / cold_s / megabyte}
    result["offload_to_hot"] = result["offload_mb_s"] / result["hot_read_mb_s"]
    result["cold_to_hot"] = result["cold_read_mb_s"] / result["hot_read_mb_s"]
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--megabytes", type=int, default=64)
    arguments = parser.parse_args()
    for variable in PROXY_VARIABLES:
        os.environ.pop(variable, None)
    os.environ.update(SAFE_ENVIRONMENT)
    with tempfile.TemporaryDirectory() as directory:
        base = Path(directory)
        moto = MotoServer(free_ports(1)[0], base / "moto.log").start()
        bucket = moto.create_bucket()
        config = base / "rocket.toml"
        config.write_text(f'tier_backend = "s3"\ntier_s3_endpoint = "{moto.url}"\ntier_s3_bucket = "{bucket}"\n'
                          f'tier_piece_bytes = {8 << 20}\ntier_piece_age_s = 0.5\n')
        node = ServerProcess(base / "data", base / "server.log").start(extra=("--config", str(config)))
        try:
            result = trio.run(measure, node.server, arguments.megabytes)
        finally:
            node.kill()
            moto.stop()
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
