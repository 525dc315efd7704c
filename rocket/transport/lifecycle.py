"""What every listener shares (Lifecycle): draining, the calls in flight, and the bytes received and sent."""

from __future__ import annotations

import trio


class Traffic:
    """Bytes received and sent on some connections (a node's listeners share one: telemetry reads it)."""

    __slots__ = ("received_bytes", "sent_bytes")

    def __init__(self) -> None:
        self.received_bytes = 0
        self.sent_bytes = 0


class Lifecycle:
    """Shared by every listener: stops accepting and reading on drain, counts calls in flight, and the traffic."""

    def __init__(self) -> None:
        self.traffic = Traffic()
        self.draining = trio.Event()
        self._calls_in_flight = 0
        self._idle = trio.Event()
        self._idle.set()

    def call_started(self) -> None:
        if self._calls_in_flight == 0:
            self._idle = trio.Event()
        self._calls_in_flight += 1

    def call_finished(self) -> None:
        self._calls_in_flight -= 1
        if self._calls_in_flight == 0:
            self._idle.set()

    @property
    def calls_in_flight(self) -> int:
        return self._calls_in_flight

    def drain(self) -> None:
        self.draining.set()

    async def wait_idle(self) -> None:
        while self._calls_in_flight:
            await self._idle.wait()
