"""The MQTT codec against real clients (Debian's mosquitto_pub and mosquitto_sub), at both protocol levels: a server
made of the codec alone, on 127.0.0.1, decodes what they send and answers with what it encodes, and they take it.
The gateway that maps MQTT onto rocket's topics builds on this codec (issue 57)."""

from __future__ import annotations

import functools
import os
import shutil

import pytest
import trio

from rocket.gateway.mqtt.codec import (Ack, ConnAck, Connect, Decoder, Disconnect, PacketType, PingReq, PingResp,
                                       Publish, SubAck, Subscribe, encode)



@pytest.fixture(autouse=True)
def mosquitto_clients() -> None:
    """Without mosquitto_pub and mosquitto_sub the tests skip; on CI (CI=true) they fail: ./test installs them."""
    if shutil.which("mosquitto_pub") is None or shutil.which("mosquitto_sub") is None:
        reason = "no mosquitto_pub or mosquitto_sub (apt-get install mosquitto-clients)"
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI: {reason}")
        pytest.skip(reason)


class CodecServer:
    """Answers CONNECT, PUBLISH (QoS 1 and 2), SUBSCRIBE (then publishes one message on the first filter) and
    PINGREQ; keeps every packet it decoded."""

    def __init__(self):
        self.received: list = []

    async def serve(self, stream: trio.SocketStream) -> None:
        decoder = Decoder()
        version = 5
        async with stream:
            while data := await stream.receive_some(65536):
                for packet in decoder.feed(data):
                    self.received.append(packet)
                    answers: list = []
                    if isinstance(packet, Connect):
                        version = packet.protocol_level
                        answers.append(ConnAck())
                    elif isinstance(packet, Publish) and packet.qos == 1:
                        answers.append(Ack(PacketType.PUBACK, packet.packet_id))
                    elif isinstance(packet, Publish) and packet.qos == 2:
                        answers.append(Ack(PacketType.PUBREC, packet.packet_id))
                    elif isinstance(packet, Ack) and packet.kind == PacketType.PUBREL:
                        answers.append(Ack(PacketType.PUBCOMP, packet.packet_id))
                    elif isinstance(packet, Subscribe):
                        answers.append(SubAck(packet.packet_id, [each.qos for each in packet.subscriptions]))
                        topic = packet.subscriptions[0].topic_filter.replace("#", "x").replace("+", "y")
                        answers.append(Publish(topic, b"from the codec", 1, packet_id=1,
                                               properties={"user_property": [("k", "v")]} if version == 5 else {}))
                    elif isinstance(packet, PingReq):
                        answers.append(PingResp())
                    elif isinstance(packet, Disconnect):
                        return
                    for answer in answers:
                        await stream.send_all(encode(answer, version))


async def serving(nursery) -> tuple[CodecServer, int]:
    server = CodecServer()
    listeners = await nursery.start(functools.partial(trio.serve_tcp, server.serve, 0, host="127.0.0.1"))
    return server, listeners[0].socket.getsockname()[1]


@pytest.mark.parametrize("version", ["mqttv311", "mqttv5"])
@pytest.mark.parametrize("qos", [0, 1, 2])
async def test_mosquitto_pub_publishes_through_the_codec(version, qos):
    async with trio.open_nursery() as nursery:
        server, port = await serving(nursery)
        extra = ["-D", "publish", "user-property", "colour", "blue"] if version == "mqttv5" else []
        with trio.fail_after(20):
            done = await trio.run_process(["mosquitto_pub", "-h", "127.0.0.1", "-p", str(port), "-V", version,
                                           "-i", "device-1", "-u", "alice", "-P", "secret", "-q", str(qos), "-r",
                                           "-t", "sensors/1/temperature", "-m", "21.5", *extra],
                                          capture_stdout=True, capture_stderr=True, check=False)
        nursery.cancel_scope.cancel()
    assert done.returncode == 0, done.stderr
    connect, publish = server.received[0], server.received[1]
    assert isinstance(connect, Connect) and connect.client_id == "device-1"
    assert (connect.username, connect.password) == ("alice", b"secret")
    assert connect.protocol_level == (4 if version == "mqttv311" else 5)
    assert isinstance(publish, Publish) and (publish.topic, publish.payload, publish.qos, publish.retain) == (
        "sensors/1/temperature", b"21.5", qos, True)
    if version == "mqttv5":
        assert publish.properties["user_property"] == [("colour", "blue")]


@pytest.mark.parametrize("version", ["mqttv311", "mqttv5"])
async def test_mosquitto_sub_subscribes_and_receives_through_the_codec(version):
    async with trio.open_nursery() as nursery:
        server, port = await serving(nursery)
        with trio.fail_after(20):
            done = await trio.run_process(["mosquitto_sub", "-h", "127.0.0.1", "-p", str(port), "-V", version,
                                           "-q", "1", "-t", "sensors/+/temperature", "-t", "alerts/#", "-C", "1",
                                           "-v"], capture_stdout=True, capture_stderr=True, check=False)
        nursery.cancel_scope.cancel()
    assert done.returncode == 0, done.stderr
    assert done.stdout.decode().strip() == "sensors/y/temperature from the codec"
    subscribe = next(packet for packet in server.received if isinstance(packet, Subscribe))
    assert [(each.topic_filter, each.qos) for each in subscribe.subscriptions] == [
        ("sensors/+/temperature", 1), ("alerts/#", 1)]
    assert any(isinstance(packet, Ack) and packet.kind == PacketType.PUBACK for packet in server.received)
