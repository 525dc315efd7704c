"""Who calls, and whether they may (the dispatcher's first two links): each connection's Caller, the gate a call
passes before it is decoded (admit), the one authorization point (authorize), and the answers about the connection
itself (PeerHello, Authenticate, AclWhoAmI)."""

from __future__ import annotations

import dataclasses

from rocket import access
from rocket.errors import Code, RocketError
from rocket.transport.methods import MethodSpec
from rocket.transport.peer_auth import PeerAuth

ABOUT_CONNECTION = frozenset({"PeerHello", "Authenticate", "AclWhoAmI"})  # answered here, by no role's handler


@dataclasses.dataclass(slots=True)
class Caller:
    """Who is at the other end of a connection, as far as it proved: calls from the wire carry one, and so do local
    calls a gateway or the console makes on a user's behalf."""
    source: str = ""  # the IP address it connects from
    peer: bool = False  # a node of the cluster (PeerHello accepted): may call everything
    user: str | None = None  # signed in (Authenticate accepted, or a gateway request's signature verified)
    muted_until: float = 0.0  # over a quota: no call of this connection's is served before (trio's clock)


class Guard:
    """What a node asks of its callers: with a cluster secret (or tls_ca), internal methods only for connections that
    said PeerHello (peer_auth.py) or whose client certificate verified (tls.py); with auth on, a signed-in user whom
    the policies allow each call (rocket/access.py)."""

    def __init__(self) -> None:
        self.peers_only = False
        self.peer_auth: PeerAuth | None = None  # with a cluster secret, what checks a PeerHello
        self.access: access.Access | None = None  # with auth on: the users and policies enforced

    def admit(self, spec: MethodSpec, caller: Caller | None) -> None:
        """Before a call from the wire is decoded: refuse an internal method to a non-node, and any but the open
        methods to a connection that has not signed in. caller None: this process, trusted."""
        if caller is None or caller.peer:
            return
        if spec.internal and self.peers_only:
            raise RocketError(Code.UNAUTHENTICATED, f"{spec.name} is for the cluster's nodes: a node says PeerHello "
                              "first")
        if self.access is not None and caller.user is None and spec.name not in access.OPEN:
            raise self.access.failed(caller.source, RocketError(
                Code.UNAUTHENTICATED, f"{spec.name} needs credentials: sign in (--user and --secret, ROCKET_USER and "
                "ROCKET_SECRET, or ~/.config/rocket/credentials)"))

    def authorize(self, caller: Caller | None, name: str, request: dict, counted: bool = True) -> None:
        """The node's one authorization point, for calls from the wire and for local calls made on a user's behalf
        alike: with auth on, a caller other than a node of the cluster needs a user whom the policies allow what the
        method needs of the request (access.needs_of). caller None: this process, trusted. Raises UNAUTHENTICATED
        or PERMISSION_DENIED, counted against the caller's source unless not counted (a page's own look)."""
        if caller is None or caller.peer or self.access is None or name in access.OPEN:
            return
        if caller.user is None:
            error = RocketError(Code.UNAUTHENTICATED, f"{name} needs a signed-in user")
            raise self.access.failed(caller.source, error) if counted else error
        self.access.authorize(caller.user, access.needs_of(name, request), caller.source, counted)

    def about_connection(self, name: str, request: dict, caller: Caller) -> dict:
        """The answer to a call about the connection itself (ABOUT_CONNECTION)."""
        if name == "AclWhoAmI":
            user = self.access.users.get(caller.user) if self.access is not None and caller.user else None
            return {"user": caller.user or "", "super": caller.peer or user is not None and user.super}
        if name == "PeerHello":  # without a cluster secret a hello proves nothing (and nothing needs proving by one)
            if self.peer_auth is not None:
                self.peer_auth.check(request)
                caller.peer = True
            return {}
        # Authenticate: with auth off any hello is welcome (a client with credentials works anywhere)
        caller.user = request["user"] if self.access is None else self.access.authenticate(request, caller.source)
        return {}
