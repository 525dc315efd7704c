"""TLS for every transport: the one place SSL contexts are built (a node's listeners, its connections to other
nodes, a client's), and reloaded (NodeTls.reload).
"""

from __future__ import annotations

import logging
import ssl
from pathlib import Path
from typing import cast

import trio

from rocket import limits
from rocket.config import NodeConfig
from rocket.errors import Code, RocketError

log = logging.getLogger("rocket.tls")

HANDSHAKE = 0x16  # the first byte of every TLS record that opens a connection (a handshake record, RFC 8446 5.1)


def server_context(cert: Path, key: Path, ca: Path | None = None, alpn: list[str] | None = None) -> ssl.SSLContext:
    """A listener's context: cert's chain and key; with ca, client certificates asked for and verified against it
    (optional: clients without one still connect, and tcp.py tells the two apart)."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(cert, key)
    if ca is not None:
        context.load_verify_locations(cafile=ca)
        context.verify_mode = ssl.CERT_OPTIONAL
    if alpn:
        context.set_alpn_protocols(alpn)
    return context


def client_context(ca: Path | str | None = None, cert: Path | None = None, key: Path | None = None) -> ssl.SSLContext:
    """A connecting side's context: the server's certificate verified against ca (the system's CAs without one),
    and its name against the host connected to; with cert and key, presented as a client certificate."""
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=str(ca) if ca is not None else None)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    if cert is not None:
        context.load_cert_chain(cert, key)
    return context


def as_client_context(tls: ssl.SSLContext | str | Path | bool | None) -> ssl.SSLContext | None:
    """What connect(tls=...) takes: a context as it is; a CA bundle's path; True for the system's CAs; None or
    False for plain TCP. A CA file that does not load is a BAD_REQUEST naming it."""
    if tls is None or tls is False:
        return None
    if isinstance(tls, ssl.SSLContext):
        return tls
    try:
        return client_context(None if tls is True else tls)
    except (OSError, ssl.SSLError) as error:
        raise RocketError(Code.BAD_REQUEST, f"TLS CA bundle {tls}: cannot load it: {error}") from None


class NodeTls:
    """A node's contexts, from its config: tcp (the TCP listener's), http2 (the HTTP/2 listener's, ALPN h2), http1
    (the HTTP/1.1 listener's: /metrics, probes and the console over HTTPS), peer (its connections to other nodes).
    None where the config asks for no TLS.

    A node with tls_cert serves TLS 1.2+ on its TCP port (tls_mode enforcing: only TLS; permissive: plain and TLS
    both, told apart by the first byte, 0x16 for a TLS handshake) and, unless http2_tls_* name other files, on HTTP/2.
    With tls_ca, the TCP listener asks every connection for a client certificate and verifies one that comes against
    tls_ca: a connection whose certificate verified is a node of the cluster (tcp.py marks it a peer, as an accepted
    PeerHello does). Its own connections to other nodes present tls_cert as a client certificate and verify the other
    node's against tls_ca, and its host name (or IP address) against the address connected to."""

    def __init__(self, config: NodeConfig):
        self.config = config
        self.mode = config.tls_mode
        self.tcp, self.http2, self.http1, self.mqtt, self.peer = self._build()

    @property
    def verifies_peers(self) -> bool:
        """A verified client certificate makes a connection a node of the cluster (tls_ca is set)."""
        return self.tcp is not None and self.config.tls_ca is not None

    @property
    def plain_accepted(self) -> bool:
        """The TCP port serves connections without TLS too: no certificate, or permissive mode."""
        return self.tcp is None or self.mode == "permissive"

    def _build(self) -> tuple[ssl.SSLContext | None, ...]:
        config = self.config
        tcp = peer = http2 = http1 = mqtt = None
        # A certificate comes with its key: the config checked it (_check_tls).
        key, http2_key = cast(Path, config.tls_key), cast(Path, config.http2_tls_key)
        if config.tls_cert is not None:
            tcp = server_context(config.tls_cert, key, config.tls_ca)
            http1 = server_context(config.tls_cert, key, alpn=["http/1.1"])
            mqtt = server_context(config.tls_cert, key, alpn=["mqtt"])  # MQTT over TLS (its ALPN id, if the client asks)
            peer = client_context(config.tls_ca, config.tls_cert, key)
        if config.http2_tls_cert is not None:
            http2 = server_context(config.http2_tls_cert, http2_key, alpn=["h2"])
        elif config.tls_cert is not None:
            http2 = server_context(config.tls_cert, key, alpn=["h2"])
        return tcp, http2, http1, mqtt, peer

    def reload(self) -> bool:
        """Re-read the certificate, key and CA files; False (logged, the old contexts kept) when one does not load.
        On SIGHUP: new connections get the new contexts, the ones open keep theirs."""
        try:
            self.tcp, self.http2, self.http1, self.mqtt, self.peer = self._build()
        except (OSError, ssl.SSLError) as error:
            log.error("TLS reload failed, the certificates in use are kept: %s", error)
            return False
        log.info("TLS reloaded: new connections use the certificate files as they are now")
        return True


async def handshake(stream: trio.SSLStream, timeout_s: float = limits.tls_handshake_s_max) -> None:
    """Complete a TLS handshake within timeout_s; raises trio.BrokenResourceError (with the SSL error as its cause)
    or trio.TooSlowError."""
    with trio.fail_after(timeout_s):
        await stream.do_handshake()


async def client_handshake(stream: trio.abc.Stream, context: ssl.SSLContext, host: str, port: int,
                           server_name: str | None = None) -> trio.SSLStream:
    """Wrap a connected stream in TLS and shake hands, checking the server's name (server_name, else host); a
    failure is a RocketError UNAVAILABLE that says why (a certificate not trusted, a server that speaks no TLS)."""
    wrapped = trio.SSLStream(stream, context, server_hostname=server_name or host, https_compatible=True)
    try:
        await handshake(wrapped, limits.connect_timeout_s)
    except trio.TooSlowError:
        await trio.aclose_forcefully(wrapped)
        raise RocketError(Code.UNAVAILABLE, f"TLS handshake with {host}:{port} timed out (does the port speak "
                          "TLS?)") from None
    except (trio.BrokenResourceError, trio.ClosedResourceError) as error:
        await trio.aclose_forcefully(wrapped)
        cause = error.__cause__ or error
        hint = " (the server may not speak TLS on this port)" if "WRONG_VERSION_NUMBER" in str(cause) else ""
        raise RocketError(Code.UNAVAILABLE, f"TLS handshake with {host}:{port} failed: {cause}{hint}") from None
    return wrapped
