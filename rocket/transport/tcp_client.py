"""The TCP transport's client: TcpChannel multiplexes calls over one connection by request id (pipelined calls,
server-streamed responses); a post is a request nobody waits for. The frames are frames.py's; the server is tcp.py.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import ssl
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from types import ModuleType
from typing import cast

import trio

from rocket import limits
from rocket.errors import Code, RocketError, collapse_single_error
from rocket.parked import Slot
from rocket.serde import SERDE_ID_OF, serde_named
from rocket.serde.versions import for_peer, spoken
from rocket.transport import frames
from rocket.transport.channel import Channel, server_schema_version
from rocket.transport.frames import POST_SINCE_SCHEMA, Frame, FrameDecoder, FrameError, Kind
from rocket.transport.listen import connect
from rocket.transport.methods import attach, method_spec, serde_for_id
from rocket.transport.streams import Outbox, receive_into, send_parts
from rocket.transport.tls import client_handshake

log = logging.getLogger("rocket.tcp")


class TcpChannel(Channel):
    """A client connection: many concurrent calls multiplexed by request id over one socket. Connections between
    nodes (pool.py, links.py) are TcpChannels too, so they say Hello as clients do. call_parked is the data plane's
    client side: a broker's produce forwarded to another node's leader waits as a slot, not a task."""

    def __init__(self, stream: trio.abc.Stream, serde: ModuleType):
        self._stream = stream
        self._chosen = serde
        self._serde = spoken(serde, 1)  # the lane once hello() heard a server that speaks it: Avro until then
        self.peer_version: int | None = None  # the server's schema version, once hello() asked it
        self._serde_id = SERDE_ID_OF[self._serde.name]
        self._request_ids = itertools.count(1)
        self._waiting: dict[int, trio.MemorySendChannel | _ParkedCall] = {}  # a call's waiter: what read_loop answers
        self._send_lock = trio.Lock()
        self._broken: RocketError | None = None
        self.closed = trio.Event()  # set once the connection is broken or closed
        self._outbox = Outbox()  # call_parked's requests, for write_loop

    async def hello(self) -> int:
        """Tell the server this side's schema version and learn its own (a server too old to know Hello is
        version 1); from then on this channel writes and reads messages in the older of the two."""
        version = await server_schema_version(self)
        self.peer_version = version
        self._serde = for_peer(spoken(self._chosen, version), version)
        self._serde_id = SERDE_ID_OF[self._serde.name]
        return version

    async def call(self, method: str, message: dict, timeout_s: float = limits.request_timeout_s_default,
                   sent: trio.Event | None = None) -> dict:
        """The response to a request; sent, if given, is set once the request is written."""
        spec = method_spec(method)
        request_id, receiver = await self._send_request(method, message, 1)
        if sent is not None:
            sent.set()
        try:
            with trio.fail_after(timeout_s):
                kind, body, attachments = await self._receive(receiver)
        except trio.TooSlowError:
            raise RocketError(Code.TIMEOUT, f"{method} got no answer within {timeout_s} s") from None
        finally:
            self._waiting.pop(request_id, None)
        response = self._decode(spec.response_type, kind, body)
        if isinstance(attachments, list):
            attach(spec, response, attachments)
        return response

    def call_parked(self, method: str, message: dict, slot: Slot) -> None:
        """call() without a task, for the data plane: the request joins write_loop's next write, and slot completes
        with the response, or the RocketError met (the server's answer, the connection lost). Nothing here times out:
        the caller sweeps the slot's deadline. Raises CONNECTION_LOST, doing nothing, once the channel is broken."""
        if self._broken is not None:
            raise self._broken
        request_id = next(self._request_ids)
        self._waiting[request_id] = _ParkedCall(self, request_id, method_spec(method), slot)
        self._outbox.put(self._request_parts(method, message, request_id))

    async def write_loop(self) -> None:
        """Write what call_parked queued: everything queued meanwhile in one write."""
        try:
            await self._outbox.write_each(self._write)
        except RocketError:
            return  # broken: _fail told every call waiting

    async def post(self, method: str, message: dict) -> None:
        """Write a request nobody waits for: for messages whose loss the sender tolerates (Raft's), so each costs no
        waiter, no timeout and, to a server of schema version POST_SINCE_SCHEMA on (hello), no answer: a POST frame.
        An older server answers the request: the read loop drops the answer, and logs an error answer at debug level.
        Raises CONNECTION_LOST once the channel is broken."""
        if self._broken is not None:
            raise self._broken
        kind = Kind.POST if (self.peer_version or 1) >= POST_SINCE_SCHEMA else Kind.REQUEST
        await self._write(*self._request_parts(method, message, next(self._request_ids), kind))

    async def stream(self, method: str, message: dict) -> AsyncIterator[dict]:
        """Yield a server stream's items; leaving the loop early cancels the stream on the server."""
        spec = method_spec(method)
        request_id, receiver = await self._send_request(method, message, limits.stream_items_queued_max)
        finished = False
        try:
            while True:
                kind, body, _ = await self._receive(receiver)
                if kind == Kind.STREAM_END:
                    finished = True
                    return
                if kind == Kind.ERROR:
                    finished = True
                yield self._decode(spec.response_type, kind, body)
        finally:
            self._waiting.pop(request_id, None)
            if not finished and self._broken is None:  # best effort: a connection that broke meanwhile ends it too
                with trio.CancelScope(shield=True), trio.move_on_after(1), contextlib.suppress(RocketError):
                    await self._write(frames.encode(Kind.CANCEL, self._serde_id, request_id))

    async def _send_request(self, method: str, message: dict, queue_size: int):
        if self._broken is not None:
            raise self._broken
        request_id = next(self._request_ids)
        parts = self._request_parts(method, message, request_id)
        sender, receiver = trio.open_memory_channel(queue_size)
        self._waiting[request_id] = sender
        await self._write(*parts)
        return request_id, receiver

    def _request_parts(self, method: str, message: dict, request_id: int, kind: Kind = Kind.REQUEST) -> list:
        """A request frame's parts, its attachment (if the method has one) carried apart, uncopied."""
        spec = method_spec(method)
        attachment = None
        if spec.attachment_field is not None:
            attachment = message[spec.attachment_field]
            message = {**message, spec.attachment_field: b""}
        body = self._serde.encode(spec.request_type, message)
        return frames.encode_parts(kind, self._serde_id, request_id, body, method, attachment)

    async def _write(self, *parts: bytes | memoryview) -> None:
        async with self._send_lock:
            try:
                await send_parts(self._stream, parts)
            except (trio.BrokenResourceError, trio.ClosedResourceError) as error:
                self._fail(RocketError(Code.CONNECTION_LOST, f"connection lost while sending: {error}"))
                raise cast(RocketError, self._broken) from None  # _fail set it

    async def _receive(self, receiver: trio.MemoryReceiveChannel) -> tuple[Kind, bytes, list | None]:
        try:
            return await receiver.receive()
        except trio.EndOfChannel:
            raise self._broken or RocketError(Code.CONNECTION_LOST, "connection closed") from None

    def _decode(self, response_type: str, kind: Kind, body: bytes) -> dict:
        if kind == Kind.ERROR:
            raise RocketError.from_wire(self._serde.decode("Error", body))
        return self._serde.decode(response_type, body)

    def _fail(self, error: RocketError) -> None:
        if self._broken is None:
            self._broken = error
        self.closed.set()
        for sender in self._waiting.values():
            sender.close()
        self._waiting.clear()

    async def read_loop(self) -> None:
        decoder = FrameDecoder(reuse=True)
        try:
            while True:
                if not await receive_into(self._stream, decoder):
                    self._fail(RocketError(Code.CONNECTION_LOST, "server closed the connection"))
                    return
                while (frame := decoder.next_frame()) is not None:
                    sender = self._waiting.get(frame.request_id)
                    if frame.request_id == 0 and frame.kind == Kind.ERROR:
                        self._fail(RocketError.from_wire(self._serde_for(frame).decode("Error", frame.body)))
                        return
                    if sender is not None:
                        try:
                            await sender.send((frame.kind, frame.body, frame.attachment))
                        except trio.BrokenResourceError:
                            pass  # the caller gave up (timeout or cancel)
                    elif frame.kind == Kind.ERROR and log.isEnabledFor(logging.DEBUG):  # an older server's answer
                        self._unheard_error(frame)  # to a post, or a call's its caller gave up on: nobody to tell
        except (trio.BrokenResourceError, trio.ClosedResourceError, FrameError) as error:
            self._fail(RocketError(Code.CONNECTION_LOST, f"connection lost: {error}"))

    def _unheard_error(self, frame: Frame) -> None:
        """Log an error answer nobody waits for: a refused post (a link's RaftStep) says so here, and only here."""
        try:
            error = RocketError.from_wire(self._serde.decode("Error", frame.body))
        except RocketError as undecodable:  # unreadable, and still nobody's to fail
            error = undecodable
        log.debug("request %d answered %s, nobody waiting: %s", frame.request_id, error.code.name, error.message)

    @staticmethod
    def _serde_for(frame: Frame) -> ModuleType:
        return serde_for_id(frame.serde)


class _ParkedCall:
    """A call_parked call, where the read loop looks for a call's waiter: its answer completes the slot."""

    __slots__ = ("channel", "request_id", "spec", "slot")

    def __init__(self, channel: TcpChannel, request_id: int, spec, slot: Slot):
        self.channel, self.request_id, self.spec, self.slot = channel, request_id, spec, slot

    async def send(self, answer: tuple) -> None:
        kind, body, attachments = answer
        self.channel._waiting.pop(self.request_id, None)
        try:
            response = self.channel._decode(self.spec.response_type, kind, body)
            if isinstance(attachments, list):
                attach(self.spec, response, attachments)
        except RocketError as error:
            response = error
        self.slot.complete(response)

    def close(self) -> None:
        self.slot.complete(self.channel._broken or RocketError(Code.CONNECTION_LOST, "connection closed"))


@asynccontextmanager
async def open_tcp_channel(host: str, port: int, serde_name: str = "json", hello: tuple[str, dict] | None = None,
                           tls: ssl.SSLContext | None = None, server_name: str | None = None,
                           plain_fallback: bool = False, unacknowledged_s: float | None = None):
    """A channel to host:port that said Hello (schema versions); with hello (a method and its request: PeerHello,
    Authenticate), one that said that next. With tls, over TLS, the server's certificate checked against server_name
    (else host); with plain_fallback (a node in tls_mode permissive), plain once the server answered the handshake
    with something other than TLS. With unacknowledged_s, the connection breaks once what it sent waits that long
    for the server's acknowledgement (listen.connect)."""
    serde = serde_named(serde_name)
    stream = await connect(host, port, unacknowledged_s)
    if tls is not None:
        try:
            stream = await client_handshake(stream, tls, host, port, server_name)
        except RocketError as error:
            if not (plain_fallback and "WRONG_VERSION_NUMBER" in error.message):
                raise
            log.info("%s:%s speaks no TLS: connecting without (tls_mode permissive)", host, port)
            stream = await connect(host, port, unacknowledged_s)
    with collapse_single_error():
        async with stream, trio.open_nursery() as nursery:
            channel = TcpChannel(stream, serde)
            nursery.start_soon(channel.read_loop)
            nursery.start_soon(channel.write_loop)
            try:
                await channel.hello()
                if hello is not None:
                    await channel.call(*hello)
                yield channel
            finally:
                nursery.cancel_scope.cancel()
