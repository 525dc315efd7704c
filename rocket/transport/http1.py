"""HTTP/1.1 on h11: what HTTP/1.1 clients expect of a node (Prometheus scrapes, health probes, the web console).
GET and HEAD of the paths a route table names (serve_http1), keep-alive, bounded requests; every other request gets a
status that says why (400 malformed, 404, 405, 413, 431), and a malformed one closes its connection."""

from __future__ import annotations

import dataclasses
import logging
import ssl
import urllib.parse
from collections.abc import Awaitable, Callable
from typing import cast

import h11
import trio

from rocket import limits
from rocket.transport.listen import serve_connections, source_of
from rocket.transport.lifecycle import Lifecycle
from rocket.transport.tls import handshake

log = logging.getLogger("rocket.http1")

# status, content type, body; or with a fourth item, [(header, value)] to add
Response = tuple[int, str, bytes] | tuple[int, str, bytes, list[tuple[str, str]]]
Route = Callable[..., Awaitable[Response]]  # () -> Response, or (path, query, Asked) -> Response for a prefix "...*"


@dataclasses.dataclass(frozen=True, slots=True)
class Asked:
    """What a prefix route learns of its request besides the path and query."""
    headers: dict[str, str]  # names in lower case; the first value of each
    source: str = ""  # the client's IP address ("" if unknown)


async def serve_http1(lifecycle: Lifecycle, host: str, port: int, routes: dict[str, Route], *,
                      tls: Callable[[], ssl.SSLContext | None] | None = None,
                      task_status=trio.TASK_STATUS_IGNORED) -> None:
    """Serve HTTP/1.1 until the lifecycle drains; reports the bound port through task_status. tls: the context for
    each new connection (HTTPS), or None (one reloaded on SIGHUP: transport/tls.py).

    A route table's key is an exact path (its route takes no argument), or a prefix ending in "*" (its route takes the
    percent-decoded path, the query string's fields, the first value of each, and the request's `Asked`: its headers
    and the client's address): an exact path wins, then the longest prefix. A route answers (status, content type,
    body), and may add a fourth item, headers to send with it (a 401's WWW-Authenticate)."""

    async def run_connection(socket_stream: trio.SocketStream) -> None:
        stream: trio.abc.Stream = socket_stream  # an SSLStream once a TLS handshake is done
        source = source_of(stream)
        context = tls() if tls is not None else None
        if context is not None:
            stream = trio.SSLStream(stream, context, server_side=True, https_compatible=True)
            try:
                await handshake(stream)
            except (trio.BrokenResourceError, trio.TooSlowError) as error:
                log.info("HTTPS handshake with %s failed: %s", source, error.__cause__ or error)
                await trio.aclose_forcefully(stream)
                return
        try:
            await _serve(stream, routes, source)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        except Exception:  # one peer's bytes must not take the listener with them
            log.exception("HTTP/1.1 connection failed")

    async def refuse_connection(stream: trio.SocketStream) -> None:
        await _answer_once(stream, 503, b"too many connections\n")

    await serve_connections(lifecycle, host, port, run_connection, refuse_connection, task_status=task_status)


async def _serve(stream: trio.abc.Stream, routes: dict[str, Route], source: str = "") -> None:
    connection = h11.Connection(h11.SERVER, max_incomplete_event_size=limits.http1_header_bytes_max)
    while True:
        with trio.move_on_after(limits.http1_idle_s) as idle:
            event = await _next_event(stream, connection)
        if idle.cancelled_caught or event is None:
            return
        if isinstance(event, h11.ConnectionClosed):
            return
        if isinstance(event, _Refusal):  # the request could not be read: answer why, then close
            await _send(stream, connection, event.status, "text/plain; charset=utf-8", event.reason.encode() + b"\n",
                        close=True)
            return
        request = cast(h11.Request, event)  # the other events a new cycle starts with were handled above
        status, content_type, body, *extra = await _route(request, routes, source)
        if not await _drain_body(stream, connection):
            await _send(stream, connection, 413, "text/plain; charset=utf-8", b"request body too large\n", close=True)
            return
        await _send(stream, connection, status, content_type, b"" if request.method == b"HEAD" else body,
                    length=len(body), extra=extra[0] if extra else ())
        if connection.our_state is h11.MUST_CLOSE:
            return
        try:
            connection.start_next_cycle()
        except h11.LocalProtocolError:
            return


class _Refusal:
    def __init__(self, status: int, reason: str):
        self.status, self.reason = status, reason


async def _next_event(stream: trio.abc.Stream, connection: h11.Connection):
    """The next request (or ConnectionClosed), a _Refusal for one that cannot be read, None once the peer left."""
    while True:
        try:
            event = connection.next_event()
        except h11.RemoteProtocolError as error:
            return _Refusal(error.error_status_hint, f"malformed request: {error}")
        if event is h11.NEED_DATA:
            data = await stream.receive_some(limits.tcp_receive_bytes)
            try:
                # h11 takes any bytes-like data (its docs), an SSLStream's bytearray too: its annotation says bytes.
                connection.receive_data(data)  # pyright: ignore[reportArgumentType]
            except h11.RemoteProtocolError as error:
                return _Refusal(error.error_status_hint, f"malformed request: {error}")
            if not data and connection.their_state is h11.IDLE:
                return None
            continue
        return event


async def _drain_body(stream: trio.abc.Stream, connection: h11.Connection) -> bool:
    """Read and drop the request's body (these paths take none); False past limits.http1_body_bytes_max."""
    received = 0
    while True:
        event = connection.next_event()
        if isinstance(event, h11.EndOfMessage):
            return True
        if isinstance(event, h11.Data):
            received += len(event.data)
            if received > limits.http1_body_bytes_max:
                return False
            continue
        if event is h11.NEED_DATA:
            data = await stream.receive_some(limits.tcp_receive_bytes)
            if not data:
                return False
            connection.receive_data(data)  # pyright: ignore[reportArgumentType]  # bytes-like: see _next_event
            continue
        return False


async def _route(request: h11.Request, routes: dict[str, Route], source: str = "") -> Response:
    target, _, query = request.target.decode("ascii", "replace").partition("?")
    path = urllib.parse.unquote(target, errors="replace")
    route, prefixed = routes.get(target), False
    if route is None:
        prefixes = [key for key in routes if key.endswith("*") and path.startswith(key[:-1])]
        route, prefixed = (routes[max(prefixes, key=len)], True) if prefixes else (None, False)
    if route is None:
        return 404, "text/plain; charset=utf-8", f"no page {target[:limits.error_excerpt_chars_max]}\n".encode()
    if request.method not in (b"GET", b"HEAD"):
        return 405, "text/plain; charset=utf-8", b"only GET and HEAD are served\n"
    if not prefixed:
        return await route()
    fields, headers = {}, {}
    for name, value in urllib.parse.parse_qsl(query, keep_blank_values=True, errors="replace"):
        fields.setdefault(name, value)
    for name, value in request.headers:  # h11 gives the names in lower case
        headers.setdefault(name.decode("ascii", "replace"), value.decode("latin-1"))
    return await route(path, fields, Asked(headers, source))


async def _send(stream: trio.abc.Stream, connection: h11.Connection, status: int, content_type: str, body: bytes,
                close: bool = False, length: int | None = None, extra=()) -> None:
    headers = [("content-type", content_type), ("content-length", str(len(body) if length is None else length)),
               ("server", "rocket"), *extra]
    if close:
        headers.append(("connection", "close"))
    try:
        data = connection.send(h11.Response(status_code=status, headers=headers))
        data += connection.send(h11.Data(data=body)) if body else b""
        data += connection.send(h11.EndOfMessage())
    except h11.LocalProtocolError:  # the request's state forbids an answer (it was not read): close instead
        return
    await stream.send_all(data)


async def _answer_once(stream: trio.SocketStream, status: int, body: bytes) -> None:
    with trio.move_on_after(limits.shutdown_grace_s):
        try:
            await stream.send_all(f"HTTP/1.1 {status} \r\ncontent-length: {len(body)}\r\nconnection: close\r\n\r\n"
                                  .encode() + body)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
