"""The `rocket` command: run a node, administer topics, send, consume and benchmark.

One module per command family; this one assembles them into the typer app that `main` runs.
"""

from __future__ import annotations

import inspect
import os
from typing import Annotated

import click
import typer
import typer.main

import rocket
from rocket.cli import acl, bench, cluster, consume, group, kv, message, run, send, top, topic

HELP = """rocket: messaging and streaming on Trio.

Exit status: 0 when done; 1 when a server refused the request or none could be reached (the error line names the
code, such as UNKNOWN_TOPIC); 2 for a usage error (a bad option or argument: nothing was asked of a server); 130
for a Ctrl-C that could not stop the command cleanly.
"""

app = typer.Typer(no_args_is_help=True, add_completion=False, help=HELP)


def _print_version(asked: bool) -> None:
    if asked:
        print(f"rocket {rocket.__version__}")
        raise typer.Exit()


@app.callback()
def _options(version: Annotated[bool, typer.Option("--version", callback=_print_version, is_eager=True,
                                                   help="Print rocket's version and exit.")] = False,
             user: Annotated[str, typer.Option("--user", envvar="ROCKET_USER", show_default=False,
                                               help="Sign in as this user (else ~/.config/rocket/credentials).")] = "",
             secret: Annotated[str, typer.Option("--secret", envvar="ROCKET_SECRET", show_default=False,
                                                 help="The user's secret.")] = "") -> None:
    """rocket: messaging and streaming on Trio."""
    if user or secret:  # every client the command opens reads them (rocket.client.credentials)
        os.environ["ROCKET_USER"], os.environ["ROCKET_SECRET"] = user, secret
app.command("run")(run.run)
app.command("send")(send.send)
app.command("consume")(consume.consume)
app.add_typer(topic.app, name="topic")
app.add_typer(bench.app, name="bench")
app.add_typer(cluster.app, name="cluster")
app.add_typer(message.app, name="message")
app.add_typer(group.app, name="group")
app.add_typer(topic.tier_app, name="tier")
app.add_typer(group.dlq_app, name="dlq")
app.add_typer(kv.app, name="kv")
app.add_typer(acl.app, name="acl")
app.command("top")(top.top)


def _reflow(command: click.Command) -> None:
    """Join each help paragraph's lines: typer's rich help keeps a docstring's line breaks, so a description
    wrapped at the source's width would show broken mid-sentence at the terminal's."""
    if command.help:
        command.help = "\n\n".join(" ".join(paragraph.split()) for paragraph in inspect.cleandoc(command.help).split("\n\n"))
    for subcommand in getattr(command, "commands", {}).values():
        _reflow(subcommand)


def main() -> None:
    command = typer.main.get_command(app)
    _reflow(command)
    command()
