"""The HTTP/2 transport (h2c prior knowledge, h2 on Trio): POST /rocket.v1/<Method>, one stream per call, serde
by content-type, rocket-status trailers, gRPC-style length-prefixed server streams, flow control both ways; and
gRPC (application/grpc) calls to a table of GrpcHandlers. Server: serve_http2. Client: Http2Channel."""

from __future__ import annotations

import logging
import math
import ssl
import struct
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import aclosing, asynccontextmanager
from types import ModuleType

import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.exceptions
import h2.settings
import trio

from rocket import limits
from rocket.errors import Code, RocketError, collapse_single_error
from rocket.serde import SERDE_BY_CONTENT_TYPE, json_codec, serde_named
from rocket.transport.listen import connect, serve_connections
from rocket.transport.rpc import Dispatcher, Lifecycle, encode_error, method_spec

log = logging.getLogger("rocket.http2")
receive_bytes = 1024 * 1024
stream_window_bytes = 16 * limits.MiB  # bulk produce must not stall on the 64 KiB default window
connection_window_bytes = 4 * stream_window_bytes  # one stream whose reader stalls must not starve the others
frame_bytes = 1 * limits.MiB  # fewer, larger DATA frames: less per-frame Python work
default_window_bytes = 65_535  # RFC 9113's initial connection window, which we raise at start
goodbye_timeout_s = 1.0  # a closing connection waits this long to deliver GOAWAY to a peer that may not read
header_text_chars_max = 1024  # rocket-message trailers: proxies and clients drop very long header values
path_prefix = "/rocket.v1/"
message_prefix = struct.Struct(">BI")  # gRPC framing: compressed flag (always 0), big-endian message length
grpc_message_bytes_max = limits.frame_bytes_max  # one gRPC message, either way: the RPC body bound
grpc_buffered_bytes_max = 2 * grpc_message_bytes_max  # a gRPC stream's unread input, so a peer cannot fill memory
grpc_timeout_s_max = 24 * 3600.0  # a longer grpc-timeout is treated as none worth tracking
GRPC_TIMEOUT_UNITS = {"H": 3600.0, "M": 60.0, "S": 1.0, "m": 1e-3, "u": 1e-6, "n": 1e-9}

STATUS_OF_CODE = {
    Code.UNKNOWN_METHOD: 404, Code.UNKNOWN_TOPIC: 404, Code.TOPIC_EXISTS: 409, Code.FRAME_TOO_LARGE: 413,
    Code.UNSUPPORTED_SERDE: 415, Code.INTERNAL: 500, Code.CORRUPT_DATA: 500, Code.OVERLOADED: 503,
    Code.UNAVAILABLE: 503, Code.TIMEOUT: 504,
}  # every other code is the caller's mistake: 400


class _RouteError(RocketError):
    """An error whose HTTP status is not its code's usual one, such as 405 for a method other than POST."""

    def __init__(self, status: int, code: Code, message: str):
        super().__init__(code, message)
        self.status = status


def _status_of(error: RocketError | None) -> int:
    if error is None:
        return 200
    return getattr(error, "status", None) or STATUS_OF_CODE.get(error.code, 400)


def _trailers(error: RocketError | None) -> list[tuple[str, str]]:
    if error is None:
        return [("rocket-status", "0")]
    return [("rocket-status", str(int(error.code))), ("rocket-error", error.code.name),
            ("rocket-message", _header_text(error.message))]


def _header_text(text: str) -> str:
    """Header values may not hold control characters or surrounding whitespace."""
    return "".join(char if char.isprintable() else " " for char in text)[:header_text_chars_max].strip()


def _header_dict(pairs) -> dict[str, str]:
    # header_encoding=None hands us bytes, so a peer's invalid UTF-8 cannot raise inside h2.
    return {bytes(name).decode("ascii", "replace"): bytes(value).decode("utf-8", "replace") for name, value in pairs}


def _local_settings(client_side: bool) -> dict[int, int]:
    settings = {
        h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: stream_window_bytes,
        h2.settings.SettingCodes.MAX_FRAME_SIZE: frame_bytes,
    }
    if client_side:
        settings[h2.settings.SettingCodes.ENABLE_PUSH] = 0
    else:
        settings[h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS] = limits.http2_streams_per_connection_max
    return settings


class _Endpoint:
    """What client and server share: the h2 state machine, the one task that writes to the socket, and
    sends that respect the peer's flow-control windows."""

    def __init__(self, socket_stream: trio.SocketStream, client_side: bool):
        self.socket_stream = socket_stream
        self.client_side = client_side
        config = h2.config.H2Configuration(client_side=client_side, header_encoding=None)
        self.connection = h2.connection.H2Connection(config=config)
        self.closed = False
        self._data_waiting = trio.Event()
        self._flushes_requested = 0
        self._flushes_done = 0
        self._flush_progress = trio.Event()
        self._window_opened = trio.Event()

    def start(self) -> None:
        self.connection.initiate_connection()
        self.connection.update_settings(_local_settings(self.client_side))
        # h2 raises its frame-size check only on the peer's ACK, and applies it from the next receive_data;
        # large DATA frames in the same read as the ACK would fail with FRAME_SIZE_ERROR. Accepting them
        # early is safe: it is the size we just advertised.
        self.connection.max_inbound_frame_size = frame_bytes
        self.connection.increment_flow_control_window(connection_window_bytes - default_window_bytes)
        self.wake_writer()

    def wake_writer(self) -> None:
        self._data_waiting.set()

    async def flush(self) -> None:
        """Wait until everything h2 has queued so far is on the socket: backpressure for whoever queued it."""
        self._flushes_requested += 1
        target = self._flushes_requested
        self.wake_writer()
        while self._flushes_done < target and not self.closed:
            await self._flush_progress.wait()

    async def write_loop(self) -> None:
        """The only task that sends on the socket, so a cancelled call never leaves half a frame behind."""
        try:
            while True:
                await self._data_waiting.wait()
                self._data_waiting = trio.Event()
                target = self._flushes_requested
                data = self.connection.data_to_send()
                if data:
                    await self.socket_stream.send_all(data)
                self._flushes_done = target
                self._announce_flush()
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            self.mark_closed()

    def mark_closed(self) -> None:
        self.closed = True
        self._announce_flush()
        self.open_window()

    def _announce_flush(self) -> None:
        self._flush_progress.set()
        self._flush_progress = trio.Event()

    def open_window(self) -> None:
        """Wake senders waiting for flow control: a window grew, settings changed or a stream was reset."""
        self._window_opened.set()
        self._window_opened = trio.Event()

    async def send_data(self, stream_id: int, data: bytes) -> None:
        """Queue data as the peer's windows allow, waiting for WINDOW_UPDATE while they are shut.
        Raises h2's StreamClosedError if the peer resets the stream meanwhile."""
        view = memoryview(data)
        while len(view) and not self.closed:
            allowed = min(self.connection.local_flow_control_window(stream_id),
                          self.connection.max_outbound_frame_size, len(view))
            if allowed <= 0:
                await self._window_opened.wait()
                continue
            self.connection.send_data(stream_id, view[:allowed])
            view = view[allowed:]
            await self.flush()


class GrpcStatus:
    """gRPC status codes (grpc/doc/statuscodes.md) that this transport answers with."""
    OK = 0
    CANCELLED = 1
    UNKNOWN = 2
    INVALID_ARGUMENT = 3
    DEADLINE_EXCEEDED = 4
    RESOURCE_EXHAUSTED = 8
    UNIMPLEMENTED = 12
    INTERNAL = 13
    UNAVAILABLE = 14
    UNAUTHENTICATED = 16


class GrpcError(Exception):
    """Raised by a gRPC handler (or the transport) to end a call with a non-OK grpc-status."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status
        self.message = message


class GrpcCall:
    """One gRPC call as its handler sees it: the request headers, the messages the client sends (raw
    protobuf bytes), and a send for response messages. The transport writes headers and trailers."""

    def __init__(self, connection: _ServerConnection, stream_id: int, headers: dict[str, str]):
        self.headers = headers
        self._connection = connection
        self._stream_id = stream_id
        self._buffer = bytearray()  # received bytes not yet split into messages
        self._messages: deque[bytes] = deque()
        self._arrived = trio.Event()
        self.client_done = False  # the client ended its side of the stream
        self.failure: GrpcError | None = None  # what the input turned out to break
        self.headers_sent = False
        self.deadline = math.inf  # trio time by which the client's grpc-timeout expires

    def _on_data(self, data: bytes) -> None:
        if self.failure is not None:
            return
        self._buffer += data
        try:
            self._messages.extend(_split_messages(self._buffer, _check_grpc_prefix))
        except GrpcError as error:
            self.failure = error
        if len(self._buffer) > grpc_buffered_bytes_max or sum(map(len, self._messages)) > grpc_buffered_bytes_max:
            self.failure = GrpcError(GrpcStatus.RESOURCE_EXHAUSTED, "the client sent more than the server buffers")
        self._arrived.set()

    def _on_end(self) -> None:
        self.client_done = True
        if self._buffer and self.failure is None:
            self.failure = GrpcError(GrpcStatus.INTERNAL, "the request stream ended inside a message")
        self._arrived.set()

    async def receive(self) -> bytes | None:
        """The client's next message, or None once it has ended its side of the stream."""
        while True:
            if self.failure is not None:
                raise self.failure
            if self._messages:
                return self._messages.popleft()
            if self.client_done:
                return None
            self._arrived = trio.Event()
            await self._arrived.wait()

    async def receive_one(self) -> bytes:
        """A unary request: exactly one message."""
        message = await self.receive()
        if message is None:
            raise GrpcError(GrpcStatus.INTERNAL, "the client sent no request message")
        return message

    async def send(self, message: bytes) -> None:
        if len(message) > grpc_message_bytes_max:
            raise GrpcError(GrpcStatus.RESOURCE_EXHAUSTED, f"response of {len(message)} bytes exceeds the limit")
        self.send_headers()
        await self._connection.send_data(self._stream_id, message_prefix.pack(0, len(message)) + message)

    def send_headers(self) -> None:
        if not self.headers_sent:
            self.headers_sent = True
            self._connection.connection.send_headers(
                self._stream_id, [(":status", "200"), ("content-type", "application/grpc")])


GrpcHandler = Callable[[GrpcCall], Awaitable[None]]


def _check_grpc_prefix(flag: int, length: int) -> None:
    """What gRPC forbids in a message prefix, as its statuses."""
    if flag == 1:
        raise GrpcError(GrpcStatus.UNIMPLEMENTED, "compressed messages are not supported (no grpc-encoding)")
    if flag != 0:
        raise GrpcError(GrpcStatus.INTERNAL, f"malformed message prefix: compressed flag {flag}")
    if length > grpc_message_bytes_max:
        raise GrpcError(GrpcStatus.RESOURCE_EXHAUSTED,
                        f"message of {length} bytes exceeds the limit of {grpc_message_bytes_max}")


def _grpc_timeout_s(value: str | None) -> float | None:
    """grpc-timeout: at most 8 digits and a unit; None when absent (a malformed one is INVALID_ARGUMENT)."""
    if value is None:
        return None
    digits, unit = value[:-1], value[-1:]
    if not digits.isdigit() or len(digits) > 8 or unit not in GRPC_TIMEOUT_UNITS:
        raise GrpcError(GrpcStatus.INVALID_ARGUMENT, f"malformed grpc-timeout {value[:32]!r}")
    timeout_s = int(digits) * GRPC_TIMEOUT_UNITS[unit]
    return None if timeout_s > grpc_timeout_s_max else timeout_s


def _is_grpc(headers: dict[str, str]) -> bool:
    content_type = headers.get("content-type", "")
    return content_type == "application/grpc" or content_type.startswith(("application/grpc+", "application/grpc;"))


async def serve_http2(dispatcher: Dispatcher, lifecycle: Lifecycle, host: str, port: int, *,
                      grpc: dict[str, GrpcHandler] | None = None, tls: ssl.SSLContext | None = None,
                      task_status=trio.TASK_STATUS_IGNORED) -> None:
    """Serve h2c (or, with a TLS context, HTTP/2 over TLS negotiated by ALPN) until the lifecycle drains;
    reports the bound port through task_status. grpc maps "/package.Service/Method" paths to handlers of
    application/grpc calls."""

    async def run_connection(stream: trio.abc.Stream) -> None:
        if tls is not None:
            stream = trio.SSLStream(stream, tls, server_side=True)
            with trio.move_on_after(limits.tls_handshake_s):
                try:
                    await stream.do_handshake()
                except trio.BrokenResourceError as error:
                    log.info("TLS handshake failed: %s", error.__cause__ or error)
            if not stream.selected_alpn_protocol() == "h2":  # no handshake, or a client that did not ask for h2
                await trio.aclose_forcefully(stream)
                return
        try:
            await _ServerConnection(dispatcher, lifecycle, stream, grpc or {}).run()
        except Exception:
            # A bug reached by one peer's bytes must not take the listener and every other client with it.
            log.exception("HTTP/2 connection failed")

    async def refuse_connection(stream: trio.SocketStream) -> None:
        return None  # closing is the refusal: HTTP/2 has no way to answer before the preface

    await serve_connections(lifecycle, host, port, run_connection, refuse_connection, task_status=task_status)


class _Request:
    """One stream's request as it arrives; a client reset cancels its scope, and so its handler."""

    def __init__(self, headers: dict[str, str]):
        self.headers = headers
        self.body = bytearray()
        self.scope = trio.CancelScope()
        self.refusal: RocketError | None = None
        self.complete = False  # the client has ended its side of the stream
        self.answering = False  # a task is running the call
        self.grpc: GrpcCall | None = None  # an application/grpc call, answered by a handler from the grpc table
        self.handler_scope = trio.CancelScope()  # a gRPC handler's: a deadline or the drain ends it, not the answer


class _ServerConnection(_Endpoint):
    def __init__(self, dispatcher: Dispatcher, lifecycle: Lifecycle, stream: trio.SocketStream,
                 grpc: dict[str, GrpcHandler]):
        super().__init__(stream, client_side=False)
        self.dispatcher = dispatcher
        self.grpc = grpc
        self.lifecycle = lifecycle
        self.requests: dict[int, _Request] = {}  # bounded by h2, which enforces MAX_CONCURRENT_STREAMS
        self.requests_done = trio.Event()
        self.requests_done.set()
        self.waiting_for_items: set[trio.CancelScope] = set()
        self.draining = False
        self.peer_gone = False

    async def run(self) -> None:
        async with self.socket_stream, trio.open_nursery() as tasks:
            tasks.start_soon(self.write_loop)
            self.start()
            async with trio.open_nursery() as calls:
                calls.start_soon(self._read_loop, calls)
                await self._drain()
                calls.cancel_scope.cancel()
            if not self.peer_gone:
                self.connection.close_connection()
                with trio.move_on_after(goodbye_timeout_s):
                    await self.flush()
            tasks.cancel_scope.cancel()

    async def _drain(self) -> None:
        """Once the node drains: refuse new streams, end server streams, give other calls the grace period.
        Reading goes on meanwhile, because answers larger than a window need the client's WINDOW_UPDATEs."""
        await self.lifecycle.draining.wait()
        self.draining = True
        for scope in list(self.waiting_for_items):
            scope.cancel()
        for request in list(self.requests.values()):
            request.handler_scope.cancel()  # gRPC streams (long polls, telemetry) end with UNAVAILABLE
        with trio.move_on_after(limits.shutdown_grace_s):
            while self.requests:
                await self.requests_done.wait()

    async def _read_loop(self, calls: trio.Nursery) -> None:
        while not self.peer_gone:
            try:
                data = await self.socket_stream.receive_some(receive_bytes)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                data = b""
            if not data:
                break
            try:
                events = self.connection.receive_data(data)
            except h2.exceptions.ProtocolError as error:
                log.info("closing an HTTP/2 connection after a protocol error: %s", error)
                with trio.move_on_after(goodbye_timeout_s):
                    await self.flush()  # h2 has queued a GOAWAY saying why
                break
            for event in events:
                self._on_event(event, calls)
            await self.flush()  # waiting here stops reading from a client that does not read our answers
        self.peer_gone = True
        calls.cancel_scope.cancel()

    def _on_event(self, event: h2.events.Event, calls: trio.Nursery) -> None:
        if isinstance(event, h2.events.RequestReceived):
            self._on_request(event, calls)
        elif isinstance(event, h2.events.DataReceived):
            self._on_data(event, calls)
        elif isinstance(event, h2.events.StreamEnded):
            self._on_request_complete(event.stream_id, calls)
        elif isinstance(event, h2.events.StreamReset):
            self._on_reset(event.stream_id)
        elif isinstance(event, (h2.events.WindowUpdated, h2.events.RemoteSettingsChanged)):
            self.open_window()
        elif isinstance(event, h2.events.ConnectionTerminated):
            self.peer_gone = True  # h2 refuses to send anything after GOAWAY, so nothing is left to do

    def _on_request(self, event: h2.events.RequestReceived, calls: trio.Nursery) -> None:
        if self.draining:
            # REFUSED_STREAM tells the client the call never ran, so retrying elsewhere is safe.
            self.connection.reset_stream(event.stream_id, h2.errors.ErrorCodes.REFUSED_STREAM)
            return
        request = self.requests[event.stream_id] = _Request(_header_dict(event.headers))
        if self.requests_done.is_set():
            self.requests_done = trio.Event()
        if _is_grpc(request.headers) and not request.headers.get(":path", "").startswith(path_prefix):
            # A gRPC call starts at its headers: a bidirectional stream's handler answers while it reads.
            request.grpc = GrpcCall(self, event.stream_id, request.headers)
            self._answer_soon(event.stream_id, request, calls)

    def _on_data(self, event: h2.events.DataReceived, calls: trio.Nursery) -> None:
        # Bodies are bounded below, per stream, so the window can reopen as soon as bytes arrive.
        self.connection.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
        request = self.requests.get(event.stream_id)
        if request is not None and request.grpc is not None:
            request.grpc._on_data(event.data)  # bounded there: past grpc_buffered_bytes_max the call fails
            return
        if request is None or request.answering:
            return
        if len(request.body) + len(event.data) > limits.frame_bytes_max:
            request.body = bytearray()
            request.refusal = RocketError(Code.FRAME_TOO_LARGE, f"request body exceeds {limits.frame_bytes_max} bytes")
            self._answer_soon(event.stream_id, request, calls)
            return
        request.body += event.data

    def _on_request_complete(self, stream_id: int, calls: trio.Nursery) -> None:
        request = self.requests.get(stream_id)
        if request is not None:
            request.complete = True
            if request.grpc is not None:
                request.grpc._on_end()
            elif not request.answering:
                self._answer_soon(stream_id, request, calls)

    def _on_reset(self, stream_id: int) -> None:
        request = self.requests.get(stream_id)
        if request is not None:
            request.scope.cancel()
            if not request.answering:
                self._forget(stream_id)
        self.open_window()  # a sender waiting on this stream's window must wake to see it closed

    def _forget(self, stream_id: int) -> None:
        self.requests.pop(stream_id, None)
        if not self.requests:
            self.requests_done.set()

    def _answer_soon(self, stream_id: int, request: _Request, calls: trio.Nursery) -> None:
        request.answering = True
        self.lifecycle.call_started()
        calls.start_soon(self._call, stream_id, request)

    async def _call(self, stream_id: int, request: _Request) -> None:
        try:
            with request.scope:
                if request.grpc is not None:
                    await self._answer_grpc(stream_id, request)
                else:
                    await self._answer(stream_id, request)
        except h2.exceptions.StreamClosedError:
            pass  # the client reset the stream while we answered; nobody is left to tell
        finally:
            self._forget(stream_id)
            self.lifecycle.call_finished()

    async def _answer(self, stream_id: int, request: _Request) -> None:
        serde: ModuleType = json_codec  # errors found before the content-type is understood are told in JSON
        try:
            if request.refusal is not None:
                raise request.refusal
            method = _method_of(request.headers)
            serde = _serde_of(request.headers)
            if self.dispatcher.is_streaming(method):
                await self._stream(stream_id, method, serde, bytes(request.body))
                return
            body, _ = await self.dispatcher.call(method, serde, bytes(request.body))
        except RocketError as error:
            await self._respond(stream_id, serde, encode_error(serde, error), error)
            if not request.complete:
                # RFC 9113 8.1: after a complete answer, NO_ERROR asks the client to stop sending its body.
                self.connection.reset_stream(stream_id, h2.errors.ErrorCodes.NO_ERROR)
                await self.flush()
            return
        await self._respond(stream_id, serde, body, None)

    async def _answer_grpc(self, stream_id: int, request: _Request) -> None:
        """Run the path's handler; every outcome, even a crash, ends in grpc-status trailers."""
        call = request.grpc
        failure: GrpcError | None = None
        try:
            path = request.headers.get(":path", "")
            handler = self.grpc.get(path)
            if request.headers.get(":method") != "POST":
                raise GrpcError(GrpcStatus.UNIMPLEMENTED, f"{request.headers.get(':method')} {path}: calls are POST")
            if handler is None:
                raise GrpcError(GrpcStatus.UNIMPLEMENTED, f"unknown method {path[:200]!r}")
            timeout_s = _grpc_timeout_s(request.headers.get("grpc-timeout"))
            if timeout_s is not None:
                call.deadline = request.handler_scope.deadline = trio.current_time() + timeout_s
            with request.handler_scope:
                await handler(call)
            if request.handler_scope.cancelled_caught:
                if self.draining:
                    raise GrpcError(GrpcStatus.UNAVAILABLE, "the server is shutting down")
                raise GrpcError(GrpcStatus.DEADLINE_EXCEEDED, "the call's grpc-timeout passed")
        except GrpcError as error:
            failure = error
        except Exception as error:  # a handler's bug must end this call only, and say so
            log.exception("gRPC method %s failed", request.headers.get(":path"))
            failure = GrpcError(GrpcStatus.INTERNAL, f"{type(error).__name__} in the server")
        trailers = [("grpc-status", str(failure.status if failure else GrpcStatus.OK))]
        if failure is not None:
            trailers.append(("grpc-message", _grpc_message_text(failure.message)))
        if call.headers_sent:
            self.connection.send_headers(stream_id, trailers, end_stream=True)
        else:  # a trailers-only response
            call.headers_sent = True
            self.connection.send_headers(stream_id, [(":status", "200"), ("content-type", "application/grpc"),
                                                     *trailers], end_stream=True)
        await self.flush()
        if not request.complete:  # stop a client still sending: the call is over (RFC 9113 8.1)
            self.connection.reset_stream(stream_id, h2.errors.ErrorCodes.NO_ERROR)
            await self.flush()

    async def _respond(self, stream_id: int, serde: ModuleType, body: bytes, error: RocketError | None) -> None:
        headers = [(":status", str(_status_of(error))), ("content-type", serde.content_type)]
        if error is not None:
            headers.append(("rocket-error", error.code.name))
        self.connection.send_headers(stream_id, headers)
        await self.send_data(stream_id, body)
        self.connection.send_headers(stream_id, _trailers(error), end_stream=True)
        await self.flush()

    async def _stream(self, stream_id: int, method: str, serde: ModuleType, body: bytes) -> None:
        self.connection.send_headers(stream_id, [(":status", "200"), ("content-type", serde.content_type)])
        await self.flush()
        try:
            async with aclosing(self.dispatcher.stream(method, serde, body)) as items:
                failure = await self._send_items(stream_id, items)
        except RocketError as error:
            failure = error
        self.connection.send_headers(stream_id, _trailers(failure), end_stream=True)
        await self.flush()

    async def _send_items(self, stream_id: int, items: AsyncIterator[bytes]) -> RocketError | None:
        """Send each item whole; draining interrupts only the wait for the next one."""
        while True:
            with trio.CancelScope() as waiting:
                self.waiting_for_items.add(waiting)
                if self.draining:
                    waiting.cancel()
                try:
                    item = await anext(items)
                except StopAsyncIteration:
                    return None
                finally:
                    self.waiting_for_items.discard(waiting)
            if waiting.cancelled_caught:
                return RocketError(Code.UNAVAILABLE, "the server is shutting down")
            await self.send_data(stream_id, message_prefix.pack(0, len(item)) + item)


def _grpc_message_text(text: str) -> str:
    """grpc-message is percent-encoded UTF-8 (gRPC over HTTP/2, "Responses")."""
    return "".join(char if " " <= char <= "~" and char != "%" else "".join(f"%{byte:02X}" for byte in char.encode())
                   for char in text[:header_text_chars_max])


def _method_of(headers: dict[str, str]) -> str:
    path = headers.get(":path", "").split("?", 1)[0]
    if not path.startswith(path_prefix):
        raise _RouteError(404, Code.UNKNOWN_METHOD, f"{path!r}: calls are POST {path_prefix}<Method>")
    if headers.get(":method") != "POST":
        raise _RouteError(405, Code.BAD_REQUEST, f"{headers.get(':method')} {path}: calls are POST")
    name = path[len(path_prefix):]
    method_spec(name)
    return name


def _serde_of(headers: dict[str, str]) -> ModuleType:
    content_type = headers.get("content-type")
    if content_type is None:
        return json_codec
    serde = SERDE_BY_CONTENT_TYPE.get(content_type.split(";", 1)[0].strip().lower())
    if serde is None:
        raise RocketError(Code.UNSUPPORTED_SERDE,
                          f"content-type {content_type!r} is not one of {', '.join(sorted(SERDE_BY_CONTENT_TYPE))}")
    return serde


class _Response:
    """One call's response as it arrives. Its data counts against flow control until the caller takes it,
    so what waits here is bounded by the stream window."""

    def __init__(self, stream_id: int):
        self.stream_id = stream_id
        self.fields: dict[str, str] = {}  # headers and trailers
        self.data = bytearray()
        self.unacknowledged_bytes = 0
        self.ended = False
        self.error: RocketError | None = None
        self.changed = trio.Event()


def _check_stream_prefix(flag: int, length: int) -> None:
    if flag != 0 or length > limits.frame_bytes_max:
        raise RocketError(Code.BAD_FRAME, f"stream message with flag {flag} and length {length}")


def _split_messages(buffer: bytearray, check=_check_stream_prefix) -> list[bytes]:
    """Remove and return the complete length-prefixed messages at the front of buffer (gRPC's framing:
    1 flag byte, 4-byte length); check(flag, length) refuses a prefix."""
    messages, offset = [], 0
    while len(buffer) - offset >= message_prefix.size:
        flag, length = message_prefix.unpack_from(buffer, offset)
        check(flag, length)
        end = offset + message_prefix.size + length
        if len(buffer) < end:
            break
        messages.append(bytes(buffer[offset + message_prefix.size:end]))
        offset = end
    del buffer[:offset]
    return messages


def _reset_error(error_code: int) -> RocketError:
    if error_code == h2.errors.ErrorCodes.REFUSED_STREAM:
        return RocketError(Code.UNAVAILABLE, "the server refused the stream; it is shutting down")
    if error_code == h2.errors.ErrorCodes.ENHANCE_YOUR_CALM:
        return RocketError(Code.OVERLOADED, "the server reset the stream: too many requests")
    return RocketError(Code.CONNECTION_LOST, f"the server reset the stream ({error_code!r})")


class Http2Channel(_Endpoint):
    """A client connection: many concurrent calls, one HTTP/2 stream each; the same API as TcpChannel."""

    def __init__(self, stream: trio.SocketStream, serde: ModuleType, authority: str):
        super().__init__(stream, client_side=True)
        self._serde = serde
        self._authority = authority
        self._responses: dict[int, _Response] = {}
        self._stream_slots = trio.Semaphore(limits.http2_streams_per_connection_max)
        self._broken: RocketError | None = None
        self.settled = trio.Event()  # the server's SETTINGS arrived (it speaks HTTP/2), or the connection failed

    async def call(self, method: str, message: dict, timeout_s: float = limits.request_timeout_s_default,
                   sent: trio.Event | None = None) -> dict:
        """The response to a request; sent, if given, is set once the request is written."""
        spec = method_spec(method)
        body = self._serde.encode(spec.request_type, message)
        try:
            with trio.fail_after(timeout_s):
                async with self._open_stream(method, body) as response:
                    if sent is not None:
                        sent.set()
                    payload = await self._read_body(response)
        except trio.TooSlowError:
            raise RocketError(Code.TIMEOUT, f"{method} got no answer within {timeout_s} s") from None
        self._raise_for_failure(response, payload)
        return self._serde.decode(spec.response_type, payload)

    async def stream(self, method: str, message: dict) -> AsyncIterator[dict]:
        """Yield a server stream's items; leaving the loop early resets the stream."""
        spec = method_spec(method)
        body = self._serde.encode(spec.request_type, message)
        async with self._open_stream(method, body) as response:
            buffer = bytearray()
            while True:
                response.changed = trio.Event()
                buffer += self._take_data(response)
                if response.fields.get(":status") == "200":
                    for item in _split_messages(buffer):
                        yield self._serde.decode(spec.response_type, item)
                if response.ended or response.error is not None:
                    self._raise_for_failure(response, bytes(buffer))
                    if buffer:
                        raise RocketError(Code.CONNECTION_LOST, "the stream ended inside a message")
                    return
                await response.changed.wait()

    async def _read_body(self, response: _Response) -> bytes:
        body = bytearray()
        while True:
            response.changed = trio.Event()
            body += self._take_data(response)
            if len(body) > limits.frame_bytes_max:
                raise RocketError(Code.FRAME_TOO_LARGE, f"response body exceeds {limits.frame_bytes_max} bytes")
            if response.ended or response.error is not None:
                return bytes(body)
            await response.changed.wait()

    def _take_data(self, response: _Response) -> bytearray:
        data, response.data = response.data, bytearray()
        self._acknowledge(response)
        return data

    def _acknowledge(self, response: _Response) -> None:
        """Reopen the window only for bytes the caller has taken, so a slow reader slows the server."""
        if response.unacknowledged_bytes and not self.closed:
            self.connection.acknowledge_received_data(response.unacknowledged_bytes, response.stream_id)
            self.wake_writer()
        response.unacknowledged_bytes = 0

    def _raise_for_failure(self, response: _Response, body: bytes) -> None:
        if response.error is not None:
            raise response.error
        status = response.fields.get(":status")
        if status == "200" and response.fields.get("rocket-status", "0") == "0":
            return
        raise self._error_of(response.fields, body if status != "200" else b"")

    def _error_of(self, fields: dict[str, str], body: bytes) -> RocketError:
        serde = SERDE_BY_CONTENT_TYPE.get(fields.get("content-type", ""), self._serde)
        if body:
            try:
                return RocketError.from_wire(serde.decode("Error", body))
            except RocketError:
                pass  # not an Error message (a proxy's page, say); the headers still tell what happened
        name = fields.get("rocket-error")
        if name is None:
            return RocketError(Code.INTERNAL, f"HTTP status {fields.get(':status')} without a rocket-error header")
        return RocketError(Code.__members__.get(name, Code.INTERNAL), fields.get("rocket-message", name))

    @asynccontextmanager
    async def _open_stream(self, method: str, body: bytes) -> AsyncIterator[_Response]:
        async with self._stream_slots:
            response = self._start_request(method)
            try:
                await self._send_body(response.stream_id, body)
                yield response
            finally:
                self._finish(response)

    def _start_request(self, method: str) -> _Response:
        if self._broken is not None:
            raise self._broken
        try:
            stream_id = self.connection.get_next_available_stream_id()
            self.connection.send_headers(stream_id, [
                (":method", "POST"), (":scheme", "http"), (":authority", self._authority),
                (":path", path_prefix + method), ("content-type", self._serde.content_type)])
        except h2.exceptions.ProtocolError as error:
            raise RocketError(Code.CONNECTION_LOST, f"cannot open a stream: {error}") from None
        response = _Response(stream_id)
        self._responses[stream_id] = response
        return response

    async def _send_body(self, stream_id: int, body: bytes) -> None:
        try:
            await self.send_data(stream_id, body)
            if not self.closed:
                self.connection.end_stream(stream_id)
                await self.flush()
        except h2.exceptions.StreamClosedError:
            pass  # the server answered early (413, say) or reset the stream; the response tells which

    def _finish(self, response: _Response) -> None:
        self._responses.pop(response.stream_id, None)
        self._acknowledge(response)
        if self.closed:
            return
        try:
            self.connection.reset_stream(response.stream_id, h2.errors.ErrorCodes.CANCEL)
            self.wake_writer()
        except h2.exceptions.StreamClosedError:
            pass  # both sides ended it: the normal case

    async def write_loop(self) -> None:
        await super().write_loop()
        # The writer returns only when the socket broke; calls must not wait for a reader to notice too.
        self._fail(RocketError(Code.CONNECTION_LOST, "connection lost while sending"))

    def _fail(self, error: RocketError) -> None:
        if self._broken is None:
            self._broken = error
        self.mark_closed()
        self.settled.set()
        for response in self._responses.values():
            response.error = response.error or self._broken
            response.changed.set()

    async def read_loop(self) -> None:
        try:
            while True:
                data = await self.socket_stream.receive_some(receive_bytes)
                if not data:
                    self._fail(RocketError(Code.CONNECTION_LOST, "the server closed the connection"))
                    return
                for event in self.connection.receive_data(data):
                    self._on_event(event)
                # Never wait for the socket here: the server may be waiting for us to read.
                self.wake_writer()
        except (trio.BrokenResourceError, trio.ClosedResourceError, h2.exceptions.ProtocolError) as error:
            self.wake_writer()  # after a protocol error h2 has queued a GOAWAY saying why
            self._fail(RocketError(Code.CONNECTION_LOST, f"connection lost: {error}"))

    def _on_event(self, event: h2.events.Event) -> None:
        if isinstance(event, (h2.events.WindowUpdated, h2.events.RemoteSettingsChanged)):
            self.open_window()
            if isinstance(event, h2.events.RemoteSettingsChanged):
                self.settled.set()
        elif isinstance(event, h2.events.ConnectionTerminated):
            self._fail(_goodbye_error(event))
        elif isinstance(event, h2.events.DataReceived):
            self._on_data(event)
        else:
            self._on_stream_event(event)

    def _on_data(self, event: h2.events.DataReceived) -> None:
        response = self._responses.get(event.stream_id)
        if response is None:
            # Nobody will take these bytes; give the connection window back at once.
            self.connection.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
            return
        response.data += event.data
        response.unacknowledged_bytes += event.flow_controlled_length
        response.changed.set()

    def _on_stream_event(self, event: h2.events.Event) -> None:
        response = self._responses.get(getattr(event, "stream_id", None))
        if response is None:
            return
        if isinstance(event, (h2.events.ResponseReceived, h2.events.TrailersReceived)):
            response.fields.update(_header_dict(event.headers))
        elif isinstance(event, h2.events.StreamEnded):
            response.ended = True
        elif isinstance(event, h2.events.StreamReset):
            self.open_window()
            if not response.ended:  # a reset after a complete answer only asks us to stop sending
                response.error = _reset_error(event.error_code)
        else:
            return
        response.changed.set()


def _goodbye_error(event: h2.events.ConnectionTerminated) -> RocketError:
    if event.error_code == h2.errors.ErrorCodes.NO_ERROR:
        return RocketError(Code.UNAVAILABLE, "the server closed the connection: it is shutting down")
    return RocketError(Code.CONNECTION_LOST, f"the server closed the connection ({event.error_code!r})")


@asynccontextmanager
async def open_http2_channel(host: str, port: int, serde_name: str = "json"):
    serde = serde_named(serde_name)
    stream = await connect(host, port)
    with collapse_single_error():
        async with stream, trio.open_nursery() as nursery:
            channel = Http2Channel(stream, serde, f"{host}:{port}")
            nursery.start_soon(channel.write_loop)
            nursery.start_soon(channel.read_loop)
            channel.start()
            await _wait_ready(channel, host, port)
            try:
                yield channel
            finally:
                nursery.cancel_scope.cancel()


async def _wait_ready(channel: Http2Channel, host: str, port: int) -> None:
    """Calls wait for the server's SETTINGS, so the first burst of them respects its stream limit."""
    with trio.move_on_after(limits.request_timeout_s_default):
        await channel.settled.wait()
    if channel._broken is not None or not channel.settled.is_set():
        reason = channel._broken.message if channel._broken is not None else "no SETTINGS frame"
        raise RocketError(Code.UNAVAILABLE, f"{host}:{port} did not answer as an HTTP/2 server: {reason}")
