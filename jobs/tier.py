"""The object stores the jobs reach through rocket's own clients, as the nodes do (rocket.node.open_tier): a node's
config names one (--tier-config: local, S3, Azure Blob, GCS or HDFS, its credentials from the environment as a
node's), and a local directory is one. The driver lists and writes; the executors fetch their share."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Iterator
from pathlib import Path
from typing import TypeVar

from rocket.config import ConfigError, NodeConfig, load_from_environment

T = TypeVar("T")
FETCH_CONCURRENCY = 8  # objects an executor fetches at once
PARTITION_OBJECTS_MAX = 256  # objects in one executor's partition, which it holds in memory at once


def tier_of(location: str | None, tier_config: str | None) -> NodeConfig | None:
    """The store to reach: the one the node config tier_config names, else location's when it is a local directory;
    None for a Hadoop URL (s3a://...), which Hadoop's file system reaches."""
    if tier_config:
        try:
            config = load_from_environment(Path(tier_config), {})
        except (ConfigError, OSError) as error:
            raise SystemExit(f"--tier-config {tier_config}: {error}") from None
        if config.tier_backend == "off":
            raise SystemExit(f"--tier-config {tier_config}: tier_backend = off names no object store")
        return config
    if location is not None and ("://" not in location or location.startswith("file://")):
        return NodeConfig(tier_backend="local", tier_directory=Path(location.removeprefix("file://")))
    return None


def on_store(config: NodeConfig, work: Callable[..., Awaitable[T]]) -> T:
    """work(store) with the store open, in a Trio run of its own."""
    import trio

    from rocket.node import open_tier

    async def main() -> T:
        async with open_tier(config) as store:
            return await work(store)

    return trio.run(main)


def get(config: NodeConfig, key: str) -> bytes | None:
    """The object at key, or None when there is none."""
    from rocket.errors import Code, RocketError

    async def read(store) -> bytes | None:
        try:
            return await store.get(key)
        except RocketError as error:
            if error.code == Code.NOT_FOUND:
                return None
            raise

    return on_store(config, read)


def put(config: NodeConfig, objects: dict[str, bytes]) -> None:
    """Each key's bytes, in order."""
    async def write(store) -> None:
        for key, data in objects.items():
            await store.put(key, data)

    on_store(config, write)


def keys(config: NodeConfig, prefix: str) -> list[str]:
    async def listing(store) -> list[str]:
        return [info.key for info in await store.list(prefix)]

    return on_store(config, listing)


def fetch(config: NodeConfig, wanted: Iterable[str]) -> Iterator[tuple[str, bytes]]:
    """(key, bytes) of each key, FETCH_CONCURRENCY at a time: an executor's partition of the objects. An object
    deleted since it was listed (retention) is left out."""
    import trio

    from rocket.errors import Code, RocketError

    wanted = list(wanted)

    async def read(store) -> list[tuple[str, bytes]]:
        found: dict[str, bytes] = {}
        limit = trio.CapacityLimiter(FETCH_CONCURRENCY)

        async def one(key: str) -> None:
            async with limit:
                try:
                    found[key] = await store.get(key)
                except RocketError as error:
                    if error.code != Code.NOT_FOUND:
                        raise

        async with trio.open_nursery() as nursery:
            for key in wanted:
                nursery.start_soon(one, key)
        return [(key, found[key]) for key in wanted if key in found]

    return iter(on_store(config, read) if wanted else [])


def add_arguments(parser) -> None:
    parser.add_argument("--tier-config", help="a node's config file: read the telemetry from, and publish the model "
                        "to, the object store it names (tier_backend), as the node does; --telemetry and --models "
                        "win where given")


def resolve(parser, args, telemetry_needed: bool = True) -> None:
    """args.telemetry and args.models: the paths given, else the store --tier-config names (a NodeConfig)."""
    store = tier_of(None, args.tier_config)
    if store is not None:
        args.telemetry = args.telemetry or (store if telemetry_needed else None)
        args.models = args.models or store
    if telemetry_needed and not args.telemetry:
        parser.error("give --telemetry or --tier-config")
    if not args.models:
        parser.error("give --models or --tier-config")
