"""The HTTP/2 server against hostile and careless clients: flow-control windows bound what a connection makes the
server hold, bodies larger than a window still complete, idle and stalled connections are closed or reset, and an
answer to a stream h2 has already forgotten ends that stream only."""

from __future__ import annotations

import json

import h2.config
import h2.connection
import h2.events
import h2.exceptions
import pytest
import trio
import trio.testing

from rocket import limits
from rocket.errors import Code, RocketError
from rocket.transport.h2_client import open_http2_channel
from rocket.transport.h2_server import _Request, _ServerConnection, serve_http2
from rocket.transport.lifecycle import Lifecycle
from tests.unit.test_http2 import Server, make_dispatcher

PING = [(":method", "POST"), (":scheme", "http"), (":authority", "x"), (":path", "/rocket.v1/Ping"),
        ("content-type", "application/json")]
PRODUCE = [*PING[:3], (":path", "/rocket.v1/Produce"), ("content-type", "application/json")]
TELEMETRY = [*PING[:3], (":path", "/apache.rocketmq.v2.MessagingService/Telemetry"),
             ("content-type", "application/grpc")]


async def telemetry(call) -> None:
    """A long-lived gRPC stream, as RocketMQ's Telemetry: it reads until the client ends."""
    while await call.receive() is not None:
        pass


async def start(nursery, **timeouts) -> Server:
    state = Server(port=0, lifecycle=Lifecycle())
    state.port = await nursery.start(lambda task_status: serve_http2(
        make_dispatcher(state), state.lifecycle, "127.0.0.1", 0, grpc={TELEMETRY[3][1]: telemetry},
        task_status=task_status, **timeouts))
    return state


class RawClient:
    """h2 as a client that does what it likes: the hostile side."""

    def __init__(self, stream: trio.SocketStream):
        self.stream = stream
        self.h2 = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding="utf-8"))
        self.events: list[h2.events.Event] = []
        self.closed = False

    async def open(self) -> None:
        self.h2.initiate_connection()
        await self.send()
        await self.receive(0.2)

    async def send(self) -> None:
        data = self.h2.data_to_send()
        if data:
            await self.stream.send_all(data)

    async def receive(self, quiet_s: float) -> None:
        """Read until the server is quiet for quiet_s (or closes)."""
        while not self.closed:
            with trio.move_on_after(quiet_s):
                data = await self.stream.receive_some(1 << 20)
                if not data:
                    self.closed = True
                    return
                self.events += self.h2.receive_data(data)
                await self.send()
                continue
            return

    async def stuff(self, stream_ids: list[int], chunk: bytes, body_bytes: int) -> int:
        """Send on each stream as much as the server's windows allow, up to body_bytes, never ending a stream; the
        bytes sent."""
        sent = 0
        per_stream = dict.fromkeys(stream_ids, 0)
        while True:
            progress = 0
            for stream_id in stream_ids:
                try:
                    allowed = min(self.h2.local_flow_control_window(stream_id), len(chunk),
                                  body_bytes - per_stream[stream_id])
                    if allowed > 0:
                        self.h2.send_data(stream_id, chunk[:allowed])
                except h2.exceptions.ProtocolError:
                    continue  # the server reset it
                if allowed > 0:
                    per_stream[stream_id] += allowed
                    progress += allowed
            await self.send()
            sent += progress
            await self.receive(0.1)
            if not progress or self.closed:
                return sent


async def test_stalled_bodies_hold_no_more_than_the_connection_bound(nursery):
    """A client that opens every stream it may with a large body and never ends one can send the server no more
    than the connection's bound plus its windows; it never gets the 1.3 GiB its streams' bodies could hold."""
    server = await start(nursery)
    async with await trio.open_tcp_stream("127.0.0.1", server.port) as stream:
        client = RawClient(stream)
        await client.open()
        streams = list(range(1, 2 * limits.http2_streams_per_connection_max, 2))
        for stream_id in streams:
            client.h2.send_headers(stream_id, PRODUCE)
        sent = await client.stuff(streams, bytes(limits.http2_frame_bytes_max), limits.frame_bytes_max)
    bound = (limits.http2_connection_held_bytes_max + limits.http2_connection_window_bytes + limits.frame_bytes_max
             + len(streams) * limits.http2_stream_window_bytes)
    assert limits.http2_connection_held_bytes_max <= sent <= bound


async def test_concurrent_bodies_past_the_connection_bound_all_complete(nursery):
    """Legitimate calls whose bodies together pass the connection's bound, interleaved on one connection, all
    complete: past the bound the fullest stream gets window, completes, and frees its bytes."""
    server = await start(nursery)
    size = 6 * limits.MiB
    count = 2 * limits.http2_connection_held_bytes_max // size + 2
    results = []
    async with open_http2_channel("127.0.0.1", server.port, "avro") as channel:

        async def produce(index: int) -> None:
            results.append(await channel.call("Produce", {"topic": "t", "queue": index, "batch": bytes(size)}))

        with trio.fail_after(60):
            async with trio.open_nursery() as calls:
                for index in range(count):
                    calls.start_soon(produce, index)
    assert sorted(result["queue"] for result in results) == list(range(count))
    assert {result["base_offset"] for result in results} == {size}


async def test_node_bound_resets_the_biggest_holder(nursery, monkeypatch):
    """Past limits.http2_held_bytes_max on the node, the connection holding most has its fullest stream reset
    with ENHANCE_YOUR_CALM, and the server still answers."""
    monkeypatch.setattr(limits, "http2_held_bytes_max", 8 * limits.MiB)
    server = await start(nursery)
    async with await trio.open_tcp_stream("127.0.0.1", server.port) as stream:
        client = RawClient(stream)
        await client.open()
        streams = [1, 3, 5, 7]
        for stream_id in streams:
            client.h2.send_headers(stream_id, PRODUCE)
        await client.stuff(streams, bytes(limits.http2_frame_bytes_max), limits.frame_bytes_max)
        resets = [event for event in client.events if isinstance(event, h2.events.StreamReset)]
        assert resets and {event.error_code for event in resets} == {h2.errors.ErrorCodes.ENHANCE_YOUR_CALM}
    async with open_http2_channel("127.0.0.1", server.port) as channel:
        assert (await channel.call("Ping", {}))["version"] == "test-1"


async def test_idle_connection_gets_goaway_and_closes(nursery):
    """A connection that opens no stream (a slowloris) is closed after idle_s, with GOAWAY."""
    server = await start(nursery, idle_s=0.5, request_s=0.5)
    async with await trio.open_tcp_stream("127.0.0.1", server.port) as stream:
        client = RawClient(stream)
        await client.open()
        with trio.fail_after(5):
            await client.receive(10)
        assert client.closed
        assert any(isinstance(event, h2.events.ConnectionTerminated) for event in client.events)


async def test_half_sent_body_is_reset_and_open_grpc_stream_is_not_idle(nursery):
    """A rocket request whose body does not complete within request_s is reset (CANCEL); a gRPC stream that sends
    nothing (telemetry waiting) is not cut, and keeps its connection open past idle_s."""
    server = await start(nursery, idle_s=0.5, request_s=0.5)
    async with await trio.open_tcp_stream("127.0.0.1", server.port) as stream:
        client = RawClient(stream)
        await client.open()
        client.h2.send_headers(1, PRODUCE)
        client.h2.send_data(1, b'{"topic": ')
        client.h2.send_headers(3, TELEMETRY)
        await client.send()
        with trio.move_on_after(2):
            await client.receive(10)
        assert not client.closed
        resets = {event.stream_id: event.error_code for event in client.events if isinstance(event, h2.events.StreamReset)}
        assert resets == {1: h2.errors.ErrorCodes.CANCEL}


async def test_answer_to_a_stream_h2_forgot_ends_that_stream_only():
    """A client resets a stream and opens another; h2 forgets the first, so answering it raises
    StreamIDTooLowError (as fuzzing found). That ends the one call: the connection answers the next stream."""
    client_side, server_side = trio.testing.memory_stream_pair()
    state = Server(port=0, lifecycle=Lifecycle())
    server = _ServerConnection(make_dispatcher(state), state.lifecycle, server_side, {})
    client = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding="utf-8"))
    client.initiate_connection()
    client.send_headers(1, PING, end_stream=True)
    client.reset_stream(1)
    client.send_headers(3, PING, end_stream=True)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(server.write_loop)
        server.start()
        server.connection.receive_data(client.data_to_send())
        assert 1 not in server.connection.streams  # forgotten, while its call might still be running
        with pytest.raises(h2.exceptions.StreamIDTooLowError):
            server.connection.send_headers(1, [(":status", "200")])
        for stream_id in (1, 3):  # stream 1 as if its call had finished before the reset was read
            request = _Request(dict(PING), trio.current_time())
            request.complete = request.answering = True
            request.body = bytearray(b"{}")
            server.requests[stream_id] = request
            state.lifecycle.call_started()
            await server._call(stream_id, request)
        answered = []
        with trio.fail_after(5):
            while not any(isinstance(event, h2.events.StreamEnded) for event in answered):
                answered += client.receive_data(await client_side.receive_some(65536))
        data = b"".join(event.data for event in answered if isinstance(event, h2.events.DataReceived))
        assert json.loads(data)["version"] == "test-1", data
        assert {event.stream_id for event in answered if isinstance(event, h2.events.ResponseReceived)} == {3}
        nursery.cancel_scope.cancel()


async def test_a_refused_body_frees_its_window(nursery):
    """413 for a body past the frame limit gives the bytes back: the connection goes on."""
    server = await start(nursery)
    async with open_http2_channel("127.0.0.1", server.port, "avro") as channel:
        for _ in range(3):
            with pytest.raises(RocketError) as caught:
                await channel.call("Produce", {"topic": "t", "batch": bytes(limits.frame_bytes_max + 1)})
            assert caught.value.code == Code.FRAME_TOO_LARGE
        assert (await channel.call("Ping", {}))["version"] == "test-1"
