"""Namespaces on a real `rocket run`: two namespaces hold a topic and a consumer group of the same names, and never see
each other's messages, over rocket's own protocol (the CLI's --namespace), RocketMQ 5's gRPC (the official Python
client's namespace) and RocketMQ's remoting (a 4.x client's NS% prefix)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.integration.test_remoting import R, RemotingClient, pull, send
from tests.integration.test_rocketmq_compat import run_client

pytest.importorskip("rocketmq.grpc_protocol", reason="needs rocketmq-python-client (pip install -e '.[test]')")


def rocket(server, *arguments: str, namespace: str = "") -> str:
    environment = {"ROCKET_NAMESPACE": namespace} if namespace else {}
    completed = subprocess.run([sys.executable, "-m", "rocket", *arguments, "--server", server.server],
                               capture_output=True, text=True, timeout=60,
                               env={**__import__("os").environ, **environment})
    assert completed.returncode == 0, completed.stderr
    return completed.stdout + completed.stderr


def test_two_namespaces_never_see_each_others_messages(server_process):
    server = server_process().start()
    for namespace in ("teama", "teamb"):
        rocket(server, "topic", "create", "orders", "--queues", "1", namespace=namespace)
    rocket(server, "topic", "create", "orders", "--queues", "1")  # the default namespace keeps its names

    # rocket's own: the CLI, one message per namespace
    for namespace in ("teama", "teamb", ""):
        subprocess.run([sys.executable, "-m", "rocket", "send", "orders", f"own-{namespace or 'default'}",
                        "--server", server.server, *(("--namespace", namespace) if namespace else ())],
                       check=True, capture_output=True, timeout=60)
    # gRPC: the official client in namespace teama sends, and receives as group "billing"
    grpc = run_client(server, "orders", """
        namespaced = ClientConfiguration(endpoint, Credentials(), namespace="teama", request_timeout=5)
        producer = Producer(namespaced, (topic,))
        producer.startup()
        producer.send(message("grpc-teama"))
        producer.shutdown()
        consumer = SimpleConsumer(namespaced, "billing", {topic: FilterExpression()}, 25)
        consumer.startup()
        got = [received["body"] for received in receive_all(consumer, 2, limit_s=20)]
        consumer.shutdown()
        report({"got": sorted(got)})
    """)
    assert grpc["got"] == ["grpc-teama", "own-teama"]
    # remoting: a 4.x client in namespace teamb names teamb%orders and teamb%billing itself
    client = RemotingClient(server.tcp_port)
    send(client, "teamb%orders", b"remoting-teamb", group="teamb%producers")
    _, _, messages = pull(client, "teamb%orders", 0, 0, group="teamb%billing")
    assert sorted(message["body"] for message in messages) == [b"own-teamb", b"remoting-teamb"]

    # and each namespace's view through the CLI
    listed = rocket(server, "topic", "list", namespace="teama")
    assert "orders" in listed and "teamb" not in listed and "teama%" not in listed
    out_a = rocket(server, "consume", "orders", "--group", "billing", "--from", "earliest", "--count", "2",
                   namespace="teama")
    assert "own-teama" in out_a and "grpc-teama" in out_a and "teamb" not in out_a
    out_default = rocket(server, "consume", "orders", "--group", "billing", "--from", "earliest", "--count", "1")
    assert "own-default" in out_default and "team" not in out_default
    described = rocket(server, "group", "describe", "orders", "--group", "billing", namespace="teama")
    assert "orders" in described
    refused = subprocess.run([sys.executable, "-m", "rocket", "topic", "list", "--namespace", "a%b", "--server",
                              server.server], capture_output=True, text=True, timeout=60)
    assert refused.returncode != 0 and "namespace" in refused.stderr
    assert R  # the remoting request codes, imported for the client
