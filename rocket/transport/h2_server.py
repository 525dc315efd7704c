"""The HTTP/2 server (serve_http2): rocket calls to the dispatcher, and gRPC (application/grpc) calls to a
table of GrpcHandlers, each handed a GrpcCall; over h2c, or TLS negotiated by ALPN."""

from __future__ import annotations

import logging
import math
import ssl
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import aclosing
from types import ModuleType
from typing import cast

import h2.errors
import h2.events
import h2.exceptions
import trio

from rocket import limits
from rocket.errors import Code, RocketError
from rocket.serde import json_codec
from rocket.serde.versions import for_peer, peer_version_of
from rocket.transport.grpc_wire import (GrpcError, GrpcStatus, check_grpc_prefix, grpc_message_text, grpc_timeout_s,
                                        is_grpc, message_prefix, split_messages)
from rocket.transport.h2_endpoint import (Endpoint, header_dict, method_of, path_prefix, rocket_trailers, serde_of,
                                          status_of)
from rocket.transport.listen import serve_connections, source_of
from rocket.transport.guard import Caller
from rocket.transport.lifecycle import Lifecycle
from rocket.transport.methods import encode_error
from rocket.transport.rpc import Dispatcher

log = logging.getLogger("rocket.http2")


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
        self.source = connection.caller.source  # the client's IP address
        self.caller = connection.caller  # its connection's: what client quotas hold (metering.py)
        self.user: str | None = None  # with auth on, the user the call's signature names (the gateway checks it)

    @property
    def acting(self) -> Caller:
        """Who the call acts as when it calls the node's methods (Dispatcher.local): its user, from its source."""
        return Caller(source=self.source, user=self.user)

    def _on_data(self, data: bytes) -> bool:
        """Take the client's bytes; False if they are not kept (the call already failed)."""
        if self.failure is not None:
            return False
        self._buffer += data
        try:
            self._messages.extend(split_messages(self._buffer, check_grpc_prefix))
        except GrpcError as error:
            self.failure = error
        if len(self._buffer) > limits.grpc_buffered_bytes_max or sum(map(len, self._messages)) > limits.grpc_buffered_bytes_max:
            self.failure = GrpcError(GrpcStatus.RESOURCE_EXHAUSTED, "the client sent more than the server buffers")
        self._arrived.set()
        return True

    @property
    def partial(self) -> bool:
        """A message has begun and not yet fully arrived: what http2_request_s times."""
        return bool(self._buffer) and self.failure is None and not self.client_done

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
                message = self._messages.popleft()
                # Taken by the handler: its bytes (and prefix) are no longer held, and the client may send more.
                self._connection.release(self._stream_id, len(message) + message_prefix.size)
                return message
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
        if len(message) > limits.grpc_message_bytes_max:
            raise GrpcError(GrpcStatus.RESOURCE_EXHAUSTED, f"response of {len(message)} bytes exceeds the limit")
        self.send_headers()
        await self._connection.send_data(self._stream_id, message_prefix.pack(0, len(message)) + message)

    def send_headers(self) -> None:
        if not self.headers_sent:
            self.headers_sent = True
            self._connection.connection.send_headers(
                self._stream_id, [(":status", "200"), ("content-type", "application/grpc")])


GrpcHandler = Callable[[GrpcCall], Awaitable[None]]


async def serve_http2(dispatcher: Dispatcher, lifecycle: Lifecycle, host: str, port: int, *,
                      grpc: dict[str, GrpcHandler] | None = None,
                      tls: ssl.SSLContext | Callable[[], ssl.SSLContext | None] | None = None,
                      idle_s: float = limits.http2_idle_s_default, request_s: float = limits.http2_request_s_default,
                      task_status=trio.TASK_STATUS_IGNORED) -> None:
    """Serve h2c (or, with a TLS context, HTTP/2 over TLS negotiated by ALPN) until the lifecycle drains;
    reports the bound port through task_status. grpc maps "/package.Service/Method" paths to handlers of
    application/grpc calls. tls may be a function that returns the context for each new connection (one reloaded
    on SIGHUP: transport/tls.py). A connection with no open stream for idle_s is closed (GOAWAY); a request body,
    or a gRPC message, not complete request_s after it began is reset. The listener's connections share one bound
    of partly received bodies (limits.http2_held_bytes_max): receive windows are given back as handlers take the
    bytes, so partly received bodies are bounded per connection and per node. One stream's h2 error ends that stream
    only. A request's rocket-schema header says the version its body is in and its answer is wanted in (absent: 1)."""
    held = HeldBodies()

    async def run_connection(stream: trio.abc.Stream) -> None:
        context = tls() if callable(tls) else tls
        if context is not None:
            stream = trio.SSLStream(stream, context, server_side=True)
            with trio.move_on_after(limits.tls_handshake_s_max):
                try:
                    await stream.do_handshake()
                except trio.BrokenResourceError as error:
                    log.info("TLS handshake failed: %s", error.__cause__ or error)
            if not stream.selected_alpn_protocol() == "h2":  # no handshake, or a client that did not ask for h2
                await trio.aclose_forcefully(stream)
                return
        try:
            await _ServerConnection(dispatcher, lifecycle, stream, grpc or {}, held, idle_s, request_s).run()
        except Exception:
            # A bug reached by one peer's bytes must not take the listener and every other client with it.
            log.exception("HTTP/2 connection failed")

    async def refuse_connection(stream: trio.SocketStream) -> None:
        return None  # closing is the refusal: HTTP/2 has no way to answer before the preface

    await serve_connections(lifecycle, host, port, run_connection, refuse_connection, task_status=task_status)


class HeldBodies:
    """The bytes of partly received request bodies (and unread gRPC input) that one listener's connections hold,
    and those connections: past limits.http2_held_bytes_max the biggest holder's fullest stream is reset."""

    def __init__(self) -> None:
        self.total = 0
        self.connections: set[_ServerConnection] = set()

    def enforce(self) -> None:
        while self.total > limits.http2_held_bytes_max and self.connections:
            holder = max(self.connections, key=lambda connection: connection.held)
            if not holder.shed():
                return


class _Request:
    """One stream's request as it arrives; a client reset cancels its scope, and so its handler."""

    def __init__(self, headers: dict[str, str], now: float):
        self.headers = headers
        self.held = 0  # bytes of its body (or unread gRPC input) the server holds; counted in the connection's
        self.window_owed = 0  # flow-controlled bytes received whose stream window is not yet given back
        self.started = now  # trio time its headers arrived: a body must complete within request_s of it
        self.body = bytearray()
        self.scope = trio.CancelScope()
        self.refusal: RocketError | None = None
        self.complete = False  # the client has ended its side of the stream
        self.answering = False  # a task is running the call
        self.grpc: GrpcCall | None = None  # an application/grpc call, answered by a handler from the grpc table
        self.handler_scope = trio.CancelScope()  # a gRPC handler's: a deadline or the drain ends it, not the answer


class _ServerConnection(Endpoint):
    def __init__(self, dispatcher: Dispatcher, lifecycle: Lifecycle, stream: trio.abc.Stream,
                 grpc: dict[str, GrpcHandler], held_bodies: HeldBodies | None = None,
                 idle_s: float = limits.http2_idle_s_default, request_s: float = limits.http2_request_s_default):
        super().__init__(stream, client_side=False, traffic=lifecycle.traffic)
        self.held_bodies = held_bodies or HeldBodies()
        self.held = 0  # bytes of partly received bodies this connection holds (limits.http2_connection_held_bytes_max)
        self.connection_window_owed = 0  # flow-controlled bytes received whose connection window is not given back
        self.idle_s = idle_s
        self.request_s = request_s
        self.open_scope = trio.CancelScope()  # cancelled when the connection has been idle for idle_s
        self.dispatcher = dispatcher
        self.grpc = grpc
        self.lifecycle = lifecycle
        self.requests: dict[int, _Request] = {}  # bounded by h2, which enforces MAX_CONCURRENT_STREAMS
        self.requests_done = trio.Event()
        self.requests_done.set()
        self.waiting_for_items: set[trio.CancelScope] = set()
        self.draining = False
        self.peer_gone = False
        self.caller = Caller(source=source_of(stream))  # a connection signs in once (Authenticate), as over TCP

    async def run(self) -> None:
        self.held_bodies.connections.add(self)
        try:
            await self._run()
        finally:
            self.held_bodies.connections.discard(self)
            for stream_id in list(self.requests):
                self._release_all(stream_id)

    async def _run(self) -> None:
        async with self.socket_stream, trio.open_nursery() as tasks:
            tasks.start_soon(self.write_loop)
            self.start()
            async with trio.open_nursery() as calls:
                calls.start_soon(self._read_loop, calls)
                calls.start_soon(self._watch)
                with self.open_scope:
                    await self._drain()
                calls.cancel_scope.cancel()
            if not self.peer_gone:
                self.connection.close_connection()
                with trio.move_on_after(limits.http2_goodbye_timeout_s):
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

    async def _watch(self) -> None:
        """The timeouts: a connection with no open stream for idle_s is closed; a body not complete within
        request_s of its headers (a gRPC message within request_s of its first bytes) is reset."""
        idle_since = trio.current_time()
        while True:
            await trio.sleep(min(limits.http2_watch_s_max, self.idle_s / 4, self.request_s / 4))
            now = trio.current_time()
            if self.requests:
                idle_since = now
            elif now - idle_since >= self.idle_s:
                log.info("closing an HTTP/2 connection from %s: no stream for %s s", self.caller.source, self.idle_s)
                self.open_scope.cancel()
                return
            for stream_id, request in list(self.requests.items()):
                if request.grpc is not None:
                    if not request.grpc.partial:
                        request.started = now  # a message's time starts at its first bytes
                        continue
                elif request.answering:
                    continue
                if now - request.started >= self.request_s:
                    log.info("resetting HTTP/2 stream %d from %s: its request did not arrive within %s s",
                             stream_id, self.caller.source, self.request_s)
                    self._reset_held(stream_id, h2.errors.ErrorCodes.CANCEL)
            self.wake_writer()

    def release(self, stream_id: int, size: int) -> None:
        """The application took size bytes of a stream's input: they are no longer held, and the windows reopen."""
        request = self.requests.get(stream_id)
        if request is None or size <= 0:
            return
        size = min(size, request.held)
        request.held -= size
        self.held -= size
        self.held_bodies.total -= size
        self._give_windows()
        self.wake_writer()

    def _release_all(self, stream_id: int) -> None:
        request = self.requests.get(stream_id)
        if request is not None:
            request.window_owed = 0  # nothing more is read on it
            self.release(stream_id, request.held)

    def _fullest(self) -> int | None:
        """The stream that holds most and may still receive (within its bound): the one that gets window past the
        connection's bound."""
        best, best_held = None, -1
        for stream_id, request in self.requests.items():
            if best_held < request.held <= self._bound_of(request) and self._receiving(request):
                best, best_held = stream_id, request.held
        return best

    @staticmethod
    def _receiving(request: _Request) -> bool:
        if request.grpc is not None:
            return not request.grpc.client_done and request.grpc.failure is None
        return not request.complete and not request.answering

    @staticmethod
    def _bound_of(request: _Request) -> int:
        return limits.grpc_message_bytes_max + message_prefix.size if request.grpc is not None else limits.frame_bytes_max

    def _give_windows(self) -> None:
        """Give back the windows of received bytes, as far as the bounds allow. Under
        limits.http2_connection_held_bytes_max every stream gets its window back while its input is within its
        bound, and the connection its window. Past it only the fullest stream does, and the connection only enough
        window for that stream's: it completes, its body goes to the handler, and the connection holds less."""
        open_connection = self.held <= limits.http2_connection_held_bytes_max
        fullest = None if open_connection else self._fullest()
        for stream_id, request in self.requests.items():
            if not request.window_owed:
                continue
            if not self._receiving(request):
                request.window_owed = 0  # the client has sent its last: no stream window is needed
            elif request.held <= self._bound_of(request) and (open_connection or stream_id == fullest):
                self._open_window_of(request.window_owed, stream_id)
                request.window_owed = 0
        if not self.connection_window_owed:
            return
        if open_connection:
            self._open_window_of(self.connection_window_owed, None)
            self.connection_window_owed = 0
        elif fullest is not None:
            try:
                need = (self.connection._get_stream_by_id(fullest).inbound_flow_control_window
                        - self.connection.inbound_flow_control_window)
            except h2.exceptions.ProtocolError:
                return
            grant = min(need, self.connection_window_owed)
            if grant > 0:
                self._open_window_of(grant, None)
                self.connection_window_owed -= grant

    def _open_window_of(self, size: int, stream_id: int | None) -> None:
        if size <= 0:
            return
        try:
            self.connection.increment_flow_control_window(size, stream_id)
        except (KeyError, h2.exceptions.ProtocolError):
            pass  # the stream is gone meanwhile (h2 forgets closed streams): it needs no window

    def _reset_held(self, stream_id: int, error_code: h2.errors.ErrorCodes) -> None:
        """Reset a stream whose request the server will not wait for: its bytes go, its handler is cancelled."""
        request = self.requests.get(stream_id)
        self._release_all(stream_id)
        try:
            self.connection.reset_stream(stream_id, error_code)
        except h2.exceptions.ProtocolError:
            pass  # already closed: nothing to tell the client
        if request is not None:
            request.scope.cancel()
            if not request.answering:
                self._forget(stream_id)
        self.open_window()

    def shed(self) -> bool:
        """Reset this connection's fullest stream because the node holds too much; False if it has none."""
        best = max(self.requests, key=lambda stream_id: self.requests[stream_id].held, default=None)
        if best is None or self.requests[best].held <= 0:
            return False
        log.warning("resetting HTTP/2 stream %d from %s (ENHANCE_YOUR_CALM): partly received bodies on this node "
                    "exceed %d bytes and its connection holds most", best, self.caller.source,
                    limits.http2_held_bytes_max)
        self._reset_held(best, h2.errors.ErrorCodes.ENHANCE_YOUR_CALM)
        self.wake_writer()
        return True

    async def _read_loop(self, calls: trio.Nursery) -> None:
        while not self.peer_gone:
            try:
                data = await self.socket_stream.receive_some(limits.http2_receive_bytes)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                data = b""
            if not data:
                break
            self.traffic.received_bytes += len(data)
            try:
                events = self.connection.receive_data(data)
            except h2.exceptions.ProtocolError as error:
                log.info("closing an HTTP/2 connection after a protocol error: %s", error)
                with trio.move_on_after(limits.http2_goodbye_timeout_s):
                    await self.flush()  # h2 has queued a GOAWAY saying why
                break
            for event in events:
                self._on_event(event, calls)
            self._give_windows()
            self.held_bodies.enforce()
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
        request = self.requests[event.stream_id] = _Request(header_dict(event.headers), trio.current_time())
        if self.requests_done.is_set():
            self.requests_done = trio.Event()
        if is_grpc(request.headers) and not request.headers.get(":path", "").startswith(path_prefix):
            # A gRPC call starts at its headers: a bidirectional stream's handler answers while it reads.
            request.grpc = GrpcCall(self, event.stream_id, request.headers)
            self._answer_soon(event.stream_id, request, calls)

    def _on_data(self, event: h2.events.DataReceived, calls: trio.Nursery) -> None:
        # The windows reopen as the application takes the bytes (_give_windows, after each read), never merely
        # because they arrived: what a connection makes the server hold is bounded.
        self.connection_window_owed += event.flow_controlled_length
        request = self.requests.get(event.stream_id)
        if request is not None and request.grpc is not None:
            # bounded there too: past limits.grpc_buffered_bytes_max the call fails
            if request.grpc._on_data(event.data):
                self._hold(request, event)
            return
        if request is None or request.answering:
            return
        if len(request.body) + len(event.data) > limits.frame_bytes_max:
            request.body = bytearray()
            request.refusal = RocketError(Code.FRAME_TOO_LARGE, f"request body exceeds {limits.frame_bytes_max} bytes")
            self._answer_soon(event.stream_id, request, calls)
            return
        request.body += event.data
        self._hold(request, event)

    def _hold(self, request: _Request, event: h2.events.DataReceived) -> None:
        request.held += len(event.data)
        request.window_owed += event.flow_controlled_length
        self.held += len(event.data)
        self.held_bodies.total += len(event.data)

    def _on_request_complete(self, stream_id: int, calls: trio.Nursery) -> None:
        request = self.requests.get(stream_id)
        if request is not None:
            request.complete = True
            if request.grpc is not None:
                request.grpc._on_end()
            elif not request.answering:
                self._answer_soon(stream_id, request, calls)

    def _on_reset(self, stream_id: int) -> None:
        self._release_all(stream_id)
        request = self.requests.get(stream_id)
        if request is not None:
            request.scope.cancel()
            if not request.answering:
                self._forget(stream_id)
        self.open_window()  # a sender waiting on this stream's window must wake to see it closed

    def _forget(self, stream_id: int) -> None:
        self._release_all(stream_id)
        self.requests.pop(stream_id, None)
        if not self.requests:
            self.requests_done.set()

    def _answer_soon(self, stream_id: int, request: _Request, calls: trio.Nursery) -> None:
        request.answering = True
        if request.grpc is None:
            self._release_all(stream_id)  # the body goes to the handler (or is refused): no longer held here
        self.lifecycle.call_started()
        calls.start_soon(self._call, stream_id, request)

    async def _call(self, stream_id: int, request: _Request) -> None:
        try:
            with request.scope:
                if request.grpc is not None:
                    await self._answer_grpc(stream_id, request)
                else:
                    await self._answer(stream_id, request)
        except h2.exceptions.ProtocolError as error:
            # The client reset the stream while we answered (StreamClosedError), or h2 has forgotten it already and
            # takes our answer for a new stream (StreamIDTooLowError), or the connection is closing: nobody is left
            # to tell, and the connection's other streams must go on.
            log.debug("HTTP/2 stream %d: answer dropped (%s: %s)", stream_id, type(error).__name__, error)
        finally:
            self._forget(stream_id)
            self.lifecycle.call_finished()

    async def _answer(self, stream_id: int, request: _Request) -> None:
        serde: ModuleType = json_codec  # errors found before the content-type is understood are told in JSON
        try:
            if request.refusal is not None:
                raise request.refusal
            method = method_of(request.headers)
            serde = for_peer(serde_of(request.headers), peer_version_of(request.headers.get("rocket-schema")))
            if self.dispatcher.is_streaming(method):
                await self._stream(stream_id, method, serde, bytes(request.body))
                return
            body, _ = await self.dispatcher.call(method, serde, bytes(request.body), caller=self.caller)
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
        call = cast(GrpcCall, request.grpc)  # _call sends only gRPC calls here
        failure: GrpcError | None = None
        try:
            path = request.headers.get(":path", "")
            handler = self.grpc.get(path)
            if request.headers.get(":method") != "POST":
                raise GrpcError(GrpcStatus.UNIMPLEMENTED, f"{request.headers.get(':method')} {path}: calls are POST")
            if handler is None:
                raise GrpcError(GrpcStatus.UNIMPLEMENTED, f"unknown method {path[:limits.error_excerpt_chars_max]!r}")
            timeout_s = grpc_timeout_s(request.headers.get("grpc-timeout"))
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
            trailers.append(("grpc-message", grpc_message_text(failure.message)))
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
        headers = [(":status", str(status_of(error))), ("content-type", serde.content_type)]
        if error is not None:
            headers.append(("rocket-error", error.code.name))
        self.connection.send_headers(stream_id, headers)
        await self.send_data(stream_id, body)
        self.connection.send_headers(stream_id, rocket_trailers(error), end_stream=True)
        await self.flush()

    async def _stream(self, stream_id: int, method: str, serde: ModuleType, body: bytes) -> None:
        self.connection.send_headers(stream_id, [(":status", "200"), ("content-type", serde.content_type)])
        await self.flush()
        try:
            async with aclosing(self.dispatcher.stream(method, serde, body, caller=self.caller)) as items:
                failure = await self._send_items(stream_id, items)
        except RocketError as error:
            failure = error
        self.connection.send_headers(stream_id, rocket_trailers(failure), end_stream=True)
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

