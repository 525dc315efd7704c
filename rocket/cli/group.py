"""Consumer group commands: settings (max attempts, retry backoff, consume mode, FIFO), positions, lag and reset; and
the group's dead letters."""

from __future__ import annotations

import sys
from typing import Annotated, Optional

import typer
from rich.table import Table

from rocket.cli.common import (Serde, Server, Transport, err, format_message, out, parse_position, plural, print_json,
                               runs_client, usage_error)
from rocket import limits
from rocket.client import Admin, connect
from rocket.errors import RocketError
from rocket.model import parse_duration_s

Topic = Annotated[str, typer.Argument(help="The topic the group consumes.", show_default=False)]
Group = Annotated[str, typer.Option("--group", help="The consumer group.", show_default=False)]

app = typer.Typer(no_args_is_help=True, help="Consumer groups: settings, positions, lag, reset, delete.")
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


GroupName = Annotated[str, typer.Argument(help="The consumer group.", show_default=False)]
MaxAttempts = Annotated[Optional[int], typer.Option(
    "--max-attempts", help=f"Deliveries before a message goes to the dead letters, 1..{limits.checks_config_max}; "
    "it overrides what the group's consumers ask for (0: none set, each consumer's own).", show_default=False)]
RetryBackoff = Annotated[Optional[str], typer.Option(
    "--retry-backoff", help="The invisible time after each failed delivery, comma-separated: 1s,5s,30s (the last "
    "repeats; 'default': rocket's 1s,5s,10s,30s,...).", show_default=False)]
Mode = Annotated[Optional[str], typer.Option("--mode", help="clustering or broadcasting.", show_default=False)]


def _backoff(text: str | None) -> tuple[float, ...] | None:
    if text is None:
        return None
    if text.strip() in ("", "default"):
        return ()
    try:
        return tuple(parse_duration_s(step.strip()) for step in text.split(","))
    except RocketError as error:
        usage_error(f"--retry-backoff {text}: {error.message}")


def _settings_table(groups: list[dict]) -> Table:
    table = Table("group", "max attempts", "retry backoff", "mode", "fifo", title="consumer groups")
    for group in groups:
        backoff = (", ".join(f"{seconds:g}s" for seconds in group["retry_backoff_s"])
                   if group["retry_backoff_s"] else "default")
        table.add_row(group["group"], str(group["max_attempts"]) if group["max_attempts"] else "each consumer's",
                      backoff, group["consume_mode"], "yes" if group["fifo"] else "no")
    return table


@app.command("create")
@runs_client
async def group_create(group: GroupName, max_attempts: MaxAttempts = None, retry_backoff: RetryBackoff = None,
                       mode: Mode = None,
                       fifo: Annotated[bool, typer.Option("--fifo", help="The group consumes in order.")] = False,
                       server: Server = None, transport: Transport = "tcp", serde: Serde = "lane") -> None:
    """Keep a consumer group's settings in the cluster's metadata; every broker and gateway applies them.

    Refused (GROUP_EXISTS) if the group has settings already: change them with update.
    """
    backoff = _backoff(retry_backoff)
    async with connect(server, transport, serde) as channel:
        made = await Admin(channel).create_consumer_group(group, max_attempts or 0, backoff or (),
                                                          mode or "clustering", fifo)
    out.print(f"created consumer group [bold]{made['group']}[/bold]")
    out.print(_settings_table([made]))


@app.command("update")
@runs_client
async def group_update(group: GroupName, max_attempts: MaxAttempts = None, retry_backoff: RetryBackoff = None,
                       mode: Mode = None,
                       fifo: Annotated[Optional[bool], typer.Option("--fifo/--no-fifo", help="Consume in order, or not.",
                                                                    show_default=False)] = None,
                       server: Server = None, transport: Transport = "tcp", serde: Serde = "lane") -> None:
    """Change a consumer group's settings: only those given change (UNKNOWN_GROUP if it has none yet)."""
    backoff = _backoff(retry_backoff)
    if max_attempts is None and backoff is None and mode is None and fifo is None:
        usage_error("give a setting to change: --max-attempts, --retry-backoff, --mode or --fifo/--no-fifo")
    async with connect(server, transport, serde) as channel:
        updated = await Admin(channel).update_consumer_group(group, max_attempts=max_attempts,
                                                             retry_backoff_s=backoff, consume_mode=mode, fifo=fifo)
    out.print(f"updated consumer group [bold]{updated['group']}[/bold]")
    out.print(_settings_table([updated]))


@app.command("list")
@runs_client
async def group_list(server: Server = None, transport: Transport = "tcp", serde: Serde = "lane",
                     as_json: Annotated[bool, typer.Option("--json", help="Print them as JSON.")] = False) -> None:
    """The consumer groups with settings, and their settings."""
    async with connect(server, transport, serde) as channel:
        groups = await Admin(channel).consumer_groups()
    if as_json:
        print_json({"groups": groups})
        return
    out.print(_settings_table(groups) if groups else "no consumer group has settings")


@app.command("settings")
@runs_client
async def group_settings(group: GroupName, server: Server = None, transport: Transport = "tcp", serde: Serde = "lane",
                         as_json: Annotated[bool, typer.Option("--json", help="Print them as JSON.")] = False) -> None:
    """One consumer group's settings (UNKNOWN_GROUP if it has none)."""
    async with connect(server, transport, serde) as channel:
        [settings] = await Admin(channel).consumer_groups(group)
    if as_json:
        print_json(settings)
        return
    out.print(_settings_table([settings]))


@app.command("describe")
@runs_client
async def group_describe(topic: Topic, group: Group,
                         server: Server = None, transport: Transport = "tcp", serde: Serde = "lane") -> None:
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
                      server: Server = None, transport: Transport = "tcp", serde: Serde = "lane") -> None:
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
            queues = await admin.seek_group(topic, group, queue, int(to))
        else:
            queues = await admin.reset_group(topic, group, position, queue)
        out.print(_group_table(topic, group, queues))


@app.command("delete")
@runs_client
async def group_delete(topic: Topic, group: Group,
                       yes: Annotated[bool, typer.Option("--yes", help="Delete without asking.")] = False,
                       server: Server = None, transport: Transport = "tcp", serde: Serde = "lane") -> None:
    """Forget a consumer group on a topic: its offsets, pop state and dead letters, and its settings.

    Refused (GROUP_ACTIVE) while the group's pull consumers run. Made again, the group starts as a new one.
    """
    if not yes and not typer.confirm(f"delete consumer group {group}'s positions on {topic}?"):
        usage_error("not deleted: confirm, or pass --yes")
    async with connect(server, transport, serde) as channel:
        await Admin(channel).delete_group(topic, group)
    out.print(f"deleted consumer group [bold]{group}[/bold] on {topic}")


@dlq_app.command("list")
@runs_client
async def dlq_list(topic: Topic, group: Group,
                   output_format: Annotated[str, typer.Option("--format", help="text, json or raw (body only).")] = "text",
                   server: Server = None, transport: Transport = "tcp", serde: Serde = "lane") -> None:
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
                     server: Server = None, transport: Transport = "tcp", serde: Serde = "lane") -> None:
    """Send a group's dead letters to their topic again; each is resent once (the position is kept)."""
    async with connect(server, transport, serde) as channel:
        resent = await Admin(channel).resend_dead_letters(topic, group)
    out.print(f"resent {plural(resent, 'dead letter')} of group {group} to {topic}")
