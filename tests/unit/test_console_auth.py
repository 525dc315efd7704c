"""The web console with auth on (rocket/gateway/console/server.py): HTTP Basic credentials of a user for every page
but the stylesheet (401 and WWW-Authenticate otherwise; wrong ones counted against the client's address, which is
refused once it has failed too often), a page its reader may not read is a 403 naming what is missing, and what a
page leaves out for its reader is a notice, never looked up."""

import base64

from rocket.access import Access, Policy, User
from rocket.clock import Clock
from rocket.gateway.console import Console
from rocket.limits import auth_failures_per_minute_max
from rocket.transport.http1 import Asked
from rocket.transport.rpc import Dispatcher

SOURCE = "10.1.2.3"


def basic(user: str, secret: str) -> Asked:
    return Asked({"authorization": "Basic " + base64.b64encode(f"{user}:{secret}".encode()).decode()}, SOURCE)


def topic_info(name: str) -> dict:
    return {"name": name, "queues": 1, "created_ms": 1_700_000_000_000, "message_type": "normal", "retention_s": -1,
            "local_retention_s": -1, "history": 1, "ttl_ms": 0, "storage_class": "raft"}


def console_with_auth() -> tuple[Console, Access, list]:
    """A broker's console over stub methods: topics orders and payments, groups billing and audit; alice may sub
    on topic:orders and group:audit, admin is a super user."""
    now = [0.0]
    access = Access(b"k" * 32, lambda: 0, lambda: now[0])
    access.users = {"admin": User("admin", b"admin-secret", True), "alice": User("alice", b"alice-secret")}
    access.policies = {"alice": [Policy("alice", "topic:orders", ("sub",)), Policy("alice", "group:audit", ("sub",))]}
    dispatcher, described = Dispatcher(), []

    async def describe_topic(request):
        return {"topic": topic_info(request["topic"]), "queues": [{"queue": 0, "min_offset": 0, "next_offset": 5,
                                                                   "bytes": 9}]}

    async def list_topics(request):
        return {"topics": [topic_info("orders"), topic_info("payments")]}

    async def consumer_groups(request):
        groups = [{"group": name, "max_attempts": 3, "retry_backoff_s": [1.0], "consume_mode": "clustering",
                   "fifo": False} for name in ("audit", "billing") if request["group"] in ("", name)]
        return {"groups": groups}

    async def describe_group(request):
        described.append((request["group"], request["topic"]))
        return {"queues": [{"queue": 0, "min_offset": 0, "next_offset": 5, "committed": 2, "pop_cursor": 0,
                            "pop_done_before": 0, "in_flight": 0, "lag": 3, "dead_letters": 0, "member": ""}]}

    dispatcher.handle("DescribeTopic", describe_topic)
    dispatcher.handle("ListTopics", list_topics)
    dispatcher.handle("ConsumerGroups", consumer_groups)
    dispatcher.handle("DescribeGroup", describe_group)
    dispatcher.guard.access = access
    return Console(dispatcher, Clock(), 1, ("broker",)), access, described


async def test_without_credentials_every_page_but_the_stylesheet_asks_for_them_and_that_is_no_failure():
    console, _, _ = console_with_auth()
    page = console.routes()["/*"]
    for path in ("/", "/topics", "/topics/orders", "/groups", "/storage", "/messages", "/nothing"):
        status, content_type, body, headers = await page(path, {}, Asked({}, SOURCE))
        assert status == 401 and headers == [("www-authenticate", 'Basic realm="rocket"')], path
        assert b"sign in" in body
    assert (await page("/static/console.css", {}, Asked({}, SOURCE)))[0] == 200
    assert (await page("/", {}))[0] == 401  # called without the request's headers at all
    for _ in range(auth_failures_per_minute_max + 1):  # a browser's first request carries none: not counted
        await page("/", {}, Asked({}, SOURCE))
    assert (await page("/", {}, basic("alice", "alice-secret")))[0] == 200


async def test_wrong_or_malformed_credentials_are_401_and_counted_until_the_address_is_refused():
    console, _, _ = console_with_auth()
    page = console.routes()["/*"]
    for asked in (basic("alice", "wrong"), basic("nobody", "alice-secret"), basic("alice", ""),
                  Asked({"authorization": "Bearer abc"}, SOURCE), Asked({"authorization": "Basic !!"}, SOURCE),
                  Asked({"authorization": "Basic " + base64.b64encode(b"no-colon").decode()}, SOURCE)):
        status, _, body, headers = await page("/", {}, asked)
        assert status == 401 and headers, asked
    for _ in range(auth_failures_per_minute_max - 7):
        await page("/", {}, basic("alice", "wrong"))
    assert (await page("/", {}, basic("alice", "alice-secret")))[0] == 200  # the 29th failure is not enough
    await page("/", {}, basic("alice", "wrong"))
    status, _, body, _ = await page("/", {}, basic("alice", "alice-secret"))  # right, but too late this minute
    assert status == 401 and b"too many failed sign-ins from 10.1.2.3" in body


async def test_a_super_user_reads_every_page_and_the_header_says_who_reads():
    console, _, described = console_with_auth()
    page = console.routes()["/*"]
    for path in ("/", "/topics", "/topics/payments", "/groups", "/groups/billing", "/storage", "/messages"):
        status, _, body = await page(path, {}, basic("admin", "admin-secret"))
        assert status == 200 and b"signed in as admin" in body, path
        assert b"Left out" not in body and b"not shown" not in body, path
    assert ("billing", "payments") in described


async def test_a_user_sees_the_lists_and_what_they_may_sub_on_and_is_refused_the_rest_by_name():
    console, _, described = console_with_auth()
    page = console.routes()["/*"]
    alice = basic("alice", "alice-secret")
    status, _, body = await page("/topics/orders", {}, alice)
    assert status == 200 and b"Topic orders" in b" ".join(body.split()) and b"signed in as alice" in body
    assert b"audit" in body  # the group alice may read, with its position on orders
    assert b"Left out, as alice may not read it: no policy allows sub on group:billing from 10.1.2.3" in body
    assert described == [("audit", "orders")]  # billing's position was never looked up
    for path, query, missing in (("/topics/payments", {}, "sub on topic:payments"),
                                 ("/groups/billing", {}, "sub on group:billing"),
                                 ("/messages", {"topic": "payments"}, "sub on topic:payments")):
        status, _, body = await page(path, query, alice)
        assert status == 403, path
        text = body.decode()
        assert f"no policy allows {missing} from 10.1.2.3" in text, text
        assert f"rocket acl grant alice --resource {missing.split()[-1]} --actions sub" in text
    status, _, body = await page("/groups/audit", {}, alice)  # its position on orders, not on payments
    assert status == 200 and b"orders</a></h2>" in body and b"sub on topic:payments" in body
    status, _, body = await page("/groups", {}, alice)  # both groups listed; positions only where alice may read
    assert status == 200 and b"billing" in body and b"Left out" in body
    assert sorted(set(described)) == [("audit", "orders")]
    for path in ("/", "/topics", "/storage", "/messages"):  # the cluster's lists: any signed-in user
        assert (await page(path, {}, alice))[0] == 200, path


async def test_a_page_denied_outright_says_so_without_suggesting_a_grant():
    console, access, _ = console_with_auth()
    access.policies["alice"].append(Policy("alice", "topic:orders", ("sub",), "deny"))
    status, _, body = await console.routes()["/*"]("/topics/orders", {}, basic("alice", "alice-secret"))
    assert status == 403 and b"sub on topic:orders is denied" in body and b"acl grant" not in body
