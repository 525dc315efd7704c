"""Opening a channel to rocket over TCP or HTTP/2 with the chosen serde (connect); over TCP, a FailoverChannel over
one or several servers.
"""

from __future__ import annotations

import contextvars
import random
import ssl
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import trio

from rocket import limits
from rocket.access import Credentials
from rocket.client.credentials import hello_of, load_credentials
from rocket.client.namespaced import NamespacedChannel
from rocket.config import ConfigError, parse_address
from rocket.errors import Code, RocketError, collapse_single_error
from rocket.model import Address
from rocket.serde import serde_named
from rocket.transport.channel import Channel
from rocket.transport.h2_client import open_http2_channel
from rocket.transport.pool import ChannelPool
from rocket.transport.methods import method_spec
from rocket.transport.tls import as_client_context

TRANSPORTS = ("tcp", "http2")
DEFAULT_SERVERS = {"tcp": "127.0.0.1:9876", "http2": "127.0.0.1:9877"}
MOVE_ON = (Code.CONNECTION_LOST, Code.UNAVAILABLE)  # the server is gone or cannot serve: try the next one


class FailoverChannel(Channel):
    """A Channel over a list of servers: each call goes to the current one, and moves on when it is gone. Over TCP a
    client may name several servers (brokers): calls go to one of them, picked at random so that clients spread, and
    move to the next when it cannot be reached or its connection breaks."""

    def __init__(self, pool: ChannelPool, servers: list[Address]):
        self._pool = pool
        self.servers = servers
        self._at = random.randrange(len(servers))

    def _each_server(self):
        """The current server, then the others in turn; each failure moves the current one on."""
        for _ in range(len(self.servers)):
            yield self.servers[self._at]
            self._at = (self._at + 1) % len(self.servers)

    async def call(self, method: str, message: dict, timeout_s: float = limits.request_timeout_s_default,
                   sent: trio.Event | None = None) -> dict:
        """The response to a request; sent, if given, is set once the request is written to a server. A method
        that must not be applied twice (MethodSpec.at_most_once) moves on only if its request never went out:
        a connection lost after that leaves its outcome unknown, which the caller is told."""
        once = method_spec(method).at_most_once
        failure = RocketError(Code.UNAVAILABLE, "no server to call")
        for server in self._each_server():
            went_out = sent if sent is not None else trio.Event()
            try:
                return await self._pool.call(server, method, message, timeout_s, went_out)
            except RocketError as error:
                if error.code not in MOVE_ON or once and error.code == Code.CONNECTION_LOST and went_out.is_set():
                    raise
                failure = error
        raise failure

    async def stream(self, method: str, message: dict) -> AsyncIterator[dict]:
        """A server stream from the first server that accepts it; a stream cut midway raises (the caller
        resumes from where it got to)."""
        failure = RocketError(Code.UNAVAILABLE, "no server to call")
        for server in self._each_server():
            try:
                channel = await self._pool.channel(server)
            except RocketError as error:
                failure = error
                continue
            async for item in channel.stream(method, message):
                yield item
            return
        raise failure

    async def discover(self) -> None:
        """Add the cluster's brokers, as the nameservers know them, to the servers."""
        status = await self.call("ClusterStatus", {})
        known = set(self.servers)
        for node in status["nodes"]:
            address = parse_address("address", node["address"])
            if "broker" in node["roles"] and node["state"] in ("up", "unknown") and address not in known:
                self.servers.append(address)
                known.add(address)


def _servers(server: str | None, transport: str) -> list[Address]:
    try:
        return [parse_address("server", text.strip()) for text in (server or DEFAULT_SERVERS[transport]).split(",")
                if text.strip()]
    except ConfigError as error:
        raise RocketError(Code.BAD_REQUEST, str(error)) from None


# The TLS a connect() without tls= uses: the CLI sets it from --tls and --tls-ca (cli/common.py), for every command.
default_tls: contextvars.ContextVar[ssl.SSLContext | str | Path | bool | None] = contextvars.ContextVar(
    "default_tls", default=None)


# The namespace a connect() without namespace= works in: the CLI sets it from --namespace (ROCKET_NAMESPACE).
default_namespace: contextvars.ContextVar[str] = contextvars.ContextVar("default_namespace", default="")


@asynccontextmanager
async def connect(server: str | None = None, transport: str = "tcp", serde: str = "lane",
                  discover: bool = False, credentials: Credentials | None = None,
                  tls: ssl.SSLContext | str | Path | bool | None = None,
                  tls_server_name: str | None = None, namespace: str | None = None) -> AsyncIterator[Channel]:
    """Yield a Channel (call(method, message) and stream(method, message)). server is HOST:PORT,
    or (over TCP) several of them separated by commas. Each connection signs in with the credentials, else those
    of the environment or the credentials file (client/credentials.py), if any. tls: an ssl.SSLContext, a CA
    bundle's path, or True (the system's CAs): the server's certificate must verify, and name the host connected to
    (or tls_server_name). Without tls, default_tls's. Over TCP the channel is a FailoverChannel; with discover, it
    also asks the cluster for its brokers and uses all of them. namespace (else default_namespace's): the topics,
    consumer groups and KV buckets the channel names are that namespace's (client/namespaced.py)."""
    namespace = default_namespace.get() if namespace is None else namespace
    async with _connect(server, transport, serde, discover, credentials, tls, tls_server_name) as channel:
        yield NamespacedChannel(channel, namespace) if namespace else channel


@asynccontextmanager
async def _connect(server: str | None, transport: str, serde: str, discover: bool, credentials: Credentials | None,
                   tls: ssl.SSLContext | str | Path | bool | None, tls_server_name: str | None
                   ) -> AsyncIterator[Channel]:
    if transport not in TRANSPORTS:
        raise RocketError(Code.BAD_REQUEST, f"transport {transport!r} is not one of {', '.join(TRANSPORTS)}")
    serde_named(serde)
    servers = _servers(server, transport)
    hello = hello_of(credentials or load_credentials())
    context = as_client_context(tls if tls is not None else default_tls.get())
    if transport == "http2":
        if len(servers) > 1 or discover:
            raise RocketError(Code.BAD_REQUEST, "several servers and discovery are for TCP")
        if context is not None:
            raise RocketError(Code.BAD_REQUEST, "this client speaks TLS over TCP only: use --transport tcp")
        async with open_http2_channel(servers[0].host, servers[0].port, serde) as channel:
            if hello is not None:
                await channel.call(*hello())
            yield channel
        return
    with collapse_single_error():
        async with trio.open_nursery() as nursery:
            # Even to one server: the pool opens a new connection when the server closed the last (an idle one, or
            # one the server went away from), as a client of a long-lived application expects.
            pool = ChannelPool(serde, hello, tls=None if context is None else lambda: context,
                               server_name=tls_server_name)
            await nursery.start(pool.run)
            channel = FailoverChannel(pool, servers)
            if len(servers) == 1 and not discover:
                await pool.channel(servers[0])  # a server that cannot be reached fails connect(), as it always did
            if discover:
                await channel.discover()
            try:
                yield channel
            finally:
                nursery.cancel_scope.cancel()
