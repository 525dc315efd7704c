"""RocketMQ remoting compatibility: the Node.js client ali-ons (tests/node, pinned in its package.json) against a real
`rocket run`, its TCP port given as the client's nameSrv.

Each test drives tests/node/aons.js (JSON lines on stdout) in its own processes: producers, push consumers,
rebalancing members. Without node or tests/node/node_modules the tests skip; on CI (CI=true) they fail instead, since
.ci/run installs both (`npm ci --prefix tests/node`).
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import sys
import threading
import time
import warnings
from collections import Counter
from pathlib import Path

import pytest

from rocket.gateway.remoting import codec
from rocket.gateway.remoting.signature import verify_remoting
from tests.unit.test_signatures import AK, SK, java_acl_signature, refused, secret_of

NODE_DIR = Path(__file__).resolve().parents[1] / "node"
DRIVER = NODE_DIR / "aons.js"

# How long a test waits for what it expects; generous for a loaded CI machine, met in seconds on a quiet one.
WAIT_S = 45.0
# ali-ons rebalances on a timer only (it ignores the broker's NOTIFY_CONSUMER_IDS_CHANGED); 1 s instead of its 10 s.
REBALANCE_MS = 1000
REPEATS_MAX = 3  # "a handful" of messages consumed again after a restart of the consumer
DESCRIBE_GROUP = """
import json, sys, trio
from rocket.client import Admin, connect

async def main():
    async with connect(sys.argv[1], "tcp", "json") as channel:
        print(json.dumps(await Admin(channel).describe_group(sys.argv[2], sys.argv[3])))

trio.run(main)
"""


@pytest.fixture
def node_binary() -> str:
    return node_or_skip()


def node_or_skip() -> str:
    """node, with the driver's packages installed; else a skip (a failure on CI, which installs them)."""
    node = shutil.which("node")
    missing = []
    if node is None:
        missing.append("node is not on PATH")
    if not (NODE_DIR / "node_modules" / "ali-ons" / "package.json").exists():
        missing.append("tests/node/node_modules has no ali-ons (npm ci --prefix tests/node)")
    if missing:
        reason = "; ".join(missing)
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI: {reason}")
        pytest.skip(reason)
    return node


def _tail(path: Path, size: int = 3000) -> str:
    """The end of a log, without the stack frames ("    at ...") of Node's errors."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(line for line in text.splitlines() if not line.startswith("    at "))[-size:]


class Driver:
    """One running `node aons.js ...`: its JSON lines as they come (a reader thread), its stderr in a file."""

    def __init__(self, node: str, args: list[str], log_path: Path):
        self.args = args
        self.log_path = log_path
        self.lines: list[dict] = []
        self._changed = threading.Condition()
        with open(log_path, "ab") as log:
            self.process = subprocess.Popen([node, str(DRIVER), *args], cwd=NODE_DIR, stdin=subprocess.PIPE,
                                            stdout=subprocess.PIPE, stderr=log)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for raw in self.process.stdout:
            try:
                line = json.loads(raw)
            except ValueError:
                line = {"unparsed": raw.decode(errors="replace")}
            with self._changed:
                self.lines.append(line)
                self._changed.notify_all()
        with self._changed:
            self._changed.notify_all()

    def snapshot(self) -> list[dict]:
        with self._changed:
            return list(self.lines)

    def wait_for(self, predicate, timeout_s: float = WAIT_S) -> bool:
        """Until predicate(lines) is true (True), or the time is up or the driver has ended (False)."""
        deadline = time.monotonic() + timeout_s
        with self._changed:
            while not predicate(self.lines):
                left = deadline - time.monotonic()
                if left <= 0 or not self._reader.is_alive():
                    return predicate(self.lines)
                self._changed.wait(min(left, 0.5))
            return True

    def messages(self) -> list[dict]:
        """The lines of messages handed to the handler, successes and failures."""
        return [line for line in self.snapshot() if "body" in line and "ok" in line]

    def bodies(self) -> list[str]:
        return [line["body"] for line in self.messages() if line["ok"]]

    def queues(self) -> list[int] | None:
        """The queues of the last rebalance line, None before the first."""
        held = [line["rebalance"] for line in self.snapshot() if "rebalance" in line]
        return held[-1] if held else None

    def stop(self, timeout_s: float = 30.0) -> dict:
        """Close its stdin (the driver's stop) and wait for it to close the consumer; returns the closed line."""
        if self.process.poll() is None:
            try:
                self.process.stdin.close()
            except OSError:
                pass
        try:
            self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            raise AssertionError(f"aons.js {self.args[0]} did not stop in {timeout_s} s: {self.stderr()}")
        self._reader.join(5)
        closed = [line for line in self.snapshot() if "closed" in line]
        assert self.process.returncode == 0 and closed and closed[-1]["closed"], (
            f"aons.js {self.args[0]} did not close cleanly (exit {self.process.returncode}, {closed}): {self.stderr()}")
        return closed[-1]

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    def stderr(self) -> str:
        return _tail(self.log_path)


class Aons:
    """Runs the driver against one rocket server; kills what is still running at the end of the test."""

    def __init__(self, node: str, server, log_dir: Path):
        self.node = node
        self.server = server
        self.log_dir = log_dir
        self.drivers: list[Driver] = []

    @property
    def namesrv(self) -> str:
        return self.server.server

    def _log(self, what: str) -> Path:
        return self.log_dir / f"aons-{len(self.drivers) + 1}-{what}.log"

    def produce(self, topic: str, count: int, *extra: str, timeout_s: float = 60.0) -> list[dict]:
        """Send count messages; returns the acknowledged sends' lines (after checking them all there)."""
        log_path = self._log("produce")
        driver = Driver(self.node, ["produce", "--namesrv", self.namesrv, "--topic", topic, "--count", str(count),
                                    "--timeout-s", str(int(timeout_s)), *extra], log_path)
        self.drivers.append(driver)
        try:
            driver.process.wait(timeout_s + 15)
        except subprocess.TimeoutExpired:
            driver.kill()
        driver._reader.join(5)
        lines = driver.snapshot()
        sent = [line for line in lines if "msgId" in line]
        assert driver.process.returncode == 0 and {"done": count} in lines and len(sent) == count, (
            f"ali-ons produce to {topic} failed (exit {driver.process.returncode}, {len(sent)} of {count} sent): "
            f"{driver.stderr()}\nserver log: {self.server_log()}")
        return sent

    def consume(self, topic: str, group: str, *extra: str, timeout_s: float = 90.0) -> Driver:
        """A push consumer, running until stopped (Driver.stop) or timeout_s."""
        driver = Driver(self.node, ["consume", "--namesrv", self.namesrv, "--topic", topic, "--group", group,
                                    "--timeout-s", str(int(timeout_s)), *extra], self._log(f"consume-{group}"))
        self.drivers.append(driver)
        return driver

    def server_log(self) -> str:
        return _tail(self.server.log_path)

    def rocket(self, *args: str, timeout_s: float = 60.0) -> subprocess.CompletedProcess:
        """rocket's own CLI against the server."""
        return subprocess.run([sys.executable, "-m", "rocket", *args, "--server", self.namesrv], capture_output=True,
                              text=True, timeout=timeout_s)

    def group_positions(self, topic: str, group: str) -> list[dict]:
        """The group's positions on the topic, per queue, as rocket's Admin.describe_group gives them."""
        described = subprocess.run([sys.executable, "-c", DESCRIBE_GROUP, self.namesrv, topic, group],
                                   capture_output=True, text=True, timeout=60)
        assert described.returncode == 0, described.stderr
        return json.loads(described.stdout)

    def create_topic(self, name: str, queues: int = 4) -> None:
        created = self.rocket("topic", "create", name, "--queues", str(queues))
        assert created.returncode == 0, created.stderr

    def kill_all(self) -> None:
        for driver in self.drivers:
            driver.kill()


@pytest.fixture
def aons(node_binary, server_process, tmp_path):
    runner = Aons(node_binary, server_process().start(), tmp_path)
    yield runner
    runner.kill_all()


def covered(expected: set[str]):
    """A wait_for predicate: every expected body handled successfully."""
    return lambda lines: expected <= {line["body"] for line in lines if line.get("ok") is True}


def report_repeats(what: str, bodies: list[str]) -> dict[str, int]:
    """Messages handed over more than once (allowed: at least once), reported as a warning."""
    repeats = {body: n for body, n in Counter(bodies).items() if n > 1}
    if repeats:
        warnings.warn(f"{what}: {len(repeats)} message(s) consumed more than once: {sorted(repeats.items())[:10]}")
    return repeats


def consumed_or_fail(aons: Aons, driver: Driver, expected: set[str], what: str, timeout_s: float = WAIT_S) -> None:
    if not driver.wait_for(covered(expected), timeout_s):
        missing = sorted(expected - set(driver.bodies()))
        driver.kill()
        pytest.fail(f"{what}: {len(missing)} of {len(expected)} never consumed in {timeout_s} s "
                    f"(first missing: {missing[:5]}; got {len(driver.messages())} deliveries)\n"
                    f"driver stderr: {driver.stderr()}\nserver log: {aons.server_log()}")


def test_send_and_consume_round_trip(aons):
    """50 messages sent by ali-ons come back to an ali-ons push consumer reading from the first offset: every body,
    with its key and user properties, at the queue and offset (and message id) its send was acknowledged with."""
    aons.create_topic("aons-orders", queues=4)
    sent = aons.produce("aons-orders", 50, "--body-prefix", "order-", "--key-prefix", "key-", "--prop",
                        "region=eu", "--prop", "n={i}")
    assert len({line["msgId"] for line in sent}) == 50, "message ids of acknowledged sends repeat"
    assert {line["queueId"] for line in sent} <= {0, 1, 2, 3}
    assert len({(line["queueId"], line["queueOffset"]) for line in sent}) == 50, "two sends acknowledged at one offset"

    consumer = aons.consume("aons-orders", "aons-billing", "--from", "first")
    expected = {f"order-{i}" for i in range(50)}
    consumed_or_fail(aons, consumer, expected, "round trip")
    consumer.stop()

    delivered = [line for line in consumer.messages() if line["ok"]]
    assert {line["body"] for line in delivered} == expected
    report_repeats("round trip", [line["body"] for line in delivered])
    for line in delivered:
        i = int(line["body"].split("-")[1])
        assert line["topic"] == "aons-orders"
        assert line["keys"] == f"key-{i}", line
        assert line["props"].get("region") == "eu" and line["props"].get("n") == str(i), line
        assert line["reconsumeTimes"] == 0, line
    by_body = {line["body"]: line for line in sent}
    placed = {line["body"]: (line["queueId"], line["queueOffset"]) for line in delivered}
    assert placed == {body: (line["queueId"], line["queueOffset"]) for body, line in by_body.items()}, (
        "a message was consumed at another queue/offset than its send was acknowledged with")
    ids = {line["body"]: line["msgId"] for line in delivered}
    assert ids == {body: line["msgId"] for body, line in by_body.items()}, (
        "the message id a consumer sees (store host + commit log offset, decoded by ali-ons) is not the one the "
        "send returned")


def test_tag_expression_selects_messages(aons):
    """Tags a, b, c in turn; a consumer subscribed with 'a||c' gets exactly the a and c messages, filtered by the
    server (ali-ons filters tags again itself: the pulled lines show what the server returned)."""
    aons.create_topic("aons-tags", queues=4)
    aons.produce("aons-tags", 30, "--body-prefix", "t-", "--tags", "a,b,c")
    expected = {f"t-{i}" for i in range(30) if i % 3 != 1}
    consumer = aons.consume("aons-tags", "aons-tag-filter", "--from", "first", "--expression", "a||c",
                            "--trace-pulled")
    consumed_or_fail(aons, consumer, expected, "tag filter 'a||c'")
    time.sleep(1)  # a b message pulled late would show now
    consumer.stop()

    delivered = [line for line in consumer.messages() if line["ok"]]
    assert {line["body"] for line in delivered} == expected
    for line in delivered:
        assert line["tags"] == ("a" if int(line["body"][2:]) % 3 == 0 else "c"), line
    report_repeats("tag filter", [line["body"] for line in delivered])
    pulled_b = [line["pulled"] for line in consumer.snapshot()
                if "pulled" in line and line["pulled"]["topic"] == "aons-tags" and line["pulled"]["tags"] == "b"]
    assert not pulled_b, (f"the server returned {len(pulled_b)} messages tagged b to a pull subscribed with 'a||c' "
                          f"(ali-ons dropped them itself): {pulled_b[:3]}")


def test_sql92_expression_selects_messages(aons):
    """User property n = 0..19; a consumer subscribed with SQL92 'n >= 10' (ali-ons: subscribe(topic,
    {expressionType: 'SQL92', subString})) gets exactly n = 10..19; ali-ons does not filter SQL itself."""
    aons.create_topic("aons-sql", queues=4)
    aons.produce("aons-sql", 20, "--body-prefix", "s-", "--prop", "n={i}")
    expected = {f"s-{i}" for i in range(10, 20)}
    consumer = aons.consume("aons-sql", "aons-sql-filter", "--from", "first", "--sql", "n >= 10", "--trace-pulled")
    consumed_or_fail(aons, consumer, expected, "SQL92 filter 'n >= 10'")
    time.sleep(1)  # a message with n < 10 pulled late would show now
    consumer.stop()

    bodies = [line["body"] for line in consumer.messages()]
    assert set(bodies) == expected, f"SQL92 'n >= 10' delivered {sorted(set(bodies) - expected)} too"
    report_repeats("SQL92 filter", bodies)


@pytest.mark.slow
def test_failing_message_is_retried_then_dead_lettered(aons):
    """A message whose handler always throws is sent back (CONSUMER_SEND_MSG_BACK, delay level 0: the broker's
    schedule) and redelivered with reconsumeTimes 0, 1, 2; with maxReconsumeTimes 2 its third failure puts it in the
    group's dead letters (RocketMQ: reconsumeTimes >= maxReconsumeTimes), which rocket's own CLI lists. The other
    message is consumed once. RocketMQ's schedule waits 10 s and 30 s (levels 3 and 4) between the tries."""
    aons.create_topic("aons-retry", queues=2)
    aons.produce("aons-retry", 2, "--body-prefix", "r-")
    consumer = aons.consume("aons-retry", "aons-retriers", "--from", "first", "--max-reconsume", "2",
                            "--fail-body-regex", "^r-0$", timeout_s=120)

    deadline = time.monotonic() + 90
    dead: list[dict] = []
    while time.monotonic() < deadline and consumer.process.poll() is None:
        listed = aons.rocket("dlq", "list", "aons-retry", "--group", "aons-retriers", "--format", "json")
        if listed.returncode == 0:
            dead = [json.loads(line) for line in listed.stdout.splitlines() if line.strip()]
            if dead:
                break
        time.sleep(2)
    time.sleep(3)  # a fourth delivery would come now; none must
    consumer.stop()

    tries = [line for line in consumer.messages() if line["body"] == "r-0"]
    local = [line["reconsumeTimes"] for line in tries if line["localRetry"]]
    assert not local, (
        f"ali-ons retried r-0 itself (reconsumeTimes {local}): its CONSUMER_SEND_MSG_BACK failed, and so did its "
        f"fallback, a send to %RETRY%aons-retriers\ndriver stderr: {consumer.stderr()}\nserver log: {aons.server_log()}")
    assert [line["body"] for line in dead] == ["r-0"], (
        f"dead letters of aons-retriers on aons-retry: {dead} (r-0 was tried with reconsumeTimes "
        f"{[line['reconsumeTimes'] for line in tries]})\ndriver stderr: {consumer.stderr()}\n"
        f"server log: {aons.server_log()}")
    assert [line["reconsumeTimes"] for line in tries] == [0, 1, 2], tries
    assert all(not line["ok"] and line["topic"] == "aons-retry" for line in tries)
    assert [line["body"] for line in consumer.messages() if line["ok"]] == ["r-1"]


def test_consumers_of_a_group_split_the_queues_and_take_them_back(aons):
    """A alone holds the 4 queues; B joins the group and they hold 2 each; B leaves and A holds 4 again; every
    message sent before, during and after is consumed by one of them."""
    aons.create_topic("aons-rebalance", queues=4)
    group = "aons-workers"
    a = aons.consume("aons-rebalance", group, "--from", "first", "--rebalance-ms", str(REBALANCE_MS), timeout_s=240)
    assert a.wait_for(lambda lines: a.queues() == [0, 1, 2, 3]), f"A alone holds {a.queues()}: {a.stderr()}"
    aons.produce("aons-rebalance", 12, "--body-prefix", "before-")

    b = aons.consume("aons-rebalance", group, "--from", "first", "--rebalance-ms", str(REBALANCE_MS), timeout_s=240)

    def split(_lines) -> bool:
        held_a, held_b = a.queues() or [], b.queues() or []
        return len(held_a) == 2 and len(held_b) == 2 and sorted(held_a + held_b) == [0, 1, 2, 3]

    assert a.wait_for(split) and b.wait_for(split), (
        f"no 2/2 split: A holds {a.queues()}, B holds {b.queues()}\nA: {a.stderr()}\nB: {b.stderr()}\n"
        f"server log: {aons.server_log()}")
    aons.produce("aons-rebalance", 12, "--body-prefix", "during-")
    during = {f"during-{i}" for i in range(12)}

    def consumed(expected: set[str]):
        return lambda _lines: expected <= set(a.bodies()) | set(b.bodies())

    assert a.wait_for(consumed(during)), (
        f"not consumed while split: {sorted(during - set(a.bodies()) - set(b.bodies()))}")
    assert set(b.bodies()) & during, "B held 2 queues but consumed none of the messages sent to them"

    b.stop()
    assert a.wait_for(lambda lines: a.queues() == [0, 1, 2, 3]), (
        f"after B left A holds {a.queues()}\nA: {a.stderr()}\nserver log: {aons.server_log()}")
    aons.produce("aons-rebalance", 12, "--body-prefix", "after-")
    expected = {f"{phase}-{i}" for phase in ("before", "during", "after") for i in range(12)}
    assert a.wait_for(consumed(expected)), (
        f"never consumed: {sorted(expected - set(a.bodies()) - set(b.bodies()))}\nA: {a.stderr()}\n"
        f"server log: {aons.server_log()}")
    a.stop()
    report_repeats("rebalance", a.bodies() + b.bodies())


def test_broadcasting_consumers_each_consume_every_message(aons):
    """Two ali-ons consumers of one group in broadcasting mode (isBroadcast: each member takes every queue, its offsets
    kept by the client): each consumes all 20 messages, from every queue."""
    aons.create_topic("aons-news", queues=4)
    group = "aons-readers"
    a = aons.consume("aons-news", group, "--from", "first", "--broadcast", "--rebalance-ms", str(REBALANCE_MS))
    b = aons.consume("aons-news", group, "--from", "first", "--broadcast", "--rebalance-ms", str(REBALANCE_MS))
    assert a.wait_for(lambda _: a.queues() == [0, 1, 2, 3]) and b.wait_for(lambda _: b.queues() == [0, 1, 2, 3]), (
        f"broadcasting members hold A {a.queues()}, B {b.queues()}\nA: {a.stderr()}\nB: {b.stderr()}")
    aons.produce("aons-news", 20, "--body-prefix", "news-")
    expected = {f"news-{i}" for i in range(20)}
    consumed_or_fail(aons, a, expected, "broadcasting A")
    consumed_or_fail(aons, b, expected, "broadcasting B")
    a.stop()
    b.stop()
    assert {line["queueId"] for line in a.messages()} == {line["queueId"] for line in b.messages()} == {0, 1, 2, 3}


@pytest.mark.parametrize("queues", [1, 4])
def test_offsets_survive_a_consumer_restart(aons, queues):
    """Consume 20 of 40, close (ali-ons persists its offsets with UPDATE_CONSUMER_OFFSET): the group's positions on
    the server are those offsets. Start again from the last offset: the other 20 come, and the first 20 (but a
    handful) not again. With 4 queues, ali-ons commits -1 for a queue it held but never consumed from (its
    persistAll writes `offset || -1`), and a RocketMQ broker answers a query for such a queue, whose first message
    is still stored, with 0 (ConsumerManageProcessor.queryConsumerOffset), so it is read from its start."""
    topic = f"aons-resume-{queues}"
    aons.create_topic(topic, queues=queues)
    queue_of = {line["body"]: line["queueId"] for line in aons.produce(topic, 40, "--body-prefix", "o-")}
    first = aons.consume(topic, "aons-resumers", "--from", "first", "--count", "20")
    assert first.wait_for(lambda lines: any("closed" in line for line in lines)), (
        f"the first run did not consume 20: {first.bodies()}\n{first.stderr()}\nserver log: {aons.server_log()}")
    closed = first.stop()
    assert closed["reason"] == "count"
    done = first.bodies()
    assert len(done) == 20

    problems = []
    # ali-ons consumes each queue in order, so what it consumed of a queue is a prefix: the offset it commits is its
    # length. Queues it consumed nothing from are left out (it commits -1 for them).
    expected = dict(Counter(queue_of[body] for body in done))
    deadline = time.monotonic() + 10
    while True:
        positions = {entry["queue"]: entry["committed"] for entry in aons.group_positions(topic, "aons-resumers")}
        if all(positions.get(queue) == offset for queue, offset in expected.items()) or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    if any(positions.get(queue) != offset for queue, offset in expected.items()):
        problems.append(f"after the close the group's committed positions are {positions}, not the offsets ali-ons "
                        f"committed {expected}")

    rest = {f"o-{i}" for i in range(40)} - set(done)
    second = aons.consume(topic, "aons-resumers", "--from", "last")
    if not second.wait_for(covered(rest)):
        missing = rest - set(second.bodies())
        problems.append(f"after the restart {len(missing)} of the other 20 never came, from queues "
                        f"{sorted({queue_of[body] for body in missing})} (the first run consumed "
                        f"{expected} per queue)")
    else:
        time.sleep(1)  # repeats of the first run's messages would have come with the rest
    second.stop()
    assert not problems, "; ".join(problems) + f"\nsecond run: {second.stderr()}\nserver log: {aons.server_log()}"
    again = set(second.bodies()) & set(done)
    if again:
        warnings.warn(f"{len(again)} of the first run's 20 messages consumed again after the restart: {sorted(again)}")
    assert len(again) <= REPEATS_MAX, f"{len(again)} of the first run's 20 came again: {sorted(again)}"
    report_repeats("after the restart", second.bodies())


def test_messages_cross_between_rocket_and_ali_ons(aons):
    """A message sent with rocket's CLI (tag, key, property) reaches an ali-ons consumer with them; one sent by
    ali-ons is read by `rocket consume` with its tag, key and property."""
    aons.create_topic("aons-from-rocket", queues=4)
    sent = aons.rocket("send", "aons-from-rocket", "hello from rocket", "--tag", "x", "--key", "k-rocket", "--prop",
                       "color=red")
    assert sent.returncode == 0, sent.stderr
    consumer = aons.consume("aons-from-rocket", "aons-readers", "--from", "first", "--count", "1")
    consumed_or_fail(aons, consumer, {"hello from rocket"}, "rocket -> ali-ons")
    consumer.stop()
    [line] = [line for line in consumer.messages() if line["ok"]]
    assert line["tags"] == "x" and line["keys"] == "k-rocket" and line["props"].get("color") == "red", line

    aons.create_topic("aons-from-node", queues=4)
    aons.produce("aons-from-node", 1, "--body-prefix", "hello from ali-ons ", "--tags", "y", "--key-prefix",
                 "k-node-", "--prop", "color=blue")
    read = aons.rocket("consume", "aons-from-node", "--group", "rocket-readers", "--count", "1", "--format", "json",
                       timeout_s=WAIT_S)
    assert read.returncode == 0, f"{read.stderr}\nserver log: {aons.server_log()}"
    [message] = [json.loads(text) for text in read.stdout.splitlines() if text.strip()]
    assert message["body"] == "hello from ali-ons 0" and message["tag"] == "y", message
    assert message["properties"].get("color") == "blue", message
    assert "k-node-0" in (message["key"], message["properties"].get("KEYS")), message


def test_kill_9_during_a_long_pull_loses_nothing_acknowledged(aons):
    """`rocket run` is killed with -9 while an ali-ons push consumer waits in long pulls, and restarted on the same
    port: ali-ons reconnects by itself, and every message acknowledged to its producer, before the kill and after
    the restart, is consumed."""
    aons.create_topic("aons-crash", queues=2)
    aons.produce("aons-crash", 10, "--body-prefix", "before-")
    consumer = aons.consume("aons-crash", "aons-survivors", "--from", "first", timeout_s=150)
    consumed_or_fail(aons, consumer, {f"before-{i}" for i in range(10)}, "before the kill")
    time.sleep(1.5)  # its pulls now wait on the empty queues
    aons.server.kill()
    aons.server.start(extra=("--listen", aons.server.server))
    aons.produce("aons-crash", 10, "--body-prefix", "after-", timeout_s=90)
    consumed_or_fail(aons, consumer, {f"before-{i}" for i in range(10)} | {f"after-{i}" for i in range(10)},
                     "after the restart", timeout_s=90)
    consumer.stop()
    report_repeats("kill -9", consumer.bodies())


# ali-ons's own signature (its Channel.beforeRequest, run in node without a connection) against rocket's check

ALI_ONS_SIGN = """
const dir = process.argv[1];
const Channel = require(dir + '/node_modules/ali-ons/lib/channel');
const RemotingCommand = require(dir + '/node_modules/ali-ons/lib/protocol/command/remoting_command');
const input = JSON.parse(process.argv[2]);
const command = RemotingCommand.createRequestCommand(input.code, input.header);
if (input.body) command.body = Buffer.from(input.body, 'base64');
// ali-ons's own signing (Channel.beforeRequest), without a connection: only these getters are read.
Channel.prototype.beforeRequest.call({ accessKey: input.ak, secretKey: input.sk, onsChannel: 'ALIYUN' }, command);
process.stdout.write(command.encode().toString('base64'));
"""


def ali_ons_frame(header: dict, body: bytes, access_key: str = AK, secret: str = SK.decode()) -> codec.Command:
    """The frame ali-ons would send for this custom header and body, decoded by rocket's codec."""
    node = node_or_skip()
    arguments = json.dumps({"code": 310, "header": header, "body": base64.b64encode(body).decode(), "ak": access_key,
                            "sk": secret})
    encoded = subprocess.run([node, "-e", ALI_ONS_SIGN, str(NODE_DIR), arguments], check=True, capture_output=True,
                             timeout=60).stdout
    return codec.decode(base64.b64decode(encoded)[4:])


def test_ali_ons_own_signature_is_accepted():
    header = {"producerGroup": "pg", "topic": "TopicA", "defaultTopic": "TBW102", "defaultTopicQueueNums": 4,
              "queueId": 2, "sysFlag": 0, "bornTimestamp": 1700000000000, "flag": 0,
              "properties": "KEYS\u0001k1\u0002TAGS\u0001t\u0002", "reconsumeTimes": 0, "unitMode": False,
              "maxReconsumeTimes": None, "note": "é ☃ \U0001f600", "\ufffd": "x", "\U0001f600": "y"}
    command = ali_ons_frame(header, b"ali-ons body \x00\xff")
    assert command.ext["OnsChannel"] == "ALIYUN" and command.ext["AccessKey"] == AK
    assert "maxReconsumeTimes" not in command.ext  # null fields are neither sent nor signed
    assert verify_remoting(command.ext, command.body, secret_of, version=command.version) == AK
    assert command.ext["Signature"] == java_acl_signature(command.ext, command.body, SK.decode())


def test_ali_ons_with_a_wrong_secret_is_refused():
    command = ali_ons_frame({"topic": "TopicA"}, b"", secret="wrong")
    refused(lambda: verify_remoting(command.ext, command.body, secret_of, version=command.version),
            "signature does not match")
