"""The web console's rendering (rocket/gateway/console): hostile names and bodies escaped everywhere, empty states
and notices in place of what a node does not serve, bodies as text or hex and cut, the rate history and its SVG
charts; and the Console's pages over a dispatcher whose roles serve nothing."""

import re
from html.parser import HTMLParser

import trio

from rocket.clock import Clock
from rocket.gateway.console import Console, pages
from rocket.gateway.console.charts import line_chart
from rocket.gateway.console.history import RateHistory, Totals
from rocket.gateway.console.server import parse_id, parse_time
from rocket.errors import Code, RocketError
from rocket.model import Message
from rocket.transport.rpc import Dispatcher

HOSTILE = '<script>alert("x")</script>&\'"'
NODE = pages.Node(1, ("broker",), "0.1.0")


class Tags(HTMLParser):
    """Every start tag a page holds, to show no hostile <script> or attribute got through."""

    def __init__(self):
        super().__init__()
        self.tags: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)


def tags_of(page: str) -> list[str]:
    parser = Tags()
    parser.feed(page)
    return parser.tags


def assert_escaped(page: str) -> None:
    assert "<script" not in page and "script" not in tags_of(page)
    assert "&lt;script&gt;" in page or "%3Cscript%3E" in page


def topic_info(name: str) -> dict:
    return {"name": name, "queues": 2, "created_ms": 1_700_000_000_000, "message_type": "normal", "retention_s": -1,
            "local_retention_s": -1, "history": 1, "ttl_ms": 0, "storage_class": "raft"}


def group_queue(queue: int, lag: int, dead: int, member: str = "") -> dict:
    return {"queue": queue, "min_offset": 0, "next_offset": 10, "committed": 10 - lag, "pop_cursor": 0,
            "pop_done_before": 0, "in_flight": 0, "lag": lag, "dead_letters": dead, "member": member}


def test_hostile_topic_group_and_key_names_are_escaped_on_every_page():
    tier = [{"topic": topic_info(HOSTILE), "queues": [
        {"queue": 0, "first_offset": 0, "local_offset": 0, "tiered_offset": 0, "next_offset": 5, "local_bytes": 100,
         "tiered_bytes": 0, "pending_bytes": 100, "pieces": 0}]}]
    page = pages.topics_page(NODE, tier, "", {}, [], 0, 10)
    assert_escaped(page)
    assert 'href="/topics/%3Cscript%3Ealert%28%22x%22%29%3C%2Fscript%3E%26%27%22"' in page  # a link that works
    described = {"topic": topic_info(HOSTILE), "queues": [{"queue": 0, "min_offset": 0, "next_offset": 5, "bytes": 9}]}
    page = pages.topic_page(NODE, HOSTILE, described, "", None, [(HOSTILE, [group_queue(0, 3, 1, HOSTILE)])], "", [],
                            0, 10)
    assert_escaped(page)
    rows = [pages.GroupRow(HOSTILE, {"group": HOSTILE, "max_attempts": 3, "retry_backoff_s": [1.0],
                                     "consume_mode": "clustering", "fifo": False}, [(HOSTILE, [group_queue(0, 4, 2)])])]
    page = pages.groups_page(NODE, rows, "", [HOSTILE])
    assert_escaped(page)
    assert re.search(r"<td class=n>4</td><td class=n>2</td>", page)  # lag, dead letters
    assert_escaped(pages.group_page(NODE, HOSTILE, None, [(HOSTILE, [group_queue(0, 1, 0, HOSTILE)])], [HOSTILE]))
    message = Message(HOSTILE.encode(), key=HOSTILE, tag=HOSTILE, properties={HOSTILE: HOSTILE}, timestamp_ms=1,
                      queue=0, offset=7)
    page = pages.messages_page(NODE, {"topic": HOSTILE, "key": HOSTILE, "from": HOSTILE}, [message], HOSTILE, HOSTILE)
    assert_escaped(page)
    assert tags_of(page).count("pre") == 1
    status = {"nameserver_leader": 1, "nameservers": [1], "topics": 1, "moving": 0, "placement": HOSTILE,
              "nodes": [{"id": 1, "address": HOSTILE, "roles": ["broker"], "state": "up", "heartbeat_age_ms": 5,
                         "load": {"groups": 1, "leads": [2], "bytes": 10, "free_disk_bytes": 1 << 30},
                         "health": "degraded", "health_reason": HOSTILE, "version": HOSTILE}], "groups": []}
    assert_escaped(pages.cluster_page(NODE, status, "", None, HOSTILE, [], 0, 10))
    assert_escaped(pages.not_found_page(NODE, "/" + HOSTILE))
    classes = [{"name": HOSTILE, "mode": "raft", "replicas": 3, "groups": []}]
    assert_escaped(pages.storage_page(NODE, classes, "", None, HOSTILE))
    assert_escaped(line_chart(HOSTILE, HOSTILE, [], 0, empty=HOSTILE))


def test_empty_states_say_so():
    assert "no topics yet" in pages.topics_page(NODE, [], "", {}, [], 0, 10)
    assert "no consumer groups yet" in pages.groups_page(NODE, [], "", [])
    assert "no position on any topic" in pages.group_page(NODE, "g", None, [], [])
    assert "no message found" in pages.messages_page(NODE, {"topic": "t"}, [], "", "nothing")
    assert "no node has joined yet" in pages.cluster_page(NODE, {"nameserver_leader": 0, "nameservers": [], "nodes": [],
                                                                 "groups": []}, "", None, "why", [], 0, 10)
    assert "collecting: a point every 10 s" in pages.topics_page(NODE, [], "", {}, [], 0, 10)
    described = {"topic": topic_info("t"), "queues": []}
    assert "no known consumer group reads this topic" in pages.topic_page(NODE, "t", described, "", None, [], "", [],
                                                                          0, 10)


def test_bodies_are_text_when_utf8_else_hex_and_cut():
    assert pages.body_text("héllo".encode()) == ("text", "héllo")
    assert pages.body_text(b"\xff\x00\x01") == ("hex", "ff 00 01")
    kind, text = pages.body_text(b"a" * 5000)
    assert kind == "text" and text.startswith("a" * pages.BODY_CHARS_MAX) and text.endswith("(5,000 bytes in all)")
    kind, text = pages.body_text(bytes(range(256)) * 20)
    assert kind == "hex" and len(text) < 2000 and text.endswith("(5,120 bytes in all)")


def test_rates_between_points_count_new_topics_from_zero_and_skip_unknown_ones():
    history = RateHistory(points_max=3)
    history.add(10_000, {"a": Totals(100, 1000)})
    history.add(20_000, {"a": Totals(150, 900), "new": Totals(20, 200, created_ms=15_000),
                         "unread": Totals(999, 999, created_ms=1)})
    rates = history.rates()
    assert [(rate.wall_ms, rate.messages_s, rate.bytes_s) for rate in rates] == [(20_000, 7.0, 20.0)]
    assert history.latest("a").messages_s == 5.0 and history.latest("a").bytes_s == 0.0  # retention shrank it
    history.add(20_000, {"a": Totals(0, 0)})  # the same time again (a clock step): dropped
    history.add(30_000, {"a": Totals(160, 900)})
    history.add(40_000, {"a": Totals(160, 900)})
    assert len(history.points) == 3 and [rate.messages_s for rate in history.rates("a")] == [1.0, 0.0]
    assert history.latest("nothing").messages_s == 0.0


def test_a_chart_draws_the_points_in_its_window():
    svg = line_chart("t", "per s", [(0, 5.0), (3_000_000, 10.0), (3_600_000, 2.0)], now_ms=3_600_000)
    assert 'data-points="3"' in svg and 'data-max="10"' in svg and "<polyline" in svg and "10</text>" in svg
    svg = line_chart("t", "per s", [(-1, 99.0), (3_600_000, 1.0)], now_ms=3_600_000, empty="nothing yet")
    assert 'data-points="1"' in svg and "<polyline" not in svg and "nothing yet" in svg


def test_message_ids_and_times_parse():
    assert parse_id(" 3.42 ") == (3, 42)
    assert parse_time("", "from") is None
    assert parse_time("1700000000000", "from") == 1_700_000_000_000
    assert parse_time("2023-11-14T22:13:20", "from") == 1_700_000_000_000  # UTC unless it says
    assert parse_time("2023-11-14T23:13:20+01:00", "from") == 1_700_000_000_000
    for bad in ("3", "a.b", "-1.2"):
        try:
            parse_id(bad)
        except RocketError as error:
            assert "QUEUE.OFFSET" in error.message
        else:
            raise AssertionError(bad)


async def test_a_node_whose_roles_serve_nothing_says_so_on_every_page():
    console = Console(Dispatcher(), Clock(), 4, ("storage",))
    routes = console.routes()
    assert set(routes) == {"/*"}  # "/" too: the node's exact paths, /metrics and the probes, win over it
    status, content_type, body = await routes["/*"]("/", {})
    assert status == 200 and content_type.startswith("text/html")
    assert b"This node&#x27;s roles (storage) do not serve ClusterStatus" in body
    for path, method in (("/topics", "TierStatus"), ("/topics/orders", "DescribeTopic"), ("/groups", "ConsumerGroups"),
                         ("/groups/g", "ConsumerGroups"), ("/storage", "StorageClasses"), ("/messages", ""),
                         ("/messages?topic=t", "DescribeTopic")):
        path, _, query = path.partition("?")
        status, _, body = await routes["/*"](path, dict([query.split("=")]) if query else {})
        assert status == 200, path
        assert f"do not serve {method}".encode() in body or not method, (path, body)
    status, content_type, css = await routes["/*"]("/static/console.css", {})
    assert status == 200 and content_type.startswith("text/css") and b"svg.chart" in css
    assert (await routes["/*"]("/nothing", {}))[0] == 404
    assert await console.sample() is False and not console.history.points


async def test_a_failing_method_is_a_notice_and_a_page_that_raises_is_a_500():
    dispatcher = Dispatcher()

    async def failing(request):
        raise RocketError(Code.UNAVAILABLE, "no nameserver answers")

    async def broken(request):
        return {"topics": None}  # not what TierStatus answers: the page fails

    dispatcher.handle("ClusterStatus", failing)
    dispatcher.handle("TierStatus", broken)
    console = Console(dispatcher, Clock(), 1, ("broker",))
    _, _, body = await console.page("/", {})
    assert b"ClusterStatus failed: UNAVAILABLE: no nameserver answers" in body
    status, _, body = await console.page("/topics", {})
    assert status == 500 and b"this page failed: TypeError" in body
    with trio.move_on_after(0.01):
        assert await console.sample() is False
