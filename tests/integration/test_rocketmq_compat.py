"""RocketMQ 5 compatibility: the official Python client (rocketmq-python-client, run in its own process because
it configures logging globally) against a real `rocket run`; gRPC error answers, PullMessage and the offset calls
(which that client lacks) over a raw socket."""

from __future__ import annotations

import concurrent.futures
import json
import socket
import subprocess
import sys
import textwrap
import time

import h2.config
import h2.connection
import h2.events
import pytest

pytest.importorskip("rocketmq.grpc_protocol", reason="needs rocketmq-python-client (pip install -e '.[test]')")

CLIENT_PRELUDE = textwrap.dedent("""
    import json, sys, time
    from rocketmq import (ClientConfiguration, Credentials, FilterExpression, Message, Producer, SimpleConsumer,
                          TransactionChecker, TransactionResolution)
    endpoint, topic = sys.argv[1], sys.argv[2]
    config = ClientConfiguration(endpoint, Credentials(), request_timeout=5)

    def message(body, tag=None, keys=(), properties=None, group=None, deliver_at_s=None):
        built = Message()
        built.topic, built.body = topic, body.encode()
        if tag:
            built.tag = tag
        for key in keys:
            built.keys = key  # the setter adds one key at a time
        for name, value in (properties or {}).items():
            built.add_property(name, value)
        if group:
            built.message_group = group
        if deliver_at_s:
            built.delivery_timestamp = deliver_at_s  # this client takes whole epoch seconds
        return built

    def receive_all(consumer, count, limit_s=30):
        got, deadline = [], time.time() + limit_s
        while len(got) < count and time.time() < deadline:
            for received in consumer.receive(16, 20):
                got.append({"body": received.body.decode(), "tag": received.tag, "keys": sorted(received.keys),
                            "properties": received.properties, "group": received.message_group,
                            "delivery_ms": received.delivery_timestamp, "at_ms": int(time.time() * 1000)})
                consumer.ack(received)
        return got

    def report(value):
        print("RESULT " + json.dumps(value), flush=True)
""")


def run_client(server, topic: str, script: str, *arguments: str, timeout_s: float = 120) -> dict:
    """Run the official client in a separate Python process against the server's HTTP/2 port (sys.argv[3:] are
    the arguments)."""
    completed = subprocess.run([sys.executable, "-c", CLIENT_PRELUDE + textwrap.dedent(script),
                                f"127.0.0.1:{server.http2_port}", topic, *arguments],
                               capture_output=True, text=True, timeout=timeout_s)
    for line in completed.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    raise AssertionError(f"client failed ({completed.returncode}): {completed.stdout[-2000:]} {completed.stderr[-3000:]}")


def send_plain(server, topic: str, count: int) -> None:
    """The official Producer sends count messages, one after the other, with bodies m-0, m-1..."""
    run_client(server, topic, """
        producer = Producer(config, (topic,))
        producer.startup()
        for i in range(int(sys.argv[3])):
            producer.send(message(f"m-{i}"))
        producer.shutdown()
        report({})
    """, str(count))


def create_topic(server, name: str, message_type: str, queues: int = 4) -> None:
    subprocess.run([sys.executable, "-m", "rocket", "topic", "create", name, "--queues", str(queues), "--type",
                    message_type, "--server", server.server], check=True, capture_output=True, timeout=60)


@pytest.fixture
def rocket_server(server_process):
    return server_process().start()


def test_normal_send_and_simple_consumer_round_trip(rocket_server):
    """Messages sent by the official Producer come back to its SimpleConsumer with the same bodies, keys, tags
    and properties, and acked messages are not delivered again."""
    create_topic(rocket_server, "orders", "normal")
    result = run_client(rocket_server, "orders", """
        producer = Producer(config, (topic,))
        producer.startup()
        ids = [producer.send(message(f"body-{i}", tag=f"tag{i % 2}", keys=(f"key-{i}", "common"),
                                     properties={"region": "eu", "n": str(i)})).message_id for i in range(5)]
        producer.shutdown()
        consumer = SimpleConsumer(config, "billing", {topic: FilterExpression()}, 25)
        consumer.startup()
        got = receive_all(consumer, 5)
        again = consumer.receive(16, 2)
        consumer.shutdown()
        report({"ids": ids, "got": got, "again": len(again)})
    """)
    assert len(set(result["ids"])) == 5
    got = sorted(result["got"], key=lambda entry: entry["body"])
    assert [entry["body"] for entry in got] == [f"body-{i}" for i in range(5)]
    for i, entry in enumerate(got):
        assert entry["tag"] == f"tag{i % 2}"
        assert entry["keys"] == sorted([f"key-{i}", "common"])
        assert entry["properties"] == {"region": "eu", "n": str(i)}
    assert result["again"] == 0


def test_normal_sends_go_to_the_queues_the_broker_picks(rocket_server):
    """The official client names no queue (every send says queue 0): as Apache RocketMQ's proxy does, the broker
    picks one, and one send at a time visits every queue in turn."""
    import trio

    from rocket.client import Admin, connect

    async def stored() -> dict[int, int]:
        async with connect(rocket_server.server) as channel:
            _, queues = await Admin(channel).describe_topic("spread")
            return {queue["queue"]: queue["next_offset"] for queue in queues}

    create_topic(rocket_server, "spread", "normal", queues=4)
    send_plain(rocket_server, "spread", 8)
    assert trio.run(stored) == {0: 2, 1: 2, 2: 2, 3: 2}


@pytest.mark.parametrize("unit", ["seconds", "milliseconds"])
def test_delay_message_arrives_no_earlier_than_its_delivery_time(rocket_server, unit):
    """A delay message sent with a delivery timestamp is received at or after that time, and carries it. The
    client takes whole epoch seconds; rocketmq-python-client 5.1.2 also puts milliseconds into Timestamp.seconds
    (its own test sets `current_mills() + 60_000`), which rocket reads as milliseconds (a value later than the year
    5000 as seconds)."""
    create_topic(rocket_server, "later", "delay")
    result = run_client(rocket_server, "later", """
        producer = Producer(config, (topic,))
        producer.startup()
        built = message("remind me", tag="t")
        deliver_at_ms = (int(time.time()) + 4) * 1000
        built.delivery_timestamp = deliver_at_ms // 1000 if sys.argv[3] == "seconds" else deliver_at_ms
        producer.send(built)
        producer.shutdown()
        consumer = SimpleConsumer(config, "reminders", {topic: FilterExpression()}, 25)
        consumer.startup()
        got = receive_all(consumer, 1)
        consumer.shutdown()
        report({"deliver_at_ms": deliver_at_ms, "got": got})
    """, unit)
    [entry] = result["got"]
    assert entry["body"] == "remind me"
    assert result["deliver_at_ms"] <= entry["at_ms"] < result["deliver_at_ms"] + 15_000
    assert entry["delivery_ms"] == result["deliver_at_ms"]


def test_fifo_messages_arrive_in_order_per_message_group(rocket_server):
    """On a FIFO topic the messages of each message group are received in the order they were sent."""
    create_topic(rocket_server, "ledger", "fifo")
    result = run_client(rocket_server, "ledger", """
        producer = Producer(config, (topic,))
        producer.startup()
        for i in range(6):
            for group in ("alice", "bob", "carol"):
                producer.send(message(f"{group}-{i}", group=group))
        producer.shutdown()
        consumer = SimpleConsumer(config, "auditors", {topic: FilterExpression()}, 25)
        consumer.startup()
        got = receive_all(consumer, 18)
        consumer.shutdown()
        report({"got": got})
    """)
    by_group: dict[str, list[str]] = {}
    for entry in result["got"]:
        by_group.setdefault(entry["group"], []).append(entry["body"])
    assert by_group == {group: [f"{group}-{i}" for i in range(6)] for group in ("alice", "bob", "carol")}


def test_transaction_commit_delivers_and_rollback_drops(rocket_server):
    """A committed transactional half message is delivered to consumers; a rolled back one never is."""
    create_topic(rocket_server, "payments", "transaction")
    result = run_client(rocket_server, "payments", """
        class Checker(TransactionChecker):
            def check(self, message):
                return TransactionResolution.ROLLBACK
        producer = Producer(config, (topic,), Checker())
        producer.startup()
        for body, commit in (("kept", True), ("dropped", False)):
            transaction = producer.begin_transaction()
            producer.send(message(body, keys=("k-" + body,)), transaction)
            transaction.commit() if commit else transaction.rollback()
        producer.shutdown()
        consumer = SimpleConsumer(config, "settlement", {topic: FilterExpression()}, 25)
        consumer.startup()
        got = receive_all(consumer, 1)
        got += [{"body": late.body.decode()} for late in consumer.receive(16, 3)]
        consumer.shutdown()
        report({"got": [entry["body"] for entry in got]})
    """)
    assert result["got"] == ["kept"]


def test_transaction_check_back_commits_an_open_transaction(monkeypatch, server_process):
    """A half message whose producer never ends its transaction is checked back over the Telemetry stream:
    the official client's TransactionChecker is called and commits, and the message is consumed once."""
    monkeypatch.setenv("ROCKET_TRANSACTION_TIMEOUT_S", "1")
    monkeypatch.setenv("ROCKET_TRANSACTION_CHECK_S", "1")
    server = server_process().start()
    create_topic(server, "refunds", "transaction")
    result = run_client(server, "refunds", """
        import threading
        checked = []
        answered = threading.Event()
        class Checker(TransactionChecker):
            def check(self, message):
                checked.append({"body": message.body.decode(), "keys": sorted(message.keys)})
                answered.set()
                return TransactionResolution.COMMIT
        producer = Producer(config, (topic,), Checker())
        producer.startup()
        transaction = producer.begin_transaction()
        producer.send(message("forgotten", keys=("r-1",)), transaction)  # never committed by the producer
        answered.wait(30)
        consumer = SimpleConsumer(config, "refunders", {topic: FilterExpression()}, 25)
        consumer.startup()
        got = receive_all(consumer, 1)
        got += [{"body": late.body.decode()} for late in consumer.receive(16, 3)]
        consumer.shutdown()
        producer.shutdown()
        report({"checked": checked, "got": [entry["body"] for entry in got]})
    """)
    assert result["checked"][:1] == [{"body": "forgotten", "keys": ["r-1"]}]
    assert result["got"] == ["forgotten"]


PUSH_FAILING = """
    import collections, threading
    from rocketmq import ConsumeResult, MessageListener, PushConsumer
    group, bodies, attempts = sys.argv[3], sys.argv[4].split(","), int(sys.argv[5])
    producer = Producer(config, (topic,))
    producer.startup()
    for body in bodies:
        producer.send(message(body))
    producer.shutdown()
    seen, lock, failed_at = collections.Counter(), threading.Lock(), []
    class Listener(MessageListener):
        def consume(self, received):
            body = received.body.decode()
            with lock:
                seen[body] += 1
                if body.startswith("bad-"):
                    failed_at.append(time.time())
            return ConsumeResult.FAILURE if body.startswith("bad-") else ConsumeResult.SUCCESS
    consumer = PushConsumer(config, group, Listener(), {topic: FilterExpression()})
    consumer.startup()
    deadline = time.time() + 60
    while time.time() < deadline and not all(seen[body] >= (attempts if body.startswith("bad-") else 1)
                                             for body in bodies):
        time.sleep(0.2)
    time.sleep(3)  # one more delivery would come now; none must
    consumer.shutdown()
    # The group's next receive moves what failed its last attempt to the dead letters, handing out nothing.
    receiver = SimpleConsumer(config, group, {topic: FilterExpression()}, 25)
    receiver.startup()
    left = receiver.receive(16, 3)
    receiver.shutdown()
    report({"seen": dict(seen), "left": len(left), "gap_s": failed_at[-1] - failed_at[0] if failed_at else 0})
"""


def push_consumer_failing(server, topic: str, group: str, bodies: list[str], attempts: int) -> dict:
    """The official PushConsumer of a group on the topic, whose listener fails the bodies named bad-*: how often
    each body came, what the group's next receive got, and the time between a failing body's first and last
    delivery; then the group's dead letters as rocket's own CLI lists them."""
    result = run_client(server, topic, PUSH_FAILING, group, ",".join(bodies), str(attempts), timeout_s=180)
    listed = subprocess.run([sys.executable, "-m", "rocket", "dlq", "list", topic, "--group", group, "--format", "raw",
                             "--server", server.server], check=True, capture_output=True, text=True, timeout=60)
    result["dead"] = sorted(listed.stdout.split())
    return result


def test_push_consumer_acks_successes_retries_failures_then_dead_letters_them(monkeypatch, server_process):
    """The official PushConsumer's listener: successes are acked and come once; failures come back (the retry
    backoff the server's settings give) and, after the last attempt, land in the group's dead-letter queue,
    which rocket's own CLI reads."""
    monkeypatch.setenv("ROCKET_ROCKETMQ_MAX_ATTEMPTS", "3")
    server = server_process().start()
    create_topic(server, "invoices", "normal")
    bodies = [("bad-" if i % 3 == 0 else "good-") + str(i) for i in range(6)]
    result = push_consumer_failing(server, "invoices", "accounting", bodies, 3)
    assert result["seen"] == {"bad-0": 3, "bad-3": 3, "good-1": 1, "good-2": 1, "good-4": 1, "good-5": 1}
    assert result["left"] == 0 and result["dead"] == ["bad-0", "bad-3"]


def test_the_groups_settings_give_the_official_push_consumer_its_attempts_and_backoff(server_process):
    """A group made with `rocket group create --max-attempts 2 --retry-backoff 4s` (the node's rocketmq_max_attempts
    left at 16): the Telemetry settings tell the official PushConsumer 2 attempts and a 4 s backoff (rocket's own
    first step is 1 s), the broker gives up where the group says, and what failed twice lands in the dead letters."""
    server = server_process().start()
    create_topic(server, "refunds", "normal")
    subprocess.run([sys.executable, "-m", "rocket", "group", "create", "refunding", "--max-attempts", "2",
                    "--retry-backoff", "4s", "--server", server.server], check=True, capture_output=True, timeout=60)
    result = push_consumer_failing(server, "refunds", "refunding", ["bad-0", "good-1"], 2)
    assert result["seen"] == {"bad-0": 2, "good-1": 1} and result["left"] == 0
    assert result["gap_s"] >= 3.5, result
    assert result["dead"] == ["bad-0"]


def test_fifo_push_consumer_forwards_a_failing_message_to_the_dead_letters(monkeypatch, server_process):
    """On a FIFO topic the official PushConsumer retries a failing message in order, locally, then gives up on it
    with ForwardMessageToDeadLetterQueue: it lands in the group's dead-letter queue, is not delivered again, and
    the message group goes on."""
    monkeypatch.setenv("ROCKET_ROCKETMQ_MAX_ATTEMPTS", "2")
    server = server_process().start()
    create_topic(server, "steps", "fifo")
    result = run_client(server, "steps", """
        import threading
        from rocketmq import ConsumeResult, MessageListener, PushConsumer
        producer = Producer(config, (topic,))
        producer.startup()
        for body in ("s0", "bad", "s2", "s3"):
            producer.send(message(body, group="order-7"))
        producer.shutdown()
        seen, lock = [], threading.Lock()
        class Listener(MessageListener):
            def consume(self, received):
                body = received.body.decode()
                with lock:
                    seen.append(body)
                return ConsumeResult.FAILURE if body == "bad" else ConsumeResult.SUCCESS
        consumer = PushConsumer(config, "shipping", Listener(), {topic: FilterExpression()})
        consumer.startup()
        deadline = time.time() + 60
        while time.time() < deadline and "s3" not in seen:
            time.sleep(0.2)
        time.sleep(3)  # a redelivery of the dead letter would come now; none must
        consumer.shutdown()
        report({"seen": seen})
    """)
    assert result["seen"] == ["s0", "bad", "bad", "s2", "s3"]
    listed = subprocess.run([sys.executable, "-m", "rocket", "dlq", "list", "steps", "--group", "shipping",
                             "--format", "raw", "--server", server.server], check=True, capture_output=True,
                            text=True, timeout=60)
    assert listed.stdout.split() == ["bad"]


def test_tag_and_sql_filter_expressions_select_messages(rocket_server):
    """The official SimpleConsumer's tag expression (`a || b`) and SQL92 expression over user properties each
    receive exactly the matching messages."""
    create_topic(rocket_server, "events", "normal")
    result = run_client(rocket_server, "events", """
        from rocketmq.grpc_protocol import FilterType
        producer = Producer(config, (topic,))
        producer.startup()
        for i in range(9):
            producer.send(message(f"e-{i}", tag=("red", "green", "blue")[i % 3], properties={"n": str(i)}))
        producer.shutdown()
        got = {}
        for group, expression in (("by-tag", FilterExpression("red || blue")),
                                  ("by-sql", FilterExpression("n > 5 AND TAGS <> 'green'", FilterType.SQL))):
            consumer = SimpleConsumer(config, group, {topic: expression}, 25)
            consumer.startup()
            got[group] = sorted(entry["body"] for entry in receive_all(consumer, 6 if group == "by-tag" else 2))
            got[group] += sorted(late.body.decode() for late in consumer.receive(16, 2))
            consumer.shutdown()
        report(got)
    """)
    assert result["by-tag"] == sorted(f"e-{i}" for i in range(9) if i % 3 != 1)
    assert result["by-sql"] == ["e-6", "e-8"]


def test_broker_killed_during_a_long_poll_loses_nothing(rocket_server):
    """`rocket run` is killed while the official SimpleConsumer waits in a long poll and restarted on the same
    ports; the client reconnects, and every message sent before and after the crash is received."""
    create_topic(rocket_server, "audit", "normal")
    run_client(rocket_server, "audit", """
        producer = Producer(config, (topic,))
        producer.startup()
        for i in range(3):
            producer.send(message(f"before-{i}"))
        producer.shutdown()
        report({})
    """)
    consumer = subprocess.Popen([sys.executable, "-c", CLIENT_PRELUDE + textwrap.dedent("""
        consumer = SimpleConsumer(config, "auditors", {topic: FilterExpression()}, 25)
        consumer.startup()
        got, deadline = set(), time.time() + 90
        while len(got) < 6 and time.time() < deadline:
            try:
                for received in consumer.receive(16, 10):
                    got.add(received.body.decode())
                    consumer.ack(received)
            except Exception as error:  # the broker is down: the client reconnects on the next call
                print("receive failed:", type(error).__name__, flush=True)
                time.sleep(0.5)
        consumer.shutdown()
        report({"got": sorted(got)})
    """), f"127.0.0.1:{rocket_server.http2_port}", "audit"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        time.sleep(8)  # the consumer took the first three and waits in a long poll
        rocket_server.kill()
        rocket_server.start(extra=("--listen", rocket_server.server, "--http2-listen",
                                   f"127.0.0.1:{rocket_server.http2_port}"))
        run_client(rocket_server, "audit", """
            producer = Producer(config, (topic,))
            producer.startup()
            for i in range(3):
                producer.send(message(f"after-{i}"))
            producer.shutdown()
            report({})
        """)
        stdout, stderr = consumer.communicate(timeout=120)
    finally:
        consumer.kill()
    results = [line for line in stdout.splitlines() if line.startswith("RESULT ")]
    assert results, f"consumer failed: {stdout[-2000:]} {stderr[-3000:]}"
    assert json.loads(results[0][len("RESULT "):])["got"] == sorted([f"before-{i}" for i in range(3)] +
                                                                      [f"after-{i}" for i in range(3)])


def test_broker_killed_during_open_transactions_loses_nothing(rocket_server):
    """`rocket run` is killed while two transactions of the official Producer are open (their half messages
    sent, neither ended) and restarted on the same ports; the producer reconnects, commits one and rolls the
    other back: the committed message is received once, the rolled-back one never, and so is a message of a
    transaction begun after the restart."""
    create_topic(rocket_server, "payments", "transaction")
    producer = subprocess.Popen([sys.executable, "-c", CLIENT_PRELUDE + textwrap.dedent("""
        class Checker(TransactionChecker):  # a check-back after the restart answers as the producer will
            def check(self, message):
                body = message.body.decode()
                return TransactionResolution.ROLLBACK if body == "roll-me-back" else TransactionResolution.COMMIT
        producer = Producer(config, (topic,), Checker())
        producer.startup()
        kept, dropped = producer.begin_transaction(), producer.begin_transaction()
        producer.send(message("commit-me"), kept)
        producer.send(message("roll-me-back"), dropped)
        print("SENT", flush=True)
        sys.stdin.readline()  # the broker was killed and restarted meanwhile
        deadline = time.time() + 60
        for end in (kept.commit, dropped.rollback):
            while True:
                try:
                    end()
                    break
                except Exception as error:  # a check-back may have ended it first; else the client reconnects
                    if "40008" in str(error) or "NOT_FOUND" in str(error) or time.time() > deadline:
                        break
                    print("end failed:", type(error).__name__, error, flush=True)
                    time.sleep(0.5)
        later = producer.begin_transaction()
        producer.send(message("after"), later)
        later.commit()
        consumer = SimpleConsumer(config, "settlers", {topic: FilterExpression()}, 25)
        consumer.startup()
        got = receive_all(consumer, 2)
        got += [{"body": late.body.decode()} for late in consumer.receive(16, 3)]
        consumer.shutdown()
        producer.shutdown()
        report({"got": sorted(entry["body"] for entry in got)})
    """), f"127.0.0.1:{rocket_server.http2_port}", "payments"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True)
    try:
        assert producer.stdout.readline().strip() == "SENT", producer.stderr.read()[-3000:]
        rocket_server.kill()
        rocket_server.start(extra=("--listen", rocket_server.server, "--http2-listen",
                                   f"127.0.0.1:{rocket_server.http2_port}"))
        stdout, stderr = producer.communicate("go\n", timeout=120)
    finally:
        producer.kill()
    results = [line for line in stdout.splitlines() if line.startswith("RESULT ")]
    assert results, f"producer failed: {stdout[-2000:]} {stderr[-3000:]}"
    assert json.loads(results[0][len("RESULT "):])["got"] == ["after", "commit-me"]


# ---- gRPC errors over a raw socket -----------------------------------------------------------------------

SERVICE_PATH = "/apache.rocketmq.v2.MessagingService/"


def grpc_exchange(port: int, path: str, data: bytes, extra_headers=()) -> dict[str, str]:
    """One gRPC-shaped request on a fresh h2c connection; the response's headers and trailers."""
    connection = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding="utf-8"))
    connection.initiate_connection()
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        stream_id = connection.get_next_available_stream_id()
        connection.send_headers(stream_id, [(":method", "POST"), (":scheme", "http"), (":authority", f"127.0.0.1:{port}"),
                                            (":path", path), ("content-type", "application/grpc"), ("te", "trailers"),
                                            *extra_headers])
        connection.send_data(stream_id, data, end_stream=True)
        sock.sendall(connection.data_to_send())
        fields: dict[str, str] = {}
        while True:
            received = sock.recv(65536)
            assert received, f"the server closed the connection; fields so far {fields}"
            for event in connection.receive_data(received):
                if isinstance(event, (h2.events.ResponseReceived, h2.events.TrailersReceived)):
                    fields.update(dict(event.headers))
                if isinstance(event, h2.events.StreamEnded) and event.stream_id == stream_id:
                    return fields
                if isinstance(event, h2.events.StreamReset) and event.stream_id == stream_id:
                    return fields
            sock.sendall(connection.data_to_send())


def grpc_stream(port: int, path: str, request) -> tuple[dict[str, str], list[bytes]]:
    """One gRPC call of a protobuf request on a fresh h2c connection; the headers and trailers, and every
    message of the response stream."""
    payload = request.SerializeToString()
    connection = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding="utf-8"))
    connection.initiate_connection()
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        stream_id = connection.get_next_available_stream_id()
        connection.send_headers(stream_id, [(":method", "POST"), (":scheme", "http"), (":authority", f"127.0.0.1:{port}"),
                                            (":path", path), ("content-type", "application/grpc"), ("te", "trailers")])
        connection.send_data(stream_id, b"\0" + len(payload).to_bytes(4, "big") + payload, end_stream=True)
        sock.sendall(connection.data_to_send())
        fields: dict[str, str] = {}
        body = b""
        ended = False
        while not ended:
            received = sock.recv(65536)
            assert received, f"the server closed the connection; fields so far {fields}"
            for event in connection.receive_data(received):
                if isinstance(event, (h2.events.ResponseReceived, h2.events.TrailersReceived)):
                    fields.update(dict(event.headers))
                if isinstance(event, h2.events.DataReceived) and event.stream_id == stream_id:
                    body += event.data
                    connection.acknowledge_received_data(event.flow_controlled_length, stream_id)
                if isinstance(event, (h2.events.StreamEnded, h2.events.StreamReset)) and event.stream_id == stream_id:
                    ended = True
            sock.sendall(connection.data_to_send())
    messages = []
    while body:
        assert body[0] == 0, "a compressed message"
        length = int.from_bytes(body[1:5], "big")
        messages.append(body[5:5 + length])
        body = body[5 + length:]
    return fields, messages


def test_malformed_frames_and_unknown_methods_get_grpc_statuses(rocket_server):
    """Unknown methods, bad message prefixes, oversized lengths, truncated messages and undecodable protobuf
    each get a gRPC error status, and the server keeps answering valid calls afterwards."""
    port = rocket_server.http2_port
    assert grpc_exchange(port, SERVICE_PATH + "NoSuchMethod", b"\0\0\0\0\0")["grpc-status"] == "12"
    assert grpc_exchange(port, "/other.Service/Call", b"\0\0\0\0\0")["grpc-status"] == "12"
    assert grpc_exchange(port, SERVICE_PATH + "QueryRoute", b"\x07\0\0\0\0")["grpc-status"] == "13"  # bad flag
    assert grpc_exchange(port, SERVICE_PATH + "QueryRoute", b"\x01\0\0\0\x01x")["grpc-status"] == "12"  # compressed
    assert grpc_exchange(port, SERVICE_PATH + "QueryRoute", b"\0\x7f\xff\xff\xff")["grpc-status"] == "8"  # too large
    assert grpc_exchange(port, SERVICE_PATH + "QueryRoute", b"\0\0\0\0\x09abc")["grpc-status"] == "13"  # truncated
    assert grpc_exchange(port, SERVICE_PATH + "QueryRoute", b"\0\0\0\0\x03\xff\xff\xff")["grpc-status"] == "13"
    answer = grpc_exchange(port, SERVICE_PATH + "QueryRoute", b"\0\0\0\0\x00", [("grpc-timeout", "bad")])
    assert answer["grpc-status"] == "3"
    answer = grpc_exchange(port, SERVICE_PATH + "Heartbeat", b"\0\0\0\0\x00")
    assert answer["grpc-status"] == "0" and answer["content-type"] == "application/grpc"


def test_namespaces_are_checked_and_authorization_headers_are_ignored_with_auth_off(rocket_server):
    """A namespace is taken (test_namespaces.py uses one), one that is not a plain name refused by name, an empty one
    is fine; with auth off (dev mode) the authorization header is not looked at, whatever its form (test_auth.py
    checks it with auth on)."""
    port = rocket_server.http2_port
    assert grpc_exchange(port, SERVICE_PATH + "Heartbeat", b"\0\0\0\0\x00",
                         [("x-mq-namespace", "tenant-a")])["grpc-status"] == "0"
    heartbeat = b"\x0a\x03\x12\x01g"  # HeartbeatRequest{group: Resource{name: "g"}}
    refused = grpc_exchange(port, SERVICE_PATH + "Heartbeat", b"\0" + len(heartbeat).to_bytes(4, "big") + heartbeat,
                            [("x-mq-namespace", "a%b")])
    assert refused["grpc-status"] != "0" and "namespace" in refused["grpc-message"]
    assert grpc_exchange(port, SERVICE_PATH + "Heartbeat", b"\0\0\0\0\x00", [("x-mq-namespace", "")])["grpc-status"] == "0"
    for header in ("Bearer abc", "MQv2-HMAC-SHA1 Credential=ak, SignedHeaders=x-mq-date-time, Signature=0a1B2c"):
        answer = grpc_exchange(port, SERVICE_PATH + "Heartbeat", b"\0\0\0\0\x00", [("authorization", header)])
        assert answer["grpc-status"] == "0", header


def test_a_client_with_credentials_sends_and_receives(rocket_server):
    """The official client signs every call when it has credentials; rocket reads the header and serves it."""
    create_topic(rocket_server, "signed", "normal")
    result = run_client(rocket_server, "signed", """
        config = ClientConfiguration(endpoint, Credentials("my-access-key", "my-secret"), request_timeout=5)
        producer = Producer(config, (topic,))
        producer.startup()
        producer.send(message("hello"))
        producer.shutdown()
        consumer = SimpleConsumer(config, "readers", {topic: FilterExpression()}, 5)
        consumer.startup()
        got = receive_all(consumer, 1)
        consumer.shutdown()
        report([entry["body"] for entry in got])
    """)
    assert result == ["hello"]


# ---- TLS ---------------------------------------------------------------------------------------------------

def self_signed(directory) -> tuple[str, str]:
    """A certificate for 127.0.0.1 (and its key) made with openssl, as an operator would."""
    cert, key = directory / "cert.pem", directory / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=rocket",
                    "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True, timeout=60)
    return str(cert), str(key)


def test_the_official_client_and_curl_speak_tls(tmp_path, server_process, monkeypatch):
    """With http2_tls_cert/key the HTTP/2 listener speaks TLS with ALPN h2: the official client with
    tls_enable (trusting the certificate) sends and receives, curl calls rocket's own API over https, and a
    client without TLS is turned away."""
    cert, key = self_signed(tmp_path)
    monkeypatch.setenv("ROCKET_HTTP2_TLS_CERT", cert)
    monkeypatch.setenv("ROCKET_HTTP2_TLS_KEY", key)
    server = server_process().start()
    create_topic(server, "secure", "normal")
    monkeypatch.setenv("GRPC_DEFAULT_SSL_ROOTS_FILE_PATH", cert)  # how gRPC clients are told to trust a CA
    result = run_client(server, "secure", """
        producer = Producer(config, (topic,), tls_enable=True)
        producer.startup()
        producer.send(message("over tls"))
        producer.shutdown()
        consumer = SimpleConsumer(config, "readers", {topic: FilterExpression()}, 5, tls_enable=True)
        consumer.startup()
        got = receive_all(consumer, 1)
        consumer.shutdown()
        report([entry["body"] for entry in got])
    """)
    assert result == ["over tls"]
    described = subprocess.run(["curl", "-s", "--http2", "--cacert", cert, "--max-time", "10", "-X", "POST", "-H",
                                "content-type: application/json", "--data", '{"topic": "secure"}',
                                f"https://127.0.0.1:{server.http2_port}/rocket.v1/DescribeTopic"],
                               capture_output=True, text=True, timeout=30)
    assert json.loads(described.stdout)["topic"]["name"] == "secure", described
    with pytest.raises(AssertionError, match="closed the connection"):
        grpc_exchange(server.http2_port, SERVICE_PATH + "Heartbeat", b"\0\0\0\0\x00")  # h2c on a TLS port


def test_unreadable_messages_go_to_the_dead_letters_and_the_rest_are_received(rocket_server):
    """A stored batch with a right CRC and malformed records: the official SimpleConsumer receives the messages
    around it, and its two messages go to the group's dead letters on their first attempt."""
    import trio

    from rocket.client import Admin, connect
    from tests.integration.test_malformed_batches import fill

    async def filled() -> None:
        async with connect(rocket_server.server) as channel:
            await fill(channel, "jobs")

    async def dead_letters() -> int:
        async with connect(rocket_server.server) as channel:
            [queue] = await Admin(channel).describe_group("jobs", "workers")
            return queue["dead_letters"]

    trio.run(filled)
    result = run_client(rocket_server, "jobs", """
        consumer = SimpleConsumer(config, "workers", {topic: FilterExpression()}, 25)
        consumer.startup()
        got = receive_all(consumer, 5)
        consumer.shutdown()
        report({"got": sorted(entry["body"] for entry in got)})
    """)
    assert result["got"] == ["m0", "m1", "m2", "m3", "m4"]
    assert trio.run(dead_letters) == 2


# ---- PullMessage and the offset calls (raw gRPC: rocketmq-python-client 5.1.2 has no pull consumer) --------

def call_unary(port: int, method: str, request, response_type):
    fields, [answer] = grpc_stream(port, SERVICE_PATH + method, request)
    assert fields["grpc-status"] == "0", fields
    return response_type.FromString(answer)


def pull(port: int, topic: str, offset: int, batch_size: int = 0, tag: str = "", sql: str = "", wait_s: int = 1):
    """A PullMessage of queue 0: its status code, the bodies pulled (with their queue offsets) and next_offset."""
    from rocketmq.grpc_protocol import definition_pb2, service_pb2
    request = service_pb2.PullMessageRequest(
        group=definition_pb2.Resource(name="pullers"), offset=offset, batch_size=batch_size,
        message_queue=definition_pb2.MessageQueue(topic=definition_pb2.Resource(name=topic), id=0),
        filter_expression=definition_pb2.FilterExpression(type=2 if sql else 1, expression=sql or tag or "*"))
    request.long_polling_timeout.FromSeconds(wait_s)
    fields, answers = grpc_stream(port, SERVICE_PATH + "PullMessage", request)
    assert fields["grpc-status"] == "0", fields
    responses = [service_pb2.PullMessageResponse.FromString(answer) for answer in answers]
    assert responses[0].WhichOneof("content") == "status" and responses[-1].WhichOneof("content") == "next_offset"
    assert all(response.WhichOneof("content") == "message" for response in responses[1:-1])
    bodies = [(response.message.body.decode(), response.message.system_properties.queue_offset)
              for response in responses[1:-1]]
    for response in responses[1:-1]:
        assert not response.message.system_properties.receipt_handle
    return responses[0].status.code, bodies, responses[-1].next_offset


def test_pull_message_reads_a_queue_from_an_offset_with_filters_and_long_polls(rocket_server):
    """PullMessage answers a status, the queue's messages from the offset in order, then next_offset; a tag or
    SQL filter keeps the matching ones, batch_size stops early (next_offset is the first message not sent), an
    empty queue long-polls and answers MESSAGE_NOT_FOUND, an offset past the end ILLEGAL_OFFSET and where to
    pull; QueryOffset gives the queue's beginning, end and the offset of a time."""
    from rocketmq.grpc_protocol import definition_pb2, service_pb2
    create_topic(rocket_server, "ledger", "normal", queues=1)
    sent = run_client(rocket_server, "ledger", """
        producer = Producer(config, (topic,))
        producer.startup()
        for i in range(3):
            producer.send(message(f"e-{i}", tag="ab"[i % 2], properties={"n": str(i)}))
        time.sleep(0.5)
        middle_ms = int(time.time() * 1000)
        time.sleep(0.5)
        for i in range(3, 5):
            producer.send(message(f"e-{i}", tag="ab"[i % 2], properties={"n": str(i)}))
        producer.shutdown()
        report({"middle_ms": middle_ms})
    """)
    port = rocket_server.http2_port
    everything = [(f"e-{i}", i) for i in range(5)]
    assert pull(port, "ledger", 0) == (20000, everything, 5)
    assert pull(port, "ledger", 2) == (20000, everything[2:], 5)
    assert pull(port, "ledger", 0, tag="a") == (20000, everything[0::2], 5)
    assert pull(port, "ledger", 1, sql="n >= 3") == (20000, everything[3:], 5)
    assert pull(port, "ledger", 0, batch_size=2) == (20000, everything[:2], 2)
    code, bodies, next_offset = pull(port, "ledger", 0, batch_size=2, tag="b")
    assert (code, bodies) == (20000, [("e-1", 1), ("e-3", 3)]) and next_offset in (4, 5)  # e-4 does not match
    started = time.monotonic()
    assert pull(port, "ledger", 5, wait_s=2) == (40401, [], 5)
    assert time.monotonic() - started >= 1.5
    assert pull(port, "ledger", 4, tag="b", wait_s=1) == (40401, [], 5)  # nothing matched: pull on from 5
    assert pull(port, "ledger", 100) == (40019, [], 5)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:  # a message sent during a long poll ends it
        started = time.monotonic()
        waiting = pool.submit(pull, port, "ledger", 5, wait_s=15)
        time.sleep(1)
        subprocess.run([sys.executable, "-m", "rocket", "send", "ledger", "late", "--tag", "a", "--server",
                        rocket_server.server], check=True, capture_output=True, timeout=60)
        assert waiting.result(timeout=30) == (20000, [("late", 5)], 6)
        assert time.monotonic() - started < 10
    fields, [answer] = grpc_stream(port, SERVICE_PATH + "PullMessage", service_pb2.PullMessageRequest(
        message_queue=definition_pb2.MessageQueue(topic=definition_pb2.Resource(name="no-such-topic"))))
    assert service_pb2.PullMessageResponse.FromString(answer).status.code == 40402

    def query(policy: int, timestamp_ms: int = 0) -> tuple[int, int]:
        request = service_pb2.QueryOffsetRequest(
            message_queue=definition_pb2.MessageQueue(topic=definition_pb2.Resource(name="ledger"), id=0),
            query_offset_policy=policy)
        request.timestamp.FromMilliseconds(timestamp_ms)
        response = call_unary(port, "QueryOffset", request, service_pb2.QueryOffsetResponse)
        return response.status.code, response.offset

    assert query(definition_pb2.BEGINNING) == (20000, 0)
    assert query(definition_pb2.END) == (20000, 6)
    assert query(definition_pb2.TIMESTAMP, sent["middle_ms"]) == (20000, 3)
    assert query(definition_pb2.TIMESTAMP, 0) == (20000, 0)
    assert query(definition_pb2.TIMESTAMP, int(time.time() * 1000) + 60_000) == (20000, 6)


def test_update_offset_then_get_offset_round_trips(rocket_server):
    """UpdateOffset commits a group's offset in a queue and GetOffset reads it back; a group that never
    committed one gets OFFSET_NOT_FOUND."""
    from rocketmq.grpc_protocol import definition_pb2, service_pb2
    create_topic(rocket_server, "tally", "normal", queues=2)
    send_plain(rocket_server, "tally", 6)
    port = rocket_server.http2_port
    queue = definition_pb2.MessageQueue(topic=definition_pb2.Resource(name="tally"), id=1)

    def get(group: str) -> tuple[int, int]:
        response = call_unary(port, "GetOffset", service_pb2.GetOffsetRequest(
            group=definition_pb2.Resource(name=group), message_queue=queue), service_pb2.GetOffsetResponse)
        return response.status.code, response.offset

    assert get("counters")[0] == 40404
    updated = call_unary(port, "UpdateOffset", service_pb2.UpdateOffsetRequest(
        group=definition_pb2.Resource(name="counters"), message_queue=queue, offset=2), service_pb2.UpdateOffsetResponse)
    assert updated.status.code == 20000
    assert get("counters") == (20000, 2)
    assert get("strangers")[0] == 40404
