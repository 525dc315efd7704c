"""Raft messages between nodes over the project's RPC layer (PeerLinks): one TCP connection per peer carrying
one-way RaftStep posts, fed by a bounded queue."""

from __future__ import annotations

import logging
import ssl
from collections.abc import Callable
from pathlib import Path

import orjson
import trio

from rocket import limits
from rocket.disk.files import replace_durably
from rocket.errors import Code, RocketError
from rocket.transport.background import Background
from rocket.transport.listen import cancel_on
from rocket.transport.peer_auth import PeerAuth
from rocket.transport.tcp_client import TcpChannel, open_tcp_channel

log = logging.getLogger("rocket.raft")


def _load_versions(path: Path | None) -> dict[int, int]:
    """The peers' schema versions a node kept (PeerLinks.versions); none from a missing or unreadable file."""
    if path is None:
        return {}
    try:
        return {int(node): int(version) for node, version in orjson.loads(path.read_bytes()).items()}
    except FileNotFoundError:
        return {}
    except (OSError, ValueError, TypeError, AttributeError) as error:
        log.warning("%s: cannot read the peers' schema versions (%s): each is learnt again when its link connects",
                    path, error)
        return {}


class PeerLinks(Background):
    """One TCP connection per peer carrying RaftStep posts (one-way: POST frames, which the peer answers not at all,
    served in its read loop), fed by a bounded queue (a full queue drops payloads, which Raft tolerates). A link whose
    posts wait limits.raft_link_silent_s for the peer's acknowledgement is broken by the kernel (TCP_USER_TIMEOUT,
    listen.connect) and connected again: the host's liveness heartbeats, a post to every peer at least once a second,
    keep bytes on the link, so a host gone without a reset is noticed without a task that asks."""

    def __init__(self, node_id: int, addresses: dict[int, tuple[str, int]], auth: PeerAuth | None = None,
                 tls: Callable[[], ssl.SSLContext | None] | None = None, plain_fallback: bool = False,
                 versions_file: Path | None = None):
        self.node_id = node_id
        self.addresses = addresses  # shared, not copied: membership may add nodes later
        self.auth = auth  # with a cluster secret, each link says PeerHello first
        self.tls = tls  # with TLS, each link's context as it is when it connects (reloaded on SIGHUP)
        self.plain_fallback = plain_fallback  # tls_mode permissive: plain to a node that speaks no TLS yet
        self._outboxes: dict[int, trio.MemorySendChannel] = {}
        # peer -> the schema version its node said when the link last connected, kept in versions_file: a node
        # restarted while a peer is unreachable still knows what that peer runs (Engine.replicas_speak), so its
        # producers' batches stay sequenced, and a batch sent again is stored once
        self.versions: dict[int, int] = _load_versions(versions_file)
        self._versions_file = versions_file
        self._versions_saved = trio.Lock()

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
        if self._versions_file is None:
            return
        async with self._versions_saved:  # one write at a time, each of the whole map as it is then
            data = orjson.dumps({str(node): version for node, version in self.versions.items()})
            try:
                await trio.to_thread.run_sync(replace_durably, self._versions_file, data)
            except OSError as error:  # a full disk, say: the link goes on, and the version is known until a restart
                log.warning("%s: cannot keep the peers' schema versions: %s", self._versions_file, error)

    async def _send_all(self, channel: TcpChannel, inbox: trio.MemoryReceiveChannel) -> None:
        """Post each payload as it comes, from this one task: nobody needs RaftStep's answer (Raft tolerates lost
        messages), so a payload costs one write, no waiting, and no answer from a peer that takes POST frames. A full socket holds this task back, and the outbox,
        full, drops what comes meanwhile. Raises CONNECTION_LOST once a write fails."""
        async for payload in inbox:
            await channel.post("RaftStep", {"sender": self.node_id, "payload": payload})
