"""The web console of `rocket run` (rocket/gateway/console), looked at by headless Chromium as a user would: a dev
node with topics, messages and a consumer group behind, every page's DOM checked for what the node holds (topic
names and counts, the group's lag, a message found by key, the rate chart drawn) and a screenshot of each saved in
pytest's tmp dir. Without chromium the tests skip; on CI (CI=true) they fail, since .ci/run installs it. With auth on
(a node started with a cluster secret and ROCKET_AUTH=true), urllib and curl check who sees what, and Chromium too
when it is there."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
import urllib.parse
from pathlib import Path

import pytest

WAIT_S = 60.0  # the console samples rates every 10 s: two samples, with room for a loaded machine
TOPIC = "web.orders-1"  # '.' and '-': names go into paths and queries as they are
BULK = "clicks"


def chromium_or_skip() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        reason = "no chromium (apt-get install chromium)"
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI: {reason}")
        pytest.skip(reason)
    return found


class Browser:
    """Headless Chromium, one process per page: the DOM after load, and a screenshot."""

    def __init__(self, binary: str, base: str, shots: Path):
        self.binary, self.base, self.shots = binary, base, shots
        self.profile = shots / "profile"

    def run(self, *flags: str, url: str) -> str:
        done = subprocess.run([self.binary, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                               f"--user-data-dir={self.profile}", *flags, url],
                              capture_output=True, timeout=120, check=True)
        return done.stdout.decode()

    def dom(self, path: str) -> str:
        return self.run("--dump-dom", url=self.base + path)

    def screenshot(self, path: str, name: str) -> Path:
        shot = self.shots / f"{name}.png"
        self.run(f"--screenshot={shot}", "--window-size=1280,900", url=self.base + path)
        assert shot.stat().st_size > 10_000, f"{name}: a blank screenshot?"
        return shot


def rocket(server, *args: str, stdin: bytes | None = None) -> str:
    done = subprocess.run([sys.executable, "-m", "rocket", *args, "--server", server.server], input=stdin,
                          capture_output=True, timeout=60)
    assert done.returncode == 0, done.stderr.decode()
    return done.stdout.decode()


def text_of(dom: str) -> str:
    """The page's text in one line, tags dropped: what a reader sees."""
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", dom))


def chart_max(dom: str) -> float:
    """The highest value the page's first chart drew (data-max), 0 if none."""
    found = re.search(r'<svg class="chart"[^>]*data-points="(\d+)" data-max="([0-9.e+]+)"', dom)
    return float(found.group(2)) if found and int(found.group(1)) >= 2 else 0.0


def test_chromium_reads_every_console_page(server_process, tmp_path):
    binary = chromium_or_skip()
    server = server_process().start()
    assert server.http_port
    browser = Browser(binary, f"http://127.0.0.1:{server.http_port}", tmp_path)
    rocket(server, "topic", "create", TOPIC, "--queues", "4")
    rocket(server, "topic", "create", BULK, "--queues", "2")
    rocket(server, "group", "create", "billing", "--max-attempts", "5")
    for number in range(1, 4):
        rocket(server, "send", TOPIC, f"hello <b>{number}</b>", "--key", f"user-{number}")
    rocket(server, "send", TOPIC, "tagged", "--key", "user-9", "--tag", "vip", "--prop", "origin=web")
    consumed = rocket(server, "consume", TOPIC, "--group", "billing", "--count", "2", "--from", "earliest")
    assert consumed.count("\n") == 2

    # Rates: the console samples every 10 s; keep sending until its chart of all topics has drawn a rate.
    deadline = time.monotonic() + WAIT_S
    while chart_max(dom := browser.dom("/")) == 0:
        assert time.monotonic() < deadline, "no rate charted in time"
        rocket(server, "send", BULK, "--file", "-", stdin=b"".join(b"click %d\n" % i for i in range(100)))
        time.sleep(1)

    # The cluster: this node, up, with its roles; the chart of the last hour.
    text = text_of(dom)
    assert "Cluster" in text and "nameserver, storage, broker" in text and f"127.0.0.1:{server.tcp_port}" in text
    assert " up " in text and "healthy" in text
    browser.screenshot("/", "cluster")

    # Topics: both, with their counts; the rate column filled in for the bulk topic.
    dom = browser.dom("/topics")
    text = text_of(dom)
    assert re.search(rf"{re.escape(TOPIC)} normal 4 4 ", text), text
    assert re.search(rf"{BULK} normal 2 [1-9][0-9,]* [0-9.,]+/s", text), text
    assert f'href="/topics/{TOPIC}"' in dom
    browser.screenshot("/topics", "topics")

    # One topic: its queues, the group reading it with its lag (4 sent, 2 consumed), a search form.
    dom = browser.dom(f"/topics/{TOPIC}")
    text = text_of(dom)
    assert f"Topic {TOPIC}" in text and "Queues" in text
    assert re.search(r"billing 2 0 0", text), text  # lag 2, none in flight, no dead letters
    browser.screenshot(f"/topics/{TOPIC}", "topic")
    assert chart_max(browser.dom(f"/topics/{BULK}")) > 0

    # Consumer groups: billing, its topic, its lag and its settings; the group's page, per queue.
    text = text_of(browser.dom("/groups"))
    assert re.search(rf"billing {re.escape(TOPIC)} 2 0 5 default clustering no", text), text
    browser.screenshot("/groups", "groups")
    dom = browser.dom("/groups/billing")
    text = text_of(dom)
    assert "Consumer group billing" in text and f"On {TOPIC}" in text
    lags = re.findall(r"<td class=\"?n\"?>(\d+)</td><td class=\"?n\"?>\d+</td><td[^>]*>[^<]*</td></tr>", dom)
    assert sum(map(int, lags)) == 2, lags  # the lag column, summed over the queues
    assert "the group has no position" in text_of(browser.dom("/groups/nobody"))

    # Storage: the default class and its groups, each with a leader.
    text = text_of(browser.dom("/storage"))
    assert re.search(r"raft raft 3 1 no [1-9]", text), text
    assert re.search(r"\d+ raft raft 1 1 none", text), text  # group, class, mode, leader 1, replicas: node 1
    browser.screenshot("/storage", "storage")

    # Messages: by key (its body escaped, shown as text), by id, from a time, the latest.
    query = urllib.parse.urlencode({"topic": TOPIC, "key": "user-2"})
    dom = browser.dom(f"/messages?{query}")
    text = text_of(dom)
    assert "Messages with key 'user-2'" in text and "user-2" in text and "user-1" not in text
    assert "hello &lt;b&gt;2&lt;/b&gt;" in dom and "<b>2</b>" not in dom
    found = re.search(r"id=(\d+\.\d+)\">", dom)
    browser.screenshot(f"/messages?{query}", "messages")
    text = text_of(browser.dom(f"/messages?topic={TOPIC}&id={found.group(1)}"))
    assert f"Message {found.group(1)} of {TOPIC}" in text and "user-2" in text
    text = text_of(browser.dom(f"/messages?topic={TOPIC}&key=user-9&from=2000-01-01T00:00"))
    assert "user-9 vip origin=web text tagged" in text, text
    text = text_of(browser.dom(f"/messages?topic={TOPIC}"))
    assert all(f"user-{number}" in text for number in (1, 2, 3, 9))
    assert "NOT_FOUND" in text_of(browser.dom("/messages?topic=nothing-here")) or \
        "UNKNOWN_TOPIC" in text_of(browser.dom("/messages?topic=nothing-here"))

    # What is not a page: 404; the node's own paths are still served beside the console.
    assert "no page /nothing" in text_of(browser.dom("/nothing"))
    assert browser.dom("/healthz").count("ok") == 1
    shots = sorted(path.name for path in tmp_path.glob("*.png"))
    assert shots == ["cluster.png", "groups.png", "messages.png", "storage.png", "topic.png", "topics.png"]


ADMIN_SECRET = "console-admin-secret-1"


def http_get(url: str, user: str | None = None, secret: str | None = None) -> tuple[int, dict, str]:
    """GET with urllib, with HTTP Basic credentials if given: (status, headers, body), errors included."""
    import base64
    import urllib.error
    import urllib.request

    request = urllib.request.Request(url)
    if user is not None:
        request.add_header("Authorization", "Basic " + base64.b64encode(f"{user}:{secret}".encode()).decode())
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, dict(response.headers), response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, dict(error.headers), error.read().decode()


def test_with_auth_on_the_console_asks_for_a_user_and_shows_each_what_they_may_read(server_process, monkeypatch,
                                                                                      tmp_path):
    monkeypatch.setenv("ROCKET_CLUSTER_SECRET", "console-cluster-secret-1")
    monkeypatch.setenv("ROCKET_AUTH", "true")
    monkeypatch.setenv("ROCKET_AUTH_ADMIN_SECRET", ADMIN_SECRET)
    server = server_process().start()
    base = f"http://127.0.0.1:{server.http_port}"

    def admin(*args: str) -> str:
        return rocket(server, "--user", "admin", "--secret", ADMIN_SECRET, *args)

    # Without credentials: 401 and the Basic challenge, on every console page; the node's own paths stay open.
    for path in ("/", "/topics", "/topics/orders", "/groups", "/messages?topic=orders"):
        status, headers, body = http_get(base + path)
        assert status == 401 and headers.get("www-authenticate") == 'Basic realm="rocket"', (path, status, body)
    assert http_get(base + "/healthz")[0] == 200 and http_get(base + "/readyz")[0] == 200
    assert http_get(base + "/metrics")[0] == 200
    assert http_get(base + "/", "admin", "not-the-secret")[0] == 401

    admin("topic", "create", "orders", "--queues", "2")
    admin("topic", "create", "payments", "--queues", "2")
    admin("send", "orders", "order one", "--key", "k-1")
    admin("send", "payments", "payment one", "--key", "k-2")
    admin("acl", "user", "create", "alice", "--user-secret", "alice-secret-0123456789")
    admin("acl", "grant", "alice", "--resource", "topic:orders", "--actions", "sub")

    # The admin (a super user) reads everything.
    for path in ("/", "/topics", "/topics/payments", "/groups", "/storage", "/messages?topic=payments"):
        status, _, body = http_get(base + path, "admin", ADMIN_SECRET)
        assert status == 200 and "signed in as admin" in body, (path, status)
    assert "payment one" in http_get(base + "/messages?topic=payments", "admin", ADMIN_SECRET)[2]

    # alice (sub on topic:orders): once the policy reached the node, the lists, orders and its messages; not payments.
    deadline = time.monotonic() + 10
    while (found := http_get(base + "/topics/orders", "alice", "alice-secret-0123456789"))[0] != 200:
        assert time.monotonic() < deadline, found
        time.sleep(0.2)
    assert "Topic orders" in text_of(found[2]) and "signed in as alice" in found[2]
    status, _, body = http_get(base + "/topics", "alice", "alice-secret-0123456789")
    assert status == 200 and "payments" in body  # listing the cluster needs only a signed-in user
    status, _, body = http_get(base + "/messages?topic=orders", "alice", "alice-secret-0123456789")
    assert status == 200 and "order one" in body
    for path in ("/topics/payments", "/messages?topic=payments"):
        status, _, body = http_get(base + path, "alice", "alice-secret-0123456789")
        assert status == 403 and "no policy allows sub on topic:payments" in body and "payment one" not in body, path
    status, _, body = http_get(base + "/groups/billing", "alice", "alice-secret-0123456789")
    assert status == 403 and "no policy allows sub on group:billing" in body

    # curl, as an operator would.
    done = subprocess.run(["curl", "-sS", "-u", "alice:alice-secret-0123456789", "-o", "/dev/null", "-w", "%{http_code}",
                           f"{base}/topics/payments"], capture_output=True, timeout=60)
    assert done.stdout == b"403", done

    # A browser, with the credentials in the URL.
    binary = shutil.which("chromium") or shutil.which("chromium-browser")
    if binary is not None:
        browser = Browser(binary, f"http://alice:alice-secret-0123456789@127.0.0.1:{server.http_port}", tmp_path)
        text = text_of(browser.dom("/topics/orders"))
        assert "Topic orders" in text and "signed in as alice" in text, text
        browser.screenshot("/topics/orders", "topic-as-alice")
