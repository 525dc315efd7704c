"""Which GCS client the tier uses, by measured throughput (issue 54, part 1): parallel puts and gets of 8 MiB
objects against fake-gcs-server on 127.0.0.1, through rocket's GCS store (gcloud-aio-storage on asyncio, through
trio-asyncio) and through Google's official client (google-cloud-storage, blocking, in Trio worker threads), in
alternating rounds in one run.

    pip install google-cloud-storage   # the official client: not one of rocket's dependencies
    python benchmarks/gcs_clients.py [--objects 32] [--parallel 8] [--rounds 3] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import trio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rocket.tier.gcs import open_gcs_store  # noqa: E402
from rocket.transport.listen import free_ports  # noqa: E402
from tests.integration.gcs_server import FakeGcsServer  # noqa: E402

OBJECT_BYTES = 8 << 20  # the size of the pieces tier.py offloads


async def in_parallel(calls, parallel: int) -> float:
    """Seconds to run every call, parallel at a time."""
    limiter = trio.CapacityLimiter(parallel)

    async def one(call) -> None:
        async with limiter:
            await call()

    started = time.perf_counter()
    async with trio.open_nursery() as nursery:
        for call in calls:
            nursery.start_soon(one, call)
    return time.perf_counter() - started


async def rocket_store(endpoint: str, bucket: str, data: bytes, objects: int, parallel: int) -> tuple[float, float]:
    async with open_gcs_store(bucket, endpoint_url=endpoint, anonymous=True) as store:
        keys = [f"aio/{number:04d}" for number in range(objects)]
        put_s = await in_parallel([lambda key=key: store.put(key, data) for key in keys], parallel)
        get_s = await in_parallel([lambda key=key: store.get(key) for key in keys], parallel)
    return put_s, get_s


async def official_client(endpoint: str, bucket: str, data: bytes, objects: int,
                          parallel: int) -> tuple[float, float]:
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import storage

    client = storage.Client(project="bench", credentials=AnonymousCredentials(),
                            client_options={"api_endpoint": endpoint})
    blobs = [client.bucket(bucket).blob(f"official/{number:04d}") for number in range(objects)]
    threads = trio.CapacityLimiter(parallel)

    def put(blob) -> None:  # with the MD5, as rocket's store sends it: GCS checks the bytes against it
        blob.upload_from_string(data, checksum="md5")

    put_s = await in_parallel([lambda blob=blob: trio.to_thread.run_sync(put, blob, limiter=threads)
                               for blob in blobs], parallel)
    get_s = await in_parallel([lambda blob=blob: trio.to_thread.run_sync(blob.download_as_bytes, limiter=threads)
                               for blob in blobs], parallel)
    client.close()
    return put_s, get_s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--objects", type=int, default=32)
    parser.add_argument("--parallel", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, default=None)
    arguments = parser.parse_args()
    data = os.urandom(OBJECT_BYTES)
    megabytes = arguments.objects * OBJECT_BYTES / 1e6
    figures: dict[str, dict[str, list[float]]] = {name: {"put_mb_s": [], "get_mb_s": []}
                                                  for name in ("gcloud-aio-storage", "google-cloud-storage")}
    with tempfile.TemporaryDirectory() as directory:
        server = FakeGcsServer(free_ports(1)[0], Path(directory) / "fake-gcs.log").start()
        try:
            server.create_bucket("bench")
            for round_number in range(arguments.rounds):
                for name, run in (("gcloud-aio-storage", rocket_store), ("google-cloud-storage", official_client)):
                    put_s, get_s = trio.run(run, server.endpoint, "bench", data, arguments.objects,
                                            arguments.parallel)
                    figures[name]["put_mb_s"].append(megabytes / put_s)
                    figures[name]["get_mb_s"].append(megabytes / get_s)
                    print(f"round {round_number + 1} {name}: put {megabytes / put_s:.1f} MB/s, "
                          f"get {megabytes / get_s:.1f} MB/s", flush=True)
        finally:
            server.stop()
    medians = {name: {key: statistics.median(values) for key, values in found.items()}
               for name, found in figures.items()}
    result = {"objects": arguments.objects, "object_bytes": OBJECT_BYTES, "parallel": arguments.parallel,
              "rounds": figures, "medians": medians}
    if arguments.out is not None:
        arguments.out.write_text(json.dumps(result, indent=2) + "\n")
    aio, official = medians["gcloud-aio-storage"], medians["google-cloud-storage"]
    print(f"gcs clients: put aio={aio['put_mb_s']:.1f} official={official['put_mb_s']:.1f} MB/s, "
          f"get aio={aio['get_mb_s']:.1f} official={official['get_mb_s']:.1f} MB/s (medians)")


if __name__ == "__main__":
    main()
