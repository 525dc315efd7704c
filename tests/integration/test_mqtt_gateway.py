"""MQTT on a real `rocket run --mqtt-listen` (issue 57), driven by real clients: Debian's mosquitto_pub and
mosquitto_sub, paho-mqtt, and a small client made of rocket's own codec where a test needs to see each packet (QoS 2's
exchange, a will after a dropped connection, hostile bytes). A message published over MQTT is consumed over rocket's
API, and one sent over rocket's API arrives over MQTT."""

from __future__ import annotations

import os
import queue
import socket
import subprocess
import sys
import re
import threading
import time
import urllib.request

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rocket.gateway.mqtt.codec import (Ack, ConnAck, Connect, Decoder, Disconnect, PacketType, PingReq, PingResp,
                                       Publish, SubAck, Subscribe, Subscription, UnsubAck, Unsubscribe, Will, encode)
from rocket.gateway.mqtt.packets import V5, V311, Reason
from tests.conftest import ServerProcess
from tests.integration.test_mqtt_clients import mosquitto_clients  # noqa: F401 (autouse: skip, or fail on CI)


def rocket(server: ServerProcess, *args: str) -> str:
    return subprocess.run([sys.executable, "-m", "rocket", *args, "--server", server.server], check=True,
                          capture_output=True, text=True, timeout=60).stdout


def start(server: ServerProcess, *extra: str) -> ServerProcess:
    server.start(extra=("--mqtt-listen", "127.0.0.1:0", *extra))
    assert server.mqtt_port
    return server


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    path = tmp_path_factory.mktemp("mqtt")
    server = start(ServerProcess(path / "data", path / "server.log"))
    rocket(server, "topic", "create", "sensors", "--queues", "4")
    rocket(server, "topic", "create", "plant", "--queues", "2")
    yield server
    server.kill()
    assert b"Traceback" not in server.log_path.read_bytes()


class Client:
    """An MQTT client of rocket's codec, over a blocking socket: each packet sent and received is the test's."""

    def __init__(self, port: int, client_id: str, version: int = V5, clean: bool = True, expiry_s: int = 0,
                 will: Will | None = None, username: str | None = None, password: bytes | None = None,
                 connect: bool = True):
        self.version = version
        self.socket = socket.create_connection(("127.0.0.1", port), timeout=20)
        self.decoder = Decoder(version=version)
        self.connack: ConnAck | None = None
        self._packets: list = []
        if connect:
            properties = {"session_expiry_interval": expiry_s} if version == V5 and expiry_s else {}
            self.send(Connect(client_id, version, clean, 60, username, password, will, properties))
            self.connack = self.receive()
            assert isinstance(self.connack, ConnAck)

    def send(self, packet) -> None:
        self.socket.sendall(encode(packet, self.version))

    def receive(self, timeout_s: float = 20):
        deadline = time.monotonic() + timeout_s
        while not self._packets:
            self.socket.settimeout(max(0.01, deadline - time.monotonic()))
            data = self.socket.recv(65536)
            if not data:
                raise EOFError("the server closed the connection")
            self._packets += self.decoder.feed(data)
        return self._packets.pop(0)

    def subscribe(self, *filters: str, qos: int = 1, packet_id: int = 1) -> list[int]:
        self.send(Subscribe(packet_id, [Subscription(text, qos) for text in filters]))
        answer = self.receive()
        assert isinstance(answer, SubAck) and answer.packet_id == packet_id
        return answer.reasons

    def publish(self, topic: str, payload: bytes, qos: int = 1, packet_id: int = 1, **options) -> list:
        """Publish, and finish its QoS exchange; returns the acks the server sent."""
        self.send(Publish(topic, payload, qos, packet_id=packet_id if qos else 0, **options))
        if qos == 0:
            return []
        first = self.receive()
        if qos == 1:
            return [first]
        self.send(Ack(PacketType.PUBREL, packet_id))
        return [first, self.receive()]

    def messages(self, count: int, timeout_s: float = 20) -> list[Publish]:
        """count PUBLISHes, each acknowledged (PUBACK, or PUBREC then PUBCOMP's PUBREL answered)."""
        found: list[Publish] = []
        deadline = time.monotonic() + timeout_s
        while len(found) < count:
            packet = self.receive(deadline - time.monotonic())
            if isinstance(packet, Publish):
                found.append(packet)
                if packet.qos == 1:
                    self.send(Ack(PacketType.PUBACK, packet.packet_id))
                elif packet.qos == 2:
                    self.send(Ack(PacketType.PUBREC, packet.packet_id))
            elif isinstance(packet, Ack) and packet.kind == PacketType.PUBREL:
                self.send(Ack(PacketType.PUBCOMP, packet.packet_id))
        return found

    def nothing_for(self, seconds: float) -> None:
        try:
            packet = self.receive(seconds)
        except (TimeoutError, socket.timeout):
            return
        raise AssertionError(f"expected nothing, got {packet}")

    def close(self, disconnect: bool = True) -> None:
        if disconnect:
            self.send(Disconnect())
        self.socket.close()


class Subscriber:
    """mosquitto_sub, line-buffered (stdbuf), its lines read in a thread: subscribed() once it printed its SUBACK."""

    def __init__(self, port: int, *args: str):
        self.process = subprocess.Popen(["stdbuf", "-oL", "mosquitto_sub", "-h", "127.0.0.1", "-p", str(port), "-d",
                                         "-v", *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.process.stdout:
            self.lines.put(line.rstrip("\n"))

    def subscribed(self, timeout_s: float = 20) -> None:
        deadline = time.monotonic() + timeout_s
        while "SUBACK" not in self.lines.get(timeout=max(0.01, deadline - time.monotonic())):
            pass

    def messages(self, count: int, timeout_s: float = 20) -> list[str]:
        found: list[str] = []
        deadline = time.monotonic() + timeout_s
        while len(found) < count:
            line = self.lines.get(timeout=max(0.01, deadline - time.monotonic()))
            if not line.startswith("Client ") and not line.startswith("Subscribed"):
                found.append(line)
        return found

    def stop(self) -> None:
        self.process.kill()
        self.process.wait()


def publish(port: int, *args: str) -> None:
    subprocess.run(["mosquitto_pub", "-h", "127.0.0.1", "-p", str(port), *args], check=True, timeout=30,
                   capture_output=True)


@pytest.mark.parametrize("version", ["mqttv311", "mqttv5"])
def test_qos_0_1_and_2_round_trip_and_cross_rocket_api_both_ways(broker, version):
    subscriber = Subscriber(broker.mqtt_port, "-V", version, "-q", "2", "-t", f"sensors/{version}/#", "-i",
                            f"sub-{version}")
    try:
        subscriber.subscribed()
        for qos in (0, 1, 2):
            extra = ["-D", "publish", "user-property", "unit", "celsius"] if version == "mqttv5" else []
            publish(broker.mqtt_port, "-V", version, "-q", str(qos), "-t", f"sensors/{version}/room{qos}",
                    "-m", f"qos {qos}", *extra)
        rocket(broker, "send", "sensors", "over rocket", "--tag", f"{version}/api")
        assert sorted(subscriber.messages(4)) == sorted(
            [f"sensors/{version}/room{qos} qos {qos}" for qos in (0, 1, 2)] + [f"sensors/{version}/api over rocket"])
    finally:
        subscriber.stop()
    found = consumed(broker, "sensors", f"reader-{version}", 1, "--tag", f"{version}/room1")
    assert len(found) == 1
    assert found[0]["tag"] == f"{version}/room1"  # the levels after the topic's first
    properties = found[0]["properties"]
    assert properties["mqtt.client"] and "mqtt.qos" not in properties  # QoS 1, the default
    assert (properties.get("unit") == "celsius") == (version == "mqttv5")


def test_one_message_crosses_mqtt_grpc_and_remoting_both_ways(broker):
    """Published over MQTT, it is pulled over remoting and received by the official RocketMQ 5 client; sent over
    remoting and gRPC, it arrives over MQTT on the topic and tag's levels."""
    pytest.importorskip("rocketmq.grpc_protocol", reason="needs rocketmq-python-client (pip install -e '.[test]')")
    from rocket.gateway.remoting import messages as layout
    from tests.integration.test_remoting import pull, send
    from tests.integration.test_rocketmq_compat import run_client
    from tests.remoting_client import RemotingClient

    rocket(broker, "topic", "create", "crossing", "--queues", "1")
    reader = Client(broker.mqtt_port, "crossing-reader")
    reader.subscribe("crossing/#")
    writer = Client(broker.mqtt_port, "crossing-writer")
    writer.publish("crossing/line/1", b"from mqtt", properties={"user_property": [("colour", "blue")]})
    assert reader.messages(1)[0].payload == b"from mqtt"
    remoting = RemotingClient(broker.tcp_port)
    try:
        code, _, pulled = pull(remoting, "crossing", 0, 0)
        assert code == 0 and [message["body"] for message in pulled] == [b"from mqtt"]
        assert pulled[0]["properties"][layout.TAGS] == "line/1" and pulled[0]["properties"]["colour"] == "blue"
        send(remoting, "crossing", b"from remoting", properties={layout.TAGS: "remoting/1"})
    finally:
        remoting.close()
    run_client(broker, "crossing", """
        producer = Producer(config, (topic,))
        producer.startup()
        producer.send(message("from grpc", tag="grpc/1"))
        producer.shutdown()
        report({})
    """)
    arrived = {(message.topic, message.payload) for message in reader.messages(2)}
    assert arrived == {("crossing/remoting/1", b"from remoting"), ("crossing/grpc/1", b"from grpc")}
    received = run_client(broker, "crossing", """
        consumer = SimpleConsumer(config, "grpc-readers", {topic: FilterExpression("line/1")}, 25)
        consumer.startup()
        report({"got": receive_all(consumer, 1)})
        consumer.shutdown()
    """)
    [got] = received["got"]
    assert (got["body"], got["tag"], got["properties"]["colour"]) == ("from mqtt", "line/1", "blue")
    for client in (reader, writer):
        client.close()


def test_qos_2_is_stored_once_when_the_publish_comes_again_before_its_release(broker):
    subscriber = Client(broker.mqtt_port, "qos2-reader")
    assert subscriber.subscribe("plant/qos2/#", qos=2) == [2]
    publisher = Client(broker.mqtt_port, "qos2-writer")
    publisher.send(Publish("plant/qos2/a", b"once", 2, packet_id=7))
    assert publisher.receive() == Ack(PacketType.PUBREC, 7)
    publisher.send(Publish("plant/qos2/a", b"once", 2, dup=True, packet_id=7))  # its PUBREC was "lost"
    assert publisher.receive() == Ack(PacketType.PUBREC, 7)
    publisher.send(Ack(PacketType.PUBREL, 7))
    assert publisher.receive() == Ack(PacketType.PUBCOMP, 7)
    delivered = subscriber.messages(1)
    assert delivered[0].payload == b"once" and delivered[0].qos == 2
    assert subscriber.receive() == Ack(PacketType.PUBREL, delivered[0].packet_id)
    subscriber.send(Ack(PacketType.PUBCOMP, delivered[0].packet_id))
    subscriber.nothing_for(2)
    publisher.close()
    subscriber.close()


def test_retained_messages_reach_new_subscribers_until_cleared(broker):
    live = Client(broker.mqtt_port, "live-reader")
    live.send(Subscribe(1, [Subscription("sensors/retained/#", 1), Subscription("sensors/retained/door", 1,
                                                                                    retain_as_published=True)]))
    assert live.receive() == SubAck(1, [1, 1])
    publish(broker.mqtt_port, "-q", "1", "-r", "-t", "sensors/retained/door", "-m", "open")
    publish(broker.mqtt_port, "-q", "1", "-r", "-t", "sensors/retained/window", "-m", "shut")
    late = Client(broker.mqtt_port, "late-reader")
    late.subscribe("sensors/retained/+")
    found = late.messages(2)
    assert sorted((message.topic, message.payload, message.retain) for message in found) == [
        ("sensors/retained/door", b"open", True), ("sensors/retained/window", b"shut", True)]
    late.close()
    delivered = {message.topic: message.retain for message in live.messages(2)}
    assert delivered == {"sensors/retained/door": True, "sensors/retained/window": False}  # Retain As Published
    live.close()
    kept = subprocess.run([sys.executable, "-m", "rocket", "kv", "get", "mqtt.retained", "sensors/retained/door",
                           "--server", broker.server], check=True, capture_output=True, timeout=60).stdout
    assert b"open" in kept  # the message as a batch of one
    publish(broker.mqtt_port, "-q", "1", "-r", "-n", "-t", "sensors/retained/door")  # an empty one clears it
    later = Client(broker.mqtt_port, "later-reader")
    later.subscribe("sensors/retained/+")
    assert [message.topic for message in later.messages(1)] == ["sensors/retained/window"]
    later.nothing_for(1)
    later.close()


def test_more_retained_messages_than_the_clients_window_all_arrive(broker):
    """Retained messages past the client's Receive Maximum wait for its PUBACKs, which the connection goes on
    reading."""
    writer = Client(broker.mqtt_port, "many-retained")
    for index in range(6):
        writer.publish(f"plant/many/{index}", b"%d" % index, retain=True, packet_id=index + 1)
    writer.close()
    reader = Client(broker.mqtt_port, "small-window", connect=False)
    reader.send(Connect("small-window", V5, True, 60, properties={"receive_maximum": 2}))
    assert isinstance(reader.receive(), ConnAck)
    reader.send(Subscribe(1, [Subscription("plant/many/#", 1)]))
    assert reader.receive() == SubAck(1, [1])
    assert sorted(message.payload for message in reader.messages(6)) == [b"%d" % index for index in range(6)]
    reader.close()


def test_wildcards_match_levels_and_unsubscribe_stops_delivery(broker):
    reader = Client(broker.mqtt_port, "wild-reader")
    assert reader.subscribe("plant/+/temp", "plant/a/#") == [1, 1]
    writer = Client(broker.mqtt_port, "wild-writer")
    for topic in ("plant/a/temp", "plant/b/temp", "plant/b/humidity", "plant/a/x/y", "plant"):
        writer.publish(topic, topic.encode())
    assert sorted(message.topic for message in reader.messages(3)) == ["plant/a/temp", "plant/a/x/y", "plant/b/temp"]
    reader.nothing_for(1)  # plant/a/temp matched two filters and came once; the others matched none
    reader.send(Unsubscribe(2, ["plant/+/temp", "plant/none"]))
    assert reader.receive() == UnsubAck(2, [Reason.SUCCESS, Reason.NO_SUBSCRIPTION_EXISTED])
    writer.publish("plant/b/temp", b"after")
    writer.publish("plant/a/temp", b"still")
    assert [message.payload for message in reader.messages(1)] == [b"still"]
    reader.nothing_for(1)
    for client in (reader, writer):
        client.close()


def test_a_will_goes_out_when_a_connection_drops_and_not_after_a_disconnect(broker):
    watcher = Client(broker.mqtt_port, "will-watcher")
    watcher.subscribe("sensors/wills/#")
    polite = Client(broker.mqtt_port, "polite", will=Will("sensors/wills/polite", b"gone", 1))
    polite.close(disconnect=True)
    dropped = Client(broker.mqtt_port, "dropped", version=V311, will=Will("sensors/wills/dropped", b"gone", 1))
    dropped.close(disconnect=False)
    assert [(message.topic, message.payload) for message in watcher.messages(1)] == [("sensors/wills/dropped",
                                                                                       b"gone")]
    watcher.nothing_for(1)
    watcher.close()


def test_a_silent_client_is_dropped_after_its_keep_alive_and_its_will_goes_out(broker):
    watcher = Client(broker.mqtt_port, "keep-alive-watcher")
    watcher.subscribe("sensors/silent/#")
    silent = Client(broker.mqtt_port, "silent", connect=False)
    silent.send(Connect("silent", V5, True, 1, will=Will("sensors/silent/will", b"timed out", 1)))
    assert isinstance(silent.receive(), ConnAck)
    started = time.monotonic()
    assert silent.receive(timeout_s=10) == Disconnect(Reason.KEEP_ALIVE_TIMEOUT, {
        "reason_string": "no packet within 1.5 times the keep-alive"})
    assert 1.4 < time.monotonic() - started < 5
    assert watcher.messages(1)[0].payload == b"timed out"
    watcher.close()


def connections(server: ServerProcess) -> dict[str, int]:
    """rocket_mqtt_connections on the server's /metrics, by state."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{server.http_port}/metrics", timeout=10).read().decode()
    return {state: int(float(count)) for state, count in
            re.findall(r'^rocket_mqtt_connections\{state="(\w+)"\} (\S+)$', text, re.MULTILINE)}


def consumed(server: ServerProcess, topic: str, group: str, count: int, *options: str) -> list[dict]:
    return [orjson.loads(line) for line in rocket(server, "consume", topic, "--group", group, "--format", "json",
                                                  "--count", str(count), *options).splitlines()
            if line.startswith("{")]


def until(condition, timeout_s: float = 20) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "not within the time"
        time.sleep(0.1)


def test_an_idle_connection_parks_and_every_packet_wakes_it(broker):
    """An idle connection gives up its task (parking.py): the parking answers its PINGREQ, and a PUBLISH (with a
    topic alias set before it parked), a SUBSCRIBE or the end of the connection wake it, served as ever. A subscriber
    whose subscriptions wait for new data parks too; a message published to its topic wakes it, and it parks again."""
    until(lambda: connections(broker).get("served", 1) == 0)  # what earlier tests left is closed or parked
    device = Client(broker.mqtt_port, "parked-device")
    until(lambda: connections(broker)["served"] == 0)  # parked at once after CONNECT
    device.send(PingReq())
    assert isinstance(device.receive(), PingResp)
    assert device.publish("sensors/parked/a", b"1", properties={"topic_alias": 3}) == [Ack(PacketType.PUBACK, 1)]
    until(lambda: connections(broker)["served"] == 0)  # idle for limits.mqtt_park_after_s, parked again
    assert device.publish("", b"2", packet_id=2, properties={"topic_alias": 3}) == [Ack(PacketType.PUBACK, 2)]
    assert [message["body"] for message in consumed(broker, "sensors", "parked-reader", 2, "--tag", "parked/a")] == [
        "1", "2"]
    until(lambda: connections(broker)["served"] == 0)
    assert device.subscribe("sensors/parked/#") == [1]
    until(lambda: connections(broker)["served"] == 0)  # parked, subscribed: its topic's watch wakes it
    writer = Client(broker.mqtt_port, "parked-writer")
    for body in (b"3", b"4"):  # the second after the subscriber parked again
        writer.publish("sensors/parked/b", body)
        assert device.messages(1)[0].payload == body
        until(lambda: connections(broker)["served"] == 0)
    device.send(PingReq())
    assert isinstance(device.receive(), PingResp)
    writer.publish("sensors/elsewhere", b"5")  # the same topic's data, for no filter of the subscriber's
    writer.publish("sensors/parked/c", b"6")
    assert device.messages(1)[0].payload == b"6"
    writer.close()
    device.close()
    until(lambda: connections(broker) == {"served": 0, "parked": 0})  # every connection counted until closed


def test_a_parked_connection_is_taken_over(broker):
    first = Client(broker.mqtt_port, "parked-twice")
    until(lambda: connections(broker)["served"] == 0)
    second = Client(broker.mqtt_port, "parked-twice")
    assert first.receive() == Disconnect(Reason.SESSION_TAKEN_OVER)
    second.send(PingReq())
    assert isinstance(second.receive(), PingResp)
    second.close()


def test_parked_connections_end_with_their_wills_when_the_broker_stops(tmp_path):
    server = start(ServerProcess(tmp_path / "data", tmp_path / "server.log"))
    try:
        rocket(server, "topic", "create", "sensors", "--queues", "2")
        devices = [Client(server.mqtt_port, f"stopped-{index}", version=V311,
                          will=Will(f"sensors/stopped/{index}", b"broker went away", 1)) for index in range(3)]
        until(lambda: connections(server) == {"served": 0, "parked": 3})
        assert server.terminate() == 0
        for device in devices:
            with pytest.raises(EOFError):
                device.receive()
        server.start(extra=("--mqtt-listen", "127.0.0.1:0"))
        wills = consumed(server, "sensors", "will-reader", 3)
        assert sorted((message["tag"], message["body"]) for message in wills) == [
            (f"stopped/{index}", "broker went away") for index in range(3)]
    finally:
        server.kill()
    assert b"Traceback" not in server.log_path.read_bytes()


def test_a_session_expires_after_its_interval(broker):
    brief = Client(broker.mqtt_port, "brief", clean=False, expiry_s=1)
    brief.subscribe("sensors/brief/#")
    brief.close()
    kept = Client(broker.mqtt_port, "brief", clean=False, expiry_s=1)
    assert kept.connack.session_present  # within its interval
    kept.close()
    time.sleep(2.5)
    gone = Client(broker.mqtt_port, "brief", clean=False, expiry_s=1)
    assert not gone.connack.session_present
    gone.close()


def test_a_session_ended_with_expiry_0_is_dropped(broker):
    """A persistent session's record goes when its DISCONNECT sets its expiry to 0 (the gateway deletes a session's
    record at its end only when it loaded or saved one: a clean session's end writes nothing)."""
    ending = Client(broker.mqtt_port, "ending", clean=False, expiry_s=300)
    ending.subscribe("sensors/ending/#")
    ending.send(Disconnect(Reason.SUCCESS, {"session_expiry_interval": 0}))
    with pytest.raises(EOFError):
        ending.receive()  # the server closes once the session is dropped
    ending.socket.close()
    again = Client(broker.mqtt_port, "ending", clean=False, expiry_s=300)
    assert not again.connack.session_present
    again.close()


def test_a_shared_subscription_spreads_messages_over_its_members_once_each(broker):
    members = [Client(broker.mqtt_port, f"member-{index}") for index in range(2)]
    for member in members:
        assert member.subscribe("$share/workers/plant/jobs/#") == [1]
    writer = Client(broker.mqtt_port, "jobs-writer")
    topics = [f"plant/jobs/{index % 7}" for index in range(40)]
    for index, topic in enumerate(topics):
        writer.publish(topic, str(index).encode(), packet_id=index % 60000 + 1)
    got: list[list[bytes]] = [[], []]
    deadline = time.monotonic() + 30
    while len(got[0]) + len(got[1]) < len(topics) and time.monotonic() < deadline:
        for index, member in enumerate(members):
            try:
                got[index] += [message.payload for message in member.messages(1, timeout_s=0.3)]
            except (TimeoutError, socket.timeout, queue.Empty):
                pass
    assert sorted(got[0] + got[1], key=int) == [str(index).encode() for index in range(40)]
    assert got[0] and got[1], "both members received"
    assert "lag" in rocket(broker, "group", "describe", "plant", "--group", "workers").lower()
    for client in (*members, writer):
        client.close()


def test_an_unacknowledged_delivery_comes_again_marked_dup_to_the_resumed_session(broker):
    reader = Client(broker.mqtt_port, "forgetful", clean=False, expiry_s=600)
    reader.subscribe("plant/forget/#")
    Client(broker.mqtt_port, "forget-writer").publish("plant/forget/x", b"ack me")
    first = reader.receive()
    assert isinstance(first, Publish) and not first.dup
    reader.close(disconnect=False)  # gone without its PUBACK
    again = Client(broker.mqtt_port, "forgetful", clean=False, expiry_s=600)
    assert again.connack.session_present
    message = again.messages(1)[0]
    assert (message.payload, message.dup) == (b"ack me", True)
    again.close()


def test_a_qos_2_delivery_comes_again_with_its_packet_id_until_received(broker):
    """Exactly once at QoS 2 across connections: what a persistent session got and did not PUBREC comes again with
    the same packet id and DUP, so the client knows it; PUBREL follows its PUBREC, then nothing more."""
    reader = Client(broker.mqtt_port, "qos2-keeper", clean=False, expiry_s=600)
    reader.subscribe("plant/keep/#", qos=2)
    Client(broker.mqtt_port, "qos2-sender").publish("plant/keep/a", b"exactly once", qos=2)
    first = reader.receive()
    assert isinstance(first, Publish) and first.qos == 2 and not first.dup
    reader.close(disconnect=False)  # gone before its PUBREC
    again = Client(broker.mqtt_port, "qos2-keeper", clean=False, expiry_s=600)
    second = again.receive()
    assert isinstance(second, Publish) and (second.payload, second.packet_id, second.dup) == (
        b"exactly once", first.packet_id, True)
    again.send(Ack(PacketType.PUBREC, second.packet_id))
    assert again.receive() == Ack(PacketType.PUBREL, second.packet_id)
    again.send(Ack(PacketType.PUBCOMP, second.packet_id))
    again.nothing_for(2)
    again.close()


def test_a_persistent_session_survives_a_kill_9_of_its_broker(tmp_path):
    server = start(ServerProcess(tmp_path / "data", tmp_path / "server.log"))
    try:
        rocket(server, "topic", "create", "sensors", "--queues", "4")
        device = Client(server.mqtt_port, "device-7", clean=False, expiry_s=3600)
        assert not device.connack.session_present
        assert device.subscribe("sensors/device-7/#") == [1]
        device.close()
        writer = Client(server.mqtt_port, "writer")
        for index in range(5):
            assert writer.publish(f"sensors/device-7/cmd{index}", b"%d" % index) == [Ack(PacketType.PUBACK, 1)]
        writer.close()
        server.kill()
        server.start(extra=("--mqtt-listen", "127.0.0.1:0"))
        device = Client(server.mqtt_port, "device-7", clean=False, expiry_s=3600)
        assert device.connack.session_present
        assert sorted(message.payload for message in device.messages(5)) == [b"0", b"1", b"2", b"3", b"4"]
        device.close()
        fresh = Client(server.mqtt_port, "device-7", clean=True)
        assert not fresh.connack.session_present
        fresh.close()
    finally:
        server.kill()


def test_paho_publishes_and_subscribes_with_mqtt_5_properties(broker):
    from paho.mqtt import client as paho
    from paho.mqtt.packettypes import PacketTypes
    from paho.mqtt.properties import Properties

    received: queue.Queue = queue.Queue()
    subscribed = threading.Event()
    client = paho.Client(paho.CallbackAPIVersion.VERSION2, client_id="paho-1", protocol=paho.MQTTv5)
    client.on_message = lambda _client, _data, message: received.put(message)
    client.on_subscribe = lambda *_: subscribed.set()
    client.connect("127.0.0.1", broker.mqtt_port)
    client.loop_start()
    try:
        client.subscribe("plant/paho/#", qos=1)
        assert subscribed.wait(20)
        properties = Properties(PacketTypes.PUBLISH)
        properties.UserProperty = [("batch", "42")]
        properties.ContentType = "text/plain"
        properties.TopicAlias = 3
        client.publish("plant/paho/line", b"first", qos=1, properties=properties).wait_for_publish(20)
        aliased = Properties(PacketTypes.PUBLISH)
        aliased.TopicAlias = 3
        client.publish("", b"second", qos=1, properties=aliased).wait_for_publish(20)  # the alias names the topic
        messages = [received.get(timeout=20), received.get(timeout=20)]
    finally:
        client.loop_stop()
        client.disconnect()
    assert [(message.topic, message.payload) for message in messages] == [("plant/paho/line", b"first"),
                                                                           ("plant/paho/line", b"second")]
    assert messages[0].properties.UserProperty == [("batch", "42")]
    assert messages[0].properties.ContentType == "text/plain"


def test_mqtt_js_publishes_and_subscribes(broker):
    script = """
const mqtt = require('mqtt');
const url = `mqtt://127.0.0.1:${process.env.MQTT_PORT}`;
const reader = mqtt.connect(url, {protocolVersion: 5, clientId: 'js-reader'});
reader.on('connect', () => reader.subscribe('plant/js/#', {qos: 1}, () => {
  const writer = mqtt.connect(url, {clientId: 'js-writer'});
  writer.on('connect', () => writer.publish('plant/js/a', 'from mqtt.js', {qos: 1}, () => writer.end()));
}));
reader.on("message", (topic, payload) => { console.log(`${topic} ${payload}`); reader.end(() => process.exit(0)); });
setTimeout(() => { console.log('timeout'); process.exit(1); }, 20000);
"""
    node_modules = os.path.join(os.path.dirname(__file__), "..", "node", "node_modules")
    if not os.path.isdir(os.path.join(node_modules, "mqtt")):
        if os.environ.get("CI") == "true":
            pytest.fail("CI: no mqtt in tests/node (npm ci --prefix tests/node)")
        pytest.skip("no mqtt in tests/node (npm ci --prefix tests/node)")
    done = subprocess.run(["node", "-e", script], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "NODE_PATH": os.path.abspath(node_modules),
                               "MQTT_PORT": str(broker.mqtt_port)})
    assert done.stdout.strip() == "plant/js/a from mqtt.js", done.stderr


def test_wildcard_first_levels_and_unknown_topics_are_refused_by_reason(broker):
    client = Client(broker.mqtt_port, "refused")
    assert client.subscribe("#", "+/x", "nosuchtopic/x", "sensors/ok") == [
        Reason.WILDCARD_SUBSCRIPTIONS_NOT_SUPPORTED, Reason.WILDCARD_SUBSCRIPTIONS_NOT_SUPPORTED,
        Reason.TOPIC_FILTER_INVALID, 1]  # no rocket topic "nosuchtopic": a filter that is not one
    [answer] = client.publish("nosuchtopic/x", b"lost", packet_id=9)
    assert (answer.kind, answer.packet_id, answer.reason) == (PacketType.PUBACK, 9, Reason.TOPIC_NAME_INVALID)
    assert "UNKNOWN_TOPIC" in answer.properties["reason_string"]
    client.close()
    old = Client(broker.mqtt_port, "refused-311", version=V311)
    old.send(Publish("nosuchtopic/x", b"lost", 1, packet_id=1))
    with pytest.raises(EOFError):  # MQTT 3.1.1 has no failed PUBACK: the connection closes
        old.receive()


# ---- credentials ---------------------------------------------------------------------------------------------


def test_credentials_are_checked_and_acl_actions_apply(tmp_path):
    from tests.integration.test_auth import ADMIN, ALICE, CLUSTER_SECRET

    from unittest import mock

    server = ServerProcess(tmp_path / "data", tmp_path / "server.log")
    with mock.patch.dict(os.environ, {"ROCKET_CLUSTER_SECRET": CLUSTER_SECRET, "ROCKET_AUTH": "true",
                                      "ROCKET_AUTH_ADMIN_SECRET": ADMIN.secret}):
        start(server)
    try:
        admin = ("--user", ADMIN.user, "--secret", ADMIN.secret)
        rocket(server, *admin, "topic", "create", "sensors", "--queues", "2")
        rocket(server, *admin, "acl", "user", "create", ALICE.user, "--user-secret", ALICE.secret)
        rocket(server, *admin, "acl", "grant", ALICE.user, "--resource", "topic:sensors", "--actions", "pub")
        time.sleep(1.5)  # the policy reaches the broker within a heartbeat
        for password in (b"wrong-secret", None):
            refused = Client(server.mqtt_port, "intruder", username=ALICE.user, password=password)
            assert refused.connack.reason == Reason.BAD_USER_NAME_OR_PASSWORD
        old = Client(server.mqtt_port, "intruder-311", version=V311, username=ALICE.user, password=b"wrong")
        assert old.connack.reason == 4  # 3.1.1's "bad user name or password"
        done = subprocess.run(["mosquitto_pub", "-h", "127.0.0.1", "-p", str(server.mqtt_port), "-u", ALICE.user,
                               "-P", "wrong", "-t", "sensors/x", "-m", "x"], capture_output=True, text=True,
                              timeout=30)
        assert done.returncode != 0
        alice = Client(server.mqtt_port, "alice-1", username=ALICE.user, password=ALICE.secret.encode())
        assert alice.connack.reason == Reason.SUCCESS
        [answer] = alice.publish("sensors/x", b"allowed")
        assert answer.reason == Reason.SUCCESS
        assert alice.subscribe("sensors/#") == [Reason.NOT_AUTHORIZED]  # pub only
        alice.close()
    finally:
        server.kill()


def test_a_brokers_mqtt_lies_in_its_namespace(tmp_path, monkeypatch):
    """mqtt_namespace: first levels name topics of that namespace, sessions and retained messages keep to its buckets,
    and its groups are its own; a client of rocket's API in the namespace sees MQTT's messages by their names."""
    monkeypatch.setenv("ROCKET_MQTT_NAMESPACE", "iot")
    server = start(ServerProcess(tmp_path / "data", tmp_path / "server.log"))
    try:
        rocket(server, "topic", "create", "sensors", "--queues", "2", "--namespace", "iot")
        device = Client(server.mqtt_port, "ns-device", clean=False, expiry_s=600)
        assert device.subscribe("sensors/#", "$share/crew/sensors/shared/#") == [1, 1]
        writer = Client(server.mqtt_port, "ns-writer")
        [answer] = writer.publish("sensors/a", b"in iot", retain=True)
        assert answer.reason == Reason.SUCCESS
        assert device.messages(1)[0].topic == "sensors/a"
        rocket(server, "send", "sensors", "from the api", "--tag", "b", "--namespace", "iot")
        assert device.messages(1)[0].topic == "sensors/b"
        consumed = rocket(server, "consume", "sensors", "--group", "reader", "--count", "2", "--format", "raw",
                          "--namespace", "iot")
        assert sorted(consumed.split("\n")[:2]) == ["from the api", "in iot"]
        groups = rocket(server, "group", "describe", "sensors", "--group", "mqtt-ns-device", "--namespace", "iot")
        assert "sensors" in groups
        for listed, expected in (("iot%mqtt.retained", "sensors/a"), ("iot%mqtt.sessions", "ns-device")):
            assert expected in rocket(server, "kv", "ls", listed, "--keys-only"), listed
        writer.publish("nosuch/a", b"x")  # the default namespace's topics are not MQTT's here
        [refused] = writer.publish("nosuch/a", b"x", packet_id=2)
        assert refused.reason == Reason.TOPIC_NAME_INVALID
        late = Client(server.mqtt_port, "ns-late")
        late.subscribe("sensors/+")
        assert [(message.topic, message.retain) for message in late.messages(1)] == [("sensors/a", True)]
        for client in (device, writer, late):
            client.close()
    finally:
        server.kill()


def test_one_rocket_topic_takes_every_mqtt_topic(tmp_path, monkeypatch):
    """mqtt_topic: every MQTT topic lies in one rocket topic, whole as its tag, so first levels need no topic each
    (a device id, say) and filters may start with a wildcard; retained messages and rocket's API follow."""
    monkeypatch.setenv("ROCKET_MQTT_TOPIC", "devices")
    server = start(ServerProcess(tmp_path / "data", tmp_path / "server.log"))
    try:
        rocket(server, "topic", "create", "devices", "--queues", "2")
        watcher = Client(server.mqtt_port, "watcher")
        assert watcher.subscribe("+/temp") == [1]
        writer = Client(server.mqtt_port, "writer")
        for number, name in enumerate(("dev-1/temp", "dev-2/temp", "dev-2/humidity"), start=1):
            [answer] = writer.publish(name, name.encode(), packet_id=number, retain=True)
            assert answer.reason == Reason.SUCCESS
        assert sorted(message.topic for message in watcher.messages(2)) == ["dev-1/temp", "dev-2/temp"]
        rocket(server, "send", "devices", "from the api", "--tag", "dev-3/temp")
        assert [message.payload for message in watcher.messages(1)] == [b"from the api"]
        consumed = rocket(server, "consume", "devices", "--group", "reader", "--count", "4", "--format", "json")
        assert sorted(orjson.loads(line)["tag"] for line in consumed.splitlines() if line.strip()) == [
            "dev-1/temp", "dev-2/humidity", "dev-2/temp", "dev-3/temp"]
        late = Client(server.mqtt_port, "late")
        late.subscribe("dev-2/#")
        assert sorted((message.topic, message.retain) for message in late.messages(2)) == [
            ("dev-2/humidity", True), ("dev-2/temp", True)]
        for client in (watcher, writer, late):
            client.close()
    finally:
        server.kill()


def test_mqtt_over_tls_with_the_nodes_certificate(tmp_path, monkeypatch):
    import trustme

    from tests.integration.test_tls import issue, write_ca

    ca = trustme.CA()
    cert, key = issue(ca, tmp_path / "tls", "node")
    ca_path = write_ca(ca, tmp_path / "tls" / "ca.pem")
    monkeypatch.setenv("ROCKET_TLS_CERT", str(cert))
    monkeypatch.setenv("ROCKET_TLS_KEY", str(key))
    server = start(ServerProcess(tmp_path / "data", tmp_path / "server.log"))
    try:
        subprocess.run([sys.executable, "-m", "rocket", "topic", "create", "sensors", "--queues", "2", "--server",
                        server.server, "--tls-ca", str(ca_path)], check=True, capture_output=True, timeout=60)
        tls = ("--cafile", str(ca_path))
        subscriber = Subscriber(server.mqtt_port, *tls, "-q", "1", "-t", "sensors/#")
        try:
            subscriber.subscribed()
            publish(server.mqtt_port, *tls, "-q", "1", "-t", "sensors/secure", "-m", "over tls")
            assert subscriber.messages(1) == ["sensors/secure over tls"]
        finally:
            subscriber.stop()
        plain = subprocess.run(["mosquitto_pub", "-h", "127.0.0.1", "-p", str(server.mqtt_port), "-t", "sensors/x",
                                "-m", "plain"], capture_output=True, timeout=30)
        assert plain.returncode != 0
    finally:
        server.kill()


# ---- hostile input ---------------------------------------------------------------------------------------------


def raw(port: int) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=20)


def closed_after(sock: socket.socket, timeout_s: float = 20) -> bytes:
    """What the server sent before it closed the connection."""
    sock.settimeout(timeout_s)
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    sock.close()
    return data


def test_malformed_and_oversized_packets_get_a_reason_and_a_close(broker):
    connect = encode(Connect("hostile", V5), V5)
    cases = {
        b"\x00\x00": Reason.MALFORMED_PACKET,  # packet type 0
        connect + b"\x82\x00": Reason.MALFORMED_PACKET,  # SUBSCRIBE without its packet id
        connect + b"\x30\xff\xff\xff\x7f": Reason.PACKET_TOO_LARGE,  # 256 MiB announced
        b"\x10\x05\x00\x04MQTT": Reason.MALFORMED_PACKET,  # CONNECT cut short
        connect + connect: Reason.PROTOCOL_ERROR,  # a second CONNECT
    }
    for sent, reason in cases.items():
        sock = raw(broker.mqtt_port)
        sock.sendall(sent)
        answer = Decoder(version=V5).feed(closed_after(sock))
        assert answer and answer[-1].reason == reason, (sent, answer)
    sock = raw(broker.mqtt_port)
    sock.sendall(b"\x10\xff\xff\x7f")  # a CONNECT of 2 MiB announced, before its body
    assert Decoder(version=V5).feed(closed_after(sock))[-1].reason == Reason.PACKET_TOO_LARGE
    Client(broker.mqtt_port, "still-serving").close()


def test_a_slowloris_connect_is_closed(broker):
    sock = raw(broker.mqtt_port)
    started = time.monotonic()
    sock.sendall(b"\x10\x20\x00")  # a CONNECT whose rest never comes
    assert closed_after(sock, timeout_s=30) == b""
    assert time.monotonic() - started < 25


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.binary(min_size=1, max_size=300))
def test_hostile_bytes_after_connect_never_break_the_server(broker, garbage):
    sock = raw(broker.mqtt_port)
    sock.sendall(encode(Connect(f"fuzz-{os.getpid()}", V5, keep_alive=5), V5) + garbage)
    sock.shutdown(socket.SHUT_WR)
    closed_after(sock)
    client = Client(broker.mqtt_port, "after-fuzz")
    client.close()
