"""Message commands: get one by its id, find by key, cancel a delayed one."""

from __future__ import annotations

import sys
from typing import Annotated, Optional

import typer

from rocket.cli.common import Serde, Server, Transport, err, fail, format_message, out, runs_client
from rocket.client import Admin, connect, parse_start
from rocket.client.admin import parse_message_id

app = typer.Typer(no_args_is_help=True, help="Single messages: get by id, find by key, cancel a delayed one.")


@app.command("get")
@runs_client
async def message_get(topic: str, message_id: Annotated[str, typer.Argument(help="QUEUE.OFFSET, as `rocket send` printed.")],
                      output_format: Annotated[str, typer.Option("--format", help="text, json or raw (body only).")] = "text",
                      server: Server = None, transport: Transport = "tcp", serde: Serde = "json") -> None:
    """Print one message by its id."""
    queue, offset = parse_message_id(message_id)
    async with connect(server, transport, serde) as channel:
        message = await Admin(channel).get_message(topic, queue, offset)
    sys.stdout.buffer.write(format_message(message, topic, output_format))


@app.command("find")
@runs_client
async def message_find(topic: str, key: Annotated[str, typer.Option("--key")],
                       start: Annotated[Optional[str], typer.Option("--from", help="ISO time (default: the start).")] = None,
                       end: Annotated[Optional[str], typer.Option("--to", help="ISO time (default: now).")] = None,
                       limit: Annotated[int, typer.Option("--limit")] = 64,
                       output_format: Annotated[str, typer.Option("--format", help="text, json or raw (body only).")] = "text",
                       server: Server = None, transport: Transport = "tcp", serde: Serde = "json") -> None:
    """Print the messages with a key stored in a time range (a scan of the key's queue over that range)."""
    start_ms = 0 if start is None else parse_start(start)
    end_ms = None if end is None else parse_start(end)
    if isinstance(start_ms, str) or isinstance(end_ms, str):
        fail("--from and --to take ISO times", 2)
    async with connect(server, transport, serde) as channel:
        found = await Admin(channel).find_messages(topic, key, start_ms, end_ms, limit)
    sys.stdout.buffer.write(b"".join(format_message(message, topic, output_format) for message in found))
    err.print(f"{len(found):,} messages with key {key!r} on {topic}")


@app.command("cancel")
@runs_client
async def message_cancel(topic: str, timer_id: Annotated[str, typer.Argument(help="QUEUE.OFFSET, as `rocket send --delay` printed.")],
                         server: Server = None, transport: Transport = "tcp", serde: Serde = "json") -> None:
    """Cancel a delayed message before its delivery time."""
    async with connect(server, transport, serde) as channel:
        await Admin(channel).cancel_timer(topic, timer_id)
    out.print(f"cancelled timer {timer_id} on {topic}")
