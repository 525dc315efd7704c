"""The TCP transport's server: length-prefixed frames (frames.py), pipelined calls, server-streamed responses.
The client is tcp_client.py; streams.py holds the byte movers both share.
"""

from __future__ import annotations

import functools
import logging
import math
import socket
import ssl
from collections.abc import Awaitable, Callable
from types import ModuleType
from typing import cast

import trio

from rocket import limits
from rocket.errors import Code, RocketError
from rocket.parked import Slot, Unparked
from rocket.serde.schema import SCHEMA_VERSION
from rocket.serde.versions import for_peer, peer_version_of
from rocket.transport import frames
from rocket.transport.frames import Frame, FrameDecoder, FrameError, Kind
from rocket.transport.listen import cancel_on, serve_connections, source_of
from rocket.transport.guard import Caller
from rocket.transport.lifecycle import Lifecycle
from rocket.transport.methods import METHODS, encode_error, serde_for_id
from rocket.transport.rpc import Dispatcher
from rocket.transport.streams import Outbox, receive_into, send_parts
from rocket.transport.tls import HANDSHAKE, NodeTls, handshake

log = logging.getLogger("rocket.tcp")


async def serve_tcp(
    dispatcher: Dispatcher,
    lifecycle: Lifecycle,
    host: str,
    port: int,
    *,
    other: tuple[Callable[[bytes], bool], Callable[[trio.abc.Stream, bytes], Awaitable[None]]] | None = None,
    tls: NodeTls | None = None,
    frame_s: float = limits.tcp_frame_s_default,
    idle_s: float = limits.tcp_idle_s_default,
    task_status=trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve the TCP protocol until the lifecycle drains; reports the bound port through task_status.
    other: (is_other, serve_other) for a second protocol on the same port (RocketMQ remoting's connections share the
    port and its limits). A connection's first limits.tcp_sniff_bytes decide: is_other(them) hands the connection,
    with them, to serve_other.
    tls: the node's TLS (transport/tls.py): a connection whose first byte opens a TLS handshake is served over TLS,
    with tls.tcp as it is when it connects; one that does not, only in permissive mode. The sniff for other
    protocols reads the decrypted bytes. With tls_ca, a connection whose client certificate verified is a peer.
    frame_s, idle_s: a request frame's longest arrival and a connection's longest idleness (the node's tcp_frame_s
    and tcp_idle_s)."""
    budget = ReceiveBudget(limits.tcp_partial_frames_bytes_max)

    async def run_connection(socket_stream: trio.SocketStream) -> None:
        stream: trio.abc.Stream = socket_stream  # an SSLStream once a TLS handshake is done
        peer = False
        if tls is not None and (context := tls.tcp) is not None:
            first_byte = await _peek_first_byte(stream)
            if first_byte is None:  # closed, or silent
                await stream.aclose()
                return
            if first_byte == HANDSHAKE:
                secured = await _accept_tls(socket_stream, context)
                if secured is None:
                    return
                peer = tls.verifies_peers and bool(secured.getpeercert())
                stream = secured
            elif not tls.plain_accepted:
                await _refuse_plain(stream)
                return
        first = b""
        if other is not None:
            is_other, serve_other = other
            with trio.move_on_after(limits.tcp_sniff_s_max):
                while len(first) < limits.tcp_sniff_bytes:
                    try:
                        data = await stream.receive_some(limits.tcp_receive_bytes)
                    except (trio.BrokenResourceError, trio.ClosedResourceError):
                        data = b""
                    if not data:
                        break
                    first += data
            if len(first) < limits.tcp_sniff_bytes:  # closed, or silent: nothing to serve
                await trio.aclose_forcefully(stream)
                return
            if is_other(first):
                await serve_other(stream, first)
                return
        await _ServerConnection(dispatcher, lifecycle, stream, peer, frame_s=frame_s, idle_s=idle_s,
                                budget=budget).run(first)

    async def refuse_connection(stream: trio.SocketStream) -> None:
        await _send_quietly(stream, _error_frame(1, 0, RocketError(Code.OVERLOADED, "too many connections")))

    await serve_connections(lifecycle, host, port, run_connection, refuse_connection, task_status=task_status)


async def _peek_first_byte(stream: trio.SocketStream) -> int | None:
    """The connection's first byte, left in the socket for whoever reads next; None if it closes or stays silent."""
    with trio.move_on_after(limits.tcp_sniff_s_max):
        try:
            first = await stream.socket.recv(1, socket.MSG_PEEK)
        except OSError:
            return None
        return first[0] if first else None
    return None


async def _accept_tls(stream: trio.SocketStream, context: ssl.SSLContext) -> trio.SSLStream | None:
    """The server side of a TLS handshake within limits.tls_handshake_s_max; None (logged once, with the client's
    address, and the connection closed) if it fails."""
    wrapped = trio.SSLStream(stream, context, server_side=True, https_compatible=True)
    try:
        await handshake(wrapped)
        return wrapped
    except trio.TooSlowError:
        reason = f"not finished within {limits.tls_handshake_s_max:g} s"
    except (trio.BrokenResourceError, trio.ClosedResourceError) as error:
        reason = str(error.__cause__ or error)
    try:
        source = "%s:%s" % stream.socket.getpeername()[:2]
    except OSError:
        source = "a client"
    log.info("TLS handshake from %s failed: %s", source, reason)
    await trio.aclose_forcefully(wrapped)
    return None


async def _refuse_plain(stream: trio.SocketStream) -> None:
    """Tell a plain client, in a frame it reads, that this port takes TLS only; then close."""
    error = RocketError(Code.UNAUTHENTICATED, "this port takes TLS only (tls_mode enforcing): connect with TLS "
                        "(the CLI's --tls or --tls-ca)")
    await _send_quietly(stream, _error_frame(1, 0, error))
    with trio.move_on_after(0.2):  # what the client sent unread would turn the close into a reset, losing the answer
        try:
            await stream.receive_some(limits.tcp_receive_bytes)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
    await trio.aclose_forcefully(stream)


async def _send_quietly(stream: trio.abc.SendStream, data: bytes) -> None:
    try:
        with trio.move_on_after(1):
            await stream.send_all(data)
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass


def _error_frame(serde_id: int, request_id: int, error: RocketError) -> bytes:
    try:
        serde = serde_for_id(serde_id)
    except RocketError:
        serde_id, serde = 1, serde_for_id(1)
    return frames.encode(Kind.ERROR, serde_id, request_id, encode_error(serde, error))


class ReceiveBudget:
    """The bytes a listener's connections hold for frames not yet whole (FrameDecoder.held_bytes), together. Past
    bytes_max the connection holding the most is closed, OVERLOADED: a decoder's memory follows what arrived, and
    this bounds what arrived and is not whole yet across many connections."""

    def __init__(self, bytes_max: int):
        self.bytes_max = bytes_max
        self.total = 0
        self._held: dict[_ServerConnection, int] = {}

    def hold(self, connection: _ServerConnection, count: int) -> None:
        """Say what connection holds now (0 once it is closed)."""
        self.total -= self._held.pop(connection, 0)
        if count and connection.closing is None:
            self._held[connection] = count
            self.total += count
        while self.total > self.bytes_max:
            biggest = max(self._held, key=self._held.__getitem__)
            held = self._held.pop(biggest)
            self.total -= held
            biggest.close_for(RocketError(
                Code.OVERLOADED, f"the server holds {self.total + held} bytes of frames not yet whole, over its limit "
                f"of {self.bytes_max}; this connection held the most ({held}): closing it"))


class _Closing(Exception):
    """The server closes the connection: error (if any) is sent to the client first."""

    def __init__(self, error: RocketError | None):
        self.error = error


class _ServerConnection:
    """One connection's server: one reader, one task per call (bounded; the reader serves an inline method's calls
    itself, in order, and sends their answers together before it reads again), whole frames written under a lock. A
    data-plane call (a method with a parked handler: Produce, StorageAppend) takes no task: the reader parks it
    (rocket/parked.py); one the handler cannot park (Unparked) is a task as usual. A writer task sends the answers of
    parked calls and of tasks: whatever one Raft round or one pass of the scheduler completed, in one write. A call
    holds its in-flight slot until its answer is written, so a client that stops reading stops the server reading it.
    The connection is closed when a request frame takes longer than frame_s to arrive (time the server spends not
    reading excluded), when it has no call in flight (a long poll and a stream are calls) for idle_s, and, the one
    holding the most, when the listener's connections together hold more than limits.tcp_partial_frames_bytes_max of
    frames not yet whole. A client that says no Hello is taken for schema version 1."""

    def __init__(self, dispatcher: Dispatcher, lifecycle: Lifecycle, stream: trio.abc.Stream, peer: bool = False, *,
                 frame_s: float = limits.tcp_frame_s_default, idle_s: float = limits.tcp_idle_s_default,
                 budget: ReceiveBudget | None = None):
        self.dispatcher = dispatcher
        self.lifecycle = lifecycle
        self.stream = stream
        self.send_lock = trio.Lock()
        self.in_flight = trio.Semaphore(limits.in_flight_requests_per_connection_max)
        self.streams: dict[int, trio.CancelScope] = {}  # request id -> its open stream: each holds an in-flight slot
        # Who it proved to be: a node of the cluster (its client certificate verified against tls_ca, or it said
        # PeerHello) may call the methods between nodes; a user signed in with Authenticate.
        self.caller = Caller(source=source_of(stream), peer=peer)
        self.peer_version = 1  # the client's schema version, from its Hello (one that says nothing is version 1)
        self.frame_s = frame_s
        self.idle_s = idle_s
        self.budget = budget
        self.closing: RocketError | None = None  # why the server closes the connection (ReceiveBudget)
        self._read_scope: trio.CancelScope | None = None
        self._receiving: trio.CancelScope | None = None  # the receive under way, whose deadline a call's end moves
        self._partial = False  # whether that receive waits for the rest of a frame (else for a new one)
        self._replies: list = []  # answers to inline requests (MethodSpec.inline), sent together before the next read
        # Unary calls' answers (a parked call's, a task's) are queued for one writer task (_write_answers): what
        # a Raft round or one pass of the scheduler completed goes in one write. A call holds its in-flight slot until
        # its answer was written.
        self._open = 0  # calls served by a task or parked whose end (_ended) has not come: the writer waits for them
        self._answers = Outbox()
        self._writer_started = False
        self._writer_gone = False
        self._reading_done = False

    def close_for(self, error: RocketError) -> None:
        """Stop reading, tell the client error, and close (in-flight calls get the usual grace)."""
        self.closing = error
        if self._read_scope is not None:
            self._read_scope.cancel()

    def _deadline(self, waited_s: float) -> float:
        """When the receive starting now gives up: the frame begun gets frame_s of the server's waiting in all; a
        connection with no call in flight (a long poll, a stream) gets idle_s; one with calls in flight, no limit."""
        if self._partial:
            return trio.current_time() + self.frame_s - waited_s
        if self.in_flight.value < limits.in_flight_requests_per_connection_max:
            return math.inf
        return trio.current_time() + self.idle_s

    async def run(self, first: bytes = b"") -> None:
        async with self.stream:
            async with trio.open_nursery() as calls:
                await self._read_until_done(calls, first)
                self._reading_done = True
                self._answers.wake()  # the writer ends once the open calls are answered
                # Streams never end by themselves; in-flight unary calls get a bounded time to answer.
                for scope in list(self.streams.values()):
                    scope.cancel()
                if self.peer_gone:
                    calls.cancel_scope.cancel()
                else:
                    calls.cancel_scope.deadline = trio.current_time() + limits.shutdown_grace_s

    async def _read_until_done(self, calls: trio.Nursery, first: bytes) -> None:
        with trio.CancelScope() as read_scope:
            self._read_scope = read_scope
            async with trio.open_nursery() as watcher:
                watcher.start_soon(cancel_on, self.lifecycle.draining, read_scope)
                try:
                    await self._read_loop(calls, first)
                except FrameError as error:
                    await self._send(_error_frame(1, error.request_id, error))
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    self.peer_gone = True
                except _Closing as closing:
                    self.closing = closing.error
                    if closing.error is None:  # idle: nobody waits for anything
                        self.peer_gone = True
                watcher.cancel_scope.cancel()
        if self.budget is not None:
            self.budget.hold(self, 0)
        if self.closing is not None:
            log.debug("closing the connection from %s: %s", self.caller.source, self.closing.message)
            with trio.move_on_after(1):
                await self._send(_error_frame(1, 0, self.closing))

    peer_gone = False

    async def _read_loop(self, calls: trio.Nursery, first: bytes) -> None:
        decoder = FrameDecoder()
        decoder.feed(first)
        traffic = self.lifecycle.traffic
        waited_s = 0.0  # how long the server waited for the rest of the frame begun (not while it did not read)
        while True:
            while (frame := decoder.next_frame()) is not None:
                waited_s = 0.0
                await self._dispatch(frame, calls)
            await self._flush_replies()
            self._partial = decoder.buffered_bytes > 0
            if not self._partial:
                waited_s = 0.0
            if self.budget is not None:
                self.budget.hold(self, decoder.held_bytes)
            with trio.CancelScope(deadline=self._deadline(waited_s)) as receiving:
                self._receiving = receiving
                started = trio.current_time()
                try:
                    received = await receive_into(self.stream, decoder)
                finally:
                    self._receiving = None
                    waited_s += trio.current_time() - started
            if receiving.cancelled_caught:
                if self._partial:
                    raise _Closing(RocketError(Code.TIMEOUT, f"a request frame did not arrive whole within "
                                               f"{self.frame_s:g} s: closing the connection"))
                raise _Closing(None)
            if not received:
                self.peer_gone = True
                return
            traffic.received_bytes += received

    async def _dispatch(self, frame: Frame, calls: trio.Nursery) -> None:
        if frame.kind == Kind.CANCEL:
            scope = self.streams.get(frame.request_id)
            if scope is not None:
                scope.cancel()
            return
        if frame.kind not in (Kind.REQUEST, Kind.POST):
            raise FrameError(Code.BAD_FRAME, f"a client may not send {frame.kind.name} frames", frame.request_id)
        muted_s = self.caller.muted_until - trio.current_time()
        if muted_s > 0:  # over a quota (metering.py): read nothing more of this connection until its throttle passed
            await trio.sleep(muted_s)
        if frame.kind == Kind.POST:
            await self._posted(frame)
            return
        spec = METHODS.get(frame.method)
        if spec is not None and spec.inline:
            self._replies += await self._unary(frame)
            return
        decoded = None
        if self.in_flight.value and self.dispatcher.parks(frame.method):
            parked, decoded = self._park(frame, calls)
            if parked:
                return
        await self._flush_replies()  # before this call may wait for a slot
        await self.in_flight.acquire()
        self._started(calls)
        calls.start_soon(self._call, frame, decoded)

    def _started(self, calls: trio.Nursery) -> None:
        """A call holds its in-flight slot (taken) from here until _ended, after its answer was written."""
        self.lifecycle.call_started()
        self._open += 1
        if not self._writer_started:
            calls.start_soon(self._write_answers)
            self._writer_started = True

    def _ended(self, count: int = 1) -> None:
        """count calls ended: answered (their answers written, or the write failed) or not (a stream, a failure)."""
        self._open -= count
        for _ in range(count):
            self.lifecycle.call_finished()
            self.in_flight.release()
        if self._reading_done and not self._open:
            self._answers.wake()
        if self._receiving is not None and not self._partial:  # perhaps idle now: the idle clock starts
            self._receiving.deadline = self._deadline(0.0)

    def _park(self, frame: Frame, calls: trio.Nursery) -> tuple[bool, dict | None]:
        """Serve a data-plane call here, in the read loop, with no task: parked (rocket/parked.py), it holds an
        in-flight slot until the writer wrote its answer. (False, the request if decoded), with nothing done, if it
        must be a task."""
        self.in_flight.acquire_nowait()
        self._started(calls)
        slot = Slot(functools.partial(self._answer_parked, frame))
        try:
            self.dispatcher.park(frame.method, self._serde_of(frame), frame.body, frame.attachment, self.caller, slot)
        except Unparked as unparked:
            self._ended()
            return False, unparked.request
        except RocketError as error:
            slot.complete(error)
        return True, None

    def _answer_parked(self, frame: Frame, outcome: object) -> None:
        """A parked call's answer: queued for the writer, with everything else the same round completes."""
        if isinstance(outcome, RocketError):
            self._answer([_error_frame(frame.serde, frame.request_id, outcome)])
        else:
            body, attachments = cast("tuple[bytes, list | None]", outcome)  # call()'s result, from park()
            self._answer(frames.encode_parts(Kind.RESPONSE, frame.serde, frame.request_id, body,
                                             attachment=attachments))

    def _answer(self, parts: list) -> None:
        """Queue a call's answer for the writer; the call ends once it is written. After the writer's end (the
        connection closed with calls still parked) the call just ends."""
        if self._writer_gone:
            self._ended()
        else:
            self._answers.put(parts, 1)

    async def _write_answers(self) -> None:
        """Send calls' answers as they come: whatever one round or one pass of the scheduler completed, in one
        write. Ends once the connection reads no more and every open call ended (or with the calls' grace, like a
        task); then the calls whose answers were never written end too."""
        try:
            await self._answers.write_each(self._send, lambda: self._reading_done and not self._open, self._ended)
        finally:
            self._writer_gone = True
            if self._answers.count:
                count, self._answers.count = self._answers.count, 0
                self._ended(count)

    def _serde_of(self, frame: Frame) -> ModuleType:
        """The serde a request is in: an older client's is read in its schemas (same version: no cost)."""
        serde = serde_for_id(frame.serde)
        if self.peer_version < SCHEMA_VERSION:
            serde = for_peer(serde, self.peer_version)
        return serde

    async def _posted(self, frame: Frame) -> None:
        """A POST: served here in the read loop, as an inline request is, and answered with nothing. Its sender hears
        of no refusal, so it is logged here: the first of a connection as a warning, later ones at debug level. Only
        inline methods (which do not wait) may be posted: another closes the connection with BAD_FRAME."""
        spec = METHODS.get(frame.method)
        if spec is None or not spec.inline:
            raise FrameError(Code.BAD_FRAME, f"{frame.method!r} cannot be posted: only methods served in the read "
                             "loop (RaftStep) can", frame.request_id)
        try:
            await self.dispatcher.call(frame.method, self._serde_of(frame), frame.body, frame.attachment,
                                       caller=self.caller, answered=False)
        except RocketError as error:
            self._posts_refused += 1
            log.log(logging.WARNING if self._posts_refused == 1 else logging.DEBUG, "a %s posted by %s was refused "
                    "(%d on this connection): %s: %s", frame.method, self.caller.source, self._posts_refused,
                    error.code.name, error.message)

    _posts_refused = 0

    async def _flush_replies(self) -> None:
        """Send the answers to inline requests served so far, in one write."""
        if self._replies:
            replies, self._replies = self._replies, []
            await self._send(*replies)

    async def _unary(self, frame: Frame, decoded: dict | None = None) -> list:
        """The reply frame's parts for a unary request: its response, or the error it met."""
        try:
            serde = self._serde_of(frame)
            body, attachments = await self.dispatcher.call(frame.method, serde, frame.body, frame.attachment,
                                                           detached=True, caller=self.caller, decoded=decoded)
        except RocketError as error:
            return [_error_frame(frame.serde, frame.request_id, error)]
        if frame.method == "Hello":  # from now on, requests and responses are in the client's version
            self.peer_version = peer_version_of(serde.decode("Hello", frame.body)["schema_version"])
        return frames.encode_parts(Kind.RESPONSE, frame.serde, frame.request_id, body, attachment=attachments)

    async def _call(self, frame: Frame, decoded: dict | None = None) -> None:
        """A call served by a task. It ends once its answer is written: here when it is the one call open on the
        connection, else by the writer, with the answers of the calls that ended meanwhile, in one write."""
        queued = False
        try:
            try:
                if self.dispatcher.is_streaming(frame.method):
                    await self._stream(frame, self._serde_of(frame))
                    return
                reply = await self._unary(frame, decoded)
            except RocketError as error:
                reply = [_error_frame(frame.serde, frame.request_id, error)]
            if self._open == 1 and not self._writer_gone:
                await self._send(*reply)
            else:
                self._answer(reply)
                queued = True
        finally:
            if not queued:  # else the writer ends it
                self._ended()

    async def _stream(self, frame: Frame, serde: ModuleType) -> None:
        if frame.request_id in self.streams:
            raise RocketError(Code.BAD_REQUEST, f"request id {frame.request_id} already has an open stream")
        with trio.CancelScope() as scope:
            self.streams[frame.request_id] = scope
            try:
                async for item in self.dispatcher.stream(frame.method, serde, frame.body, caller=self.caller):
                    await self._send(frames.encode(Kind.STREAM_ITEM, frame.serde, frame.request_id, item))
                await self._send(frames.encode(Kind.STREAM_END, frame.serde, frame.request_id))
            except RocketError as error:
                await self._send(_error_frame(frame.serde, frame.request_id, error))
            finally:
                self.streams.pop(frame.request_id, None)

    async def _send(self, *parts: bytes | memoryview) -> None:
        self.lifecycle.traffic.sent_bytes += sum(map(len, parts))
        async with self.send_lock:
            try:
                await send_parts(self.stream, parts)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                pass
