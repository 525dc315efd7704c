"""Message commands: get one by its id, find by key, cancel a delayed one."""

from __future__ import annotations

import sys
from typing import Annotated, Optional

import typer

from rocket.cli.common import (Serde, Server, Transport, err, format_message, out, parse_position, plural, runs_client,
                               usage_error)
from rocket.client import Admin, connect
from rocket.client.admin import parse_message_id
from rocket.errors import RocketError

app = typer.Typer(no_args_is_help=True, help="Single messages: get by id, find by key, cancel a delayed one.")


@app.command("get")
@runs_client
async def message_get(topic: Annotated[str, typer.Argument(help="The topic the message was sent to.", show_default=False)],
                      message_id: Annotated[str, typer.Argument(help="QUEUE.OFFSET, as `rocket send` printed (a delayed message's timer id until it is delivered).", show_default=False)],
                      output_format: Annotated[str, typer.Option("--format", help="text, json or raw (body only).")] = "text",
                      server: Server = None, transport: Transport = "tcp", serde: Serde = "lane") -> None:
    """Print one message by its id, or a delayed one by its timer id."""
    try:
        queue, offset = parse_message_id(message_id)
    except RocketError as error:
        usage_error(error.message)
    async with connect(server, transport, serde) as channel:
        message = await Admin(channel).get_message_or_scheduled(topic, queue, offset)
    sys.stdout.buffer.write(format_message(message, topic, output_format))


@app.command("find")
@runs_client
async def message_find(topic: Annotated[str, typer.Argument(help="The topic to search.", show_default=False)],
                       key: Annotated[str, typer.Option("--key", help="The key the messages were sent with (or, with --id, the client's message id).")],
                       message_id: Annotated[bool, typer.Option("--id", help="The key is a message id the client gave (RocketMQ's UNIQ_KEY, gRPC's message id).")] = False,
                       queue: Annotated[Optional[int], typer.Option("--queue", help="Search this queue alone (default: every queue).")] = None,
                       start: Annotated[Optional[str], typer.Option("--from", help="ISO time (default: the start).")] = None,
                       end: Annotated[Optional[str], typer.Option("--to", help="ISO time (default: now).")] = None,
                       limit: Annotated[int, typer.Option("--limit", help="Print at most this many messages.")] = 64,
                       output_format: Annotated[str, typer.Option("--format", help="text, json or raw (body only).")] = "text",
                       server: Server = None, transport: Transport = "tcp", serde: Serde = "lane") -> None:
    """Print the messages with a key stored in a time range.

    Each storage group keeps an index of its messages' keys and message ids, so a lookup reads only the batches
    that hold the key; those its indexer has not reached yet (it works in the node's idle time) are read whole.
    """
    start_ms = 0 if start is None else parse_position(start, "--from", times_only=True)
    end_ms = None if end is None else parse_position(end, "--to", times_only=True)
    async with connect(server, transport, serde) as channel:
        found = await Admin(channel).find_messages(topic, key, start_ms, end_ms, limit, message_id=message_id,
                                                   queues=() if queue is None else (queue,))
    sys.stdout.buffer.write(b"".join(format_message(message, topic, output_format) for message in found))
    err.print(f"{plural(len(found), 'message')} with {'message id' if message_id else 'key'} {key!r} on {topic}")


@app.command("cancel")
@runs_client
async def message_cancel(topic: Annotated[str, typer.Argument(help="The delay topic the message was sent to.", show_default=False)],
                         timer_id: Annotated[str, typer.Argument(help="QUEUE.OFFSET, as `rocket send --delay` printed.", show_default=False)],
                         server: Server = None, transport: Transport = "tcp", serde: Serde = "lane") -> None:
    """Cancel a delayed message before its delivery time."""
    try:
        parse_message_id(timer_id)
    except RocketError as error:
        usage_error(error.message)
    async with connect(server, transport, serde) as channel:
        await Admin(channel).cancel_timer(topic, timer_id)
    out.print(f"cancelled timer {timer_id} on {topic}")
