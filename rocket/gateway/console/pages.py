"""The console's pages, rendered from what the node's methods answered (pure: data in, HTML out). Every value that
came from a method is escaped where it is written: topic, group and key names and message bodies are user data.
A section whose method failed, or that the node's roles do not serve, is a notice in its place."""

from __future__ import annotations

import datetime
import html
import urllib.parse
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field

from rocket.gateway.console.charts import line_chart
from rocket.gateway.console.history import Rate
from rocket.model import Message

BODY_CHARS_MAX = 1024  # a body longer than this is shown cut, with its size
NAV = (("/", "Cluster"), ("/topics", "Topics"), ("/groups", "Consumer groups"), ("/storage", "Storage"),
       ("/messages", "Messages"))


class Safe(str):
    """Markup made here (links, charts): written as it is; any other cell value is escaped."""


def esc(value) -> str:
    return html.escape(str(value), quote=True)


def link(path: str, *names: str, text: str | None = None, **query: str) -> Safe:
    """A link to path/name..., each name percent-encoded whole, with a query; its text escaped."""
    target = path + "".join("/" + urllib.parse.quote(name, safe="") for name in names)
    if query:
        target += "?" + urllib.parse.urlencode(query)
    return Safe(f'<a href="{esc(target)}">{esc(text if text is not None else names[-1] if names else path)}</a>')


def count(value: int | float) -> str:
    return f"{value:,}" if isinstance(value, int) else f"{value:,.2f}"


def size(value: int) -> str:
    for unit, bytes_ in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if value >= bytes_:
            return f"{value / bytes_:.1f} {unit}"
    return f"{value:,} B"


def when(wall_ms: int) -> str:
    if wall_ms <= 0:
        return ""
    return datetime.datetime.fromtimestamp(wall_ms / 1000, datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]


def rate(value: Rate | None, bytes_: bool = False) -> str:
    if value is None:
        return "…"
    return f"{size(int(value.bytes_s))}/s" if bytes_ else f"{value.messages_s:,.2f}/s"


def body_text(body: bytes) -> tuple[str, str]:
    """("text" or "hex", the body shown): UTF-8 text when it decodes, else hex; cut at BODY_CHARS_MAX."""
    try:
        text, kind = bytes(body).decode("utf-8"), "text"
    except UnicodeDecodeError:
        text, kind = bytes(body[:BODY_CHARS_MAX // 2 + 1]).hex(" "), "hex"
    if len(text) > BODY_CHARS_MAX or len(body) > BODY_CHARS_MAX:
        text = text[:BODY_CHARS_MAX] + f" … ({len(body):,} bytes in all)"
    return kind, text


@dataclass(frozen=True)
class Node:
    """Who serves the console: shown in the header."""
    node_id: int = 0
    roles: tuple[str, ...] = ()
    version: str = ""
    user: str = ""  # with auth on: who reads the page


def notice(text: str) -> Safe:
    return Safe(f'<p class="notice">{esc(text)}</p>')


def table(headers: list[str], rows: list[list], empty: str, numeric: AbstractSet[int] = frozenset()) -> Safe:
    """headers, then rows of cells; the columns numbered in numeric are right-aligned. An empty table says empty."""
    if not rows:
        return Safe(f'<p class="empty">{esc(empty)}</p>')
    head = "".join(f'<th{" class=n" if i in numeric else ""}>{esc(name)}</th>' for i, name in enumerate(headers))
    body = "".join("<tr>" + "".join(f'<td{" class=n" if i in numeric else ""}>'
                                    f'{cell if isinstance(cell, Safe) else esc(cell)}</td>'
                                    for i, cell in enumerate(row)) + "</tr>" for row in rows)
    return Safe(f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>")


def facts(pairs: list[tuple[str, object]]) -> Safe:
    return Safe('<div class="facts">' + "".join(
        f"<div><span>{esc(name)}</span>{value if isinstance(value, Safe) else esc(value)}</div>"
        for name, value in pairs) + "</div>")


def layout(title: str, here: str, node: Node, *sections: str) -> str:
    nav = "".join(f'<a href="{path}"{" class=here" if path == here else ""}>{name}</a>' for path, name in NAV)
    who = f"node {node.node_id} · {', '.join(node.roles)} · rocket {node.version}"
    if node.user:
        who += f" · signed in as {node.user}"
    return ("<!doctype html><html lang=en><head><meta charset=utf-8>"
            f"<title>{esc(title)} · rocket</title><link rel=stylesheet href=/static/console.css></head><body>"
            f'<header><span class="brand">rocket</span><nav>{nav}</nav><span class="node">{esc(who)}</span></header>'
            f"<main><h1>{esc(title)}</h1>{''.join(sections)}</main></body></html>")


def charts(history: list[Rate], now_ms: int, what: str, every_s: float) -> Safe:
    empty = f"collecting: a point every {every_s:g} s"
    messages = [(point.wall_ms, point.messages_s) for point in history]
    stored = [(point.wall_ms, point.bytes_s) for point in history]
    return Safe('<div class="charts">' + line_chart(f"{what}: messages in", "per s", messages, now_ms, empty=empty)
                + line_chart(f"{what}: bytes in", "bytes per s", stored, now_ms, empty=empty) + "</div>")


# The pages. Each takes what the methods answered (None where one failed: its notice says why).

def cluster_page(node: Node, status: dict | None, status_notice: str, health: dict | None, health_notice: str,
                 history: list[Rate], now_ms: int, every_s: float) -> str:
    sections: list[str] = []
    if status is None:
        sections.append(notice(status_notice))
    else:
        health_of = {entry["node"]: entry for entry in (health or {}).get("nodes", [])}
        sections.append(facts([("nameserver leader", status["nameserver_leader"] or "none"),
                               ("nameservers", ", ".join(map(str, status["nameservers"])) or "none"),
                               ("nodes", len(status["nodes"])), ("storage groups", len(status["groups"])),
                               ("topics", status.get("topics", 0)), ("replicas moving", status.get("moving", 0)),
                               ("placement", status.get("placement", ""))]))
        rows = []
        for entry in sorted(status["nodes"], key=lambda entry: entry["id"]):
            load, judged = entry["load"], health_of.get(entry["id"], {})
            state = entry.get("health") or ""
            mark = Safe(f'<span class="{"bad" if state == "degraded" else "ok"}">{esc(state)}</span>') if state else ""
            age = entry.get("heartbeat_age_ms", -1)
            rows.append([entry["id"], entry["address"], ", ".join(entry["roles"]), entry["state"], mark,
                         entry.get("health_reason", "") or judged.get("verdict", ""),
                         f"{age / 1000:.1f} s" if age >= 0 else "", load.get("groups", 0), len(load.get("leads", [])),
                         size(load.get("bytes", 0)), size(load.get("free_disk_bytes", 0)), entry.get("version", "")])
        sections.append(Safe("<h2>Nodes</h2>"))
        sections.append(table(["node", "address", "roles", "state", "health", "why", "heartbeat", "replicas",
                               "leads", "stored", "free disk", "version"], rows, "no node has joined yet",
                              numeric={0, 6, 7, 8, 9, 10}))
    sections.append(Safe("<h2>Rates, the last hour</h2>"))
    sections.append(charts(history, now_ms, "all topics", every_s))
    sections.append(Safe("<h2>Node health</h2>"))
    if health is None:
        sections.append(notice(health_notice))
    else:
        sections.append(facts([("scorer", health.get("scorer", "")), ("model", health.get("model", "") or "none"),
                               ("window", f'{health.get("window_s", 0):g} s'),
                               ("windows judged", health.get("windows_judged", 0))]))
        rows = [[entry["node"], entry["state"], entry.get("pin", ""), entry.get("verdict", ""),
                 f'{entry["fsync_p99_s"] * 1000:.1f} ms' if entry.get("fsync_p99_s", -1) >= 0 else "",
                 f'{entry["call_p99_s"] * 1000:.1f} ms' if entry.get("call_p99_s", -1) >= 0 else "",
                 entry.get("raft_lag_entries", 0)] for entry in health.get("nodes", [])]
        sections.append(table(["node", "state", "pin", "verdict", "fsync p99", "call p99", "raft lag"], rows,
                              "no storage node judged yet", numeric={0, 4, 5, 6}))
    return layout("Cluster", "/", node, *sections)


def topic_totals(queues: list[dict]) -> tuple[int, int, int, int]:
    """A TierStatus topic's messages held, local bytes, tiered bytes, pending bytes."""
    held = sum(queue["next_offset"] - queue["first_offset"] for queue in queues)
    return (held, sum(queue["local_bytes"] for queue in queues), sum(queue["tiered_bytes"] for queue in queues),
            sum(queue["pending_bytes"] for queue in queues))


def topics_page(node: Node, topics: list[dict] | None, topics_notice: str, latest: dict[str, Rate | None],
                history: list[Rate], now_ms: int, every_s: float, cut: int = 0) -> str:
    sections: list[str] = [Safe("<h2>Rates, the last hour</h2>"), charts(history, now_ms, "all topics", every_s),
                           Safe("<h2>Topics</h2>")]
    if topics is None:
        sections.append(notice(topics_notice))
    else:
        rows = []
        for entry in topics:
            spec, queues = entry["topic"], entry["queues"]
            held, local, tiered, pending = topic_totals(queues)
            retention = spec.get("retention_s", -1)
            rows.append([link("/topics", spec["name"]), spec.get("message_type", ""), spec["queues"], count(held),
                         rate(latest.get(spec["name"])), size(local), size(tiered), size(pending),
                         spec.get("storage_class", ""), "forever" if retention < 0 else f"{retention:,} s"])
        sections.append(table(["topic", "type", "queues", "messages", "in", "local", "tiered", "to tier",
                               "storage class", "retention"], rows, "no topics yet: rocket topic create NAME",
                              numeric={2, 3, 4, 5, 6, 7}))
        if cut:
            sections.append(notice(f"{cut:,} more topics are not shown"))
    return layout("Topics", "/topics", node, *sections)


def search_form(topic: str = "", message_id: str = "", key: str = "", start: str = "", end: str = "") -> Safe:
    def field_(name: str, label: str, value: str, placeholder: str) -> str:
        return (f'<label>{esc(label)}<input name="{name}" value="{esc(value)}" placeholder="{esc(placeholder)}">'
                "</label>")
    return Safe('<form class="search" method="get" action="/messages">'
                + field_("topic", "topic", topic, "orders") + field_("id", "id (QUEUE.OFFSET)", message_id, "0.42")
                + field_("key", "key", key, "user-7") + field_("from", "from (UTC, ISO or epoch ms)", start,
                                                               "2025-01-31T12:00")
                + field_("to", "to", end, "") + '<button type="submit">Find</button></form>')


def topic_page(node: Node, name: str, described: dict | None, described_notice: str, tier: list[dict] | None,
               groups: list[tuple[str, list[dict]]], groups_notice: str, history: list[Rate], now_ms: int,
               every_s: float) -> str:
    sections: list[str] = []
    if described is None:
        return layout(f"Topic {name}", "/topics", node, notice(described_notice))
    spec = described["topic"]
    tier_of = {queue["queue"]: queue for queue in tier or []}
    sections.append(facts([("type", spec.get("message_type", "")), ("queues", spec["queues"]),
                           ("created", when(spec.get("created_ms", 0))),
                           ("storage class", spec.get("storage_class", "")),
                           ("retention", "forever" if spec.get("retention_s", -1) < 0 else f'{spec["retention_s"]:,} s'),
                           ("local retention", "" if spec.get("local_retention_s", -1) < 0
                            else f'{spec["local_retention_s"]:,} s'),
                           ("browse", link("/messages", text="latest messages", topic=spec["name"]))]))
    sections.append(Safe("<h2>Rates, the last hour</h2>"))
    sections.append(charts(history, now_ms, spec["name"], every_s))
    rows = []
    for queue in described["queues"]:
        tiered = tier_of.get(queue["queue"], {})
        rows.append([queue["queue"], count(queue["min_offset"]), count(queue["next_offset"]),
                     count(queue["next_offset"] - queue["min_offset"]), size(queue["bytes"]),
                     size(tiered.get("tiered_bytes", 0)), size(tiered.get("pending_bytes", 0)),
                     count(tiered.get("pieces", 0))])
    sections.append(Safe("<h2>Queues</h2>"))
    sections.append(table(["queue", "first offset", "next offset", "messages", "stored", "tiered", "to tier",
                           "pieces"], rows, "no queues", numeric=set(range(8))))
    sections.append(Safe("<h2>Consumer groups</h2>"))
    if groups_notice:
        sections.append(notice(groups_notice))
    group_rows = [[link("/groups", group, topic=spec["name"]), count(sum(queue["lag"] for queue in queues)),
                   count(sum(queue["in_flight"] for queue in queues)),
                   count(sum(queue["dead_letters"] for queue in queues)),
                   ", ".join(sorted({queue["member"] for queue in queues if queue["member"]}))]
                  for group, queues in groups]
    sections.append(table(["group", "lag", "in flight", "dead letters", "members"], group_rows,
                          "no known consumer group reads this topic", numeric={1, 2, 3}))
    sections.append(Safe("<h2>Find messages</h2>"))
    sections.append(search_form(spec["name"]))
    return layout(f"Topic {spec['name']}", "/topics", node, *sections)


@dataclass
class GroupRow:
    group: str
    settings: dict | None = None  # ConsumerGroupInfo, if the group has settings
    topics: list[tuple[str, list[dict]]] = field(default_factory=list)  # the topics it reads, GroupQueue per queue


def settings_cells(settings: dict | None) -> list:
    if settings is None:
        return ["default", "", "", ""]
    backoff = ", ".join(f"{seconds:g} s" for seconds in settings.get("retry_backoff_s", [])) or "default"
    return [settings.get("max_attempts", 0) or "each receive's", backoff, settings.get("consume_mode", ""),
            "yes" if settings.get("fifo") else "no"]


def groups_page(node: Node, groups: list[GroupRow] | None, groups_notice: str, notes: list[str]) -> str:
    sections: list[str] = [Safe('<form class="search" method="get" action="/groups"><label>group'
                                '<input name="group" placeholder="billing"></label>'
                                '<button type="submit">Look up</button></form>')]
    sections.extend(notice(note) for note in notes)
    if groups is None:
        sections.append(notice(groups_notice))
    else:
        rows = []
        for row in groups:
            lag = sum(queue["lag"] for _, queues in row.topics for queue in queues)
            dead = sum(queue["dead_letters"] for _, queues in row.topics for queue in queues)
            topics = Safe(", ".join(link("/topics", topic) for topic, _ in row.topics))
            rows.append([link("/groups", row.group), topics, count(lag), count(dead), *settings_cells(row.settings)])
        sections.append(table(["group", "topics", "lag", "dead letters", "max attempts", "retry backoff", "mode",
                               "FIFO"], rows, "no consumer groups yet", numeric={2, 3}))
    return layout("Consumer groups", "/groups", node, *sections)


def group_page(node: Node, name: str, settings: dict | None, topics: list[tuple[str, list[dict]]],
               notes: list[str]) -> str:
    cells = settings_cells(settings)
    sections: list[str] = [facts([("settings", "set" if settings else "none (defaults)"), ("max attempts", cells[0]),
                                  ("retry backoff", cells[1]), ("mode", cells[2]), ("FIFO", cells[3])])]
    sections.extend(notice(note) for note in notes)
    if not topics:
        sections.append(Safe('<p class="empty">the group has no position on any topic</p>'))
    for topic, queues in topics:
        sections.append(Safe(f"<h2>On {link('/topics', topic)}</h2>"))
        rows = [[queue["queue"], count(queue["min_offset"]), count(queue["next_offset"]),
                 "" if queue["committed"] < 0 else count(queue["committed"]), count(queue["pop_done_before"]),
                 count(queue["in_flight"]), count(queue["lag"]), count(queue["dead_letters"]), queue["member"]]
                for queue in queues]
        sections.append(table(["queue", "first", "next", "committed", "popped to", "in flight", "lag",
                               "dead letters", "member"], rows, "no queues", numeric=set(range(8))))
    return layout(f"Consumer group {name}", "/groups", node, *sections)


def storage_page(node: Node, classes: list[dict] | None, classes_notice: str, status: dict | None,
                 status_notice: str) -> str:
    sections: list[str] = [Safe("<h2>Storage classes</h2>")]
    if classes is None:
        sections.append(notice(classes_notice))
    else:
        rows = [[entry["name"], entry["mode"], entry["replicas"], entry.get("min_in_sync_replicas", 1),
                 "yes" if entry.get("unclean_election") else "no", len(entry.get("groups", []))] for entry in classes]
        sections.append(table(["class", "mode", "replicas", "min in sync", "unclean election", "groups"], rows,
                              "no storage classes", numeric={2, 3, 5}))
    sections.append(Safe("<h2>Storage groups</h2>"))
    if status is None:
        sections.append(notice(status_notice))
    else:
        rows = []
        for group in sorted(status["groups"], key=lambda group: group["id"]):
            lag = ", ".join(f'node {entry["node"]}: {entry["entries"]:,}' for entry in group.get("lagging", []))
            controlled = group.get("mode") == "controller"
            rows.append([group["id"], group.get("storage_class", ""), group.get("mode", ""),
                         Safe('<span class="bad">none</span>') if not group.get("leader") else group["leader"],
                         ", ".join(map(str, group["voters"])), ", ".join(map(str, group.get("learners", []))),
                         lag or "none", ", ".join(map(str, group.get("sync_state_set", []))) if controlled else "",
                         f'{group.get("master_epoch", 0)}/{group.get("sync_state_set_epoch", 0)}' if controlled else ""])
        sections.append(table(["group", "class", "mode", "leader", "replicas", "learners", "lagging (entries)",
                               "sync state set", "epochs"], rows, "no storage groups yet", numeric={0}))
    return layout("Storage", "/storage", node, *sections)


def messages_page(node: Node, query: dict[str, str], messages: list[Message] | None, messages_notice: str,
                  what: str) -> str:
    sections: list[str] = [search_form(query.get("topic", ""), query.get("id", ""), query.get("key", ""),
                                       query.get("from", ""), query.get("to", ""))]
    if messages_notice:
        sections.append(notice(messages_notice))
    if messages is not None:
        topic = query.get("topic", "")
        sections.append(Safe(f"<h2>{esc(what)}</h2>"))
        rows = []
        for message in messages:
            kind, text = body_text(message.body)
            properties = "; ".join(f"{name}={value}" for name, value in sorted(message.properties.items()))
            rows.append([link("/messages", text=f"{message.queue}.{message.offset}", topic=topic,
                              id=f"{message.queue}.{message.offset}"),
                         when(message.timestamp_ms), message.key, message.tag, properties, kind,
                         Safe(f'<pre class="body">{esc(text)}</pre>')])
        sections.append(table(["id", "stored (UTC)", "key", "tag", "properties", "as", "body"], rows,
                              "no message found"))
    return layout("Messages", "/messages", node, *sections)


def not_found_page(node: Node, path: str) -> str:
    return layout("Not found", "", node, notice(f"no page {path}"))


def error_page(node: Node, text: str) -> str:
    return layout("Error", "", node, notice(text))


def refused_page(node: Node, text: str) -> str:
    return layout("Not allowed", "", node, notice(text))
