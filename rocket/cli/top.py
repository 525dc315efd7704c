"""`rocket top`: a node's numbers, live, from its /metrics page (the HTTP/1.1 listener, --http-listen). It reads what
Prometheus would scrape and needs no connection to the cluster's TCP port.
"""

from __future__ import annotations

import time
import urllib.error
import urllib.request
from typing import Annotated

import typer
from prometheus_client.parser import text_string_to_metric_families
from rich.console import Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from rocket.cli.common import REFUSED, fail, out, size, usage_error

DEFAULT_HTTP = "127.0.0.1:9878"

Samples = dict[str, list[tuple[dict[str, str], float]]]  # sample name -> (labels, value)


def scrape(address: str, timeout_s: float = 5.0) -> Samples:
    """Every sample of the node's /metrics, by sample name. Read with prometheus_client's parser."""
    url = address if address.startswith(("http://", "https://")) else f"http://{address}"
    with urllib.request.urlopen(f"{url.rstrip('/')}/metrics", timeout=timeout_s) as response:
        text = response.read().decode()
    found: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found.setdefault(sample.name, []).append((sample.labels, sample.value))
    return found


def _by(samples: Samples, name: str, *labels: str) -> dict[tuple[str, ...], float]:
    """A sample's values summed by the given labels."""
    summed: dict[tuple[str, ...], float] = {}
    for found, value in samples.get(name, ()):
        key = tuple(found.get(label, "") for label in labels)
        summed[key] = summed.get(key, 0.0) + value
    return summed


def _rate(now: Samples, before: Samples | None, seconds: float, name: str,
          *labels: str) -> dict[tuple, float | None]:
    """Per label values, the counter's increase per second since before (None without a look before, or after a
    reset)."""
    current = _by(now, name, *labels)
    if before is None or seconds <= 0:
        return {key: None for key in current}
    previous = _by(before, name, *labels)
    return {key: (value - previous.get(key, 0.0)) / seconds if value >= previous.get(key, 0.0) else None
            for key, value in current.items()}


def quantile(q: float, buckets: list[tuple[float, float]]) -> float | None:
    """The quantile of a histogram's cumulative (upper bound, count) buckets, interpolated within its bucket as
    Prometheus's histogram_quantile does; None when they hold nothing."""
    buckets = sorted(buckets)
    total = buckets[-1][1] if buckets else 0.0
    if total <= 0:
        return None
    rank, lower, below = q * total, 0.0, 0.0
    for bound, count in buckets:
        if count >= rank:
            if bound == float("inf"):
                return lower
            inside = count - below
            return lower + (bound - lower) * ((rank - below) / inside if inside else 1.0)
        lower, below = bound, count
    return lower


def _p99(now: Samples, before: Samples | None, name: str, label: str | None) -> dict[str, float | None]:
    """Per value of label (or '' for none), the p99 of what the histogram observed since before (since the node
    started without a look before)."""
    def buckets(samples: Samples | None) -> dict[tuple[str, float], float]:
        return {(labels.get(label, "") if label else "", float(labels["le"])): value
                for labels, value in (samples or {}).get(f"{name}_bucket", ())}
    current, previous = buckets(now), buckets(before)
    by_key: dict[str, list[tuple[float, float]]] = {}
    for (key, bound), count in current.items():
        by_key.setdefault(key, []).append((bound, count - previous.get((key, bound), 0.0)))
    return {key: quantile(0.99, found) for key, found in by_key.items()}


def _number(value: float | None, unit: str = "") -> str:
    if value is None:
        return "-"
    if abs(value) >= 100 or value == int(value):
        return f"{value:,.0f}{unit}"
    return f"{value:,.1f}{unit}"


def _seconds(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value * 1000:.2f} ms" if value < 1 else f"{value:.2f} s"


def frame(address: str, now: Samples, before: Samples | None, seconds: float, rows: int) -> Group:
    """One screen: the node, its topics, consumer groups, RPC methods and Raft groups. Per topic the produce and read
    rates (from the counters' change between two looks) with the backlog, consumer groups' lag, per RPC method the
    rate, p99 and errors, and the Raft groups' states."""
    info = next(iter(now.get("rocket_node_info", [])), ({}, 0))[0]
    states = _by(now, "rocket_raft_groups", "state")
    cpu = _rate(now, before, seconds, "process_cpu_seconds_total").get((), None)
    rss = _by(now, "process_resident_memory_bytes").get(())
    fsync = _p99(now, before, "rocket_fsync_seconds", None).get("")
    commit = _p99(now, before, "rocket_raft_commit_seconds", None).get("")
    draining = _by(now, "rocket_node_draining").get((), 0.0)
    head = Text.assemble(
        (f"rocket top  {address}", "bold"), f"  node {info.get('node', '?')} ({info.get('roles', '?')}) "
        f"v{info.get('version', '?')}{'  DRAINING' if draining else ''}\n",
        "raft groups: ", *[(f"{state} {int(states.get((state,), 0))}  ", "green" if state == "leader" else "")
                           for state in ("leader", "follower", "candidate")],
        f"fsync p99 {_seconds(fsync)}  commit p99 {_seconds(commit)}  ",
        f"cpu {'-' if cpu is None else f'{cpu * 100:.0f}%'}  rss {size(int(rss)) if rss else '-'}",
        "" if before is not None else "  (rates after the next look)")

    topics = Table(title="topics (produced, backlog: on the groups' leaders)", title_justify="left", expand=True)
    for column in ("topic", "produced/s", "read/s", "produced", "backlog", "queues"):
        topics.add_column(column, justify="left" if column == "topic" else "right")
    produced = _by(now, "rocket_topic_produced_messages_total", "topic")
    produced_rate = _rate(now, before, seconds, "rocket_topic_produced_messages_total", "topic")
    read_rate = _rate(now, before, seconds, "rocket_topic_read_messages_total", "topic")
    backlog = _by(now, "rocket_topic_backlog_messages", "topic")
    queues = _by(now, "rocket_topic_queues", "topic")
    names = sorted(set(produced) | set(read_rate), key=lambda key: (-(produced_rate.get(key) or 0), key))
    for key in names[:rows]:
        topics.add_row(key[0], _number(produced_rate.get(key)), _number(read_rate.get(key)),
                       _number(produced.get(key)), _number(backlog.get(key)), _number(queues.get(key)))

    lags = Table(title="consumer groups", title_justify="left", expand=True)
    for column in ("group", "topic", "lag"):
        lags.add_column(column, justify="right" if column == "lag" else "left")
    lag = _by(now, "rocket_consumer_group_lag_messages", "consumer_group", "topic")
    for (group, topic), value in sorted(lag.items(), key=lambda item: (-item[1], item[0]))[:rows]:
        lags.add_row(group, topic, _number(value))

    calls = Table(title="rpc (served by this node)", title_justify="left", expand=True)
    for column in ("method", "calls/s", "p99", "calls", "errors"):
        calls.add_column(column, justify="left" if column in ("method", "errors") else "right")
    count = _by(now, "rocket_rpc_seconds_count", "method")
    call_rate = _rate(now, before, seconds, "rocket_rpc_seconds_count", "method")
    p99 = _p99(now, before, "rocket_rpc_seconds", "method")
    errors: dict[str, list[str]] = {}
    for (method, code), value in sorted(_by(now, "rocket_rpc_errors_total", "method", "code").items()):
        errors.setdefault(method, []).append(f"{code} {value:,.0f}")
    ordered = sorted(count, key=lambda key: (-(call_rate.get(key) or 0), -count[key], key))
    for key in ordered[:rows]:
        calls.add_row(key[0], _number(call_rate.get(key)), _seconds(p99.get(key[0])), _number(count[key]),
                      Text(", ".join(errors.get(key[0], [])), style="red"))

    groups = Table(title="raft groups", title_justify="left", expand=True)
    for column in ("group", "leads", "commit", "applied", "lagging replicas"):
        groups.add_column(column, justify="right" if column != "lagging replicas" else "left")
    leads = _by(now, "rocket_group_leader", "group")
    commits = _by(now, "rocket_raft_group_commit_index", "group")
    applied = _by(now, "rocket_raft_group_applied_index", "group")
    lagging: dict[str, list[str]] = {}
    for (group, replica), value in sorted(_by(now, "rocket_group_lag_entries", "group", "replica").items()):
        lagging.setdefault(group, []).append(f"{replica}: {value:,.0f}")
    for key in sorted(commits, key=lambda key: int(key[0]) if key[0].isdigit() else 0)[:rows]:
        groups.add_row(key[0], "yes" if leads.get(key) else "", _number(commits[key]), _number(applied.get(key)),
                       ", ".join(lagging.get(key[0], [])))
    return Group(head, topics, lags, calls, groups)


def top(http: Annotated[str, typer.Option("--http", help="HOST:PORT of the node's HTTP/1.1 listener (--http-listen), where /metrics is.")] = DEFAULT_HTTP,
        interval: Annotated[float, typer.Option("--interval", help="Seconds between looks; rates are over this.")] = 2.0,
        once: Annotated[bool, typer.Option("--once", help="Print one frame (after two looks --interval apart, for rates; one look with --interval 0) and exit.")] = False,
        rows: Annotated[int, typer.Option("--rows", help="At most this many rows per table.")] = 20) -> None:
    """A node's topics, consumer groups, RPC methods and Raft groups, live, from its /metrics page."""
    if interval < 0 or (interval == 0 and not once):
        usage_error("--interval: more than 0 seconds (0 only with --once)")
    if rows < 1:
        usage_error("--rows: at least 1")

    def look() -> tuple[Samples, float]:
        try:
            return scrape(http), time.monotonic()
        except (urllib.error.URLError, OSError, ValueError) as error:
            fail(f"cannot read http://{http}/metrics: {getattr(error, 'reason', error)} (is the node's "
                 "--http-listen there?)", REFUSED)

    before, before_at = look()
    if once:
        now, now_at = before, before_at
        if interval > 0:
            time.sleep(interval)
            now, now_at = look()
            out.print(frame(http, now, before, now_at - before_at, rows))
        else:
            out.print(frame(http, now, None, 0.0, rows))
        return
    try:
        with Live(frame(http, before, None, 0.0, rows), console=out, screen=False, auto_refresh=False) as live:
            while True:
                time.sleep(interval)
                now, now_at = look()
                live.update(frame(http, now, before, now_at - before_at, rows), refresh=True)
                before, before_at = now, now_at
    except KeyboardInterrupt:
        pass
