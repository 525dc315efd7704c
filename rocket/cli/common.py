"""What every command shares: the consoles, the connection options, one-line failures, progress and formats."""

from __future__ import annotations

import functools
import sys
import inspect
from pathlib import Path
from typing import Annotated, Any, Literal, NoReturn, Optional, cast, overload

import orjson
import trio
import typer
import typer.core
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TransferSpeedColumn

from rocket.client import parse_start
from rocket.client.connection import DEFAULT_SERVERS, default_namespace, default_tls
from rocket.errors import Code, RocketError, collapse_single_error, leaf_exceptions
from rocket.model import Message, check_namespace

out = Console()
err = Console(stderr=True)

USAGE_ERROR = 2  # the command line is wrong: nothing was asked of a server
REFUSED = 1  # a server refused the request, or none could be reached
INTERRUPTED = 130  # Ctrl-C, as shells report a SIGINT

Server = Annotated[Optional[str], typer.Option(
    "--server", envvar="ROCKET_SERVER", show_default=f"{DEFAULT_SERVERS['tcp']}, or {DEFAULT_SERVERS['http2']} over http2",
    help="HOST:PORT of a rocket server, or several comma-separated (TCP: calls move on when one is gone).")]
Transport = Annotated[str, typer.Option("--transport", help="tcp (the --listen port) or http2 (the --http2-listen port).")]
Serde = Annotated[str, typer.Option("--serde", help="lane, json or avro: how requests and responses are encoded "
                                    "(lane: fixed binary layouts for the data plane's messages, Avro for the rest).")]
Tls = Annotated[bool, typer.Option(
    "--tls", help="TCP over TLS: the server's certificate verified against the system's CAs (--tls-ca: against yours).")]
TlsCa = Annotated[Optional[Path], typer.Option(
    "--tls-ca", envvar="ROCKET_TLS_CA", dir_okay=False,
    help="CA bundle (PEM) the server's certificate must verify against; implies --tls.")]
Namespace = Annotated[str, typer.Option(
    "--namespace", envvar="ROCKET_NAMESPACE", show_default="the default namespace",
    help="The namespace of the topics, consumer groups and KV buckets named: NS%name on the wire, as RocketMQ's "
         "clients wrap a namespace.")]

_display_type_rich = typer.core.TyperOption.display_type_rich


def _no_type_on_flags(self: typer.core.TyperOption, ctx) -> str | None:
    """A flag takes no value, so its help shows none (typer shows <bool>, which reads as if it took one)."""
    return None if self.is_flag else _display_type_rich(self, ctx)


typer.core.TyperOption.display_type_rich = _no_type_on_flags


def fail(message: str, status: int) -> NoReturn:
    """The message as it is: brackets in it (a name, an extra's `rocket[azure]`) are text, not rich markup."""
    err.print(f"[red]error:[/red] {escape(message)}", highlight=False, soft_wrap=True)
    raise typer.Exit(status)


def usage_error(message: str) -> NoReturn:
    fail(message, USAGE_ERROR)


@overload
def parse_position(text: str, option: str, times_only: Literal[True]) -> int: ...
@overload
def parse_position(text: str, option: str, times_only: bool = False) -> str | int: ...
def parse_position(text: str, option: str, times_only: bool = False) -> str | int:
    """earliest, latest or an ISO time (as epoch ms) for option; anything else is a usage error naming it."""
    expected = "an ISO time, such as 2030-01-31T09:00" if times_only else "earliest, latest or an ISO time"
    try:
        position = parse_start(text)
    except RocketError:
        position = None
    if position is None or (times_only and isinstance(position, str)):
        usage_error(f"{option} {text!r}: expected {expected} (UTC unless it names a zone)")
    return position


def print_json(value) -> None:
    """A command's --json answer: one line of JSON on stdout."""
    sys.stdout.write(orjson.dumps(value).decode() + "\n")


def plural(count: int, noun: str, nouns: str | None = None) -> str:
    """1 topic, 2 topics, 1,000 messages."""
    return f"{count:,} {noun if count == 1 else nouns or noun + 's'}"


def wrong_port_hint(error: RocketError, transport: str) -> str:
    """What the port probably is, when its answer was not the protocol asked for."""
    if transport == "tcp" and "frame version" in error.message:
        return (f" (the port does not speak rocket's TCP frames: an HTTP/2 port? Use --transport http2 there, or "
                f"the TCP port, {DEFAULT_SERVERS['tcp']} by default)")
    if transport == "http2" and "as an HTTP/2 server" in error.message:
        return (f" (a rocket TCP port? Use --transport tcp there, or the HTTP/2 port, {DEFAULT_SERVERS['http2']} "
                "by default)")
    if error.code == Code.UNKNOWN_METHOD:
        return " (the port answered, but does not serve rocket's client calls: is it a rocket node's --listen port?)"
    return ""


def runs_client(function):
    """Run an async command body under trio: a rocket error becomes one clear line and exit 1, Ctrl-C exit 130.
    A command that takes --server also gets --tls, --tls-ca and --namespace: what connect() uses when not told
    otherwise."""

    @functools.wraps(function)
    def wrapper(*args, tls: bool = False, tls_ca: Path | None = None, namespace: str = "", **kwargs):
        if tls_ca is not None and not tls_ca.is_file():
            usage_error(f"--tls-ca {tls_ca}: no such file")
        default_tls.set(tls_ca if tls_ca is not None else tls)  # trio.run's tasks start in a copy of this context
        try:
            default_namespace.set(check_namespace(namespace))
        except RocketError as error:
            usage_error(f"--namespace: {error.message}")
        try:
            with collapse_single_error():
                return trio.run(functools.partial(function, *args, **kwargs))
        except RocketError as error:
            fail(f"{error.code.name}: {error.message}{wrong_port_hint(error, kwargs.get('transport', 'tcp'))}", REFUSED)
        except KeyboardInterrupt:
            raise typer.Exit(INTERRUPTED)
        except BaseExceptionGroup as group:
            # Ctrl-C may land while several tasks end at once, each with something to say: the interrupt wins.
            leaves = list(leaf_exceptions(group))
            if any(isinstance(leaf, KeyboardInterrupt) for leaf in leaves):
                raise typer.Exit(INTERRUPTED)
            exits = [leaf for leaf in leaves if isinstance(leaf, typer.Exit)]
            if exits:
                raise exits[0] from None
            refusals = [leaf for leaf in leaves if isinstance(leaf, RocketError)]
            if refusals and len(refusals) == len(leaves):
                fail(f"{refusals[0].code.name}: {refusals[0].message}", REFUSED)
            raise

    signature = inspect.signature(function, eval_str=True)
    if "server" in signature.parameters:  # a client command: it connects, so it may connect over TLS
        added = [inspect.Parameter("tls", inspect.Parameter.KEYWORD_ONLY, default=False, annotation=Tls),
                 inspect.Parameter("tls_ca", inspect.Parameter.KEYWORD_ONLY, default=None, annotation=TlsCa),
                 inspect.Parameter("namespace", inspect.Parameter.KEYWORD_ONLY, default="", annotation=Namespace)]
        parameters = [parameter.replace(kind=inspect.Parameter.KEYWORD_ONLY) if parameter.kind in (
            inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.POSITIONAL_ONLY) else parameter
            for parameter in signature.parameters.values()]
        # The wrapper is a plain function, whose __signature__ typer reads; the functools stubs do not declare it.
        cast(Any, wrapper).__signature__ = signature.replace(parameters=parameters + added)
        wrapper.__annotations__ = {**{name: parameter.annotation for name, parameter in signature.parameters.items()},
                                   "tls": Tls, "tls_ca": TlsCa, "namespace": Namespace}
    return wrapper


def progress_bar(total: int | None, unit: str = "messages") -> Progress:
    columns = [TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn()]
    if unit == "bytes":
        columns = [TextColumn("[bold]{task.description}"), BarColumn(), TransferSpeedColumn(), TimeElapsedColumn()]
    return Progress(*columns, console=err, disable=not err.is_terminal, transient=False)


def size(count: int) -> str:
    """Bytes for people: 512 B, 1.5 KiB, 3.2 GiB."""
    scaled: float = count
    for unit in ("B", "KiB", "MiB", "GiB"):
        if scaled < 1024 or unit == "GiB":
            return f"{scaled:,} {unit}" if unit == "B" else f"{scaled:,.1f} {unit}"
        scaled /= 1024
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
