"""Consumer group commands: positions, lag and reset; and the group's dead letters."""

from __future__ import annotations

import sys
from typing import Annotated

import typer
from rich.table import Table

from rocket.cli.common import (Serde, Server, Transport, err, format_message, out, parse_position, plural, runs_client,
                               usage_error)
from rocket.client import Admin, connect

Topic = Annotated[str, typer.Argument(help="The topic the group consumes.", show_default=False)]
Group = Annotated[str, typer.Option("--group", help="The consumer group.", show_default=False)]

app = typer.Typer(no_args_is_help=True, help="Consumer groups: positions, lag, reset.")
dlq_app = typer.Typer(no_args_is_help=True, help="A consumer group's dead letters: list them, send them again.")


def _group_table(topic: str, group: str, queues: list[dict]) -> Table:
    readers: dict[str, list[str]] = {}
    for q in queues:
        if q["member"]:
            readers.setdefault(q["member"], []).append(str(q["queue"]))
    caption = "; ".join(f"{member} reads queue{'s' if len(read) > 1 else ''} {', '.join(read)}"
                        for member, read in readers.items())
    table = Table("queue", "next offset", "pull position", "pop cursor", "in flight", "lag", "dead letters",
                  title=f"group {group} on {topic}", caption=caption or "no live pull consumer", caption_justify="left")
    for q in queues:
        table.add_row(str(q["queue"]), f"{q['next_offset']:,}", "-" if q["committed"] < 0 else f"{q['committed']:,}",
                      f"{q['pop_cursor']:,}", f"{q['in_flight']:,}", f"{q['lag']:,}", f"{q['dead_letters']:,}")
    table.add_row("all", "", "", "", f"{sum(q['in_flight'] for q in queues):,}", f"{sum(q['lag'] for q in queues):,}",
                  f"{sum(q['dead_letters'] for q in queues):,}")
    return table


@app.command("describe")
@runs_client
async def group_describe(topic: Topic, group: Group,
                         server: Server = None, transport: Transport = "tcp", serde: Serde = "json") -> None:
    """A group's positions on a topic, per queue.

    For each queue: the pull position, the live consumer reading it, the pop cursor, messages in flight, lag and dead
    letters.
    """
    async with connect(server, transport, serde) as channel:
        out.print(_group_table(topic, group, await Admin(channel).describe_group(topic, group)))


@app.command("reset")
@runs_client
async def group_reset(topic: Topic, group: Group,
                      to: Annotated[str, typer.Option("--to", help="earliest, latest, an ISO time, or (with --queue) "
                                                                  "an offset.")],
                      queue: Annotated[int, typer.Option("--queue", help="Only this queue (-1: every queue).")] = -1,
                      server: Server = None, transport: Transport = "tcp", serde: Serde = "json") -> None:
    """Move a group's positions (pull and pop) on every queue, or on one.

    What the group had in flight is dropped. An offset steps past a batch that its consumers cannot read (BAD_BATCH
    names where the next one starts). Refused (GROUP_ACTIVE) while the group's pull consumers run: their next commit
    would undo it.
    """
    if to.isdigit() and queue < 0:
        usage_error(f"--to {to}: an offset names one queue; give it with --queue")
    position = int(to) if to.isdigit() else parse_position(to, "--to")
    async with connect(server, transport, serde) as channel:
        admin = Admin(channel)
        if to.isdigit():
            queues = await admin.seek_group(topic, group, queue, position)
        else:
            queues = await admin.reset_group(topic, group, position, queue)
        out.print(_group_table(topic, group, queues))


@dlq_app.command("list")
@runs_client
async def dlq_list(topic: Topic, group: Group,
                   output_format: Annotated[str, typer.Option("--format", help="text, json or raw (body only).")] = "text",
                   server: Server = None, transport: Transport = "tcp", serde: Serde = "json") -> None:
    """Print a group's dead letters of a topic (where they came from and how often they were tried)."""
    listed = 0
    async with connect(server, transport, serde) as channel:
        async for messages in Admin(channel).dead_letters(topic, group):
            sys.stdout.buffer.write(b"".join(format_message(m, topic, output_format) for m in messages))
            listed += len(messages)
    err.print(f"{plural(listed, 'dead letter')} of group {group} on {topic}")


@dlq_app.command("resend")
@runs_client
async def dlq_resend(topic: Topic, group: Group,
                     server: Server = None, transport: Transport = "tcp", serde: Serde = "json") -> None:
    """Send a group's dead letters to their topic again; each is resent once (the position is kept)."""
    async with connect(server, transport, serde) as channel:
        resent = await Admin(channel).resend_dead_letters(topic, group)
    out.print(f"resent {plural(resent, 'dead letter')} of group {group} to {topic}")
