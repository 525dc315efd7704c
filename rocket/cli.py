"""The `rocket` command: run a node, administer topics, send, consume and benchmark."""

from __future__ import annotations

import functools
import json
import logging
import os
import signal
import sys
import time
from pathlib import Path
from typing import Annotated, Optional

import orjson
import trio
import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TransferSpeedColumn
from rich.table import Table

from rocket import limits
from rocket.client import Admin, connect, open_consumer, open_producer, parse_start
from rocket.client.admin import parse_message_id
from rocket.client import bench as bench_module
from rocket.config import ConfigError, load_from_environment
from rocket.errors import Code, RocketError, collapse_single_error
from rocket.filter import matches_all
from rocket.model import Message, dead_letter_topic, parse_duration_s
from rocket.serde import batch as batch_codec

app = typer.Typer(no_args_is_help=True, add_completion=False, help="rocket: messaging and streaming on Trio.")
topic_app = typer.Typer(no_args_is_help=True, help="Create, list and describe topics.")
bench_app = typer.Typer(no_args_is_help=True, help="Measure produce and consume against a running server.")
app.add_typer(topic_app, name="topic")
cluster_app = typer.Typer(no_args_is_help=True, help="Inspect the cluster: nodes, groups, leaders, load.")
app.add_typer(bench_app, name="bench")
app.add_typer(cluster_app, name="cluster")
message_app = typer.Typer(no_args_is_help=True, help="Single messages: get by id, find by key, cancel a delayed one.")
app.add_typer(message_app, name="message")
group_app = typer.Typer(no_args_is_help=True, help="Consumer groups: positions, lag, reset.")
app.add_typer(group_app, name="group")
tier_app = typer.Typer(no_args_is_help=True, help="Tiered storage: what is local, offloaded and pending.")
app.add_typer(tier_app, name="tier")
dlq_app = typer.Typer(no_args_is_help=True, help="A consumer group's dead letters: list them, send them again.")
app.add_typer(dlq_app, name="dlq")

out = Console()
err = Console(stderr=True)

Server = Annotated[Optional[str], typer.Option("--server", envvar="ROCKET_SERVER", help="HOST:PORT of a rocket server, or several comma-separated (TCP: calls move on when one is gone).")]
Transport = Annotated[str, typer.Option("--transport", help="tcp or http2.")]
Serde = Annotated[str, typer.Option("--serde", help="json or avro.")]


def _fail(message: str, status: int) -> None:
    err.print(f"[red]error:[/red] {message}", highlight=False, soft_wrap=True)
    raise typer.Exit(status)


def _runs_client(function):
    """Run an async command body under trio, turning rocket errors into one clear line and exit 1."""

    @functools.wraps(function)
    def wrapper(*args, **kwargs):
        try:
            with collapse_single_error():
                return trio.run(functools.partial(function, *args, **kwargs))
        except RocketError as error:
            _fail(f"{error.code.name}: {error.message}", 1)
        except KeyboardInterrupt:
            raise typer.Exit(130)

    return wrapper


def _progress(total: int | None, unit: str = "messages") -> Progress:
    columns = [TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn()]
    if unit == "bytes":
        columns = [TextColumn("[bold]{task.description}"), BarColumn(), TransferSpeedColumn(), TimeElapsedColumn()]
    return Progress(*columns, console=err, disable=not err.is_terminal, transient=False)


@app.command()
def run(
    role: Annotated[Optional[str], typer.Option("--role", help="all, or a comma-separated list of nameserver, storage, broker.")] = None,
    config: Annotated[Optional[Path], typer.Option("--config", help="TOML config file.")] = None,
    data_dir: Annotated[Optional[Path], typer.Option("--data-dir", help="Where data lives (default ./rocket-data).")] = None,
    listen: Annotated[Optional[str], typer.Option("--listen", help="TCP HOST:PORT (default 127.0.0.1:9876).")] = None,
    http2_listen: Annotated[Optional[str], typer.Option("--http2-listen", help="HTTP/2 HOST:PORT or 'off' (default 127.0.0.1:9877).")] = None,
    log_level: Annotated[Optional[str], typer.Option("--log-level")] = None,
    node_id: Annotated[Optional[int], typer.Option("--node-id", help="This node's id in the cluster (default 1).")] = None,
    nameservers: Annotated[Optional[str], typer.Option("--nameservers", help="ID@HOST:PORT,... of the nameserver group (default: this node alone).")] = None,
    advertise: Annotated[Optional[str], typer.Option("--advertise", help="HOST:PORT other nodes reach this one at (default: --listen).")] = None,
) -> None:
    """Run a node. With no flags: dev mode, all roles in one process, data in ./rocket-data."""
    from rocket.node import keep_freed_memory, run_node

    flags = {"roles": role, "data_dir": data_dir, "listen": listen, "http2_listen": http2_listen, "log_level": log_level,
             "node_id": node_id, "nameservers": nameservers, "advertise": advertise}
    try:
        node_config = load_from_environment(config, flags)
    except ConfigError as error:
        _fail(f"config: {error}", 2)
    logging.basicConfig(level=node_config.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    keep_freed_memory()
    try:
        with collapse_single_error():
            trio.run(functools.partial(run_node, node_config))
    except RocketError as error:
        _fail(f"{error.code.name}: {error.message}", 2 if error.code.name == "CONFIG_INVALID" else 1)
    except OSError as error:
        _fail(f"cannot start: {error}", 1)


@topic_app.command("create")
@_runs_client
async def topic_create(name: str, queues: Annotated[int, typer.Option("--queues")] = 8,
                       message_type: Annotated[str, typer.Option("--type", help="normal, fifo, delay or transaction: the sends the topic accepts.")] = "normal",
                       server: Server = None, transport: Transport = "tcp", serde: Serde = "json") -> None:
    """Create a topic with a number of queues and a message type."""
    async with connect(server, transport, serde) as channel:
        spec = await Admin(channel).create_topic(name, queues, message_type)
    out.print(f"created {spec.message_type} topic [bold]{spec.name}[/bold] with {spec.queues} queues")


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
        _fail(f"{option}: {error.message}", 2)


def _show_retention(seconds: float) -> str:
    if seconds < 0:
        return "default"
    if seconds == 0:
        return "forever"
    for unit, size in (("d", 86_400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds / size:.0f}{unit}"
    return f"{seconds:g}s"


@topic_app.command("update")
@_runs_client
async def topic_update(name: str,
                       retention: Annotated[Optional[str], typer.Option("--retention", help="Total retention: data older is deleted from the tier (365d, 12h, forever, default).")] = None,
                       local_retention: Annotated[Optional[str], typer.Option("--local-retention", help="Hot retention: local data older goes once it is offloaded (1h, forever, default).")] = None,
                       server: Server = None, transport: Transport = "tcp", serde: Serde = "json") -> None:
    """Change a topic's retention settings."""
    retention_s = _retention(retention, "--retention")
    local_retention_s = _retention(local_retention, "--local-retention")
    async with connect(server, transport, serde) as channel:
        spec = await Admin(channel).update_topic(name, retention_s, local_retention_s)
    out.print(f"topic [bold]{spec.name}[/bold]: retention {_show_retention(spec.retention_s)}, local retention "
              f"{_show_retention(spec.local_retention_s)}")


@tier_app.command("status")
@_runs_client
async def tier_status(topic: Annotated[Optional[str], typer.Argument(help="One topic; all by default.")] = None,
                      queues: Annotated[bool, typer.Option("--queues", help="One row per queue.")] = False,
                      server: Server = None, transport: Transport = "tcp", serde: Serde = "json") -> None:
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
            table.add_row(f"{spec.name} / {row['queue']}", retention, offsets, _size(row["local_bytes"]),
                          _size(row["tiered_bytes"]), _size(row["pending_bytes"]), f"{row['pieces']:,}")
    out.print(table)


def _size(count: int) -> str:
    """Bytes for people: 512 B, 1.5 KiB, 3.2 GiB."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if count < 1024 or unit == "GiB":
            return f"{count:,} {unit}" if unit == "B" else f"{count:,.1f} {unit}"
        count /= 1024
    return ""


@topic_app.command("list")
@_runs_client
async def topic_list(server: Server = None, transport: Transport = "tcp", serde: Serde = "json") -> None:
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


@topic_app.command("describe")
@_runs_client
async def topic_describe(name: str, server: Server = None, transport: Transport = "tcp", serde: Serde = "json") -> None:
    """Show a topic's queues: offsets and sizes."""
    async with connect(server, transport, serde) as channel:
        spec, queues = await Admin(channel).describe_topic(name)
    table = Table("queue", "min offset", "next offset", "messages", "bytes", title=f"{spec.message_type} topic {spec.name}")
    for q in queues:
        table.add_row(str(q["queue"]), f"{q['min_offset']:,}", f"{q['next_offset']:,}",
                      f"{q['next_offset'] - q['min_offset']:,}", f"{q['bytes']:,}")
    out.print(table)


@message_app.command("get")
@_runs_client
async def message_get(topic: str, message_id: Annotated[str, typer.Argument(help="QUEUE.OFFSET, as `rocket send` printed.")],
                      output_format: Annotated[str, typer.Option("--format", help="text, json or raw (body only).")] = "text",
                      server: Server = None, transport: Transport = "tcp", serde: Serde = "json") -> None:
    """Print one message by its id."""
    queue, offset = parse_message_id(message_id)
    async with connect(server, transport, serde) as channel:
        message = await Admin(channel).get_message(topic, queue, offset)
    sys.stdout.buffer.write(_format(message, topic, output_format))


@message_app.command("find")
@_runs_client
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
        _fail("--from and --to take ISO times", 2)
    async with connect(server, transport, serde) as channel:
        found = await Admin(channel).find_messages(topic, key, start_ms, end_ms, limit)
    sys.stdout.buffer.write(b"".join(_format(message, topic, output_format) for message in found))
    err.print(f"{len(found):,} messages with key {key!r} on {topic}")


@message_app.command("cancel")
@_runs_client
async def message_cancel(topic: str, timer_id: Annotated[str, typer.Argument(help="QUEUE.OFFSET, as `rocket send --delay` printed.")],
                         server: Server = None, transport: Transport = "tcp", serde: Serde = "json") -> None:
    """Cancel a delayed message before its delivery time."""
    async with connect(server, transport, serde) as channel:
        await Admin(channel).cancel_timer(topic, timer_id)
    out.print(f"cancelled timer {timer_id} on {topic}")


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


@group_app.command("describe")
@_runs_client
async def group_describe(topic: str, group: Annotated[str, typer.Option("--group")],
                         server: Server = None, transport: Transport = "tcp", serde: Serde = "json") -> None:
    """A group's positions on a topic, per queue: pull position, the live consumer reading it, pop cursor, messages in
    flight, lag."""
    async with connect(server, transport, serde) as channel:
        out.print(_group_table(topic, group, await Admin(channel).describe_group(topic, group)))


@group_app.command("reset")
@_runs_client
async def group_reset(topic: str, group: Annotated[str, typer.Option("--group")],
                      to: Annotated[str, typer.Option("--to", help="earliest, latest, an ISO time, or (with --queue) "
                                                                  "an offset.")],
                      queue: Annotated[int, typer.Option("--queue", help="Only this queue (-1: every queue).")] = -1,
                      server: Server = None, transport: Transport = "tcp", serde: Serde = "json") -> None:
    """Move a group's positions (pull and pop) on every queue, or on one; what it had in flight is dropped. An
    offset steps past a batch that its consumers cannot read (BAD_BATCH names where the next one starts).
    Refused (GROUP_ACTIVE) while the group's pull consumers run: their next commit would undo it."""
    async with connect(server, transport, serde) as channel:
        admin = Admin(channel)
        if to.isdigit():
            queues = await admin.seek_group(topic, group, queue, int(to))
        else:
            queues = await admin.reset_group(topic, group, parse_start(to), queue)
        out.print(_group_table(topic, group, queues))


@dlq_app.command("list")
@_runs_client
async def dlq_list(topic: str, group: Annotated[str, typer.Option("--group")],
                   output_format: Annotated[str, typer.Option("--format", help="text, json or raw (body only).")] = "text",
                   server: Server = None, transport: Transport = "tcp", serde: Serde = "json") -> None:
    """Print a group's dead letters of a topic (where they came from and how often they were tried)."""
    dead_letters = dead_letter_topic(group, topic)
    async with connect(server, transport, serde) as channel:
        async with open_consumer(channel, dead_letters, group + "%list", start="earliest", wait_ms=0) as consumer:
            listed = 0
            while messages := await consumer.poll():
                sys.stdout.buffer.write(b"".join(_format(m, topic, output_format) for m in messages))
                listed += len(messages)
    err.print(f"{listed:,} dead letters of group {group} on {topic}")


@dlq_app.command("resend")
@_runs_client
async def dlq_resend(topic: str, group: Annotated[str, typer.Option("--group")],
                     server: Server = None, transport: Transport = "tcp", serde: Serde = "json") -> None:
    """Send a group's dead letters to their topic again; each is resent once (the position is kept)."""
    dead_letters = dead_letter_topic(group, topic)
    resent = 0
    async with connect(server, transport, serde) as channel, open_producer(channel, topic) as producer:
        async with open_consumer(channel, dead_letters, group + "%resend", start="earliest", wait_ms=0) as consumer:
            while messages := await consumer.poll():
                for message in messages:
                    message.properties = {name: value for name, value in message.properties.items()
                                          if not name.startswith("DLQ_")}
                await producer.send_many(messages)
                await consumer.commit()
                resent += len(messages)
    out.print(f"resent {resent:,} dead letters of group {group} to {topic}")


@cluster_app.command("status")
@_runs_client
async def cluster_status(server: Server = None, transport: Transport = "tcp", serde: Serde = "json",
                         groups: Annotated[bool, typer.Option("--groups", help="Also list every storage group.")] = False,
                         as_json: Annotated[bool, typer.Option("--json", help="Print the status as JSON.")] = False) -> None:
    """Nodes with their roles, liveness and load; storage groups with their replicas and leaders."""
    async with connect(server, transport, serde) as channel:
        status = await Admin(channel).cluster_status()
    if as_json:
        sys.stdout.write(orjson.dumps(status).decode() + "\n")
        return
    out.print(f"nameservers {status['nameservers']}, leader [bold]{status['nameserver_leader'] or 'none'}[/bold]; "
              f"metadata version {status['version']}; {status['topics']} topics; {len(status['groups'])} storage groups")
    nodes = Table("node", "address", "roles", "state", "heartbeat", "groups", "leads", "stored", "free disk",
                  title="nodes")
    for node in status["nodes"]:
        load = node["load"]
        age = f"{node['heartbeat_age_ms'] / 1000:.1f} s ago" if node["heartbeat_age_ms"] >= 0 else "-"
        state = {"up": "[green]up[/green]", "down": "[red]down[/red]"}.get(node["state"], f"[yellow]{node['state']}[/yellow]")
        nodes.add_row(str(node["id"]), node["address"], ",".join(node["roles"]), state, age, str(load["groups"]),
                      str(len(load["leads"])), f"{load['bytes']:,}", f"{load['free_disk_bytes'] / 2**30:,.1f} GiB")
    out.print(nodes)
    if groups:
        table = Table("group", "voters", "learners", "leader", "behind (node: entries)", title="storage groups")
        for group in status["groups"]:
            behind = ", ".join(f"{lag['node']}: {lag['entries']:,}" for lag in group["lagging"])
            table.add_row(str(group["id"]), ",".join(map(str, group["voters"])), ",".join(map(str, group["learners"])),
                          str(group["leader"] or "-"), behind)
        out.print(table)


@cluster_app.command("drain")
@_runs_client
async def cluster_drain(node: int, server: Server = None, transport: Transport = "tcp", serde: Serde = "json",
                        undo: Annotated[bool, typer.Option("--undo", help="Let the node take replicas again.")] = False,
                        wait: Annotated[bool, typer.Option("--wait", help="Wait until no replica is left on it.")] = False,
                        timeout_s: Annotated[float, typer.Option("--timeout-s")] = 600.0) -> None:
    """Move every replica off a storage node so that it can be shut down."""
    async with connect(server, transport, serde) as channel:
        admin = Admin(channel)
        await admin.drain_node(node, not undo)
        out.print(f"node {node} {'takes replicas again' if undo else 'is draining'}")
        if not wait or undo:
            return
        with trio.fail_after(timeout_s), _progress(None, "replicas") as progress:
            task = progress.add_task(f"replicas left on node {node}")
            while True:
                status = await admin.cluster_status()
                left = sum(node in group["voters"] + group["learners"] for group in status["groups"])
                progress.update(task, completed=left)
                if not left:
                    break
                await trio.sleep(1)
    out.print(f"node {node} holds no replica: it can be shut down")


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


@app.command()
@_runs_client
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
        _fail("give a message body or --file, not both", 2)
    deliver_at_ms = 0
    if delay is not None and deliver_at is not None:
        _fail("give --delay or --deliver-at, not both", 2)
    if delay is not None:
        deliver_at_ms = int(time.time() * 1000 + parse_duration_s(delay) * 1000)
    if deliver_at is not None:
        when = parse_start(deliver_at)
        if not isinstance(when, int):
            _fail(f"--deliver-at {deliver_at!r}: expected an ISO time", 2)
        deliver_at_ms = when
    if deliver_at_ms and file is not None:
        _fail("--delay and --deliver-at apply to one message, not to --file", 2)
    properties = {}
    for item in prop or []:
        name, separator, value = item.partition("=")
        if not separator or not name:
            _fail(f"--prop {item!r}: expected NAME=VALUE", 2)
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
    with _progress(total, "bytes") as progress:
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


def _format(message: Message, topic: str, output_format: str) -> bytes:
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


@app.command()
@_runs_client
async def consume(
    topic: str,
    group: Annotated[str, typer.Option("--group", help="Consumer group; its position is stored on the server.")],
    count: Annotated[Optional[int], typer.Option("--count", help="Stop after this many messages.")] = None,
    start: Annotated[str, typer.Option("--from", help="Where a new group starts: earliest, latest or an ISO time.")] = "earliest",
    follow: Annotated[bool, typer.Option("--follow", help="Keep waiting for new messages.")] = False,
    output_format: Annotated[str, typer.Option("--format", help="text, json or raw (body only).")] = "text",
    tag: Annotated[Optional[str], typer.Option("--tag", help="Only messages with these tags: 'a || b' ('*' for all).")] = None,
    sql: Annotated[Optional[str], typer.Option("--sql", help="Only messages whose properties match this SQL92 expression.")] = None,
    mode: Annotated[str, typer.Option("--mode", help="clustering (the group's live members split the queues) or broadcasting (each member reads all).")] = "clustering",
    member: Annotated[Optional[str], typer.Option("--member", help="This consumer's name in its group (broadcasting members resume by it).")] = None,
    server: Server = None, transport: Transport = "tcp", serde: Serde = "json",
) -> None:
    """Consume a topic as a group, printing messages and committing the group's position. SIGTERM (or Ctrl-C) stops it
    cleanly: the position is committed and the consumer leaves its group at once."""
    if output_format not in ("text", "json", "raw"):
        _fail(f"--format {output_format!r}: expected text, json or raw", 2)
    if tag is not None and sql is not None:
        _fail("give --tag or --sql, not both", 2)
    filter_type, expression = ("sql", sql) if sql is not None else ("tag", "*" if tag is None else tag)
    async with connect(server, transport, serde) as channel:
        async with open_consumer(channel, topic, group, start=parse_start(start), mode=mode, member=member,
                                 wait_ms=1000 if (follow or count) else 300, filter_type=filter_type,
                                 filter=expression) as consumer, trio.open_nursery() as nursery:
            nursery.start_soon(_cancel_on_sigterm, nursery.cancel_scope)
            bodies_only = output_format == "raw" and matches_all(consumer.filter)  # no Message made per message
            received = 0
            with _progress(count) as progress:
                task = progress.add_task("consuming", total=count)
                while count is None or received < count:
                    before = dict(consumer.positions)
                    poll = consumer.poll_bodies if bodies_only else consumer.poll
                    polled = await poll(limit=None if count is None else count - received)
                    if not polled and not follow and count is None and consumer.positions == before:
                        break
                    if polled:
                        if bodies_only:
                            sys.stdout.buffer.write(b"\n".join(polled) + b"\n")
                        else:
                            sys.stdout.buffer.write(b"".join(_format(m, topic, output_format) for m in polled))
                        sys.stdout.buffer.flush()
                        received += len(polled)
                        progress.update(task, advance=len(polled))
                        await consumer.commit()
            nursery.cancel_scope.cancel()
    err.print(f"consumed {received:,} messages from {topic} as group {group}")


async def _cancel_on_sigterm(scope: trio.CancelScope) -> None:
    """A supervisor's stop (systemd, timeout, kill) ends the command as Ctrl-C does, through its cleanup."""
    with trio.open_signal_receiver(signal.SIGTERM) as signals:
        async for _ in signals:
            scope.cancel()


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


@bench_app.command("produce")
@_runs_client
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
    before = await trio.to_thread.run_sync(bench_module.raw_disk_bandwidth, disk_dir, probe_bytes)
    direct = await trio.to_thread.run_sync(bench_module.raw_disk_bandwidth_direct, disk_dir, probe_bytes)
    async with connect(server, transport, serde) as channel:
        with _progress(messages) as progress:
            task = progress.add_task("producing", total=messages)
            result = await bench_module.bench_produce(
                channel, messages=messages, size=size, batch_bytes=batch_bytes, in_flight=in_flight, topic=topic,
                on_progress=lambda n: progress.update(task, advance=n))
    after = await trio.to_thread.run_sync(bench_module.raw_disk_bandwidth, disk_dir, probe_bytes)
    _bench_report("rocket bench produce", result, [before, after], json_file, direct)


@bench_app.command("consume")
@_runs_client
async def bench_consume(
    topic: Annotated[str, typer.Option("--topic", help="A topic filled by bench produce.")],
    messages: Annotated[int, typer.Option("--messages")] = 200_000,
    disk_dir: Annotated[Path, typer.Option("--disk-dir")] = Path("rocket-data"),
    json_file: Annotated[Optional[Path], typer.Option("--json")] = None,
    bodies: Annotated[bool, typer.Option("--bodies", help="Read bodies only (poll_bodies), not messages.")] = False,
    server: Server = None, transport: Transport = "tcp", serde: Serde = "avro",
) -> None:
    """Consume throughput from the earliest offset, as a new group."""
    disk = await trio.to_thread.run_sync(bench_module.raw_disk_bandwidth, disk_dir)
    async with connect(server, transport, serde) as channel:
        with _progress(messages) as progress:
            task = progress.add_task("consuming", total=messages)
            result = await bench_module.bench_consume(channel, topic=topic, messages=messages, bodies=bodies,
                                                      on_progress=lambda n: progress.update(task, advance=n))
    _bench_report("rocket bench consume", result, [disk], json_file)


def main() -> None:
    app()
