"""The node's telemetry task (run_telemetry): it samples the registry into the spool and ships closed spool files to
the object store. It never waits on the hot path: a sample reads counters the components keep, and a spool that
cannot be written drops the sample and counts it."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from functools import partial

import trio

from rocket import limits
from rocket.clock import sleep_periodic
from rocket.errors import RocketError
from rocket.telemetry.registry import Telemetry, counter_family, gauge_family
from rocket.telemetry.ship import KEY_PREFIX_DEFAULT, ship_forever, ship_now
from rocket.telemetry.spool import Spool
from rocket.tier.objectstore import ObjectStore

log = logging.getLogger("rocket.telemetry")


def raft_metrics(host, store) -> Callable[[], Iterable]:
    """A Raft host's fsyncs and WAL bytes, and per group it hosts: whether this node leads it, and each lagging
    replica's entries behind. store (or None): the storage role's, whose own fsyncs count too."""
    wal_start = host.wal.log.end_position

    def collect():
        yield counter_family("rocket_fsyncs", "fsyncs of the Raft WAL and the store", [],
                             [([], host.rounds.fsyncs + (store.fsyncs if store is not None else 0))])
        yield counter_family("rocket_wal_written_bytes", "Bytes written to the Raft WAL since the node started", [],
                             [([], host.wal.log.end_position - wal_start)])
        groups = sorted(host.groups)
        yield gauge_family("rocket_group_leader", "1 where this node leads the Raft group", ["group"],
                           [([str(group)], float(host.leads(group))) for group in groups])
        yield gauge_family("rocket_group_lag_entries", "Entries a replica lacks, on the group's leader",
                           ["group", "replica"],
                           [([str(group), str(node)], entries) for group in groups if host.leads(group)
                            for node, entries in host.lagging(group).items()])
    return collect


def traffic_metrics(traffic) -> Callable[[], Iterable]:
    """The bytes a node's listeners received and sent (rocket.transport.rpc.Traffic)."""

    def collect():
        yield counter_family("rocket_received_bytes", "Bytes the node's listeners received", [],
                             [([], traffic.received_bytes)])
        yield counter_family("rocket_sent_bytes", "Bytes the node's listeners sent", [], [([], traffic.sent_bytes)])
    return collect


async def run_telemetry(telemetry: Telemetry, spool: Spool, objects: ObjectStore | None, interval_s: float, *,
                        prefix: str = KEY_PREFIX_DEFAULT, task_status=trio.TASK_STATUS_IGNORED) -> None:
    """Sample every interval_s and ship, until cancelled; then sample once more, close the open file and ship it,
    within limits.telemetry_flush_s_max (what is left is shipped after the next start). Each sample of the registry
    (registry.py) is appended to the spool (spool.py) in a worker thread; beside it the shipper (ship.py) moves closed
    spool files to the object store."""
    async with trio.open_nursery() as nursery:
        if objects is not None:
            nursery.start_soon(partial(ship_forever, spool, objects, telemetry.node_id, prefix=prefix))
        task_status.started()
        try:
            while True:
                await sleep_periodic(interval_s)
                await sample_once(telemetry, spool)
        finally:
            with trio.move_on_after(limits.telemetry_flush_s_max) as scope:
                scope.shield = True
                await sample_once(telemetry, spool)
                if objects is not None:
                    try:
                        await ship_now(spool, objects, telemetry.node_id, prefix=prefix)
                    except (RocketError, OSError) as error:
                        log.warning("telemetry: the last files were not shipped, they will be after a restart: %s",
                                    error)


async def sample_once(telemetry: Telemetry, spool: Spool) -> None:
    records = telemetry.sample(time.time())
    dropped_before = spool.dropped_records
    try:
        await trio.to_thread.run_sync(spool.append, records)
    except OSError as error:
        log.warning("telemetry: a sample of %d records was dropped: %s", len(records), error)
        telemetry.samples_dropped.inc(len(records))
    telemetry.samples_dropped.inc(spool.dropped_records - dropped_before)
