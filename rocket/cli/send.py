"""`rocket send`: one message, or every line of a file."""

from __future__ import annotations

import os
import sys
import time
from typing import Annotated, Optional

import trio
import typer

from rocket import limits
from rocket.cli.common import Serde, Server, Transport, fail, out, progress_bar, runs_client
from rocket.client import connect, open_producer, parse_start
from rocket.errors import Code, RocketError
from rocket.model import Message, parse_duration_s
from rocket.serde import batch as batch_codec


def _read_chunks(stream, chunk_bytes: int):
    """Yield chunks of whole lines (each ending in a newline), read in large blocks."""
    carry = b""
    while True:
        block = stream.read(chunk_bytes)
        if not block:
            break
        data = carry + block
        cut = data.rfind(b"\n") + 1
        if cut == 0:
            if len(data) > limits.message_bytes_max:
                raise RocketError(Code.BAD_REQUEST, f"a line is longer than the message limit of {limits.message_bytes_max} bytes")
            carry = data
            continue
        carry = data[cut:]
        yield data[:cut]
    if carry:
        yield carry + b"\n"


@runs_client
async def send(
    topic: str,
    body: Annotated[Optional[str], typer.Argument(help="Message body; omit with --file.")] = None,
    key: Annotated[str, typer.Option("--key")] = "",
    tag: Annotated[str, typer.Option("--tag")] = "",
    prop: Annotated[Optional[list[str]], typer.Option("--prop", help="NAME=VALUE, repeatable.")] = None,
    file: Annotated[Optional[str], typer.Option("--file", help="Send each line of a file ('-' for stdin).")] = None,
    delay: Annotated[Optional[str], typer.Option("--delay", help="Deliver after this long (90s, 5m, 2h, 365d): delay topics.")] = None,
    deliver_at: Annotated[Optional[str], typer.Option("--deliver-at", help="Deliver at this ISO time: delay topics.")] = None,
    server: Server = None, transport: Transport = "tcp", serde: Serde = "json",
) -> None:
    """Send one message, or every line of a file as fast as the disk takes them."""
    if (body is None) == (file is None):
        fail("give a message body or --file, not both", 2)
    deliver_at_ms = 0
    if delay is not None and deliver_at is not None:
        fail("give --delay or --deliver-at, not both", 2)
    if delay is not None:
        deliver_at_ms = int(time.time() * 1000 + parse_duration_s(delay) * 1000)
    if deliver_at is not None:
        when = parse_start(deliver_at)
        if not isinstance(when, int):
            fail(f"--deliver-at {deliver_at!r}: expected an ISO time", 2)
        deliver_at_ms = when
    if deliver_at_ms and file is not None:
        fail("--delay and --deliver-at apply to one message, not to --file", 2)
    properties = {}
    for item in prop or []:
        name, separator, value = item.partition("=")
        if not separator or not name:
            fail(f"--prop {item!r}: expected NAME=VALUE", 2)
        properties[name] = value
    async with connect(server, transport, serde) as channel, open_producer(channel, topic) as producer:
        if file is None:
            message = await producer.send(Message(body.encode(), key=key, tag=tag, properties=properties,
                                                  deliver_at_ms=deliver_at_ms))
            if deliver_at_ms:
                when = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(deliver_at_ms / 1000))
                out.print(f"scheduled for {when} UTC on {topic} as timer {message.queue}.{message.offset}")
            else:
                out.print(f"sent to {topic} queue {message.queue} offset {message.offset} (id {message.queue}.{message.offset})")
            return
        await _send_lines(producer, file)


async def _send_lines(producer, file: str) -> None:
    stream = sys.stdin.buffer if file == "-" else open(file, "rb")
    total = None if file == "-" else os.path.getsize(file)
    sent_messages = 0
    chunk_bytes = limits.producer_batch_bytes_default
    with progress_bar(total, "bytes") as progress:
        task = progress.add_task("sending", total=total)
        chunks = _read_chunks(stream, chunk_bytes)
        while True:
            chunk = await trio.to_thread.run_sync(next, chunks, None)
            if chunk is None:
                break
            await producer.send_encoded(batch_codec.encode_lines(chunk, int(time.time() * 1000)))
            sent_messages += chunk.count(b"\n")
            progress.update(task, advance=len(chunk))
        await producer.flush()
    out.print(f"sent {sent_messages:,} messages to {producer.topic}")
