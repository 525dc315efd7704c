"""`rocket send`: one message, or every line of a file."""

from __future__ import annotations

import datetime
import os
import sys
import time
from typing import Annotated, Optional, cast

import trio
import typer

from rocket import limits
from rocket.cli.common import Serde, Server, Transport, out, plural, progress_bar, runs_client, usage_error
from rocket.client import connect, open_producer
from rocket.errors import Code, RocketError
from rocket.model import Message, parse_duration_s, queue_for_key
from rocket.serde import batch as batch_codec



def _read_chunks(stream, first_bytes: int, first_count: int, chunk_bytes: int):
    """Yield chunks of whole lines (each ending in a newline), read in large blocks: the first first_count of
    about first_bytes, so that even a short input makes a batch for every queue, then of about chunk_bytes."""
    carry = b""
    chunks = 0
    while True:
        block = stream.read(first_bytes if chunks < first_count else chunk_bytes)
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
        chunks += 1
        yield data[:cut]
    if carry:
        yield carry + b"\n"


def _delivery_time_ms(delay: str | None, deliver_at: str | None) -> int:
    """The epoch ms of --delay or --deliver-at (0 for neither); one in the past is refused as a negative delay is."""
    if delay is not None and deliver_at is not None:
        usage_error("give --delay or --deliver-at, not both")
    now_ms = time.time() * 1000
    if delay is not None:
        try:
            delay_s = parse_duration_s(delay)
        except RocketError as error:
            usage_error(f"--delay: {error.message}")
        if delay_s <= 0:
            usage_error(f"--delay {delay!r}: a delay is longer than zero")
        return int(now_ms + delay_s * 1000)
    if deliver_at is None:
        return 0
    try:
        moment = datetime.datetime.fromisoformat(deliver_at)
    except ValueError:
        usage_error(f"--deliver-at {deliver_at!r}: expected an ISO time, such as 2030-01-31T09:00 (UTC unless it "
                    "names a zone)")
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=datetime.timezone.utc)
    deliver_at_ms = int(moment.timestamp() * 1000)
    if deliver_at_ms <= now_ms:
        usage_error(f"--deliver-at {deliver_at!r} is in the past: give a later time, or send without a delay")
    return deliver_at_ms


def _open_lines(file: str):
    """The stream of --file and its size (None for stdin); a file that cannot be read is a usage error."""
    if file == "-":
        return sys.stdin.buffer, None
    try:
        stream = open(file, "rb")
    except OSError as error:
        usage_error(f"--file {file}: {error.strerror.lower() if error.strerror else error}")
    return stream, os.fstat(stream.fileno()).st_size


@runs_client
async def send(
    topic: Annotated[str, typer.Argument(help="The topic to send to.", show_default=False)],
    body: Annotated[Optional[str], typer.Argument(help="Message body; omit with --file.", show_default=False)] = None,
    key: Annotated[str, typer.Option("--key", help="Message key: messages with one key go to one queue, in order; "
                                     "rocket message find looks them up by it.")] = "",
    tag: Annotated[str, typer.Option("--tag", help="Message tag, which consumers filter on (consume --tag).")] = "",
    prop: Annotated[Optional[list[str]], typer.Option("--prop", help="A property NAME=VALUE (repeat the option for "
                                                      "more); consumers filter on them with --sql.")] = None,
    file: Annotated[Optional[str], typer.Option("--file", help="Send each line of a file ('-' for stdin) as a "
                                                "message, batches spread over the queues unless --key is given.")] = None,
    delay: Annotated[Optional[str], typer.Option("--delay", help="Deliver after this long (90s, 5m, 2h, 365d): delay topics.")] = None,
    deliver_at: Annotated[Optional[str], typer.Option("--deliver-at", help="Deliver at this ISO time, UTC unless it names a zone: delay topics.")] = None,
    server: Server = None, transport: Transport = "tcp", serde: Serde = "lane",
) -> None:
    """Send one message, or every line of a file as fast as the disk takes them."""
    if body is None and file is None:
        usage_error("give a message body, or --file with a file of lines ('-' for stdin)")
    if body is not None and file is not None:
        usage_error("give a message body or --file, not both")
    deliver_at_ms = _delivery_time_ms(delay, deliver_at)
    if deliver_at_ms and file is not None:
        usage_error("--delay and --deliver-at apply to one message, not to --file")
    properties = {}
    for item in prop or []:
        name, separator, value = item.partition("=")
        if not separator or not name:
            usage_error(f"--prop {item!r}: expected NAME=VALUE")
        properties[name] = value
    lines = None if file is None else _open_lines(file)
    async with connect(server, transport, serde) as channel, open_producer(channel, topic) as producer:
        if lines is None:  # no --file, so a body: checked above
            message = await producer.send(Message(cast(str, body).encode(), key=key, tag=tag, properties=properties,
                                                  deliver_at_ms=deliver_at_ms))
            message_id = f"{message.queue}.{message.offset}"
            if deliver_at_ms:
                when = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(deliver_at_ms / 1000))
                out.print(f"scheduled for {when} UTC on {topic} as timer {message_id} (queue {message.queue} offset "
                          f"{message.offset} of the topic's timers): `rocket message get` shows it by that id until "
                          "it is delivered, `rocket message cancel` cancels it")
            else:
                out.print(f"sent to {topic} queue {message.queue} offset {message.offset} (id {message_id})")
            return
        await _send_lines(producer, *lines, Message(b"", key=key, tag=tag, properties=properties))


async def _send_lines(producer, stream, total: int | None, template: Message) -> None:
    """Every line as a message. Without a key, batches go to any queue (the broker spreads them) and many are in
    flight at once; with a key, all go to its queue in order. A tag or properties cost a message object per line."""
    queue = queue_for_key(template.key, producer.queues) if template.key else -1
    plain = not (template.key or template.tag or template.properties)

    def encode(chunk: bytes) -> bytes:
        now_ms = int(time.time() * 1000)
        if plain:
            return batch_codec.encode_lines(chunk, now_ms)
        return batch_codec.encode([Message(line, key=template.key, tag=template.tag, properties=template.properties)
                                   for line in chunk[:-1].split(b"\n")], now_ms)

    def next_batch(chunks) -> tuple[bytes, int, int] | None:
        """Read and encode in a worker thread, so the Trio thread only sends."""
        chunk = next(chunks, None)
        return None if chunk is None else (encode(chunk), chunk.count(b"\n"), len(chunk))

    sent_messages = 0
    chunks = _read_chunks(stream, limits.send_first_batch_bytes, producer.queues, limits.producer_batch_bytes_default)
    with stream, progress_bar(total, "bytes") as progress:
        task = progress.add_task("sending", total=total)
        while (batch := await trio.to_thread.run_sync(next_batch, chunks)) is not None:
            encoded, count, size = batch
            await producer.send_encoded(encoded, queue)
            sent_messages += count
            progress.update(task, advance=size)
        await producer.flush()
    out.print(f"sent {plural(sent_messages, 'message')} to {producer.topic}")
