"""MQTT on a three-node cluster (issue 57): a persistent session kept in the storage groups resumes on another broker
after a kill -9 of the broker it was on, with what was published meanwhile; a shared subscription spreads over
members on different brokers."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from rocket.gateway.mqtt.codec import Publish
from rocket.gateway.mqtt.packets import Reason
from rocket.transport.listen import free_ports
from tests.integration.test_cluster import Node, running
from tests.integration.test_mqtt_gateway import Client

NODES = (1, 2, 3)


class MqttNode(Node):
    def __init__(self, *args, mqtt_port: int, **kwargs):
        super().__init__(*args, **kwargs)
        self.mqtt_port = mqtt_port

    def command(self) -> list[str]:
        return [*super().command(), "--mqtt-listen", f"127.0.0.1:{self.mqtt_port}"]


@pytest.fixture
def nodes(tmp_path):
    ports = free_ports(2 * len(NODES))
    nameservers = ",".join(f"{node}@127.0.0.1:{port}" for node, port in zip(NODES, ports))
    environment = {"ROCKET_STORAGE_GROUPS": "8", "ROCKET_REPLICATION": "3"}
    made = {node: MqttNode(node, ports[index], nameservers, tmp_path, environment=environment,
                           mqtt_port=ports[len(NODES) + index]) for index, node in enumerate(NODES)}
    with running(made) as started:
        yield started


def rocket(node: Node, *args: str) -> None:
    deadline = time.monotonic() + 60
    while True:  # the cluster places its groups after the nodes are ready
        done = subprocess.run([sys.executable, "-m", "rocket", *args, "--server", node.server], capture_output=True,
                              text=True, timeout=60)
        if done.returncode == 0:
            return
        assert time.monotonic() < deadline, done.stderr
        time.sleep(1)


def published(port: int, client_id: str, topics: list[str], timeout_s: float = 60) -> None:
    """Each topic published at QoS 1 until a PUBACK says stored (leaders move after a kill)."""
    writer = Client(port, client_id)
    for index, topic in enumerate(topics):
        deadline = time.monotonic() + timeout_s
        while True:
            [answer] = writer.publish(topic, topic.encode(), packet_id=index + 1)
            if answer.reason == Reason.SUCCESS:
                break
            assert time.monotonic() < deadline, answer
            time.sleep(0.5)
    writer.close()


def test_a_persistent_session_resumes_on_another_broker_after_a_kill_9(nodes):
    first, second, third = nodes[1], nodes[2], nodes[3]
    rocket(first, "topic", "create", "sensors", "--queues", "2")
    device = Client(first.mqtt_port, "device-9", clean=False, expiry_s=3600)
    assert device.subscribe("sensors/device-9/#") == [1]
    device.close()
    first.kill()
    topics = [f"sensors/device-9/cmd{index}" for index in range(5)]
    published(second.mqtt_port, "writer", topics)
    deadline = time.monotonic() + 60
    while True:  # the session's record and group lie in groups that may be electing a leader
        resumed = Client(third.mqtt_port, "device-9", clean=False, expiry_s=3600)
        if resumed.connack.reason == Reason.SUCCESS:
            break
        assert time.monotonic() < deadline, resumed.connack
        time.sleep(1)
    assert resumed.connack.session_present
    messages = resumed.messages(5, timeout_s=60)
    assert sorted(message.topic for message in messages) == topics
    resumed.close()


def test_a_shared_subscription_spreads_over_members_on_different_brokers(nodes):
    rocket(nodes[1], "topic", "create", "jobs", "--queues", "4")
    members = [Client(nodes[node].mqtt_port, f"worker-{node}") for node in (1, 2)]
    for member in members:
        assert member.subscribe("$share/workers/jobs/#") == [1]
    writers = [Client(nodes[3].mqtt_port, f"jobs-writer-{index}") for index in range(4)]  # one queue each, or so
    for index in range(40):
        writers[index % 4].send(Publish(f"jobs/{index}", str(index).encode(), 1, packet_id=index + 1))
    for writer in writers:
        for _ in range(10):
            writer.receive()
    got: list[list[bytes]] = [[], []]
    deadline = time.monotonic() + 60
    while len(got[0]) + len(got[1]) < 40 and time.monotonic() < deadline:
        for index, member in enumerate(members):
            try:
                got[index] += [message.payload for message in member.messages(1, timeout_s=0.3)]
            except TimeoutError:
                pass
    assert sorted(got[0] + got[1], key=int) == [str(index).encode() for index in range(40)]
    assert got[0] and got[1], "members on both brokers received"
    for client in (*members, *writers):
        client.close()
