"""The `rocket` command: run a node, administer topics, send, consume and benchmark.

One module per command family; this one assembles them into the typer app that `main` runs.
"""

from __future__ import annotations

import typer

from rocket.cli import bench, cluster, consume, group, message, run, send, topic

app = typer.Typer(no_args_is_help=True, add_completion=False, help="rocket: messaging and streaming on Trio.")
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


def main() -> None:
    app()
