"""What every command shares: the consoles, the connection options, one-line failures, progress and formats."""

from __future__ import annotations

import functools
from typing import Annotated, Optional

import orjson
import trio
import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TransferSpeedColumn

from rocket.errors import RocketError, collapse_single_error
from rocket.model import Message

out = Console()
err = Console(stderr=True)

Server = Annotated[Optional[str], typer.Option("--server", envvar="ROCKET_SERVER", help="HOST:PORT of a rocket server, or several comma-separated (TCP: calls move on when one is gone).")]
Transport = Annotated[str, typer.Option("--transport", help="tcp or http2.")]
Serde = Annotated[str, typer.Option("--serde", help="json or avro.")]


def fail(message: str, status: int) -> None:
    err.print(f"[red]error:[/red] {message}", highlight=False, soft_wrap=True)
    raise typer.Exit(status)


def runs_client(function):
    """Run an async command body under trio, turning rocket errors into one clear line and exit 1."""

    @functools.wraps(function)
    def wrapper(*args, **kwargs):
        try:
            with collapse_single_error():
                return trio.run(functools.partial(function, *args, **kwargs))
        except RocketError as error:
            fail(f"{error.code.name}: {error.message}", 1)
        except KeyboardInterrupt:
            raise typer.Exit(130)

    return wrapper


def progress_bar(total: int | None, unit: str = "messages") -> Progress:
    columns = [TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn()]
    if unit == "bytes":
        columns = [TextColumn("[bold]{task.description}"), BarColumn(), TransferSpeedColumn(), TimeElapsedColumn()]
    return Progress(*columns, console=err, disable=not err.is_terminal, transient=False)


def size(count: int) -> str:
    """Bytes for people: 512 B, 1.5 KiB, 3.2 GiB."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if count < 1024 or unit == "GiB":
            return f"{count:,} {unit}" if unit == "B" else f"{count:,.1f} {unit}"
        count /= 1024
    return ""


def format_message(message: Message, topic: str, output_format: str) -> bytes:
    if output_format == "json":
        return orjson.dumps({
            "topic": topic, "queue": message.queue, "offset": message.offset, "key": message.key,
            "tag": message.tag, "properties": message.properties, "timestamp_ms": message.timestamp_ms,
            "body": message.body.decode("utf-8", "replace"),
        }) + b"\n"
    if output_format == "raw":
        return message.body + b"\n"
    meta = f"{message.queue}:{message.offset}"
    if message.key:
        meta += f" key={message.key}"
    if message.tag:
        meta += f" tag={message.tag}"
    for name, value in message.properties.items():
        meta += f" {name}={value}"
    return meta.encode() + b" " + message.body + b"\n"
