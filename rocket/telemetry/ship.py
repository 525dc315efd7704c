"""The telemetry shipper: each closed spool file, oldest first, is put to the object store under
<prefix>v1/node=<id>/date=<YYYY-MM-DD>/<name> (partitions Spark reads as columns), then deleted locally.
A put is idempotent by key, so a crash between put and delete only ships the same file again under the same key.
"""

from __future__ import annotations

import io
import logging
from datetime import datetime, timezone
from pathlib import Path
from typing import cast

import fastavro
import trio

from rocket.errors import RocketError
from rocket.limits.tier import telemetry_ship_interval_s, telemetry_ship_retry_s_max
from rocket.telemetry.spool import Spool, parse_closed_name
from rocket.tier.objectstore import ObjectStore

log = logging.getLogger("rocket.telemetry")

KEY_PREFIX_DEFAULT = "telemetry/"
KEY_VERSION = "v1"  # the layout of keys and files under the prefix; jobs/ reads this version


def object_key(prefix: str, node_id: int, name: str) -> str:
    """The key of closed spool file name: dated by its first sample, in UTC."""
    fields = parse_closed_name(name)
    assert fields is not None, name
    date = datetime.fromtimestamp(fields[0] / 1000, tz=timezone.utc).strftime("%Y-%m-%d")
    return f"{prefix}{KEY_VERSION}/node={node_id}/date={date}/{name}"


def read_samples(data: bytes) -> list[dict]:
    """The TelemetrySample records of one spool file's bytes."""
    return cast("list[dict]", list(fastavro.reader(io.BytesIO(data))))  # a TelemetrySample record reads as a dict


async def ship_once(spool: Spool, objects: ObjectStore, node_id: int, *, prefix: str = KEY_PREFIX_DEFAULT) -> int:
    """Ship the spool's closed files, oldest first, and return how many. A failed put (RocketError) or read
    (OSError) raises and leaves that file and the later ones for the next pass."""
    shipped = 0
    for path in await trio.to_thread.run_sync(spool.closed):
        data = await trio.to_thread.run_sync(_read_or_none, path)
        if data is None:
            continue  # the spool's bound dropped it meanwhile
        await objects.put(object_key(prefix, node_id, path.name), data)
        # False when the bound dropped it after our read: then it is counted dropped, though shipped.
        await trio.to_thread.run_sync(spool.discard, path)
        shipped += 1
    return shipped


async def ship_now(spool: Spool, objects: ObjectStore, node_id: int, *, prefix: str = KEY_PREFIX_DEFAULT) -> int:
    """Close the open file and ship everything: a node's graceful stop. Raises as ship_once does."""
    await trio.to_thread.run_sync(spool.rotate)
    return await ship_once(spool, objects, node_id, prefix=prefix)


async def ship_forever(spool: Spool, objects: ObjectStore, node_id: int, *,
                       interval_s: float = telemetry_ship_interval_s, prefix: str = KEY_PREFIX_DEFAULT,
                       retry_s_max: float = telemetry_ship_retry_s_max) -> None:
    """Ship every interval_s until cancelled. During an outage passes back off, doubling up to retry_s_max,
    and one warning is logged per outage; meanwhile the spool's bound drops its oldest files."""
    assert interval_s > 0, interval_s
    wait_s_max = max(interval_s, retry_s_max)
    wait_s = interval_s
    failing = False
    while True:
        try:
            await ship_once(spool, objects, node_id, prefix=prefix)
        except (RocketError, OSError) as error:
            if not failing:
                log.warning("telemetry: shipping to the object store failed, retrying every %.0f s at most: %s",
                            wait_s_max, error)
            wait_s = min(wait_s * 2, wait_s_max) if failing else interval_s
            failing = True
        else:
            if failing:
                log.info("telemetry: shipping to the object store works again")
            wait_s = interval_s
            failing = False
        await trio.sleep(wait_s)


def _read_or_none(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return None
