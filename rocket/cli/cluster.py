"""Cluster commands: status of nodes and storage groups, queue placement, node health, draining a node, handing a
controller-mode group's mastership over, storage classes, and training the models (train.py)."""

from __future__ import annotations

import time
from typing import Annotated, cast

import typer
from rich.table import Table

from rocket import limits
from rocket.cli import train
from rocket.cli.common import (Serde, Server, Transport, out, plural, print_json, progress_bar, runs_client,
                               usage_error)
from rocket.client import Admin, connect

app = typer.Typer(no_args_is_help=True, help="Inspect the cluster: nodes, groups, leaders, load.")
class_app = typer.Typer(no_args_is_help=True, help="Storage classes: named pools of storage groups, in raft or "
                        "controller mode, that topics are placed on.")
app.add_typer(class_app, name="storage-class")
app.command("train")(train.cluster_train)


@app.command("status")
@runs_client
async def cluster_status(server: Server = None, transport: Transport = "tcp", serde: Serde = "lane",
                         groups: Annotated[bool, typer.Option("--groups", help="Also list every storage group.")] = False,
                         as_json: Annotated[bool, typer.Option("--json", help="Print the status as JSON.")] = False) -> None:
    """Nodes with their roles, liveness and load; storage groups with their replicas and leaders."""
    async with connect(server, transport, serde) as channel:
        status = await Admin(channel).cluster_status()
    if as_json:
        print_json(status)
        return
    out.print(f"nameservers {status['nameservers']}, leader [bold]{status['nameserver_leader'] or 'none'}[/bold]; "
              f"metadata version {status['version']}; {plural(status['topics'], 'topic')}; "
              f"{plural(len(status['groups']), 'storage group')}")
    out.print(f"queue placement: {status['placement'] or '-'}; load history of {status.get('load_series', 0)} "
              "groups and topics")
    nodes = Table("node", "address", "roles", "version", "state", "health", "heartbeat", "groups", "leads", "stored",
                  "free disk", title="nodes")
    for node in status["nodes"]:
        load = node["load"]
        age = f"{node['heartbeat_age_ms'] / 1000:.1f} s ago" if node["heartbeat_age_ms"] >= 0 else "-"
        state = {"up": "[green]up[/green]", "down": "[red]down[/red]"}.get(node["state"], f"[yellow]{node['state']}[/yellow]")
        health = {"healthy": "[green]healthy[/green]", "": "-"}.get(node.get("health", ""),
                                                                  f"[red]{node.get('health')}[/red]")
        if node.get("health") == "degraded":
            health += f": {node.get('health_reason', '')}"
        nodes.add_row(str(node["id"]), node["address"], ",".join(node["roles"]), _version_of(node), state, health,
                      age, str(load["groups"]),
                      str(len(load["leads"])), f"{load['bytes']:,}", f"{load['free_disk_bytes'] / 2**30:,.1f} GiB")
    out.print(nodes)
    if groups:
        table = Table("group", "class", "voters", "learners", "readers", "leader", "behind (node: entries)",
                      title="storage groups")
        for group in status["groups"]:
            behind = ", ".join(f"{lag['node']}: {lag['entries']:,}" for lag in group["lagging"])
            table.add_row(str(group["id"]), group.get("storage_class", "raft"), ",".join(map(str, group["voters"])),
                          ",".join(str(node) for node in group["learners"] if node not in group.get("readers", ())),
                          ",".join(map(str, group.get("readers", ()))), str(group["leader"] or "-"), behind)
        out.print(table)


@app.command("placement")
@runs_client
async def cluster_placement(explain: Annotated[str, typer.Option("--explain", help="The topic (or %KV%bucket) whose queues to explain.", show_default=False)],
                            server: Server = None, transport: Transport = "tcp", serde: Serde = "lane",
                            as_json: Annotated[bool, typer.Option("--json", help="Print it as JSON.")] = False) -> None:
    """Where each queue of a topic went and why: its group and node, its predicted load, and the runner-up."""
    async with connect(server, transport, serde) as channel:
        placed = await Admin(channel).placement_explain(explain)
    if as_json:
        print_json(placed)
        return
    out.print(f"topic [bold]{placed['topic']}[/bold]: placed by {placed['predictor'] or '-'}; "
              f"now {placed['model']}")
    table = Table("queue", "group", "node", "queue predicted", "group score", "runner-up", "its score",
                  title="placement (bytes/s over the forecast horizon)")

    def rate(value: float) -> str:
        return "-" if value < 0 else f"{value:,.0f}"

    for row in placed["queues"]:
        table.add_row(str(row["queue"]), str(row["group"]), str(row["node"] or "-"), rate(row["predicted"]),
                      rate(row["score"]), str(row["runner_up"] or "-"), rate(row["runner_up_score"]))
    out.print(table)
    if placed["note"]:
        out.print(placed["note"])


@app.command("health")
@runs_client
async def cluster_health(state: Annotated[str | None, typer.Argument(help="With --pin: healthy, degraded or auto (the judge decides again).", show_default=False)] = None,
                         node: Annotated[int, typer.Option("--node", help="Only this storage node.")] = 0,
                         pin: Annotated[int, typer.Option("--pin", help="Pin this storage node to STATE by hand.", show_default=False)] = 0,
                         server: Server = None, transport: Transport = "tcp", serde: Serde = "lane",
                         as_json: Annotated[bool, typer.Option("--json", help="Print it as JSON.")] = False) -> None:
    """Each storage node's health: its last window's features (fsync p99 against the other nodes' median, the error
    rate of calls to it), the scorer's verdict, and the runs of windows that degrade it or bring it back."""
    if (pin == 0) != (state is None):
        usage_error("pin a node with --pin NODE healthy|degraded|auto; without --pin, give no state")
    async with connect(server, transport, serde) as channel:
        admin = Admin(channel)
        if pin:
            await admin.pin_node_health(pin, cast(str, state))  # a pin comes with its state: checked above
            out.print(f"node {pin} pinned {state}" if state != "auto" else f"node {pin}: the judge decides again")
            return
        health = await admin.node_health(node)
    if as_json:
        print_json(health)
        return
    out.print(f"scorer [bold]{health['scorer']}[/bold] ({health['model']}); windows of {health['window_s']:g} s, "
              f"{health['windows_judged']} judged; degraded after {health['degrade_windows']} unhealthy windows, "
              f"back after {health['recover_windows']} healthy ones")
    table = Table("node", "state", "pin", "fsync p99", "calls to it", "their p99", "failed", "CPU denied",
                  "Raft lag", "score", "unhealthy run", "healthy run", "reason", title="node health (last window)")

    def ms(seconds: float) -> str:
        return f"{seconds * 1000:.1f} ms" if seconds >= 0 else "-"

    for row in health["nodes"]:
        failed = f"{row['call_errors'] / row['calls']:.0%}" if row["calls"] else "-"
        state_text = "[red]degraded[/red]" if row["state"] == "degraded" else "[green]healthy[/green]"
        table.add_row(str(row["node"]), state_text, row["pin"], ms(row["fsync_p99_s"]), str(row["calls"]),
                      ms(row["call_p99_s"]), failed, f"{row['cpu_starved_s'] / health['window_s']:.0%}",
                      str(row["raft_lag_entries"]), f"{row['score']:.2f}", str(row["unhealthy_windows"]),
                      str(row["healthy_windows"]), row["reason"])
    out.print(table)
    for row in health["nodes"] if node else ():  # one node: the verdict and the features it rests on
        out.print(f"node {row['node']}: {row['verdict']}")
        for feature in row["features"]:
            out.print(f"  {feature['name']} = {feature['value']:.4g}")


@app.command("drain")
@runs_client
async def cluster_drain(node: Annotated[int, typer.Argument(help="The storage node's id (--node-id).", show_default=False)],
                        server: Server = None, transport: Transport = "tcp", serde: Serde = "lane",
                        undo: Annotated[bool, typer.Option("--undo", help="Let the node take replicas again.")] = False,
                        wait: Annotated[bool, typer.Option("--wait", help="Wait until no replica is left on it.")] = False,
                        timeout_s: Annotated[float, typer.Option("--timeout-s", help="With --wait: give up waiting (exit 1) after this many seconds.")] = 600.0) -> None:
    """Move every replica off a storage node so that it can be shut down."""
    async with connect(server, transport, serde) as channel:
        admin = Admin(channel)
        if undo or not wait:
            await admin.drain_node(node, not undo)
            out.print(f"node {node} {'takes replicas again' if undo else 'is draining'}")
            return
        with progress_bar(None, "replicas") as progress:
            task = progress.add_task(f"replicas left on node {node}")
            await admin.drain_node_and_wait(node, timeout_s, on_progress=lambda left: progress.update(task, completed=left))
    out.print(f"node {node} holds no replica: it can be shut down")


@app.command("handover")
@runs_client
async def cluster_handover(group: Annotated[int, typer.Argument(help="A controller-mode storage group (see rocket cluster status).", show_default=False)],
                           to: Annotated[int, typer.Option("--to", help="The replica to make its master: it must be in the group's SyncStateSet, or join it within 30 s.", show_default=False)],
                           server: Server = None, transport: Transport = "tcp", serde: Serde = "lane") -> None:
    """Hand a controller-mode group's mastership over to another replica, fencing the old master."""
    async with connect(server, transport, serde) as channel:
        state = await Admin(channel).handover(group, to)
    out.print(f"group {group}: node {state['master']} is master at epoch {state['master_epoch']} (SyncStateSet "
              f"{state['sync_state_set']})")


@class_app.command("create")
@runs_client
async def storage_class_create(name: Annotated[str, typer.Argument(help="The class's name, as topic create --storage-class names it.", show_default=False)],
                               mode: Annotated[str, typer.Option("--mode", help="controller (RIP-44: a master and slaves, the master named by the controller) or raft.")] = "controller",
                               replicas: Annotated[int, typer.Option("--replicas", help="Replicas of each group, each on its own storage node.")] = 2,
                               groups: Annotated[int, typer.Option("--groups", help="Storage groups to make for the class.", show_default="the nameservers' storage_groups")] = 0,
                               min_in_sync_replicas: Annotated[int, typer.Option("--min-in-sync-replicas", help="Controller mode: writes are refused (NOT_ENOUGH_REPLICAS) while fewer replicas than this are in sync; each write is acknowledged once every replica in sync holds it.")] = 1,
                               unclean_election: Annotated[bool, typer.Option("--unclean-election", help="Controller mode: let a replica out of the sync state set become master when none in it is up (it may lose writes).")] = False,
                               ha_max_lag_s: Annotated[float, typer.Option("--ha-max-lag-s", help="Controller mode: a slave further behind its master than this many seconds leaves the sync state set.")] = limits.ha_lag_s_default,
                               server: Server = None, transport: Transport = "tcp", serde: Serde = "lane") -> None:
    """Create a storage class: a named pool of new storage groups that topics can be placed on."""
    async with connect(server, transport, serde) as channel:
        made = await Admin(channel).create_storage_class(name, mode, replicas, groups, min_in_sync_replicas,
                                                         unclean_election, ha_max_lag_s)
    out.print(f"created {made['mode']}-mode storage class [bold]{made['name']}[/bold]: "
              f"{plural(len(made['groups']), 'group')} of {plural(made['replicas'], 'replica')} "
              f"({', '.join(str(group['id']) for group in made['groups'])})")


def _acknowledged_by(storage_class: dict) -> str:
    """Raft mode acknowledges on a majority of the replicas; controller mode on every replica in sync, and refuses
    writes while fewer than min_in_sync_replicas are."""
    if storage_class["mode"] != "controller":
        return "a majority"
    return f"all in sync (at least {storage_class['min_in_sync_replicas']})"


@class_app.command("list")
@runs_client
async def storage_class_list(server: Server = None, transport: Transport = "tcp", serde: Serde = "lane",
                             as_json: Annotated[bool, typer.Option("--json", help="Print them as JSON.")] = False) -> None:
    """The storage classes, the default (raft) first: their mode, replicas and groups."""
    async with connect(server, transport, serde) as channel:
        classes = await Admin(channel).storage_classes()
    if as_json:
        print_json({"classes": classes})
        return
    table = Table("name", "mode", "replicas", "acknowledged by", "groups", title="storage classes")
    for storage_class in classes:
        table.add_row(storage_class["name"], storage_class["mode"], str(storage_class["replicas"]),
                      _acknowledged_by(storage_class), f"{len(storage_class['groups']):,}")
    out.print(table)


@class_app.command("describe")
@runs_client
async def storage_class_describe(name: Annotated[str, typer.Argument(help="The storage class.", show_default=False)],
                                 server: Server = None, transport: Transport = "tcp", serde: Serde = "lane",
                                 as_json: Annotated[bool, typer.Option("--json", help="Print it as JSON.")] = False) -> None:
    """A storage class's settings, its groups (master, epochs, sync state set) and their recent elections."""
    async with connect(server, transport, serde) as channel:
        [storage_class] = await Admin(channel).storage_classes(name)
    if as_json:
        print_json(storage_class)
        return
    controller = storage_class["mode"] == "controller"
    line = (f"storage class [bold]{storage_class['name']}[/bold]: {storage_class['mode']} mode, "
            f"{plural(storage_class['replicas'], 'replica')}, acknowledged by {_acknowledged_by(storage_class)}")
    if controller:
        line += (f"; a slave {storage_class['ha_max_lag_s']:g} s behind leaves the sync state set; unclean elections "
                 f"{'allowed' if storage_class['unclean_election'] else 'refused'}")
    out.print(line)
    table = Table("group", "replicas", "master" if controller else "leader", "epoch", "sync state set", "sss epoch",
                  title="storage groups")
    for group in storage_class["groups"]:
        table.add_row(str(group["id"]), ",".join(map(str, group["voters"])), str(group["leader"] or "-"),
                      str(group["master_epoch"]) if controller else "-",
                      ",".join(map(str, group["sync_state_set"])) if controller else "-",
                      str(group["sync_state_set_epoch"]) if controller else "-")
    out.print(table)
    if not controller:
        return
    if not storage_class["elections"]:
        out.print("no elections since the class was made")
        return
    out.print("recent elections, newest first:")
    for election in reversed(storage_class["elections"]):
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(election["at_ms"] / 1000))
        row = (f"  {when} UTC  group {election['group']}: node {election['master']} master at epoch "
               f"{election['master_epoch']} (was node {election['previous']})")
        if election["unclean"]:
            row += (f" [red]unclean: possible loss: entries past {election['master_last_index']:,}[/red] (the previous "
                    f"master had {election['previous_last_index']:,})")
        out.print(row)


def _version_of(node: dict) -> str:
    """A node's rocket version and schema version (serde/versions.py): a rolling upgrade shows here."""
    return f"{node.get('version') or '-'} (schema {node.get('schema_version', 1)})"
