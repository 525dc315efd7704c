"""The web console of `rocket run` (rocket/gateway/console), looked at by headless Chromium as a user would: a dev
node with topics, messages and a consumer group behind, every page's DOM checked for what the node holds (topic
names and counts, the group's lag, a message found by key, the rate chart drawn) and a screenshot of each saved in
pytest's tmp dir. Without chromium the tests skip; on CI (CI=true) they fail, since .ci/run installs it."""

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
