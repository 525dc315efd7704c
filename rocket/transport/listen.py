"""Connections for every transport: accepting them (bound port reported at start, a bounded number,
no new ones once the node drains) and opening them, with one error for a server that is not there."""

from __future__ import annotations

import ipaddress
import random
import socket
from collections.abc import Awaitable, Callable

import trio

from rocket import limits
from rocket.errors import Code, RocketError
from rocket.transport.lifecycle import Lifecycle

Handler = Callable[[trio.SocketStream], Awaitable[None]]


async def connect(host: str, port: int, unacknowledged_s: float | None = None) -> trio.SocketStream:
    """A TCP connection to host:port. With unacknowledged_s, the kernel breaks it once bytes sent on it wait that
    long for the peer's acknowledgement, or for room in its window (TCP_USER_TIMEOUT, RFC 5482): a host gone without
    a reset (powered off, cut off) is noticed by a connection that writes, with no wake-up of its own."""
    try:
        stream = await trio.open_tcp_stream(host, port)
    except OSError as error:
        raise RocketError(Code.UNAVAILABLE, f"cannot connect to {host}:{port}: {error.strerror or error}") from None
    unpaced_on_loopback(stream)
    if unacknowledged_s is not None and hasattr(socket, "TCP_USER_TIMEOUT"):
        stream.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, max(1, round(unacknowledged_s * 1000)))
    return stream


def unpaced_on_loopback(stream: trio.SocketStream) -> None:
    """A connection over a loopback address gets Reno congestion control, which does not pace. The
    machine's default may be BBR, which paces at the bandwidth it measured over its last round trips; on loopback
    those span microseconds. During a produce on the development VM its estimate fell at times from 16-42 Gbit/s to
    0.6-1.7, and a 1 MiB batch then came through in 64 KiB segments over milliseconds (benchmarks/RESULTS.md,
    "Loopback connections without pacing"). Reno is built into Linux and open to every user. Other connections,
    other systems, and any refusal keep the machine's default."""
    option = getattr(socket, "TCP_CONGESTION", None)
    if option is None:
        return
    try:
        if ipaddress.ip_address(stream.socket.getpeername()[0]).is_loopback:
            stream.socket.setsockopt(socket.IPPROTO_TCP, option, b"reno")
    except (OSError, ValueError):
        pass


FREE_PORTS_LOW = 20000  # above the well-known servers' ports (rocket's 9876-9878, NATS, Redis, etcd, AMQP)


def _ephemeral_low() -> int:
    """Where the kernel's ephemeral ports start: what bind(port 0) and outgoing connections take."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as ranges:
            return int(ranges.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """Ports nobody holds right now, to start servers on (tests, benchmarks, example clusters). They are drawn below
    the kernel's ephemeral range, so that no bind to port 0 and no outgoing connection's source port takes one
    between this call and the server's bind: a cluster test under the whole suite's load once found its node's port
    so taken ('Address already in use'). Where that range leaves too little room, the kernel chooses.
    Each port is handed over reserved (see _reserve): another free_ports, in any process, passes it by."""
    low = _ephemeral_low()
    draw = random.SystemRandom()
    chosen: dict[int, socket.socket] = {}
    sockets: list[socket.socket] = []
    try:
        for _ in range(count * 20 if low - FREE_PORTS_LOW >= 1000 else 0):
            if len(chosen) == count:
                break
            port = draw.randrange(FREE_PORTS_LOW, low)
            each = socket.socket()
            sockets.append(each)
            try:
                each.bind((host, port))  # held until all are chosen, so no port is given twice
            except OSError:
                continue
            chosen[port] = each
        while len(chosen) < count:
            each = socket.socket()
            sockets.append(each)
            each.bind((host, 0))
            chosen[each.getsockname()[1]] = each
        for each in chosen.values():
            _reserve(each)
        return list(chosen)
    finally:
        for each in sockets:
            each.close()


def _reserve(bound: socket.socket) -> None:
    """Leave bound's port in TIME_WAIT, as Yelp's ephemeral-port-reserve does: for a minute, a bind without
    SO_REUSEADDR (free_ports' own draw, in every process) is refused it, while a server's bind, with SO_REUSEADDR
    (trio's, asyncio's, Go's, Java's, Mosquitto's), takes it. A chaos test's node once lost its port in the ten
    seconds it took to start: the other pytest worker had drawn the same one and bound it first."""
    bound.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # the accepted side inherits it, and so the TIME_WAIT
    bound.listen(1)
    with socket.create_connection(bound.getsockname()[:2]):
        accepted, _ = bound.accept()
        accepted.close()  # the side that closes first keeps the TIME_WAIT: this port's


async def cancel_on(event: trio.Event, scope: trio.CancelScope) -> None:
    await event.wait()
    scope.cancel()


async def serve_connections(lifecycle: Lifecycle, host: str, port: int, run_connection: Handler,
                            refuse_connection: Handler, *, connections_max: int = limits.connections_max,
                            task_status=trio.TASK_STATUS_IGNORED) -> None:
    """Run run_connection for each connection until the lifecycle drains; past connections_max, refuse_connection
    answers and the connection is closed. Reports the bound port through task_status."""
    listeners = await trio.open_tcp_listeners(port, host=host)
    bound_port = listeners[0].socket.getsockname()[1]
    connections = trio.CapacityLimiter(connections_max)

    async def handle(stream: trio.SocketStream) -> None:
        unpaced_on_loopback(stream)
        try:
            connections.acquire_nowait()
        except trio.WouldBlock:
            async with stream:
                await refuse_connection(stream)
            return
        try:
            await run_connection(stream)
        finally:
            connections.release()

    async with trio.open_nursery() as nursery:

        async def accept_until_drained() -> None:
            with trio.CancelScope() as accept_scope:
                nursery.start_soon(cancel_on, lifecycle.draining, accept_scope)
                # Connections live in the outer nursery: draining stops accepting, not the calls in flight.
                await trio.serve_listeners(handle, listeners, handler_nursery=nursery)

        nursery.start_soon(accept_until_drained)
        task_status.started(bound_port)


def source_of(stream) -> str:
    """The IP address a connection comes from ("" if it is gone, or has no socket); under TLS, its transport's."""
    try:
        return str(getattr(stream, "transport_stream", stream).socket.getpeername()[0])
    except (AttributeError, OSError, IndexError, TypeError):
        return ""
