"""Client quotas on the dispatcher (its third link): which calls count, holding a throttled connection, and
charging what a call used to its user's and its topic's quotas (rocket/quotas.py), as Kafka does."""

from __future__ import annotations

from typing import TypeGuard

import trio

from rocket import quotas
from rocket.transport.guard import Caller, Guard


class Metering:
    """On brokers: the client quotas, charged for every call from the wire that is not a node's."""

    def __init__(self, guard: Guard) -> None:
        self._guard = guard  # with auth on, a call is charged to its user
        self.quotas: quotas.Quotas | None = None

    def charged(self, caller: Caller | None) -> TypeGuard[Caller]:
        """Whether a call counts against the quotas: one from the wire, not a node's, while any quota is set."""
        return self.quotas is not None and caller is not None and not caller.peer and bool(self.quotas.entities)

    @staticmethod
    async def held(caller: Caller) -> None:
        """Wait while the caller's connection is throttled (Kafka mutes the channel): a client that ignores its
        throttle time is held all the same."""
        wait = caller.muted_until - trio.current_time()
        if wait > 0:
            await trio.sleep(wait)

    def charge(self, caller: Caller, topic: str, produced: int = 0, consumed: int = 0, requests: int = 1,
               user: str | None = None) -> float:
        """Charge a call served to its user's (with auth on: user, else the connection's) and its topic's quotas;
        returns its throttle in seconds, and mutes the caller's connection for that long. The gateways, whose
        protocols sign each request, call it with the request's user. A call is charged after it is served: its
        answer's throttle_ms (methods.TELLS_THROTTLE) says the throttle, and held() holds the connection's next
        call."""
        assert self.quotas is not None, "charged() says whether a call is charged"
        user = (user or caller.user) if self._guard.access is not None else None
        throttle_s = self.quotas.charge(user, topic, produced, consumed, requests)
        if throttle_s:
            caller.muted_until = max(caller.muted_until, trio.current_time() + throttle_s)
        return throttle_s
