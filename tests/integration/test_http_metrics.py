"""The HTTP/1.1 listener of `rocket run`: /metrics in Prometheus's text format (read back with prometheus_client's
own parser), /healthz and /readyz, keep-alive, curl as an HTTP/1.1 client, and hostile requests answered with a
status that says why, the listener serving on."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families


@pytest.fixture
def server(server_process):
    started = server_process().start()
    assert started.http_port, "dev mode on a free TCP port listens for HTTP/1.1 on a free port too"
    return started


def exchange(port: int, request: bytes) -> bytes:
    """Send raw bytes (then nothing more: the write side is shut) and read until the server closes or answers one
    whole response."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as connection:
        connection.sendall(request)
        connection.shutdown(socket.SHUT_WR)
        answer = b""
        while chunk := connection.recv(65536):
            answer += chunk
            head, separator, body = answer.partition(b"\r\n\r\n")
            if separator and b"content-length:" in head.lower():
                length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
                if len(body) >= length:
                    break
        return answer


def get(port: int, path: str) -> tuple[int, dict[str, str], bytes]:
    answer = exchange(port, f"GET {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n".encode())
    head, _, body = answer.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    headers = dict(line.lower().split(": ", 1) for line in lines[1:])
    return int(lines[0].split()[1]), headers, body


def test_metrics_parse_with_prometheus_clients_parser(server):
    subprocess.run([sys.executable, "-m", "rocket", "topic", "create", "orders", "--server", server.server],
                   check=True, capture_output=True, timeout=60)
    subprocess.run([sys.executable, "-m", "rocket", "send", "orders", "hello", "--server", server.server],
                   check=True, capture_output=True, timeout=60)
    again = subprocess.run([sys.executable, "-m", "rocket", "topic", "create", "orders", "--server", server.server],
                           capture_output=True, timeout=60)
    assert again.returncode != 0  # TOPIC_EXISTS: counted as an error of CreateTopic
    status, headers, body = get(server.http_port, "/metrics")
    assert status == 200 and headers["content-type"].startswith("text/plain; version=")
    families = {family.name: family for family in text_string_to_metric_families(body.decode())}
    assert "process_cpu_seconds" in families and "process_resident_memory_bytes" in families
    fsync = [name for name in families if "fsync" in name]
    assert fsync, sorted(families)
    samples = [sample for name in fsync for sample in families[name].samples]
    assert any(sample.name.endswith("_count") and sample.value > 0 for sample in samples)  # the send was synced
    calls = {sample.labels["method"]: sample.value for sample in families["rocket_rpc_seconds"].samples
             if sample.name == "rocket_rpc_seconds_count"}
    assert calls["Produce"] >= 1 and calls["CreateTopic"] >= 2  # per method, as the node served them
    errors = {(sample.labels["method"], sample.labels["code"]): sample.value
              for sample in families["rocket_rpc_errors"].samples if sample.name == "rocket_rpc_errors_total"}
    assert errors[("CreateTopic", "TOPIC_EXISTS")] == 1


def test_health_and_readiness_and_errors(server):
    assert get(server.http_port, "/healthz")[:1] == (200,) and get(server.http_port, "/healthz")[2] == b"ok\n"
    assert get(server.http_port, "/readyz")[0] == 200
    assert get(server.http_port, "/nope")[0] == 404
    assert exchange(server.http_port, b"POST /metrics HTTP/1.1\r\nhost: x\r\ncontent-length: 2\r\n\r\nhi"
                    ).startswith(b"HTTP/1.1 405")
    head = exchange(server.http_port, b"HEAD /healthz HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200") and b"content-length: 3" in head and head.endswith(b"\r\n\r\n")
    # two requests on one connection (keep-alive), the second after the first's answer
    with socket.create_connection(("127.0.0.1", server.http_port), timeout=10) as connection:
        for _ in range(2):
            connection.sendall(b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n")
            answer = b""
            while not answer.endswith(b"ok\n"):
                answer += connection.recv(65536)
            assert answer.startswith(b"HTTP/1.1 200")


def test_curl_speaks_http1_to_it(server):
    if shutil.which("curl") is None:
        pytest.skip("needs curl")
    completed = subprocess.run(["curl", "-sS", "--http1.1", "-o", "-", "-w", "\n%{http_code} %{http_version}",
                                f"http://127.0.0.1:{server.http_port}/readyz"], capture_output=True, text=True,
                               timeout=30)
    assert completed.stdout.endswith("ready\n\n200 1.1"), completed


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(request=st.one_of(
    st.binary(max_size=300),
    st.builds(lambda method, target, junk: method + b" " + target + b" HTTP/1.1\r\n" + junk + b"\r\n\r\n",
              st.sampled_from([b"GET", b"POST", b"PUT", b"\x00", b"G ET"]),
              st.sampled_from([b"/metrics", b"/readyz", b"*", b"/%00", b"/" + b"a" * 20000]),
              st.binary(max_size=100))))
def test_hostile_requests_get_a_status_and_the_listener_serves_on(server, request):
    answer = exchange(server.http_port, request)
    assert answer == b"" or answer.startswith(b"HTTP/1.1 "), answer[:200]
    if answer:
        assert int(answer.split()[1]) in (200, 400, 404, 405, 413, 414, 431, 501), answer[:200]
    assert get(server.http_port, "/healthz")[0] == 200
    assert b"Traceback" not in server.log_path.read_bytes()


def rocket(server, *arguments: str) -> str:
    return subprocess.run([sys.executable, "-m", "rocket", *arguments, "--server", server.server], check=True,
                          capture_output=True, text=True, timeout=60).stdout


def scrape(server) -> dict:
    status, _, body = get(server.http_port, "/metrics")
    assert status == 200
    return {family.name: family for family in text_string_to_metric_families(body.decode())}


def values(families: dict, name: str, **labels: str) -> list[float]:
    """The values of the samples named name (a counter's with _total, a histogram's _count) whose labels include
    labels."""
    return [sample.value for family in families.values() for sample in family.samples
            if sample.name == name and labels.items() <= sample.labels.items()]


def test_the_families_of_issue_34_after_produce_and_consume(server, tmp_path):
    """Node, Raft, topics, consumer groups, tier, KV and process families, with values that follow what was sent
    and consumed; no per-queue series unless asked."""
    rocket(server, "topic", "create", "orders", "--queues", "4")
    lines = tmp_path / "lines"
    lines.write_text("".join(f"message {number}\n" for number in range(40)))
    rocket(server, "send", "orders", "--file", str(lines))
    rocket(server, "send", "orders", "one more", "--key", "k")
    families = scrape(server)
    assert values(families, "rocket_topic_produced_messages_total", topic="orders") == [41]
    assert values(families, "rocket_topic_produced_bytes_total", topic="orders")[0] > 41 * len("message 0")
    assert values(families, "rocket_node_info", node="1") == [1]
    assert values(families, "rocket_node_draining") == [0]
    states = {sample.labels["state"]: sample.value for sample in families["rocket_raft_groups"].samples}
    assert states["leader"] >= 2 and states["follower"] == states["candidate"] == 0  # dev mode leads them all
    assert states["leader"] == len(families["rocket_raft_group_applied_index"].samples)
    assert all(sample.value >= 1 for sample in families["rocket_raft_group_commit_index"].samples)
    assert values(families, "rocket_raft_commit_seconds_count")[0] >= 1  # sampled, one proposal at a time
    assert values(families, "rocket_fsync_seconds_count")[0] >= 1
    assert values(families, "process_resident_memory_bytes")[0] > 0 and "python_info" in families
    assert values(families, "rocket_tier_uploaded_pieces_total") == [0] and "rocket_kv_txns" in families
    assert not [name for name in families if name.startswith("rocket_queue_")]  # per queue: only when asked
    assert "rocket_consumer_group_lag_messages" in families  # and empty: no group committed yet
    assert not families["rocket_consumer_group_lag_messages"].samples

    rocket(server, "consume", "orders", "--group", "billing", "--count", "15")
    families = scrape(server)
    assert values(families, "rocket_consumer_group_lag_messages", consumer_group="billing", topic="orders") == [26]
    assert values(families, "rocket_topic_backlog_messages", topic="orders") == [26]
    assert values(families, "rocket_topic_read_messages_total", topic="orders")[0] >= 15
    rocket(server, "consume", "orders", "--group", "billing", "--count", "26")
    families = scrape(server)
    assert values(families, "rocket_consumer_group_lag_messages", consumer_group="billing", topic="orders") == [0]
    assert values(families, "rocket_topic_backlog_messages", topic="orders") == [0]
    calls = {sample.labels["method"] for sample in families["rocket_rpc_seconds"].samples}
    assert {"Produce", "CreateTopic"} <= calls

    rocket(server, "kv", "bucket", "create", "settings")
    rocket(server, "kv", "put", "settings", "colour", "blue")
    rocket(server, "kv", "put", "settings", "size", "9")
    rocket(server, "kv", "get", "settings", "colour")
    families = scrape(server)
    assert values(families, "rocket_kv_txns_total") == [2]
    assert values(families, "rocket_kv_operations_total", op="put") == [2]
    assert values(families, "rocket_kv_reads_total", op="get") == [1] and values(families, "rocket_kv_shards") == [1]


def test_per_queue_series_only_when_asked(server_process, tmp_path):
    config = tmp_path / "rocket.toml"
    config.write_text("metrics_per_queue = true\n")
    server = server_process().start(extra=("--config", str(config)))
    rocket(server, "topic", "create", "orders", "--queues", "4")
    for key in ("a", "b", "c", "d", "e", "f"):
        rocket(server, "send", "orders", f"to {key}", "--key", key)
    families = scrape(server)
    produced = {sample.labels["queue"]: sample.value for sample in families["rocket_queue_produced_messages"].samples
                if sample.labels["topic"] == "orders"}
    assert sum(produced.values()) == 6 and set(produced) <= {"0", "1", "2", "3"}
    assert values(families, "rocket_topic_produced_messages_total", topic="orders") == [6]
    assert set(produced) == {sample.labels["queue"] for sample in families["rocket_queue_backlog_messages"].samples}


def test_rocket_top_once_shows_topics_lag_calls_and_raft(server, tmp_path):
    rocket(server, "topic", "create", "orders", "--queues", "2")
    lines = tmp_path / "lines"
    lines.write_text("".join(f"message {number}\n" for number in range(12)))
    rocket(server, "send", "orders", "--file", str(lines))
    rocket(server, "consume", "orders", "--group", "billing", "--count", "5")
    shown = subprocess.run([sys.executable, "-m", "rocket", "top", "--http", f"127.0.0.1:{server.http_port}", "--once",
                            "--interval", "0.3"], capture_output=True, text=True, timeout=60,
                           env={**os.environ, "COLUMNS": "160"})
    assert shown.returncode == 0, shown.stderr
    screen = shown.stdout
    assert "node 1 (nameserver,storage,broker)" in screen and "leader" in screen
    [orders] = [line for line in screen.splitlines() if "│ orders " in line and "billing" not in line]
    assert orders.split("│")[4].strip() == "12"  # produced
    [billing] = [line for line in screen.splitlines() if "│ billing " in line]
    assert billing.split("│")[3].strip() == "7"  # lag
    assert [line for line in screen.splitlines() if "│ Produce " in line]
    refused = subprocess.run([sys.executable, "-m", "rocket", "top", "--http", "127.0.0.1:1", "--once"],
                             capture_output=True, text=True, timeout=60)
    assert refused.returncode == 1 and "cannot read http://127.0.0.1:1/metrics" in refused.stderr
