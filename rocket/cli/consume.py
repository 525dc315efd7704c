"""`rocket consume`: read a topic as a consumer group, printing messages and committing positions."""

from __future__ import annotations

import signal
import sys
from typing import Annotated, Optional, cast

import trio
import typer

from rocket.cli.common import (Serde, Server, Transport, err, format_message, plural, progress_bar, runs_client,
                               usage_error)
from rocket.client import connect, open_consumer, parse_start
from rocket.errors import RocketError
from rocket.filter import matches_all
from rocket.model import Message


@runs_client
async def consume(
    topic: Annotated[str, typer.Argument(help="The topic to read.", show_default=False)],
    group: Annotated[str, typer.Option("--group", help="Consumer group; its position is stored on the server.")],
    count: Annotated[Optional[int], typer.Option("--count", help="Stop after this many messages.")] = None,
    start: Annotated[str, typer.Option("--from", help="Where a new group starts: earliest, latest or an ISO time.")] = "earliest",
    follow: Annotated[bool, typer.Option("--follow", help="Keep waiting for new messages.")] = False,
    output_format: Annotated[str, typer.Option("--format", help="text, json or raw (body only).")] = "text",
    tag: Annotated[Optional[str], typer.Option("--tag", help="Only messages with these tags: 'a || b' ('*' for all).")] = None,
    sql: Annotated[Optional[str], typer.Option("--sql", help="Only messages whose properties match this SQL92 expression.")] = None,
    mode: Annotated[str, typer.Option("--mode", help="clustering (the group's live members split the queues) or broadcasting (each member reads all).")] = "clustering",
    member: Annotated[Optional[str], typer.Option("--member", help="This consumer's name in its group (broadcasting members resume by it).")] = None,
    server: Server = None, transport: Transport = "tcp", serde: Serde = "lane",
) -> None:
    """Consume a topic as a group, printing messages and committing the group's position.

    SIGTERM or Ctrl-C stops it cleanly: the position is committed, the consumer leaves its group at once, and the
    count consumed is printed.
    """
    if output_format not in ("text", "json", "raw"):
        usage_error(f"--format {output_format!r}: expected text, json or raw")
    if tag is not None and sql is not None:
        usage_error("give --tag or --sql, not both")
    try:
        start_position = parse_start(start)
    except RocketError as error:
        usage_error(error.message)
    filter_type, expression = ("sql", sql) if sql is not None else ("tag", "*" if tag is None else tag)
    received = 0
    stop = trio.CancelScope()  # the reading loop's alone: the connection must outlive it, to commit and leave
    async with trio.open_nursery() as nursery:
        # Stop on a signal from here on, through the consumer's cleanup: Trio would otherwise raise
        # KeyboardInterrupt wherever the Ctrl-C lands, in any task, skipping the count below.
        await nursery.start(_cancel_on_stop_signals, stop)
        async with connect(server, transport, serde) as channel:
            async with open_consumer(channel, topic, group, start=start_position, mode=mode, member=member,
                                     wait_ms=1000 if (follow or count) else 300, filter_type=filter_type,
                                     filter=expression) as consumer:
                bodies_only = output_format == "raw" and matches_all(consumer.filter)  # no Message made per message
                with stop, progress_bar(count) as progress:
                    task = progress.add_task("consuming", total=count)
                    while count is None or received < count:
                        before = dict(consumer.positions)
                        poll = consumer.poll_bodies if bodies_only else consumer.poll
                        polled = await poll(limit=None if count is None else count - received)
                        if not polled and not follow and count is None and consumer.positions == before:
                            break
                        if polled:
                            # poll_bodies gives the bodies, poll the messages.
                            if bodies_only:
                                sys.stdout.buffer.write(b"\n".join(cast("list[bytes]", polled)) + b"\n")
                            else:
                                messages = cast("list[Message]", polled)
                                lines = (format_message(m, topic, output_format) for m in messages)
                                sys.stdout.buffer.write(b"".join(lines))
                            sys.stdout.buffer.flush()
                            received += len(polled)
                            progress.update(task, advance=len(polled))
                            with trio.CancelScope(shield=True):  # what was printed is committed, even when stopped
                                await consumer.commit()
        nursery.cancel_scope.cancel()
    err.print(f"consumed {plural(received, 'message')} from {topic} as group {group}")


async def _cancel_on_stop_signals(scope: trio.CancelScope, task_status=trio.TASK_STATUS_IGNORED) -> None:
    """A supervisor's stop (systemd, timeout, kill) and Ctrl-C both end the command through its cleanup."""
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        task_status.started()
        async for _ in signals:
            scope.cancel()
