"""The HTTP/2 transport (h2 on trio, h2c with prior knowledge): POST /rocket.v1/<Method>, one stream
per call, serde by content-type, rocket-status trailers, gRPC-style length-prefixed server streams.

h2 is sans-IO: every state change is followed by a flush of data_to_send() under one lock.
"""

from __future__ import annotations

import logging
import struct
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from types import ModuleType

import h2.config
import h2.connection
import h2.events
import h2.exceptions
import h2.settings
import trio

from rocket import limits
from rocket.errors import Code, RocketError, collapse_single_error
from rocket.serde import SERDE_BY_CONTENT_TYPE, json_codec, serde_named
from rocket.transport.listen import cancel_on, serve_connections
from rocket.transport.rpc import Dispatcher, Lifecycle, encode_error, method_spec

log = logging.getLogger("rocket.http2")
receive_bytes = 256 * 1024
window_bytes = 16 * limits.MiB  # large windows so bulk produce is not throttled by the 64 KiB default
frame_bytes = 1 * limits.MiB - 1  # fewer, larger DATA frames: less per-frame Python work
PATH_PREFIX = "/rocket.v1/"
_message_prefix = struct.Struct(">BI")  # gRPC-style: compressed flag, length

STATUS_OF_CODE = {
    Code.UNKNOWN_METHOD: 404, Code.UNKNOWN_TOPIC: 404, Code.FRAME_TOO_LARGE: 413, Code.UNSUPPORTED_SERDE: 415,
    Code.TOPIC_EXISTS: 409, Code.OVERLOADED: 503, Code.UNAVAILABLE: 503, Code.TIMEOUT: 504, Code.INTERNAL: 500,
}


def _settings(client_side: bool) -> dict:
    settings = {
        h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: window_bytes,
        h2.settings.SettingCodes.MAX_FRAME_SIZE: frame_bytes,
    }
    if not client_side:
        settings[h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS] = limits.http2_streams_per_connection_max
    return settings


class _Endpoint:
    """What client and server share: the h2 state machine, flushing it, and flow-controlled sends."""

    def __init__(self, stream: trio.SocketStream, client_side: bool):
        self.socket_stream = stream
        self.connection = h2.connection.H2Connection(
            h2.config.H2Configuration(client_side=client_side, header_encoding="utf-8"))
        self.send_lock = trio.Lock()
        self.window_opened = trio.Event()
        self.closed = False

    def start(self, client_side: bool) -> None:
        self.connection.initiate_connection()
        self.connection.update_settings(_settings(client_side))
        self.connection.increment_flow_control_window(window_bytes - 65535)

    async def flush(self) -> None:
        async with self.send_lock:
            data = self.connection.data_to_send()
            if data and not self.closed:
                try:
                    await self.socket_stream.send_all(data)
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    self.closed = True

    def open_window(self) -> None:
        self.window_opened.set()
        self.window_opened = trio.Event()

    async def send_data(self, stream_id: int, data: bytes, end_stream: bool) -> None:
        """Send data within flow-control windows, waiting for WINDOW_UPDATE when they are shut."""
        view = memoryview(data)
        while len(view):
            if self.closed:
                raise RocketError(Code.CONNECTION_LOST, "connection closed while sending")
            allowed = min(self.connection.local_flow_control_window(stream_id), self.connection.max_outbound_frame_size)
            if allowed <= 0:
                await self.window_opened.wait()
                continue
            self.connection.send_data(stream_id, bytes(view[:allowed]))
            view = view[allowed:]
            await self.flush()
        if end_stream:
            self.connection.end_stream(stream_id)
            await self.flush()


def _headers(pairs) -> dict[str, str]:
    return {name: value for name, value in pairs}


async def serve_http2(dispatcher: Dispatcher, lifecycle: Lifecycle, host: str, port: int, *,
                      task_status=trio.TASK_STATUS_IGNORED) -> None:
    """Serve h2c until the lifecycle drains; reports the bound port through task_status."""

    async def run_connection(stream: trio.SocketStream) -> None:
        await _ServerConnection(dispatcher, lifecycle, stream).run()

    async def refuse_connection(stream: trio.SocketStream) -> None:
        return None  # closing is the refusal: h2 has no way to answer before its preface

    await serve_connections(lifecycle, host, port, run_connection, refuse_connection, task_status=task_status)


class _Request:
    def __init__(self, headers: dict[str, str]):
        self.headers = headers
        self.body = bytearray()
        self.scope = trio.CancelScope()
        self.refused = False


class _ServerConnection(_Endpoint):
    def __init__(self, dispatcher: Dispatcher, lifecycle: Lifecycle, stream: trio.SocketStream):
        super().__init__(stream, client_side=False)
        self.dispatcher = dispatcher
        self.lifecycle = lifecycle
        self.requests: dict[int, _Request] = {}
        self.peer_gone = False

    async def run(self) -> None:
        async with self.socket_stream:
            self.start(client_side=False)
            await self.flush()
            async with trio.open_nursery() as calls:
                with trio.CancelScope() as read_scope:
                    calls.start_soon(cancel_on, self.lifecycle.draining, read_scope)
                    await self._read_loop(calls)
                    read_scope.cancel()
                if self.peer_gone:
                    calls.cancel_scope.cancel()
                else:
                    calls.cancel_scope.deadline = trio.current_time() + limits.shutdown_grace_s
            if not self.peer_gone:
                self.connection.close_connection()
                await self.flush()

    async def _read_loop(self, calls: trio.Nursery) -> None:
        while True:
            try:
                data = await self.socket_stream.receive_some(receive_bytes)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                data = b""
            if not data:
                self.peer_gone = True
                return
            try:
                events = self.connection.receive_data(data)
            except h2.exceptions.ProtocolError as error:
                log.info("closing HTTP/2 connection after a protocol error: %s", error)
                await self.flush()  # h2 has queued a GOAWAY
                self.peer_gone = True
                return
            for event in events:
                if isinstance(event, h2.events.ConnectionTerminated):
                    self.peer_gone = True
                    return
                self._on_event(event, calls)
            await self.flush()

    def _on_event(self, event, calls: trio.Nursery) -> None:
        if isinstance(event, h2.events.RequestReceived):
            self.requests[event.stream_id] = _Request(_headers(event.headers))
        elif isinstance(event, h2.events.DataReceived):
            self.connection.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
            request = self.requests.get(event.stream_id)
            if request is None or request.refused:
                return
            request.body += event.data
            if len(request.body) > limits.frame_bytes_max:
                request.refused = True
                request.body = bytearray()
                error = RocketError(Code.FRAME_TOO_LARGE, f"request body exceeds {limits.frame_bytes_max} bytes")
                self._start_call(calls, event.stream_id, request, error)
        elif isinstance(event, h2.events.StreamEnded):
            request = self.requests.get(event.stream_id)
            if request is not None and not request.refused:
                self._start_call(calls, event.stream_id, request, None)
        elif isinstance(event, h2.events.StreamReset):
            request = self.requests.pop(event.stream_id, None)
            if request is not None:
                request.scope.cancel()
        elif isinstance(event, (h2.events.WindowUpdated, h2.events.RemoteSettingsChanged)):
            self.open_window()

    def _start_call(self, calls: trio.Nursery, stream_id: int, request: _Request, error: RocketError | None) -> None:
        self.lifecycle.call_started()
        calls.start_soon(self._call, stream_id, request, error)

    async def _call(self, stream_id: int, request: _Request, refusal: RocketError | None) -> None:
        serde: ModuleType = json_codec
        try:
            with request.scope:
                try:
                    if refusal is not None:
                        raise refusal
                    serde, method = self._route(request.headers)
                    if method_spec(method).streaming:
                        await self._stream(stream_id, method, serde, bytes(request.body))
                        return
                    body = await self.dispatcher.call(method, serde, bytes(request.body))
                    await self._respond(stream_id, 200, serde, body)
                except RocketError as error:
                    await self._respond_error(stream_id, serde, error)
        except (h2.exceptions.StreamClosedError, h2.exceptions.ProtocolError):
            pass  # the client reset or the connection closed; nobody is left to answer
        finally:
            self.requests.pop(stream_id, None)
            self.lifecycle.call_finished()

    def _route(self, headers: dict[str, str]) -> tuple[ModuleType, str]:
        content_type = headers.get("content-type", json_codec.content_type).split(";")[0].strip()
        serde = SERDE_BY_CONTENT_TYPE.get(content_type)
        if serde is None:
            raise RocketError(Code.UNSUPPORTED_SERDE, f"content-type {content_type!r} is not one of "
                              f"{', '.join(sorted(SERDE_BY_CONTENT_TYPE))}")
        path = headers.get(":path", "")
        if headers.get(":method") != "POST" or not path.startswith(PATH_PREFIX):
            raise RocketError(Code.UNKNOWN_METHOD, f"{headers.get(':method')} {path}: calls are POST {PATH_PREFIX}<Method>")
        return serde, path[len(PATH_PREFIX):]

    async def _respond(self, stream_id: int, status: int, serde: ModuleType, body: bytes,
                       extra: tuple[tuple[str, str], ...] = ()) -> None:
        headers = [(":status", str(status)), ("content-type", serde.content_type), *extra]
        self.connection.send_headers(stream_id, headers)
        await self.send_data(stream_id, body, end_stream=False)
        self.connection.send_headers(stream_id, [("rocket-status", "0" if status == 200 else "1")], end_stream=True)
        await self.flush()

    async def _respond_error(self, stream_id: int, serde: ModuleType, error: RocketError) -> None:
        status = STATUS_OF_CODE.get(error.code, 400)
        await self._respond(stream_id, status, serde, encode_error(serde, error), (("rocket-error", error.code.name),))

    async def _stream(self, stream_id: int, method: str, serde: ModuleType, body: bytes) -> None:
        started = False
        try:
            async for item in self.dispatcher.stream(method, serde, body):
                if not started:
                    self.connection.send_headers(stream_id, [(":status", "200"), ("content-type", serde.content_type)])
                    started = True
                await self.send_data(stream_id, _message_prefix.pack(0, len(item)) + item, end_stream=False)
            trailers = [("rocket-status", "0")]
        except RocketError as error:
            if not started:
                await self._respond_error(stream_id, serde, error)
                return
            trailers = [("rocket-status", str(int(error.code))), ("rocket-error", error.code.name),
                        ("rocket-message", error.message.replace("\n", " ")[:1000])]
        if not started:
            self.connection.send_headers(stream_id, [(":status", "200"), ("content-type", serde.content_type)])
        self.connection.send_headers(stream_id, trailers, end_stream=True)
        await self.flush()


class Http2Channel(_Endpoint):
    """A client connection: many concurrent calls, one HTTP/2 stream each. Same API as TcpChannel."""

    def __init__(self, stream: trio.SocketStream, serde: ModuleType, authority: str):
        super().__init__(stream, client_side=True)
        self._serde = serde
        self._authority = authority
        self._waiting: dict[int, trio.MemorySendChannel] = {}
        self._streams_open = trio.Semaphore(limits.http2_streams_per_connection_max - 8)
        self._broken: RocketError | None = None

    async def _open_stream(self, method: str, message: dict) -> tuple[int, trio.MemoryReceiveChannel]:
        if self._broken is not None:
            raise self._broken
        spec = method_spec(method)
        body = self._serde.encode(spec.request_type, message)
        sender, receiver = trio.open_memory_channel(limits.http2_events_queued_max)
        stream_id = self.connection.get_next_available_stream_id()
        self._waiting[stream_id] = sender
        self.connection.send_headers(stream_id, [
            (":method", "POST"), (":scheme", "http"), (":authority", self._authority),
            (":path", PATH_PREFIX + method), ("content-type", self._serde.content_type)])
        await self.send_data(stream_id, body, end_stream=True)
        return stream_id, receiver

    async def _events(self, receiver: trio.MemoryReceiveChannel) -> AsyncIterator[tuple[str, object]]:
        while True:
            try:
                yield await receiver.receive()
            except trio.EndOfChannel:
                raise self._broken or RocketError(Code.CONNECTION_LOST, "connection closed") from None

    def _error(self, headers: dict[str, str], body: bytes) -> RocketError:
        try:
            return RocketError.from_wire(self._serde.decode("Error", body))
        except RocketError:
            code = headers.get("rocket-error", "INTERNAL")
            return RocketError(Code.__members__.get(code, Code.INTERNAL), headers.get("rocket-message", "HTTP/2 error"))

    async def call(self, method: str, message: dict, timeout_s: float = limits.request_timeout_s_default) -> dict:
        spec = method_spec(method)
        async with self._streams_open:
            stream_id, receiver = await self._open_stream(method, message)
            headers: dict[str, str] = {}
            body = bytearray()
            try:
                with trio.fail_after(timeout_s):
                    async for kind, value in self._events(receiver):
                        if kind == "headers":
                            headers.update(value)
                        elif kind == "data":
                            body += value
                        elif kind == "end":
                            break
            except trio.TooSlowError:
                self._reset(stream_id)
                raise RocketError(Code.TIMEOUT, f"{method} got no answer within {timeout_s} s") from None
            finally:
                self._waiting.pop(stream_id, None)
        if headers.get(":status") != "200":
            raise self._error(headers, bytes(body))
        return self._serde.decode(spec.response_type, bytes(body))

    async def stream(self, method: str, message: dict) -> AsyncIterator[dict]:
        """Yield a server stream's items; leaving the loop early resets the stream."""
        spec = method_spec(method)
        async with self._streams_open:
            stream_id, receiver = await self._open_stream(method, message)
            headers: dict[str, str] = {}
            buffer = bytearray()
            finished = False
            try:
                async for kind, value in self._events(receiver):
                    if kind == "headers":
                        headers.update(value)
                        if headers.get(":status", "200") != "200":
                            continue
                    elif kind == "data":
                        buffer += value
                        while len(buffer) >= _message_prefix.size:
                            _, length = _message_prefix.unpack_from(buffer)
                            if len(buffer) < _message_prefix.size + length:
                                break
                            item = bytes(buffer[_message_prefix.size:_message_prefix.size + length])
                            del buffer[:_message_prefix.size + length]
                            if headers.get(":status") == "200":
                                yield self._serde.decode(spec.response_type, item)
                    elif kind == "end":
                        finished = True
                        if headers.get(":status") != "200":
                            raise self._error(headers, bytes(buffer))
                        if headers.get("rocket-status", "0") != "0":
                            raise self._error(headers, b"")
                        return
            finally:
                self._waiting.pop(stream_id, None)
                if not finished:
                    self._reset(stream_id)
                    with trio.CancelScope(shield=True), trio.move_on_after(1):
                        await self.flush()

    def _reset(self, stream_id: int) -> None:
        try:
            self.connection.reset_stream(stream_id)
        except h2.exceptions.H2Error:
            pass

    def _fail(self, error: RocketError) -> None:
        if self._broken is None:
            self._broken = error
        self.closed = True
        self.open_window()
        for sender in self._waiting.values():
            sender.close()
        self._waiting.clear()

    async def read_loop(self) -> None:
        try:
            while True:
                data = await self.socket_stream.receive_some(receive_bytes)
                if not data:
                    self._fail(RocketError(Code.CONNECTION_LOST, "server closed the connection"))
                    return
                for event in self.connection.receive_data(data):
                    await self._on_event(event)
                await self.flush()
        except (trio.BrokenResourceError, trio.ClosedResourceError, h2.exceptions.ProtocolError) as error:
            self._fail(RocketError(Code.CONNECTION_LOST, f"connection lost: {error}"))

    async def _on_event(self, event) -> None:
        if isinstance(event, (h2.events.WindowUpdated, h2.events.RemoteSettingsChanged)):
            self.open_window()
            return
        if isinstance(event, h2.events.ConnectionTerminated):
            self._fail(RocketError(Code.CONNECTION_LOST, f"server closed the connection ({event.error_code!r})"))
            return
        sender = self._waiting.get(getattr(event, "stream_id", None))
        if isinstance(event, h2.events.DataReceived):
            self.connection.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
        if sender is None:
            return
        if isinstance(event, (h2.events.ResponseReceived, h2.events.TrailersReceived)):
            item = ("headers", _headers(event.headers))
        elif isinstance(event, h2.events.DataReceived):
            item = ("data", event.data)
        elif isinstance(event, h2.events.StreamEnded):
            item = ("end", None)
        elif isinstance(event, h2.events.StreamReset):
            item = ("headers", {"rocket-error": "CONNECTION_LOST", "rocket-message": "stream reset by the server"})
            await self._deliver(sender, item)
            item = ("end", None)
        else:
            return
        await self._deliver(sender, item)

    @staticmethod
    async def _deliver(sender: trio.MemorySendChannel, item) -> None:
        try:
            await sender.send(item)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass  # the caller gave up on this stream


@asynccontextmanager
async def open_http2_channel(host: str, port: int, serde_name: str = "json"):
    serde = serde_named(serde_name)
    try:
        stream = await trio.open_tcp_stream(host, port)
    except OSError as error:
        raise RocketError(Code.UNAVAILABLE, f"cannot connect to {host}:{port}: {error.strerror or error}") from None
    with collapse_single_error():
        async with stream, trio.open_nursery() as nursery:
            channel = Http2Channel(stream, serde, f"{host}:{port}")
            channel.start(client_side=True)
            await channel.flush()
            nursery.start_soon(channel.read_loop)
            try:
                yield channel
            finally:
                nursery.cancel_scope.cancel()
