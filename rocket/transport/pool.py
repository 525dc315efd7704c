"""Channels from one node to the others: one pipelined TCP channel per address, opened on first use,
kept while it works and reopened after it breaks. The channels live in the pool's own nursery."""

from __future__ import annotations

import math
import ssl
from collections.abc import Callable

import trio

from rocket import limits
from rocket.errors import Code, RocketError
from rocket.model import Address
from rocket.transport.background import Background
from rocket.transport.tcp_client import TcpChannel, open_tcp_channel


class ChannelPool(Background):
    def __init__(self, serde: str = "lane", hello: Callable[[], tuple[str, dict]] | None = None,
                 tls: Callable[[], ssl.SSLContext | None] | None = None, server_name: str | None = None,
                 plain_fallback: bool = False):
        self._serde = serde
        self._hello = hello  # each channel's first call: a node's PeerHello, a client's Authenticate
        # TLS: the context for each new channel (a node's is reloaded on SIGHUP), and the name the servers'
        # certificates are checked against (default: each address's host)
        self._tls = tls
        self._server_name = server_name
        self._plain_fallback = plain_fallback  # tls_mode permissive: plain to a node that speaks no TLS yet
        # Keyed by the addresses this node calls: its peers' and nameservers', from config and metadata, not clients.
        self._channels: dict[Address, TcpChannel] = {}
        self._opening: dict[Address, trio.Lock] = {}

    async def call(self, address: Address, method: str, request: dict,
                   timeout_s: float = limits.request_timeout_s_default, sent: trio.Event | None = None) -> dict:
        channel = await self.channel(address)
        return await channel.call(method, request, timeout_s, sent)

    def open_channel(self, address: Address) -> TcpChannel | None:
        """The open channel to address, or None if there is none now (channel() opens one)."""
        channel = self._channels.get(address)
        return channel if channel is not None and not channel.closed.is_set() else None

    async def channel(self, address: Address) -> TcpChannel:
        """The open channel to address, opened now if there is none or it broke."""
        channel = self._channels.get(address)
        if channel is not None and not channel.closed.is_set():
            return channel
        if self._nursery is None:
            raise RocketError(Code.UNAVAILABLE, "the node is not connected to its peers yet")
        lock = self._opening.setdefault(address, trio.Lock())
        async with lock:
            # Taking a free lock ends in a shielded checkpoint: a shutdown that came meanwhile may have closed the
            # nursery, and start would raise RuntimeError. The cancellation is this call's to raise.
            await trio.lowlevel.checkpoint_if_cancelled()
            channel = self._channels.get(address)
            if channel is None or channel.closed.is_set():
                channel = await self._nursery.start(self._hold, address)
            return channel

    async def _hold(self, address: Address, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Open a channel, hand it over, and keep it open until it breaks; later errors end it quietly."""
        started, channel = False, None
        with trio.CancelScope(deadline=trio.current_time() + limits.connect_timeout_s) as connecting:
            try:
                hello = self._hello() if self._hello is not None else None
                tls = self._tls() if self._tls is not None else None
                async with open_tcp_channel(*address, self._serde, hello, tls, self._server_name,
                                            self._plain_fallback) as channel:
                    connecting.deadline = math.inf
                    self._channels[address] = channel
                    task_status.started(channel)
                    started = True
                    await channel.closed.wait()
            except RocketError:
                if not started:
                    raise
            finally:
                if channel is not None and self._channels.get(address) is channel:
                    del self._channels[address]
        if not started:
            raise RocketError(Code.UNAVAILABLE, f"connecting to {address[0]}:{address[1]} timed out")
