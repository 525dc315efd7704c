"""Benchmark commands: produce and consume throughput beside the raw bandwidth of the disk."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import trio
import typer
from rich.table import Table

from rocket import limits
from rocket.cli import disk_probe
from rocket.cli.common import Serde, Server, Transport, err, out, progress_bar, runs_client
from rocket.client import Admin, connect
from rocket.client import bench as bench_module

app = typer.Typer(no_args_is_help=True, help="Measure produce and consume against a running server.")

DEV_DATA_DIR = Path("rocket-data")  # where `rocket run` keeps its data by default


def _bench_report(title: str, result: dict, disks: list[dict], json_file: Optional[Path],
                  direct: dict | None = None) -> None:
    """Print and save a result beside the raw disk bandwidth, probed before and after the run (and with
    O_DIRECT, which takes no page-cache page, as rocket's WAL with wal_direct_io)."""
    raw_mb_per_s = sum(disk["mb_per_s"] for disk in disks) / len(disks) if disks else 0.0
    ratio = result["mb_per_s"] / raw_mb_per_s if raw_mb_per_s else 0.0
    table = Table("metric", "value", title=title)
    for name, value in result.items():
        table.add_row(name, f"{value:,.2f}" if isinstance(value, float) else str(value))
    if disks:
        probes = " / ".join(f"{disk['mb_per_s']:,.1f}" for disk in disks)
        table.add_row("raw disk MB/s (1 MiB + fdatasync), before / after", probes)
        table.add_row("ratio to raw disk (mean of probes)", f"{ratio:.2f}")
    report = {"result": result, "raw_disk": disks, "raw_disk_mb_per_s": raw_mb_per_s, "ratio_to_raw_disk": ratio}
    if direct is not None:
        report["raw_disk_direct"] = direct
        report["ratio_to_raw_disk_direct"] = result["mb_per_s"] / direct["mb_per_s"] if direct["mb_per_s"] else 0.0
        table.add_row("raw disk MB/s with O_DIRECT", f"{direct['mb_per_s']:,.1f}")
        table.add_row("ratio to the O_DIRECT probe", f"{report['ratio_to_raw_disk_direct']:.2f}")
    out.print(table)
    if json_file:
        json_file.write_text(json.dumps(report, indent=2))


def _disk_directory(disk_dir: Optional[Path]) -> Path:
    """Where to probe the disk: as given, else ./rocket-data where a dev-mode server keeps its data, else here.
    The default is never created: a probe leaves nothing behind."""
    if disk_dir is not None:
        return disk_dir
    return DEV_DATA_DIR if DEV_DATA_DIR.is_dir() else Path(".")


DiskDir = Annotated[Optional[Path], typer.Option("--disk-dir", show_default="./rocket-data if it exists, else the current directory",
                                                 help="A directory on the server's data disk, where the raw disk bandwidth is probed.")]
JsonFile = Annotated[Optional[Path], typer.Option("--json", help="Write the results as JSON to this file.")]
Messages = Annotated[int, typer.Option("--messages", help="How many messages to send or read.")]


@app.command("produce")
@runs_client
async def bench_produce(
    messages: Messages = 200_000,
    size: Annotated[int, typer.Option("--size", help="Body bytes per message.")] = 1024,
    batch_bytes: Annotated[int, typer.Option("--batch-bytes", help="Bytes of messages per batch sent.")] = limits.producer_batch_bytes_default,
    in_flight: Annotated[int, typer.Option("--in-flight", help="Batches in flight at once.")] = 16,
    rate: Annotated[float, typer.Option("--rate", help="Batches sent a second, each at its due time (0: as fast as "
                                        "--in-flight allows). For latency at a given load: give --in-flight room.")] = 0.0,
    topic: Annotated[Optional[str], typer.Option("--topic", help="Send to this topic, created if it does not exist "
                                                 "and kept (default: a new bench-... topic whose data expires after the run).")] = None,
    disk_dir: DiskDir = None,
    json_file: JsonFile = None,
    probe: Annotated[bool, typer.Option("--probe/--no-probe", help="Probe the raw disk before and after (its writes "
                                        "are still flushed when the run starts: without, for latency at a given load).")] = True,
    server: Server = None, transport: Transport = "tcp", serde: Serde = "lane",
) -> None:
    """Durable produce throughput and latency, beside the disk's raw fdatasync bandwidth."""
    disk_dir = _disk_directory(disk_dir)
    probe_bytes = max(limits.bench_probe_bytes_min, min(messages * size, limits.bench_probe_bytes_max))
    if probe:
        before = await trio.to_thread.run_sync(disk_probe.raw_disk_bandwidth, disk_dir, probe_bytes)
        direct = await trio.to_thread.run_sync(disk_probe.raw_disk_bandwidth_direct, disk_dir, probe_bytes)
    async with connect(server, transport, serde) as channel:
        with progress_bar(messages) as progress:
            task = progress.add_task("producing", total=messages)
            result = await bench_module.bench_produce(
                channel, messages=messages, size=size, batch_bytes=batch_bytes, in_flight=in_flight, topic=topic,
                rate=rate, on_progress=lambda n: progress.update(task, advance=n))
        if topic is None:
            # A retention this short lets the storage nodes drop the data soon, and keeps the topic for bench consume.
            await Admin(channel).update_topic(result["topic"], limits.bench_topic_retention_s, limits.bench_topic_retention_s)
    if probe:
        after = await trio.to_thread.run_sync(disk_probe.raw_disk_bandwidth, disk_dir, probe_bytes)
        _bench_report("rocket bench produce", result, [before, after], json_file, direct)
    else:
        _bench_report("rocket bench produce", result, [], json_file)
    megabytes = messages * size / 1e6
    if topic is None:
        err.print(f"topic {result['topic']} holds the {megabytes:,.0f} MB sent; its retention is now "
                  f"{limits.bench_topic_retention_s:g} s, so the storage nodes drop them soon (or now: "
                  f"rocket topic delete {result['topic']} --force)")
    else:
        err.print(f"topic {topic} keeps the {megabytes:,.0f} MB sent (for bench consume); `rocket topic update {topic} "
                  "--retention 1m --local-retention 1m` lets them go")


@app.command("consume")
@runs_client
async def bench_consume(
    topic: Annotated[str, typer.Option("--topic", help="A topic filled by bench produce.")],
    messages: Messages = 200_000,
    disk_dir: DiskDir = None,
    json_file: JsonFile = None,
    bodies: Annotated[bool, typer.Option("--bodies", help="Read bodies only (poll_bodies), not messages.")] = False,
    server: Server = None, transport: Transport = "tcp", serde: Serde = "lane",
) -> None:
    """Consume throughput from the earliest offset, as a new group."""
    disk = await trio.to_thread.run_sync(disk_probe.raw_disk_bandwidth, _disk_directory(disk_dir))
    async with connect(server, transport, serde) as channel:
        with progress_bar(messages) as progress:
            task = progress.add_task("consuming", total=messages)
            result = await bench_module.bench_consume(channel, topic=topic, messages=messages, bodies=bodies,
                                                      on_progress=lambda n: progress.update(task, advance=n))
    _bench_report("rocket bench consume", result, [disk], json_file)
