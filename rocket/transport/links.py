"""Raft messages between nodes over the project's RPC layer (PeerLinks): one TCP connection per peer carrying
one-way RaftStep posts, fed by a bounded queue."""

from __future__ import annotations

import logging
import ssl
from collections.abc import Awaitable, Callable

import trio

from rocket import limits
from rocket.errors import Code, RocketError
from rocket.transport.background import Background
from rocket.transport.listen import cancel_on
from rocket.transport.peer_auth import PeerAuth
from rocket.transport.tcp_client import TcpChannel, open_tcp_channel

log = logging.getLogger("rocket.raft")


class PeerLinks(Background):
    """One TCP connection per peer carrying RaftStep posts (one-way: POST frames, which the peer answers not at all,
    served in its read loop), fed by a bounded queue (a full queue drops payloads, which Raft tolerates). A link whose
    posts wait limits.raft_link_silent_s for the peer's acknowledgement is broken by the kernel (TCP_USER_TIMEOUT,
    listen.connect) and connected again: the host's liveness heartbeats, a post to every peer at least once a second,
    keep bytes on the link, so a host gone without a reset is noticed without a task that asks."""

    def __init__(self, node_id: int, addresses: dict[int, tuple[str, int]], auth: PeerAuth | None = None,
                 tls: Callable[[], ssl.SSLContext | None] | None = None, plain_fallback: bool = False,
                 versions: dict[int, int] | None = None,
                 keep_versions: Callable[[dict[int, int]], Awaitable[None]] | None = None):
        self.node_id = node_id
        self.addresses = addresses  # shared, not copied: membership may add nodes later
        self.auth = auth  # with a cluster secret, each link says PeerHello first
        self.tls = tls  # with TLS, each link's context as it is when it connects (reloaded on SIGHUP)
        self.plain_fallback = plain_fallback  # tls_mode permissive: plain to a node that speaks no TLS yet
        self._outboxes: dict[int, trio.MemorySendChannel] = {}
        # peer -> the schema version its node said when the link last connected; versions: as a node kept them, and
        # keep_versions keeps them after each change (disk/peer_versions.py): a node restarted while a peer is
        # unreachable still knows what that peer runs (Engine.replicas_speak), so its producers' batches stay
        # sequenced, and a batch sent again is stored once
        self.versions: dict[int, int] = dict(versions or {})
        self._keep_versions = keep_versions
        self._versions_kept = trio.Lock()

    def post(self, destination: int, payload: bytes) -> None:
        outbox = self._outboxes.get(destination)
        if outbox is None:
            if destination not in self.addresses or self._nursery is None:
                return
            outbox, inbox = trio.open_memory_channel(limits.raft_outbox_payloads_max)
            self._outboxes[destination] = outbox
            self._nursery.start_soon(self._link, destination, inbox)
        try:
            outbox.send_nowait(payload)
        except trio.WouldBlock:
            log.debug("dropping Raft messages to node %d: its queue is full", destination)

    async def _link(self, destination: int, inbox: trio.MemoryReceiveChannel) -> None:
        host, port = self.addresses[destination]
        while True:
            with trio.CancelScope() as connection:
                try:
                    hello = self.auth.hello() if self.auth is not None else None
                    tls = self.tls() if self.tls is not None else None
                    async with (open_tcp_channel(host, port, "lane", hello, tls, None, self.plain_fallback,
                                                 limits.raft_link_silent_s) as channel,
                                trio.open_nursery() as watcher):
                        if self.versions.get(destination) != (channel.peer_version or 1):
                            self.versions[destination] = channel.peer_version or 1
                            await self._save_versions()
                        # A broken read loop is a broken link, even while nothing is being written.
                        watcher.start_soon(cancel_on, channel.closed, connection)
                        await self._send_all(channel, inbox)
                except RocketError as error:  # a refused hello or certificate is a misconfiguration: say it here
                    refused = error.code == Code.UNAUTHENTICATED or "TLS handshake" in error.message
                    level = logging.WARNING if refused else logging.DEBUG
                    log.log(level, "link to node %d: %s", destination, error)
            if connection.cancelled_caught:
                log.debug("link to node %d: the connection closed", destination)
            # Whatever queued while the peer was down is stale by now: Raft resends what matters.
            while True:
                try:
                    inbox.receive_nowait()
                except trio.WouldBlock:
                    break
            await trio.sleep(limits.raft_link_reconnect_s)

    async def _save_versions(self) -> None:
        if self._keep_versions is not None:
            async with self._versions_kept:  # one write at a time, each of the whole map as it is then
                await self._keep_versions(dict(self.versions))

    async def _send_all(self, channel: TcpChannel, inbox: trio.MemoryReceiveChannel) -> None:
        """Post each payload as it comes, from this one task: nobody needs RaftStep's answer (Raft tolerates lost
        messages), so a payload costs one write, no waiting, and no answer from a peer that takes POST frames. A full socket holds this task back, and the outbox,
        full, drops what comes meanwhile. Raises CONNECTION_LOST once a write fails."""
        async for payload in inbox:
            await channel.post("RaftStep", {"sender": self.node_id, "payload": payload})
