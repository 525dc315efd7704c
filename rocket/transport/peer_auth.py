"""Nodes prove to each other that they belong to the cluster (PeerAuth): with a cluster secret, a connection that says
a good PeerHello may call the methods nodes use among themselves (MethodSpec.internal), which no other may."""

from __future__ import annotations

from collections.abc import Callable

from rocket.access import HelloCheck, signed_hello


class PeerAuth:
    """With a cluster secret set, a node opening a TCP connection to another first calls PeerHello (hello), signed
    under the secret (rocket.access.signed_hello: its node id, the time and a fresh nonce); the connection then may
    call the internal methods. A hello too far from the receiver's clock, or seen before (replayed), is refused."""

    def __init__(self, secret: bytes, node_id: int, wall_ms: Callable[[], int]):
        assert secret
        self._secret = secret
        self.node_id = node_id
        self._wall_ms = wall_ms
        self._check = HelloCheck("peer hello")

    def hello(self) -> tuple[str, dict]:
        """The PeerHello call a new connection makes first."""
        return "PeerHello", {"node": self.node_id, **signed_hello(self._secret, "peer hello", self.node_id,
                                                                   self._wall_ms())}

    def check(self, request: dict) -> None:
        """Accept a PeerHelloRequest or raise UNAUTHENTICATED saying why."""
        self._check.check(self._secret, request["node"], request, self._wall_ms())
