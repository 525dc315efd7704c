"""Opening a channel to a rocket server over TCP or HTTP/2 with the chosen serde."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from rocket.config import ConfigError, parse_address
from rocket.errors import Code, RocketError
from rocket.serde import serde_named
from rocket.transport.http2 import open_http2_channel
from rocket.transport.tcp import open_tcp_channel

TRANSPORTS = ("tcp", "http2")
DEFAULT_SERVERS = {"tcp": "127.0.0.1:9876", "http2": "127.0.0.1:9877"}


@asynccontextmanager
async def connect(server: str | None = None, transport: str = "tcp", serde: str = "json") -> AsyncIterator:
    """Yield a channel with call(method, message) and stream(method, message)."""
    if transport not in TRANSPORTS:
        raise RocketError(Code.BAD_REQUEST, f"transport {transport!r} is not one of {', '.join(TRANSPORTS)}")
    serde_named(serde)
    try:
        address = parse_address("server", server or DEFAULT_SERVERS[transport])
    except ConfigError as error:
        raise RocketError(Code.BAD_REQUEST, str(error)) from None
    opener = open_tcp_channel if transport == "tcp" else open_http2_channel
    async with opener(address.host, address.port, serde) as channel:
        yield channel
