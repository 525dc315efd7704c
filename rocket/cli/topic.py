"""Topic commands: create, update, delete, list and describe; and the tier status of topics."""

from __future__ import annotations

import time
from typing import Annotated, Optional

import typer
from rich.table import Table

from rocket.cli.common import Serde, Server, Transport, out, plural, runs_client, size, usage_error
from rocket.client import Admin, connect
from rocket.errors import RocketError
from rocket.model import DEFAULT_STORAGE_CLASS, parse_duration_s

app = typer.Typer(no_args_is_help=True, help="Create, update, delete, list and describe topics.")
Retention = Annotated[Optional[str], typer.Option("--retention", help="Total retention: data older is deleted from the tier (365d, 12h, forever, default).")]
ReadReplicas = Annotated[Optional[int], typer.Option("--read-replicas", help="Learners each of the topic's storage groups keeps on other nodes to serve its reads and long polls (0..4); they never vote.")]
LocalRetention = Annotated[Optional[str], typer.Option("--local-retention", help="Hot retention: local data older goes once it is offloaded (1h, forever, default).")]
tier_app = typer.Typer(no_args_is_help=True, help="Tiered storage: what is local, offloaded and pending.")


@app.command("create")
@runs_client
async def topic_create(name: Annotated[str, typer.Argument(help="The topic's name.", show_default=False)],
                       queues: Annotated[int, typer.Option("--queues", help="Queues: the topic's unit of order and of parallel reads.")] = 8,
                       message_type: Annotated[str, typer.Option("--type", help="normal, fifo, delay or transaction: the sends the topic accepts.")] = "normal",
                       storage_class: Annotated[str, typer.Option("--storage-class", help="The storage class whose groups hold the queues (see rocket cluster storage-class list).")] = DEFAULT_STORAGE_CLASS,
                       retention: Retention = None, local_retention: LocalRetention = None,
                       read_replicas: ReadReplicas = None,
                       server: Server = None, transport: Transport = "tcp", serde: Serde = "lane") -> None:
    """Create a topic with a number of queues and a message type, in a storage class, with its retention and read
    replicas."""
    retention_s = _retention(retention, "--retention")
    local_retention_s = _retention(local_retention, "--local-retention")
    async with connect(server, transport, serde) as channel:
        spec = await Admin(channel).create_topic(name, queues, message_type, storage_class, retention_s,
                                                 local_retention_s, read_replicas or 0)
    placed = "" if spec.storage_class == DEFAULT_STORAGE_CLASS else f" in storage class {spec.storage_class}"
    kept = "" if retention is None and local_retention is None else (
        f", retention {_show_retention(spec.retention_s)}, local retention {_show_retention(spec.local_retention_s)}")
    readers = f", {plural(spec.read_replicas, 'read replica')} per group" if spec.read_replicas else ""
    out.print(f"created {spec.message_type} topic [bold]{spec.name}[/bold] with {plural(spec.queues, 'queue')}"
              f"{placed}{kept}{readers}")


@app.command("delete")
@runs_client
async def topic_delete(name: Annotated[str, typer.Argument(help="The topic to delete.", show_default=False)],
                       yes: Annotated[bool, typer.Option("--yes", help="Delete without asking: its messages cannot be brought back.")] = False,
                       force: Annotated[bool, typer.Option("--force", help="Delete even while consumer groups have messages of it left to consume.")] = False,
                       server: Server = None, transport: Transport = "tcp", serde: Serde = "lane") -> None:
    """Delete a topic: its messages (local and in the tier), timers, dead letters, and its groups' offsets on it.

    Refused (NOT_CONSUMED) while a consumer group has messages left to consume, unless --force. Made again, the topic
    starts empty.
    """
    if not yes and not typer.confirm(f"delete topic {name} and every message in it?"):
        usage_error("not deleted: confirm, or pass --yes")
    async with connect(server, transport, serde) as channel:
        await Admin(channel).delete_topic(name, force)
    out.print(f"deleted topic [bold]{name}[/bold]")


def _retention(text: str | None, option: str) -> float | None:
    """A retention option: a duration (365d, 1h), 'forever' (0) or 'default' (-1)."""
    if text is None:
        return None
    if text in ("forever", "0"):
        return 0.0
    if text == "default":
        return -1.0
    try:
        return parse_duration_s(text)
    except RocketError as error:
        usage_error(f"{option}: {error.message}")


def _show_retention(seconds: float) -> str:
    if seconds < 0:
        return "default"
    if seconds == 0:
        return "forever"
    for unit, unit_s in (("d", 86_400), ("h", 3600), ("m", 60)):
        if seconds >= unit_s and seconds % unit_s == 0:
            return f"{seconds / unit_s:.0f}{unit}"
    return f"{seconds:g}s"


@app.command("update")
@runs_client
async def topic_update(name: Annotated[str, typer.Argument(help="The topic to change.", show_default=False)],
                       retention: Retention = None, local_retention: LocalRetention = None,
                       queues: Annotated[Optional[int], typer.Option("--queues", help="Raise the topic's queues to this many; the new ones go where the predicted load is lowest (see rocket cluster placement --explain).")] = None,
                       storage_class: Annotated[str, typer.Option("--storage-class", help="Move the topic to this storage class, with its offsets, while it is produced to and consumed.")] = "",
                       wait: Annotated[bool, typer.Option("--wait/--no-wait", help="With --storage-class: return once the topic moved, or once its move started.")] = True,
                       read_replicas: ReadReplicas = None,
                       server: Server = None, transport: Transport = "tcp", serde: Serde = "lane") -> None:
    """Change a topic's retention settings or read replicas, add queues to it, or move it to another storage
    class."""
    retention_s = _retention(retention, "--retention")
    local_retention_s = _retention(local_retention, "--local-retention")
    async with connect(server, transport, serde) as channel:
        admin = Admin(channel)
        spec = await admin.update_topic(name, retention_s, local_retention_s, queues, storage_class, read_replicas)
        moving = storage_class and spec.storage_class != storage_class
        if moving and wait:
            started = time.monotonic()
            spec = await admin.wait_moved(name, storage_class)
            out.print(f"topic [bold]{name}[/bold] moved to storage class {storage_class} in "
                      f"{time.monotonic() - started:.1f} s")
        elif moving:
            out.print(f"topic [bold]{name}[/bold] is moving to storage class {storage_class}")
    out.print(f"topic [bold]{spec.name}[/bold]: {plural(spec.queues, 'queue')}, storage class {spec.storage_class}, "
              f"retention {_show_retention(spec.retention_s)}, "
              f"local retention {_show_retention(spec.local_retention_s)}, "
              f"{plural(spec.read_replicas, 'read replica')} per group")


@tier_app.command("status")
@runs_client
async def tier_status(topic: Annotated[Optional[str], typer.Argument(help="One topic; all by default.")] = None,
                      queues: Annotated[bool, typer.Option("--queues", help="One row per queue.")] = False,
                      server: Server = None, transport: Transport = "tcp", serde: Serde = "lane") -> None:
    """Per topic: local and tiered bytes, data pending upload, oldest offsets."""
    async with connect(server, transport, serde) as channel:
        topics = await Admin(channel).tier_status(topic or "")
    table = Table("topic / queue", "retention total / local", "offsets first / local / next", "local", "tiered",
                  "pending", "pieces", title="tier")
    for spec, rows in topics:
        retention = f"{_show_retention(spec.retention_s)} / {_show_retention(spec.local_retention_s)}"
        if not queues:
            rows = [{"queue": "all", "first_offset": min((r["first_offset"] for r in rows), default=0),
                     "local_offset": min((r["local_offset"] for r in rows), default=0),
                     **{field: sum(r[field] for r in rows) for field in
                        ("next_offset", "local_bytes", "tiered_bytes", "pending_bytes", "pieces")}}]
        for row in rows:
            offsets = f"{row['first_offset']:,} / {row['local_offset']:,} / {row['next_offset']:,}"
            table.add_row(f"{spec.name} / {row['queue']}", retention, offsets, size(row["local_bytes"]),
                          size(row["tiered_bytes"]), size(row["pending_bytes"]), f"{row['pieces']:,}")
    out.print(table)


@app.command("list")
@runs_client
async def topic_list(server: Server = None, transport: Transport = "tcp", serde: Serde = "lane") -> None:
    """List topics."""
    async with connect(server, transport, serde) as channel:
        admin = Admin(channel)
        table = Table("topic", "type", "queues", "messages", "bytes", "created")
        for spec in await admin.list_topics():
            _, queues = await admin.describe_topic(spec.name)
            messages = sum(q["next_offset"] - q["min_offset"] for q in queues)
            created = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(spec.created_ms / 1000))
            table.add_row(spec.name, spec.message_type, str(spec.queues), f"{messages:,}", f"{sum(q['bytes'] for q in queues):,}", created)
    out.print(table)


@app.command("describe")
@runs_client
async def topic_describe(name: Annotated[str, typer.Argument(help="The topic to describe.", show_default=False)],
                         server: Server = None, transport: Transport = "tcp", serde: Serde = "lane") -> None:
    """Show a topic's queues: offsets and sizes."""
    async with connect(server, transport, serde) as channel:
        spec, queues = await Admin(channel).describe_topic(name)
    placed = "" if spec.storage_class == DEFAULT_STORAGE_CLASS else f" (storage class {spec.storage_class})"
    if spec.read_replicas:
        placed += f" ({plural(spec.read_replicas, 'read replica')} per group)"
    table = Table("queue", "min offset", "next offset", "messages", "bytes",
                  title=f"{spec.message_type} topic {spec.name}{placed}")
    for q in queues:
        table.add_row(str(q["queue"]), f"{q['min_offset']:,}", f"{q['next_offset']:,}",
                      f"{q['next_offset'] - q['min_offset']:,}", f"{q['bytes']:,}")
    out.print(table)
