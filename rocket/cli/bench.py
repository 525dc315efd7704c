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
from rocket.cli.common import Serde, Server, Transport, out, progress_bar, runs_client
from rocket.client import bench as bench_module
from rocket.client import connect

app = typer.Typer(no_args_is_help=True, help="Measure produce and consume against a running server.")


def _bench_report(title: str, result: dict, disks: list[dict], json_file: Optional[Path],
                  direct: dict | None = None) -> None:
    """Print and save a result beside the raw disk bandwidth, probed before and after the run (and with
    O_DIRECT, which takes no page-cache page, as rocket's WAL with wal_direct_io)."""
    raw_mb_per_s = sum(disk["mb_per_s"] for disk in disks) / len(disks)
    ratio = result["mb_per_s"] / raw_mb_per_s if raw_mb_per_s else 0.0
    table = Table("metric", "value", title=title)
    for name, value in result.items():
        table.add_row(name, f"{value:,.2f}" if isinstance(value, float) else str(value))
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


@app.command("produce")
@runs_client
async def bench_produce(
    messages: Annotated[int, typer.Option("--messages")] = 200_000,
    size: Annotated[int, typer.Option("--size", help="Body bytes per message.")] = 1024,
    batch_bytes: Annotated[int, typer.Option("--batch-bytes")] = limits.producer_batch_bytes_default,
    in_flight: Annotated[int, typer.Option("--in-flight", help="Batches in flight at once.")] = 16,
    topic: Annotated[Optional[str], typer.Option("--topic")] = None,
    disk_dir: Annotated[Path, typer.Option("--disk-dir", help="Directory on the server's data disk.")] = Path("rocket-data"),
    json_file: Annotated[Optional[Path], typer.Option("--json", help="Write results as JSON here.")] = None,
    server: Server = None, transport: Transport = "tcp", serde: Serde = "avro",
) -> None:
    """Durable produce throughput and latency, beside the disk's raw fdatasync bandwidth."""
    probe_bytes = max(256 * limits.MiB, min(messages * size, 4096 * limits.MiB))
    before = await trio.to_thread.run_sync(disk_probe.raw_disk_bandwidth, disk_dir, probe_bytes)
    direct = await trio.to_thread.run_sync(disk_probe.raw_disk_bandwidth_direct, disk_dir, probe_bytes)
    async with connect(server, transport, serde) as channel:
        with progress_bar(messages) as progress:
            task = progress.add_task("producing", total=messages)
            result = await bench_module.bench_produce(
                channel, messages=messages, size=size, batch_bytes=batch_bytes, in_flight=in_flight, topic=topic,
                on_progress=lambda n: progress.update(task, advance=n))
    after = await trio.to_thread.run_sync(disk_probe.raw_disk_bandwidth, disk_dir, probe_bytes)
    _bench_report("rocket bench produce", result, [before, after], json_file, direct)


@app.command("consume")
@runs_client
async def bench_consume(
    topic: Annotated[str, typer.Option("--topic", help="A topic filled by bench produce.")],
    messages: Annotated[int, typer.Option("--messages")] = 200_000,
    disk_dir: Annotated[Path, typer.Option("--disk-dir")] = Path("rocket-data"),
    json_file: Annotated[Optional[Path], typer.Option("--json")] = None,
    bodies: Annotated[bool, typer.Option("--bodies", help="Read bodies only (poll_bodies), not messages.")] = False,
    server: Server = None, transport: Transport = "tcp", serde: Serde = "avro",
) -> None:
    """Consume throughput from the earliest offset, as a new group."""
    disk = await trio.to_thread.run_sync(disk_probe.raw_disk_bandwidth, disk_dir)
    async with connect(server, transport, serde) as channel:
        with progress_bar(messages) as progress:
            task = progress.add_task("consuming", total=messages)
            result = await bench_module.bench_consume(channel, topic=topic, messages=messages, bodies=bodies,
                                                      on_progress=lambda n: progress.update(task, advance=n))
    _bench_report("rocket bench consume", result, [disk], json_file)
