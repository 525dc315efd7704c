"""The HTTP/2 client: Http2Channel runs many concurrent calls over one connection, one stream each, and
open_http2_channel connects it (h2c prior knowledge)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from types import ModuleType

import h2.errors
import h2.events
import h2.exceptions
import trio

from rocket import limits
from rocket.errors import Code, RocketError, collapse_single_error
from rocket.serde import SERDE_BY_CONTENT_TYPE, serde_named
from rocket.serde.schema import SCHEMA_VERSION
from rocket.serde.versions import for_peer, spoken
from rocket.transport.channel import Channel, server_schema_version
from rocket.transport.grpc_wire import split_messages
from rocket.transport.h2_endpoint import Endpoint, header_dict, path_prefix
from rocket.transport.listen import connect
from rocket.transport.methods import method_spec


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


def _reset_error(error_code: int) -> RocketError:
    if error_code == h2.errors.ErrorCodes.REFUSED_STREAM:
        return RocketError(Code.UNAVAILABLE, "the server refused the stream; it is shutting down")
    if error_code == h2.errors.ErrorCodes.ENHANCE_YOUR_CALM:
        return RocketError(Code.OVERLOADED, "the server reset the stream: too many requests")
    return RocketError(Code.CONNECTION_LOST, f"the server reset the stream ({error_code!r})")


class Http2Channel(Endpoint, Channel):
    """A client connection: many concurrent calls, one HTTP/2 stream each; the same API as TcpChannel."""

    def __init__(self, stream: trio.SocketStream, serde: ModuleType, authority: str):
        super().__init__(stream, client_side=True)
        self._chosen = serde
        self._serde = spoken(serde, 1)  # the lane once hello() heard a server that speaks it: Avro until then
        self._authority = authority
        # The server's schema version (serde/versions.py), asked with Hello before the first call; the requests
        # say in their rocket-schema header the version they are written in, which the answers are written in too.
        self.peer_version: int | None = None
        self._schema_header = str(SCHEMA_VERSION)
        self._hello_lock = trio.Lock()
        self._responses: dict[int, _Response] = {}
        self._stream_slots = trio.Semaphore(limits.http2_streams_per_connection_max)
        self._broken: RocketError | None = None
        self.settled = trio.Event()  # the server's SETTINGS arrived (it speaks HTTP/2), or the connection failed

    async def call(self, method: str, message: dict, timeout_s: float = limits.request_timeout_s_default,
                   sent: trio.Event | None = None) -> dict:
        """The response to a request; sent, if given, is set once the request is written."""
        if self.peer_version is None and method != "Hello":
            await self.hello()
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
        if self.peer_version is None:
            await self.hello()
        spec = method_spec(method)
        body = self._serde.encode(spec.request_type, message)
        async with self._open_stream(method, body) as response:
            buffer = bytearray()
            while True:
                response.changed = trio.Event()
                buffer += self._take_data(response)
                if response.fields.get(":status") == "200":
                    for item in split_messages(buffer, _check_stream_prefix):
                        yield self._serde.decode(spec.response_type, item)
                if response.ended or response.error is not None:
                    self._raise_for_failure(response, bytes(buffer))
                    if buffer:
                        raise RocketError(Code.CONNECTION_LOST, "the stream ended inside a message")
                    return
                await response.changed.wait()

    async def hello(self) -> int:
        """Learn the server's schema version (a server too old to know Hello is version 1); from then on this
        channel writes and reads messages in the older of the two."""
        async with self._hello_lock:
            if self.peer_version is None:
                version = await server_schema_version(self)
                self._serde = for_peer(spoken(self._chosen, version), version)
                self._schema_header = str(min(version, SCHEMA_VERSION))
                self.peer_version = version
        return self.peer_version

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
                (":path", path_prefix + method), ("content-type", self._serde.content_type),
                ("rocket-schema", self._schema_header)])
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
                data = await self.socket_stream.receive_some(limits.http2_receive_bytes)
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
        # An event of no stream looks up stream 0, the connection's own: no request's, as None would be no key.
        response = self._responses.get(getattr(event, "stream_id", 0))
        if response is None:
            return
        if isinstance(event, (h2.events.ResponseReceived, h2.events.TrailersReceived)):
            response.fields.update(header_dict(event.headers))
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
