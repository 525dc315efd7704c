"""Connections opened and accepted by every transport: those over a loopback address are not paced."""

from __future__ import annotations

import socket

import pytest
import trio

from rocket.transport.listen import connect, serve_connections
from rocket.transport.lifecycle import Lifecycle

pytestmark = pytest.mark.skipif(not hasattr(socket, "TCP_CONGESTION"), reason="no per-socket congestion control")


def congestion_of(sock) -> bytes:
    return sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, 16).rstrip(b"\0")


def machine_default() -> bytes:
    with socket.socket() as plain:
        return congestion_of(plain)


async def test_both_ends_of_a_loopback_connection_use_reno(nursery):
    if machine_default() == b"reno":
        pytest.skip("the machine's default is Reno already: nothing would tell the change apart")
    accepted: list[bytes] = []
    done = trio.Event()

    async def run_connection(stream: trio.SocketStream) -> None:
        accepted.append(congestion_of(stream.socket))
        done.set()

    port = await nursery.start(serve_connections, Lifecycle(), "127.0.0.1", 0, run_connection, run_connection)
    stream = await connect("127.0.0.1", port)
    async with stream:
        assert congestion_of(stream.socket) == b"reno"
        await done.wait()
    assert accepted == [b"reno"]
