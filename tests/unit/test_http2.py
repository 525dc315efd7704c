"""The HTTP/2 transport against handlers defined here: serdes, flow control, concurrency, streams, errors,
curl as an outside client, protocol garbage, resets and drain."""

from __future__ import annotations

import dataclasses
import json
import struct
import subprocess

import pytest
import trio

from rocket import limits
from rocket.errors import Code, RocketError
from rocket.serde import avro_codec, json_codec
from rocket.transport import h2_endpoint
from rocket.transport.h2_client import open_http2_channel
from rocket.transport.h2_server import serve_http2
from rocket.transport.lifecycle import Lifecycle
from rocket.transport.rpc import Dispatcher

SERDES = ["json", "avro", "lane"]
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"


@dataclasses.dataclass
class Server:
    port: int
    lifecycle: Lifecycle
    cancelled: list[str] = dataclasses.field(default_factory=list)  # handlers that saw a cancellation
    barrier_size: int = 0  # Ping holds its answer until this many Pings are in flight at once
    pings_waiting: int = 0
    pings_released: trio.Event = dataclasses.field(default_factory=trio.Event)


def make_dispatcher(server: Server) -> Dispatcher:
    """Handlers for the methods the tests call."""
    dispatcher = Dispatcher()

    async def ping(request: dict) -> dict:
        if server.barrier_size:
            server.pings_waiting += 1
            if server.pings_waiting >= server.barrier_size:
                server.pings_released.set()
            await server.pings_released.wait()
        return {"version": "test-1", "roles": ["broker", "nameserver"]}

    async def produce(request: dict) -> dict:
        return {"queue": request["queue"], "base_offset": len(request["batch"]), "count": len(request["topic"])}

    async def pull(request: dict) -> dict:
        size = request["queues"][0]["offset"]
        return {"batches": [{"queue": 0, "base_offset": size, "batch": bytes(range(256)) * (size // 256)}],
                "next_offsets": []}

    async def describe_topic(request: dict) -> dict:
        raise RocketError(Code.UNKNOWN_TOPIC, f"no topic {request['topic']}")

    async def list_topics(request: dict) -> dict:
        raise ValueError("a bug")

    dispatcher.handle("Ping", ping)
    dispatcher.handle("Produce", produce)
    dispatcher.handle("Pull", pull)
    dispatcher.handle("DescribeTopic", describe_topic)
    dispatcher.handle("ListTopics", list_topics)
    dispatcher.handle("Subscribe", lambda request: subscribe(server, request))
    return dispatcher



async def subscribe(server: Server, request: dict):
    """max_bytes items; -1 means forever (slowly); wait_ms 1 means fail after the first item."""
    count = request["max_bytes"]
    index = 0
    try:
        while count < 0 or index < count:
            yield {"batches": [{"queue": 0, "base_offset": index, "batch": b"item-%d" % index}], "next_offsets": []}
            index += 1
            if request["wait_ms"] == 1:
                raise RocketError(Code.OFFSET_OUT_OF_RANGE, "offset 1 is gone\nreally")
            if count < 0:
                await trio.sleep(0.01)
    except trio.Cancelled:
        server.cancelled.append("Subscribe")
        raise


def subscription(count: int, fail_after_first: bool = False) -> dict:
    return {"topic": "t", "queues": [], "max_bytes": count, "wait_ms": 1 if fail_after_first else 0}


@pytest.fixture
async def server(nursery) -> Server:
    state = Server(port=0, lifecycle=Lifecycle())
    state.port = await nursery.start(serve_http2, make_dispatcher(state), state.lifecycle, "127.0.0.1", 0)
    return state


async def curl(*args: str) -> subprocess.CompletedProcess:
    return await trio.run_process(["curl", "-s", "--http2-prior-knowledge", "--max-time", "10", *args],
                                  capture_stdout=True, capture_stderr=True, check=False)


def url(server: Server, method: str) -> str:
    return f"http://127.0.0.1:{server.port}/rocket.v1/{method}"


@pytest.mark.parametrize("serde", SERDES)
async def test_unary_call_with_each_serde(server, serde):
    """A unary call round-trips its request and response in JSON and in Avro."""
    async with open_http2_channel("127.0.0.1", server.port, serde) as channel:
        assert await channel.call("Ping", {}) == {"version": "test-1", "roles": ["broker", "nameserver"]}
        produced = await channel.call("Produce", {"topic": "abc", "queue": 7, "batch": b"12345"})
    assert produced == {"queue": 7, "base_offset": 5, "count": 3, "scheduled": False, "throttle_ms": 0}


@pytest.mark.parametrize("serde", SERDES)
@pytest.mark.parametrize("window_bytes", [limits.http2_stream_window_bytes, 64 * 1024])
async def test_four_mebibyte_bodies_cross_flow_control(server, monkeypatch, serde, window_bytes):
    """4 MiB goes up and 4 MiB comes down, also when small windows force waits for WINDOW_UPDATE."""
    monkeypatch.setattr(limits, "http2_stream_window_bytes", window_bytes)
    monkeypatch.setattr(limits, "http2_connection_window_bytes", max(window_bytes, h2_endpoint.DEFAULT_WINDOW_BYTES))
    size = 4 * limits.MiB
    async with open_http2_channel("127.0.0.1", server.port, serde) as channel:
        produced = await channel.call("Produce", {"topic": "t", "queue": 0, "batch": b"\x07" * size})
        pulled = await channel.call("Pull", {"topic": "t", "queues": [{"queue": 0, "offset": size}]})
    assert produced["base_offset"] == size
    assert pulled["batches"][0]["batch"] == bytes(range(256)) * (size // 256)


async def test_fifty_concurrent_calls_share_one_connection(server):
    """Fifty calls are in flight at once on one connection: no answer comes until all fifty have arrived."""
    server.barrier_size = 50
    answers = []
    async with open_http2_channel("127.0.0.1", server.port) as channel:

        async def ping() -> None:
            answers.append(await channel.call("Ping", {}, timeout_s=10))

        async with trio.open_nursery() as nursery:
            for _ in range(50):
                nursery.start_soon(ping)
    assert server.pings_waiting == 50
    assert len(answers) == 50 and all(answer["version"] == "test-1" for answer in answers)


@pytest.mark.parametrize("serde", SERDES)
async def test_server_stream_yields_every_item(server, serde):
    """A streaming method delivers its items in order, then ends cleanly."""
    async with open_http2_channel("127.0.0.1", server.port, serde) as channel:
        items = [item async for item in channel.stream("Subscribe", subscription(300))]
        assert [item["batches"][0]["base_offset"] for item in items] == list(range(300))
        assert items[299]["batches"][0]["batch"] == b"item-299"
        assert await channel.call("Ping", {})


async def test_server_stream_failure_arrives_in_trailers(server):
    """A stream that fails after an item delivers the item, then the error's code and message."""
    received = []
    async with open_http2_channel("127.0.0.1", server.port) as channel:
        with pytest.raises(RocketError) as caught:
            async for item in channel.stream("Subscribe", subscription(5, fail_after_first=True)):
                received.append(item)
    assert len(received) == 1
    assert caught.value.code == Code.OFFSET_OUT_OF_RANGE and caught.value.message == "offset 1 is gone really"


async def test_leaving_a_stream_early_cancels_its_handler(server):
    """Breaking out of an endless stream resets it, which cancels the handler; the connection stays usable."""
    async with open_http2_channel("127.0.0.1", server.port) as channel:
        async with trio.open_nursery():
            async for item in channel.stream("Subscribe", subscription(-1)):
                if item["batches"][0]["base_offset"] == 3:
                    break
        with trio.fail_after(5):
            while "Subscribe" not in server.cancelled:
                await trio.sleep(0.01)
        assert (await channel.call("Ping", {}))["roles"]


async def test_timeout_resets_the_stream_and_cancels_the_handler(server):
    """A call that outlives its timeout fails with TIMEOUT, and the server's handler is cancelled."""
    server_dispatcher_slow = Dispatcher()

    async def never(request: dict) -> dict:
        try:
            await trio.sleep_forever()
        finally:
            server.cancelled.append("never")

    server_dispatcher_slow.handle("Ping", never)
    async with trio.open_nursery() as nursery:
        lifecycle = Lifecycle()
        port = await nursery.start(serve_http2, server_dispatcher_slow, lifecycle, "127.0.0.1", 0)
        async with open_http2_channel("127.0.0.1", port) as channel:
            with pytest.raises(RocketError) as caught:
                await channel.call("Ping", {}, timeout_s=0.2)
            with trio.fail_after(5):
                while "never" not in server.cancelled:
                    await trio.sleep(0.01)
        nursery.cancel_scope.cancel()
    assert caught.value.code == Code.TIMEOUT


@pytest.mark.parametrize("method, message, code", [
    ("DescribeTopic", {"topic": "missing"}, Code.UNKNOWN_TOPIC),
    ("ListTopics", {}, Code.INTERNAL),
    ("SearchOffset", {"topic": "t", "queue": 0, "timestamp_ms": 0}, Code.UNKNOWN_METHOD),
])
async def test_handler_errors_keep_their_codes(server, method, message, code):
    """A RocketError keeps its code, a plain exception becomes INTERNAL, an unserved method is UNKNOWN_METHOD."""
    async with open_http2_channel("127.0.0.1", server.port, "avro") as channel:
        with pytest.raises(RocketError) as caught:
            await channel.call(method, message)
        assert caught.value.code == code
        assert (await channel.call("Ping", {}))["version"] == "test-1"


async def test_body_over_the_frame_limit_is_refused_with_413(server):
    """A request body past limits.frame_bytes_max is answered FRAME_TOO_LARGE; the connection keeps working."""
    async with open_http2_channel("127.0.0.1", server.port, "avro") as channel:
        with pytest.raises(RocketError) as caught:
            await channel.call("Produce", {"topic": "t", "batch": bytes(limits.frame_bytes_max + 1)})
        assert caught.value.code == Code.FRAME_TOO_LARGE
        assert (await channel.call("Ping", {}))["version"] == "test-1"


async def test_curl_calls_ping(server):
    """curl, an outside HTTP/2 client, gets Ping's JSON and the success trailer."""
    answered = await curl("-X", "POST", "-H", "content-type: application/json", "--data", "{}", url(server, "Ping"))
    assert json.loads(answered.stdout) == {"version": "test-1", "roles": ["broker", "nameserver"]}
    without_type = await curl("-i", "-X", "POST", "--data-binary", "{}", "-H", "content-type:", url(server, "Ping"))
    assert b"HTTP/2 200" in without_type.stdout and b"rocket-status: 0" in without_type.stdout


@pytest.mark.parametrize("path, method, data, content_type, status, code", [
    ("/rocket.v1/Nope", "POST", "{}", "application/json", 404, "UNKNOWN_METHOD"),
    ("/elsewhere", "POST", "{}", "application/json", 404, "UNKNOWN_METHOD"),
    ("/rocket.v1/Ping", "GET", "", "application/json", 405, "BAD_REQUEST"),
    ("/rocket.v1/Produce", "POST", "{oops", "application/json", 400, "UNDECODABLE"),
    ("/rocket.v1/Produce", "POST", '{"topic": "t"}', "application/json", 400, "BAD_REQUEST"),
    ("/rocket.v1/Produce", "POST", "\x01\x02garbage", "application/avro", 400, "UNDECODABLE"),
    ("/rocket.v1/Ping", "POST", "{}", "text/plain", 415, "UNSUPPORTED_SERDE"),
    ("/rocket.v1/DescribeTopic", "POST", '{"topic": "x"}', "application/json", 404, "UNKNOWN_TOPIC"),
    ("/rocket.v1/ListTopics", "POST", "{}", "application/json", 500, "INTERNAL"),
])
async def test_curl_sees_status_error_header_and_error_body(server, path, method, data, content_type, status, code):
    """Every refusal carries an HTTP status, a rocket-error header, an Error body in a known serde and trailers."""
    arguments = ["-i", "-X", method, "-H", f"content-type: {content_type}"]
    if data:
        arguments += ["--data-binary", data]
    answered = await curl(*arguments, f"http://127.0.0.1:{server.port}{path}")
    head, _, body = answered.stdout.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/2 %d" % status), head
    assert b"rocket-error: " + code.encode() in head
    # curl -i prints the trailers straight after the body.
    error_body, _, trailers = body.partition(b"rocket-status: ")
    assert trailers.startswith(b"%d\r\n" % Code[code])
    serde = avro_codec if b"content-type: application/avro" in head else json_codec
    assert serde.decode("Error", error_body)["code"] == code


async def read_until_closed(stream: trio.SocketStream) -> bytes:
    received = bytearray()
    with trio.fail_after(5):
        while data := await stream.receive_some(65536):
            received += data
    return bytes(received)


def frame_types(data: bytes) -> list[int]:
    types, offset = [], 0
    while offset + 9 <= len(data):
        length = int.from_bytes(data[offset:offset + 3], "big")
        types.append(data[offset + 3])
        offset += 9 + length
    return types


async def test_garbage_closes_that_connection_only(server):
    """Bytes that are not HTTP/2 close their connection; the server answers the next client."""
    stream = await trio.open_tcp_stream("127.0.0.1", server.port)
    async with stream:
        await stream.send_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n" + bytes(range(256)))
        await read_until_closed(stream)
    async with open_http2_channel("127.0.0.1", server.port) as channel:
        assert (await channel.call("Ping", {}))["version"] == "test-1"


async def test_protocol_violation_gets_goaway(server):
    """A frame that breaks the protocol after a valid preface is answered with GOAWAY, then the close."""
    window_update_on_stream_0_of_zero = struct.pack(">I", 4)[1:] + b"\x08\x00" + bytes(4) + bytes(4)
    stream = await trio.open_tcp_stream("127.0.0.1", server.port)
    async with stream:
        await stream.send_all(PREFACE + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00" + window_update_on_stream_0_of_zero)
        received = await read_until_closed(stream)
    goaway_type = 0x7
    assert goaway_type in frame_types(received)
    async with open_http2_channel("127.0.0.1", server.port) as channel:
        assert (await channel.call("Ping", {}))["roles"]


async def test_cannot_connect_is_unavailable():
    """A port nobody listens on fails with UNAVAILABLE."""
    listener = trio.socket.socket()
    await listener.bind(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    listener.close()
    with pytest.raises(RocketError) as caught:
        async with open_http2_channel("127.0.0.1", port):
            pass
    assert caught.value.code == Code.UNAVAILABLE


async def test_server_death_is_connection_lost():
    """A call in flight when the server goes away fails with CONNECTION_LOST, and so does the next one."""
    dispatcher = Dispatcher()
    dispatcher.handle("Ping", lambda request: trio.sleep_forever())
    server_scope = trio.CancelScope()

    async def run_server(task_status=trio.TASK_STATUS_IGNORED) -> None:
        with server_scope:
            await serve_http2(dispatcher, Lifecycle(), "127.0.0.1", 0, task_status=task_status)

    async def stop_server_soon() -> None:
        await trio.sleep(0.1)
        server_scope.cancel()

    async with trio.open_nursery() as nursery:
        port = await nursery.start(run_server)
        async with open_http2_channel("127.0.0.1", port) as channel:
            nursery.start_soon(stop_server_soon)
            with pytest.raises(RocketError) as in_flight:
                await channel.call("Ping", {}, timeout_s=5)
            with pytest.raises(RocketError) as next_call:
                await channel.call("Ping", {}, timeout_s=5)
    assert in_flight.value.code == Code.CONNECTION_LOST and next_call.value.code == Code.CONNECTION_LOST


async def test_drain_stops_the_server_and_its_connections():
    """Setting lifecycle.draining ends serve_http2 by itself, and the client's next call fails cleanly."""
    lifecycle = Lifecycle()
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            state = Server(port=0, lifecycle=lifecycle)
            port = await nursery.start(serve_http2, make_dispatcher(state), lifecycle, "127.0.0.1", 0)
            async with open_http2_channel("127.0.0.1", port) as channel:
                assert (await channel.call("Ping", {}))["version"] == "test-1"
                lifecycle.drain()
                with pytest.raises(RocketError) as caught:
                    while True:
                        await channel.call("Ping", {}, timeout_s=5)
                        await trio.sleep(0.01)
        # Leaving the nursery proves serve_http2 returned by itself.
    assert caught.value.code in (Code.UNAVAILABLE, Code.CONNECTION_LOST)
    with pytest.raises(RocketError) as refused:
        async with open_http2_channel("127.0.0.1", port):
            pass
    assert refused.value.code == Code.UNAVAILABLE


async def test_drain_finishes_calls_ends_streams_and_stops_the_server():
    """On drain a call in flight still answers, an open stream ends UNAVAILABLE, and serve_http2 returns."""
    lifecycle = Lifecycle()
    dispatcher = Dispatcher()

    async def slow_ping(request: dict) -> dict:
        await trio.sleep(0.3)
        return {"version": "slow", "roles": []}

    state = Server(port=0, lifecycle=lifecycle)
    dispatcher.handle("Ping", slow_ping)
    dispatcher.handle("Subscribe", lambda request: subscribe(state, request))
    outcomes = {}
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            port = await nursery.start(serve_http2, dispatcher, lifecycle, "127.0.0.1", 0)
            async with open_http2_channel("127.0.0.1", port) as channel:

                async def call_in_flight() -> None:
                    outcomes["call"] = await channel.call("Ping", {})

                async def stream_in_flight() -> None:
                    with pytest.raises(RocketError) as caught:
                        async for _ in channel.stream("Subscribe", subscription(-1)):
                            pass
                    outcomes["stream"] = caught.value.code

                async with trio.open_nursery() as clients:
                    clients.start_soon(call_in_flight)
                    clients.start_soon(stream_in_flight)
                    while lifecycle.calls_in_flight < 2:  # both reached the server (a sleep was too short under load)
                        await trio.sleep(0.01)
                    lifecycle.drain()
        # Leaving the nursery proves serve_http2 returned by itself.
    assert outcomes == {"call": {"version": "slow", "roles": []}, "stream": Code.UNAVAILABLE}
    assert lifecycle.calls_in_flight == 0
