"""Raft links over TCP: TcpChannel.post (a request nobody waits for: a POST frame, never answered, to a server of
schema version 4 on), RaftStep served inline in the server's read loop (MethodSpec.inline), and PeerLinks posting over
one channel per peer, reconnecting once it breaks or its peer's host leaves its posts unacknowledged."""

from __future__ import annotations

import dataclasses
import logging
import time
from functools import partial

import pytest
import trio

from rocket import limits
from rocket.disk import peer_versions
from rocket.errors import Code, RocketError
from rocket.serde import avro_codec
from rocket.serde.schema import SCHEMA_VERSION
from rocket.transport import frames, methods
from rocket.transport.links import PeerLinks
from rocket.transport.peer_auth import PeerAuth
from rocket.transport.lifecycle import Lifecycle
from rocket.transport.rpc import Dispatcher
from rocket.transport.tcp import serve_tcp
from rocket.transport.channel import server_schema_version
from rocket.transport.frames import Kind
from rocket.transport.tcp_client import open_tcp_channel

SECRET = b"a cluster secret of some length"


def wall_ms() -> int:
    return int(time.time() * 1000)


class RaftServer:
    """A TCP server whose RaftStep handler records each payload, as RaftHost.receive would take it."""

    def __init__(self, secret: bytes | None = None):
        self.payloads: list[bytes] = []
        self.arrived = trio.Event()  # set once `expected` payloads arrived
        self.expected = 1
        self.observed: list[tuple[str, str | None]] = []  # (method, error) the dispatcher's telemetry saw
        self.dispatcher = Dispatcher()
        self.dispatcher.on_call = lambda method, seconds, error: self.observed.append((method, error))
        if secret is not None:
            self.dispatcher.guard.peers_only = True
            self.dispatcher.guard.peer_auth = PeerAuth(secret, 1, wall_ms)
        self.dispatcher.handle("RaftStep", self._raft_step)
        self.serving = trio.CancelScope()

    async def _raft_step(self, request: dict) -> dict:
        self.payloads.append(bytes(request["payload"]))
        if len(self.payloads) >= self.expected:
            self.arrived.set()
        return {}

    async def serve(self, nursery: trio.Nursery, port: int = 0) -> int:
        """Serve on port (0: any free one) until stop(); returns the port."""
        return await nursery.start(self._serve, port)

    async def _serve(self, port: int, task_status=trio.TASK_STATUS_IGNORED) -> None:
        with self.serving:
            await serve_tcp(self.dispatcher, Lifecycle(), "127.0.0.1", port, task_status=task_status)

    def stop(self) -> None:
        """Stop serving and close every connection, as a node that goes down."""
        self.serving.cancel()


def step(index: int) -> dict:
    return {"sender": 2, "payload": index.to_bytes(4, "big")}


async def test_a_refused_post_is_logged_by_the_server_and_neither_fails_the_channel_nor_stays_behind(nursery, caplog):
    """Posts a server refuses (RaftStep from a connection that said no PeerHello) get no answer: the server logs
    them, the first as a warning and the rest at debug level, each with the code; the channel keeps working and holds
    nothing for them."""
    caplog.set_level(logging.DEBUG, logger="rocket.tcp")
    server = RaftServer(SECRET)
    port = await server.serve(nursery)
    async with open_tcp_channel("127.0.0.1", port, "avro") as channel:
        for index in range(50):
            await channel.post("RaftStep", step(index))
        # Requests are served in order on one connection: once Hello is answered, the fifty before it were served.
        assert await channel.hello() == channel.peer_version
        assert not channel.closed.is_set() and channel._waiting == {}
    refusals = [record.levelno for record in caplog.records
                if record.name == "rocket.tcp" and "UNAUTHENTICATED" in record.getMessage()]
    assert refusals == [logging.WARNING] + [logging.DEBUG] * 49
    assert server.payloads == []


@pytest.mark.parametrize("server_version", [4, 3])
async def test_a_post_is_a_post_frame_to_a_new_server_and_an_answered_request_to_an_older_one(
        nursery, monkeypatch, server_version):
    """A server of schema version 4 on answers no post: the channel writes POST frames and reads nothing back for
    them. To an older one (version 3) the channel writes requests, which it answers, and the channel drops the
    answers. Either way the payloads arrive in order."""
    written: list[tuple[Kind, str]] = []
    encode_parts = frames.encode_parts
    encoded: list[str] = []  # the type of each Avro message encoded, on either side
    encode = avro_codec.encode
    monkeypatch.setattr(avro_codec, "encode", lambda type_name, message: (encoded.append(type_name),
                                                                          encode(type_name, message))[1])

    def recording(kind, serde_id, request_id, body, method="", attachment=None):
        written.append((Kind(kind), method))
        return encode_parts(kind, serde_id, request_id, body, method, attachment)

    monkeypatch.setattr(frames, "encode_parts", recording)
    server = RaftServer()
    server.expected = 20

    async def hello(request: dict) -> dict:
        return {"schema_version": server_version, "version": "old" if server_version < 4 else "new"}

    server.dispatcher._handlers["Hello"] = hello
    port = await server.serve(nursery)
    async with open_tcp_channel("127.0.0.1", port, "avro") as channel:
        assert channel.peer_version == server_version
        written.clear()
        for index in range(20):
            await channel.post("RaftStep", step(index))
        with trio.fail_after(5):
            await server.arrived.wait()
            await server_schema_version(channel)  # answered after the posts: any answer to them came before
    assert server.payloads == [step(index)["payload"] for index in range(20)]
    posted = [entry for entry in written if entry[1] == "RaftStep"]
    answers = [kind for kind, _ in written if kind == Kind.RESPONSE]
    answer_type = methods.method_spec("RaftStep").response_type
    if server_version >= 4:  # nor is an answer encoded that nobody would hear
        assert posted == [(Kind.POST, "RaftStep")] * 20 and len(answers) == 1  # Hello's
        assert encoded.count(answer_type) == 0
    else:
        assert posted == [(Kind.REQUEST, "RaftStep")] * 20 and len(answers) == 21
        assert encoded.count(answer_type) == 20


async def test_hostile_posts_are_refused_in_one_line_and_the_server_goes_on(nursery, caplog):
    """Over a raw socket: a POST of a method that waits (Produce) closes the connection with a one-line BAD_FRAME; a
    POST of RaftStep with a body that is not one is logged and answered with nothing, and the connection goes on."""
    server = RaftServer()
    port = await server.serve(nursery)

    async def answers(stream: trio.SocketStream, data: bytes) -> list[frames.Frame]:
        await stream.send_all(data)
        decoder, found = frames.FrameDecoder(), []
        with trio.move_on_after(1):
            while chunk := await stream.receive_some(65536):
                decoder.feed(chunk)
                while (frame := decoder.next_frame()) is not None:
                    found.append(frame)
        return found

    async with await trio.open_tcp_stream("127.0.0.1", port) as stream:
        [refusal] = await answers(stream, frames.encode(Kind.POST, 1, 5, b"{}", "Produce"))
    assert (refusal.kind, refusal.request_id) == (Kind.ERROR, 5)
    body = bytes(refusal.body)
    assert b"BAD_FRAME" in body and b"cannot be posted" in body and b"\n" not in body
    async with await trio.open_tcp_stream("127.0.0.1", port) as stream:
        found = await answers(stream, frames.encode(Kind.POST, 1, 6, b"[not json", "RaftStep")
                              + frames.encode(Kind.REQUEST, 1, 7, b'{"schema_version": 4}', "Hello"))
    assert [(frame.kind, frame.request_id) for frame in found] == [(Kind.RESPONSE, 7)]
    assert server.payloads == []
    assert any("RaftStep posted by" in record.getMessage() and record.levelno == logging.WARNING
               for record in caplog.records)


async def test_a_post_after_the_server_closed_raises_connection_lost(nursery):
    """Losing the connection fails a channel of posts as it fails one of calls: closed is set, and the next post
    raises CONNECTION_LOST."""
    server = RaftServer()
    port = await server.serve(nursery)
    async with open_tcp_channel("127.0.0.1", port, "avro") as channel:
        await channel.post("RaftStep", step(0))
        await server.arrived.wait()
        server.stop()
        with trio.fail_after(5):
            await channel.closed.wait()
        with pytest.raises(RocketError) as error:
            await channel.post("RaftStep", step(1))
        assert error.value.code == Code.CONNECTION_LOST
    assert server.payloads == [step(0)["payload"]]


async def test_an_inline_method_is_served_in_order_without_taking_a_slot(nursery, monkeypatch):
    """With the connection's one in-flight slot held by a call that waits, RaftSteps on the same connection are
    still served, in the order sent, and a RaftStep call (an older link's) gets its answer."""
    monkeypatch.setattr(limits, "in_flight_requests_per_connection_max", 1)
    server = RaftServer()
    server.expected = 200
    entered, release = trio.Event(), trio.Event()

    async def delete_user(request: dict) -> dict:  # any method not inline, holding its slot until released
        entered.set()
        await release.wait()
        return {}

    server.dispatcher.handle("AclDeleteUser", delete_user)
    port = await server.serve(nursery)
    async with open_tcp_channel("127.0.0.1", port, "avro") as channel, trio.open_nursery() as calls:
        calls.start_soon(channel.call, "AclDeleteUser", {"user": "someone"})
        await entered.wait()
        for index in range(199):
            await channel.post("RaftStep", step(index))
        with trio.fail_after(5):
            assert await channel.call("RaftStep", step(199)) == {}
            await server.arrived.wait()
        assert server.payloads == [step(index)["payload"] for index in range(200)]
        assert not release.is_set()  # the slot was held throughout
        release.set()
    assert server.observed.count(("RaftStep", None)) == 200  # telemetry sees inline calls too


async def test_raft_step_is_refused_to_a_caller_that_is_not_a_peer(nursery):
    """With a cluster secret, RaftStep (inline) is refused UNAUTHENTICATED to a connection that said no
    PeerHello, or a wrong one, and served to one that said the right one."""
    server = RaftServer(SECRET)
    port = await server.serve(nursery)
    outsider = PeerAuth(b"not the cluster's secret at all", 2, wall_ms)
    for hello in (None, outsider.hello()):
        with pytest.raises(RocketError) as error:
            async with open_tcp_channel("127.0.0.1", port, "avro", hello) as channel:
                await channel.call("RaftStep", step(0))
        assert error.value.code == Code.UNAUTHENTICATED
    assert server.payloads == []
    async with open_tcp_channel("127.0.0.1", port, "avro", PeerAuth(SECRET, 2, wall_ms).hello()) as channel:
        assert await channel.call("RaftStep", step(1)) == {}
        await channel.post("RaftStep", step(2))
        server.expected = 2
        with trio.fail_after(5):
            await server.arrived.wait()
    assert server.payloads == [step(1)["payload"], step(2)["payload"]]


async def test_links_talk_to_a_server_that_serves_raft_step_as_a_task(nursery, monkeypatch):
    """An older node (schema version 1: before Hello) serves RaftStep as any call (a task each), and answers it: a
    link's posts reach it in order all the same."""
    old = dataclasses.replace(methods.METHODS["RaftStep"], inline=False)
    monkeypatch.setitem(methods.METHODS, "RaftStep", old)
    server = RaftServer()
    del server.dispatcher._handlers["Hello"]  # UNKNOWN_METHOD: the link takes it for version 1
    server.expected = 100
    port = await server.serve(nursery)
    links = PeerLinks(2, {1: ("127.0.0.1", port)})
    await nursery.start(links.run)
    for index in range(100):
        links.post(1, step(index)["payload"])
        await trio.sleep(0)
    with trio.fail_after(5):
        await server.arrived.wait()
    assert server.payloads == [step(index)["payload"] for index in range(100)]


async def test_a_link_reconnects_once_its_connection_closes_even_while_idle(nursery):
    """When the peer closes the connection, the link notices through the channel's read loop (nothing being
    written), connects again, and its next payloads arrive."""
    first, second = RaftServer(), RaftServer()
    port = await first.serve(nursery)
    links = PeerLinks(2, {1: ("127.0.0.1", port)})
    await nursery.start(links.run)
    links.post(1, b"before")
    with trio.fail_after(5):
        await first.arrived.wait()
    first.stop()
    await second.serve(nursery, port)
    with trio.fail_after(5):  # the link says Hello to the new server with no payload to send
        while ("Hello", None) not in second.observed:
            await trio.sleep(0.05)
    links.post(1, b"after")
    with trio.fail_after(5):
        await second.arrived.wait()
    assert first.payloads == [b"before"] and second.payloads == [b"after"]


async def test_a_link_whose_posts_stay_unacknowledged_reconnects(nursery, monkeypatch):
    """A peer that takes a payload and then reads nothing more: once its window is full, what the link sends waits
    unacknowledged, as it does to a host gone without a reset; after limits.raft_link_silent_s the kernel breaks the
    connection (TCP_USER_TIMEOUT) and the link connects again, with no Hello of its own meanwhile."""
    monkeypatch.setattr(limits, "raft_link_silent_s", 0.5)
    server = RaftServer()
    hung = trio.Event()

    async def hangs(request: dict) -> dict:  # served inline: the connection reads nothing more
        server.payloads.append(bytes(request["payload"]))
        await hung.wait()
        return {}

    server.dispatcher.handle("RaftStep", hangs)
    port = await server.serve(nursery)
    links = PeerLinks(2, {1: ("127.0.0.1", port)})
    await nursery.start(links.run)
    links.post(1, b"unanswered")
    with trio.fail_after(5):
        while not server.payloads:
            await trio.sleep(0.01)
    with trio.fail_after(30):
        while server.observed.count(("Hello", None)) < 2:  # the second connection's Hello
            links.post(1, bytes(256 * limits.KiB))  # fills the windows; a full outbox drops the rest
            await trio.sleep(0.01)
    assert server.payloads[0] == b"unanswered" and server.observed == [("Hello", None)] * 2  # no Hello but the two
    hung.set()


async def test_the_versions_peers_said_outlive_a_restart_of_the_node(nursery, tmp_path):
    """What each peer said on connecting is kept (disk/peer_versions.py, as the node keeps it): links made after a
    restart know it before the peer can be reached again (a leader restarted during a partition keeps its producers'
    batches sequenced)."""
    server = RaftServer()
    port = await server.serve(nursery)
    path = tmp_path / peer_versions.PEER_VERSIONS_FILE
    links = PeerLinks(2, {1: ("127.0.0.1", port)}, versions=peer_versions.load(path),
                      keep_versions=partial(peer_versions.keep, path))
    await nursery.start(links.run)
    links.post(1, b"hello")
    with trio.fail_after(5):
        await server.arrived.wait()
        while not path.exists():
            await trio.sleep(0.01)
    assert links.versions == {1: SCHEMA_VERSION}
    restarted = PeerLinks(2, {1: ("127.0.0.1", 1)}, versions=peer_versions.load(path))  # the peer unreachable now
    assert restarted.versions == {1: SCHEMA_VERSION}
    path.write_bytes(b"{not json")
    assert peer_versions.load(path) == {}  # learnt again from each link, with a warning
    assert peer_versions.load(tmp_path / "none.json") == {}


async def test_a_versions_file_that_cannot_be_written_leaves_the_link_working(nursery, tmp_path):
    """The versions file's directory is gone (a full disk fails alike): the link carries its posts all the same."""
    server = RaftServer()
    port = await server.serve(nursery)
    links = PeerLinks(2, {1: ("127.0.0.1", port)},
                      keep_versions=partial(peer_versions.keep, tmp_path / "gone" / "peer_versions.json"))
    await nursery.start(links.run)
    links.post(1, b"still")
    with trio.fail_after(5):
        await server.arrived.wait()
    assert server.payloads == [b"still"] and links.versions == {1: SCHEMA_VERSION}
