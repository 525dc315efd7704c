"""The one Channel interface: call() and stream() on a connection to a rocket server. TcpChannel, Http2Channel,
FailoverChannel, LocalChannel and MockChannel implement it, and the client SDK takes any of them."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Protocol

import trio

from rocket import __version__, limits
from rocket.errors import Code, RocketError
from rocket.serde.schema import SCHEMA_VERSION
from rocket.serde.versions import peer_version_of


class Channel(Protocol):
    """Calls to one server (or one cluster, for FailoverChannel) by method name, with messages as dicts shaped by
    the method's schemas (methods.METHODS). Every failure is a RocketError, as the server sent it or as the channel
    met it (TIMEOUT, CONNECTION_LOST, UNAVAILABLE)."""

    async def call(self, method: str, message: dict, timeout_s: float = limits.request_timeout_s_default,
                   sent: trio.Event | None = None) -> dict:
        """The response to a request, or TIMEOUT after timeout_s; sent, if given, is set once the request is on
        its way, so a caller may start other work without reordering it behind this one."""
        ...

    def stream(self, method: str, message: dict) -> AsyncIterator[dict]:
        """A server stream's items in order (an async generator); an error ends it, and leaving the loop early
        cancels the stream on the server."""
        ...


async def server_schema_version(channel: Channel) -> int:
    """Tell the server this side's schema version with Hello, and learn its own (a server too old to know Hello is
    version 1): a channel then writes and reads messages in the older of the two."""
    try:
        reply = await channel.call("Hello", {"schema_version": SCHEMA_VERSION, "version": __version__})
    except RocketError as error:
        if error.code != Code.UNKNOWN_METHOD:
            raise
        return 1
    return peer_version_of(reply["schema_version"])


# Three other classes have a `call`, and are not Channels because they take something a Channel does not:
# - ChannelPool.call(address, method, request, timeout_s, sent) (transport/pool.py): a Channel's call to the node
#   at address, over the pool's TcpChannel to it. One node talks to many others through one pool.
# - Peers.call(address, method, request, timeout_s) (roles/peers.py): a role's call to another node, through the
#   ChannelPool; when address is this node's own, straight to Dispatcher.local (no serde, no socket).
# - Dispatcher.call(method, serde, body, attachment) and Dispatcher.stream(method, serde, body) (transport/rpc.py):
#   the server side: encoded request in, encoded response out. Each transport's server calls it with the bytes it
#   received; LocalChannel (transport/local.py) calls it in process, which makes it a Channel without a socket.
