"""What a client does when a broker throttles it (client quotas, rocket/quotas.py): an answer's `throttle_ms` says how
long to wait, and the client's next call on that broker waits that long (Kafka's clients do the same). A client that
did not would be held by the broker anyway: it reads nothing more of the connection until then."""

from __future__ import annotations

import trio


class Throttle:
    """Shared by a client's calls: the moment (trio's clock) before which none goes out, and what it was told."""

    __slots__ = ("until", "times", "total_ms")

    def __init__(self) -> None:
        self.until = 0.0
        self.times = 0  # answers that said to wait
        self.total_ms = 0  # and how long, in all

    async def wait(self) -> None:
        """Before a call: wait out the last throttle time told."""
        wait_s = self.until - trio.current_time()
        if wait_s > 0:
            await trio.sleep(wait_s)

    def told(self, response: dict) -> int:
        """After an answer: note its throttle time, if any; returns it (ms)."""
        throttle_ms = response.get("throttle_ms", 0)
        if throttle_ms > 0:
            self.times += 1
            self.total_ms += throttle_ms
            self.until = max(self.until, trio.current_time() + throttle_ms / 1000)
        return throttle_ms
