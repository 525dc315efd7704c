"""Users and policies: who may do what (`rocket run --auth` enforces them); client quotas: how fast, per broker
(brokers throttle a client over its quota)."""

from __future__ import annotations

import re
from datetime import datetime, timezone
from typing import Annotated, Optional

import typer
from rich.table import Table

from rocket.cli.common import Serde, Server, Transport, out, print_json, runs_client, size, usage_error
from rocket.client import Admin, connect

app = typer.Typer(no_args_is_help=True, help="Users and policies: who may publish, subscribe, administer.")
user_app = typer.Typer(no_args_is_help=True, help="Users: an access key and its secret.")
app.add_typer(user_app, name="user")
quota_app = typer.Typer(no_args_is_help=True, help="Client quotas: bytes and requests a second, per broker; over them "
                        "a client is throttled (told to wait), not failed.")
app.add_typer(quota_app, name="quota")

User = Annotated[str, typer.Argument(help="The user (its access key).", show_default=False)]
Resource = Annotated[str, typer.Option("--resource", help="cluster, or topic:NAME, group:NAME, bucket:NAME; a name "
                                       "may end in * (topic:orders-*).", show_default=False)]
Json = Annotated[bool, typer.Option("--json", help="Print as JSON.")]


@user_app.command("create")
@runs_client
async def user_create(user: User,
                      secret: Annotated[Optional[str], typer.Option(
                          "--user-secret", help="Its secret (default: one the cluster makes, printed once).",
                          show_default=False)] = None,
                      super_user: Annotated[bool, typer.Option("--super", help="Allowed everything.")] = False,
                      server: Server = None, transport: Transport = "tcp", serde: Serde = "lane") -> None:
    """Create a user. Its secret is shown once: the cluster keeps it only sealed."""
    async with connect(server, transport, serde) as channel:
        made = await Admin(channel).create_user(user, secret or "", super_user)
    out.print(f"created user [bold]{made['user']}[/bold]{' (super user)' if made['super'] else ''}")
    out.print(f"secret: {made['secret']}", highlight=False, soft_wrap=True)


@user_app.command("list")
@runs_client
async def user_list(server: Server = None, transport: Transport = "tcp", serde: Serde = "lane",
                    as_json: Json = False) -> None:
    """The users (never their secrets)."""
    async with connect(server, transport, serde) as channel:
        users = await Admin(channel).users()
    if as_json:
        print_json({"users": users})
        return
    table = Table("user", "super", "created", title="users")
    for user in users:
        created = datetime.fromtimestamp(user["created_ms"] / 1000, timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
        table.add_row(user["user"], "yes" if user["super"] else "no", created)
    out.print(table)


@user_app.command("delete")
@runs_client
async def user_delete(user: User, server: Server = None, transport: Transport = "tcp", serde: Serde = "lane") -> None:
    """Delete a user and its policies."""
    async with connect(server, transport, serde) as channel:
        await Admin(channel).delete_user(user)
    out.print(f"deleted user [bold]{user}[/bold] and its policies")


@app.command("grant")
@runs_client
async def grant(user: User, resource: Resource,
                actions: Annotated[str, typer.Option("--actions", help="Comma-separated: pub, sub, admin, kv-read, "
                                                     "kv-write.", show_default=False)],
                deny: Annotated[bool, typer.Option("--deny", help="Deny them instead (a deny wins over any allow).")]
                = False,
                cidr: Annotated[Optional[list[str]], typer.Option("--cidr", help="Only from this network (repeat "
                                                                  "for several; default: from anywhere).")] = None,
                server: Server = None, transport: Transport = "tcp", serde: Serde = "lane") -> None:
    """Allow (or deny) a user actions on a resource; replaces its policy of that kind on that resource."""
    wanted = [action.strip() for action in actions.split(",") if action.strip()]
    if not wanted:
        usage_error("--actions: name at least one of pub, sub, admin, kv-read, kv-write")
    async with connect(server, transport, serde) as channel:
        policy = await Admin(channel).grant(user, resource, wanted, deny, cidr or [])
    out.print(_policies_table([policy]))


@app.command("revoke")
@runs_client
async def revoke(user: User, resource: Resource,
                 effect: Annotated[str, typer.Option("--effect", help="allow or deny; default both.")] = "",
                 server: Server = None, transport: Transport = "tcp", serde: Serde = "lane") -> None:
    """Drop a user's policies on a resource."""
    async with connect(server, transport, serde) as channel:
        await Admin(channel).revoke(user, resource, effect)
    out.print(f"revoked {user}'s policies on {resource}")


@app.command("list")
@runs_client
async def policy_list(user: Annotated[str, typer.Option("--user-name", help="Only this user's.")] = "",
                      server: Server = None, transport: Transport = "tcp", serde: Serde = "lane",
                      as_json: Json = False) -> None:
    """The policies, by user and resource."""
    async with connect(server, transport, serde) as channel:
        policies = await Admin(channel).policies(user)
    if as_json:
        print_json({"policies": policies})
        return
    out.print(_policies_table(policies) if policies else "no policies")


@app.command("whoami")
@runs_client
async def whoami(server: Server = None, transport: Transport = "tcp", serde: Serde = "lane") -> None:
    """The user this client signs in as."""
    async with connect(server, transport, serde) as channel:
        me = await Admin(channel).whoami()
    out.print(f"{me['user'] or '(not signed in)'}{' (super user)' if me['super'] else ''}")


def _policies_table(policies: list[dict]) -> Table:
    table = Table("user", "resource", "actions", "effect", "from", title="policies")
    for policy in policies:
        table.add_row(policy["user"], policy["resource"], ", ".join(policy["actions"]), policy["effect"],
                      ", ".join(policy["cidrs"]) or "anywhere")
    return table


# ---- client quotas ---------------------------------------------------------------------------------------------

Entity = Annotated[str, typer.Argument(help="user:NAME, user:* (every user without a quota of its own) or topic:NAME.",
                                       show_default=False)]
_UNITS = {"": 1, "b": 1, "k": 1000, "kb": 1000, "kib": 1024, "m": 1000**2, "mb": 1000**2, "mib": 1024**2,
          "g": 1000**3, "gb": 1000**3, "gib": 1024**3}


def parse_rate(option: str, text: str) -> int:
    """Bytes a second as people write them: 200KiB, 1MiB, 5MB, 1048576 (a trailing /s is allowed); 0: unlimited."""
    found = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*(?:/s)?\s*", text)
    if found is None or found.group(2).lower() not in _UNITS:
        usage_error(f"{option} {text!r}: a size a second, e.g. 200KiB, 1MiB, 5MB or 1048576 (0: unlimited)")
    return int(float(found.group(1)) * _UNITS[found.group(2).lower()])


def _rate(value: int) -> str:
    return size(value) + "/s" if value else "unlimited"


@quota_app.command("set")
@runs_client
async def quota_set(entity: Entity,
                    produce: Annotated[str, typer.Option("--produce-bytes", help="Produced bytes a second (200KiB, "
                                                         "1MiB, ...; 0: unlimited).")] = "0",
                    consume: Annotated[str, typer.Option("--consume-bytes", help="Consumed bytes a second (0: "
                                                         "unlimited).")] = "0",
                    requests: Annotated[float, typer.Option("--requests", help="Calls a second (0: unlimited).")] = 0.0,
                    server: Server = None, transport: Transport = "tcp", serde: Serde = "lane") -> None:
    """Set an entity's quota, which each broker enforces on its own (a client of N brokers gets N times it)."""
    produce_bytes, consume_bytes = parse_rate("--produce-bytes", produce), parse_rate("--consume-bytes", consume)
    if requests < 0:
        usage_error("--requests: 0 (unlimited) or more")
    async with connect(server, transport, serde) as channel:
        quota = await Admin(channel).set_quota(entity, produce_bytes, consume_bytes, requests)
    out.print(_quotas_table([quota]))


@quota_app.command("list")
@runs_client
async def quota_list(server: Server = None, transport: Transport = "tcp", serde: Serde = "lane",
                     as_json: Json = False) -> None:
    """The quotas, by entity."""
    async with connect(server, transport, serde) as channel:
        quotas = await Admin(channel).quotas()
    if as_json:
        print_json({"quotas": quotas})
        return
    out.print(_quotas_table(quotas) if quotas else "no quotas")


@quota_app.command("delete")
@runs_client
async def quota_delete(entity: Entity, server: Server = None, transport: Transport = "tcp",
                       serde: Serde = "lane") -> None:
    """Drop an entity's quota (a user's falls back to user:*, if there is one)."""
    async with connect(server, transport, serde) as channel:
        await Admin(channel).delete_quota(entity)
    out.print(f"dropped the quota on {entity}")


def _quotas_table(quotas: list[dict]) -> Table:
    table = Table("entity", "produce", "consume", "requests", title="quotas (per broker)")
    for quota in quotas:
        table.add_row(quota["entity"], _rate(quota["produce_bytes_per_s"]), _rate(quota["consume_bytes_per_s"]),
                      f"{quota['requests_per_s']:g}/s" if quota["requests_per_s"] else "unlimited")
    return table
