"""The `rocket` command: run a node, administer topics, send, consume and benchmark. One module per command family;
this one assembles them into the typer app (`build_app`) that `main` runs. `common.py` holds the exit codes, the
one-line errors and the connection options; `disk_probe.py` is the raw probe that benchmarks compare against.
"""

from __future__ import annotations

import inspect
import os
import sys
from typing import Annotated, cast

import typer
import typer.main
from typer.core import TyperCommand, TyperGroup

import rocket
from rocket.cli import run

HELP = """rocket: messaging and streaming on Trio.

Exit status: 0 when done; 1 when a server refused the request or none could be reached (the error line names the
code, such as UNKNOWN_TOPIC); 2 for a usage error (a bad option or argument: nothing was asked of a server); 130
for a Ctrl-C that could not stop the command cleanly.
"""


def _print_version(asked: bool) -> None:
    if asked:
        print(f"rocket {rocket.__version__}")
        raise typer.Exit()


def _options(version: Annotated[bool, typer.Option("--version", callback=_print_version, is_eager=True,
                                                   help="Print rocket's version and exit.")] = False,
             user: Annotated[str, typer.Option("--user", envvar="ROCKET_USER", show_default=False,
                                               help="Sign in as this user (else ~/.config/rocket/credentials).")] = "",
             secret: Annotated[str, typer.Option("--secret", envvar="ROCKET_SECRET", show_default=False,
                                                 help="The user's secret.")] = "") -> None:
    """rocket: messaging and streaming on Trio."""
    if user or secret:  # every client the command opens reads them (rocket.client.credentials)
        os.environ["ROCKET_USER"], os.environ["ROCKET_SECRET"] = user, secret


def build_app(node_only: bool = False) -> typer.Typer:
    """The typer app: every command, or with node_only `run` alone (the same command, help and options). `rocket run`
    gets an app of its command alone: a node's start then skips importing the client commands (and what they
    import). The families: `run`, `send`, `consume`, `topic` (and `tier`), `message`, `group` (consumer-group
    settings: `create`, `update`, `list`, `settings`; positions: `describe`, `reset`; and `dlq` beside it), `cluster`
    (and `cluster storage-class`), `bench`, `kv`, `acl` (users and policies: `user create|list|delete`, `grant`,
    `revoke`, `list`, `whoami`; client quotas: `quota set|list|delete`) and `top`."""
    built = typer.Typer(no_args_is_help=True, add_completion=False, help=HELP)
    built.callback()(_options)
    built.command("run")(run.run)
    if node_only:
        return built
    from rocket.cli import acl, bench, cluster, consume, group, kv, message, send, top, topic

    built.command("send")(send.send)
    built.command("consume")(consume.consume)
    built.add_typer(topic.app, name="topic")
    built.add_typer(bench.app, name="bench")
    built.add_typer(cluster.app, name="cluster")
    built.add_typer(message.app, name="message")
    built.add_typer(group.app, name="group")
    built.add_typer(topic.tier_app, name="tier")
    built.add_typer(group.dlq_app, name="dlq")
    built.add_typer(kv.app, name="kv")
    built.add_typer(acl.app, name="acl")
    built.command("top")(top.top)
    return built


def __getattr__(name: str):
    """`app`, the whole command tree, is built when first asked for (tests walk it), not at import."""
    if name == "app":
        globals()["app"] = built = build_app()
        return built
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _reflow(command: TyperCommand | TyperGroup) -> None:
    """Join each help paragraph's lines: typer's rich help keeps a docstring's line breaks, so a description
    wrapped at the source's width would show broken mid-sentence at the terminal's."""
    if command.help:
        command.help = "\n\n".join(" ".join(paragraph.split()) for paragraph in inspect.cleandoc(command.help).split("\n\n"))
    for subcommand in getattr(command, "commands", {}).values():
        _reflow(subcommand)


def main() -> None:
    command = typer.main.get_command(build_app(node_only=sys.argv[1:2] == ["run"]))
    _reflow(cast("TyperCommand | TyperGroup", command))  # what typer builds its app of
    command()

__all__ = ["main"]
