"""Nodes prove to each other that they belong to the cluster: with a cluster secret set, a node opening a TCP
connection to another first calls PeerHello with an HMAC-SHA256, under the secret, of its node id, the time and a
fresh nonce; the connection then may call the methods nodes use among themselves (MethodSpec.internal), which no
other connection may. A hello too far from the receiver's clock, or seen before (replayed), is refused."""

from __future__ import annotations

import collections
import hashlib
import hmac
import secrets
from collections.abc import Callable

from rocket import limits
from rocket.errors import Code, RocketError


class PeerAuth:
    def __init__(self, secret: bytes, node_id: int, wall_ms: Callable[[], int]):
        assert secret
        self._secret = secret
        self.node_id = node_id
        self._wall_ms = wall_ms
        self._seen: collections.OrderedDict[str, int] = collections.OrderedDict()  # nonce -> its time, oldest first

    def hello(self) -> dict:
        """A PeerHelloRequest for a new connection."""
        time_ms, nonce = self._wall_ms(), secrets.token_hex(16)
        return {"node": self.node_id, "time_ms": time_ms, "nonce": nonce, "mac": self._mac(self.node_id, time_ms, nonce)}

    def check(self, request: dict) -> None:
        """Accept a PeerHelloRequest or raise UNAUTHENTICATED saying why."""
        now_ms = self._wall_ms()
        if not hmac.compare_digest(str(request["mac"]), self._mac(request["node"], request["time_ms"], request["nonce"])):
            raise RocketError(Code.UNAUTHENTICATED, "peer hello: the MAC does not match this cluster's secret")
        if abs(now_ms - request["time_ms"]) > limits.peer_hello_skew_s * 1000:
            raise RocketError(Code.UNAUTHENTICATED, f"peer hello: its time is more than {limits.peer_hello_skew_s:g} s "
                              "from this node's clock")
        while self._seen and (next(iter(self._seen.values())) < now_ms - 2 * limits.peer_hello_skew_s * 1000
                              or len(self._seen) >= limits.peer_hello_nonces_max):
            self._seen.popitem(last=False)
        if request["nonce"] in self._seen:
            raise RocketError(Code.UNAUTHENTICATED, "peer hello: replayed (its nonce was seen before)")
        self._seen[request["nonce"]] = request["time_ms"]

    def _mac(self, node: int, time_ms: int, nonce: str) -> str:
        message = f"rocket-peer-hello|{node}|{time_ms}|{nonce}".encode()
        return hmac.new(self._secret, message, hashlib.sha256).hexdigest()
