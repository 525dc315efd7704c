"""Idle MQTT connections without a task of their own (Parking): their sockets in one epoll set, which one task waits
on. It answers PINGREQ itself; other bytes, the end of a keep-alive, a takeover or the gateway's end wake the
connection into a task again."""

from __future__ import annotations

import heapq
import math
import os
import select
from collections.abc import Callable
from typing import TYPE_CHECKING

import trio

from rocket.gateway.mqtt.codec import encode
from rocket.gateway.mqtt.packets import V5, MqttError, PingReq, PingResp, keep_alive_ran_out

if TYPE_CHECKING:
    from rocket.gateway.mqtt.connection import Connection

PINGREQ, PINGRESP = encode(PingReq(), V5), encode(PingResp(), V5)  # the same bytes in MQTT 3.1.1
READ_BYTES = 65536  # what a wake-up reads at once, as the connection's own reads do


class Parking:
    """wake(connection, data) takes a connection back: data is what woke it (b"": the client closed), or why it ends
    (its keep-alive ran out). Keep-alives are checked once a second: a silent client is dropped within two seconds of
    its time."""

    def __init__(self, wake: Callable[[Connection, bytes | MqttError], None]):
        self._wake = wake
        self._epoll = select.epoll()
        self._parked: dict[int, Connection] = {}  # fd -> the connection parked on it
        self._due: dict[int, list[Connection]] = {}  # a second -> connections parked with a keep-alive ending in it
        self._seconds: list[int] = []  # the seconds in _due, as a heap

    def __len__(self) -> int:
        return len(self._parked)

    def park(self, connection: Connection) -> None:
        """Until data comes, or connection.parked_until (trio's clock; inf: no keep-alive) passes."""
        fd = connection.fd
        self._parked[fd] = connection
        self._epoll.register(fd, select.EPOLLIN)
        self._schedule(connection)

    def _schedule(self, connection: Connection) -> None:
        if connection.parked_until != math.inf:
            second = math.ceil(connection.parked_until)
            due = self._due.get(second)
            if due is None:
                due = self._due[second] = []
                heapq.heappush(self._seconds, second)
            due.append(connection)

    def unpark(self, connection: Connection) -> bool:
        """Take the connection out (it is served by a task again); False if it was not parked."""
        fd = connection.fd
        if self._parked.get(fd) is not connection:
            return False
        del self._parked[fd]
        self._epoll.unregister(fd)
        return True

    def wake_all(self, why: Callable[[], bytes | MqttError]) -> None:
        """Every parked connection, each with what why() gives it."""
        for connection in list(self._parked.values()):
            self.unpark(connection)
            self._wake(connection, why())

    async def run(self) -> None:
        """Wait on every parked socket at once, until cancelled; then each parked connection is woken as closed (its
        task ends it, as a cancelled connection's does)."""
        try:
            while True:
                with trio.move_on_after(1):
                    await trio.lowlevel.wait_readable(self._epoll.fileno())
                for fd, _ in self._epoll.poll(0):
                    connection = self._parked.get(fd)
                    if connection is not None:
                        self._readable(connection)
                self._expire(trio.current_time())
        finally:
            self.wake_all(bytes)  # b"": as closed
            self._epoll.close()

    def _readable(self, connection: Connection) -> None:
        try:
            data = os.read(connection.fd, READ_BYTES)
        except BlockingIOError:
            return  # nothing after all: it stays
        except OSError:
            data = b""  # reset: as closed
        if data == PINGREQ:
            try:
                if os.write(connection.fd, PINGRESP) == len(PINGRESP):
                    if connection.keep_alive_s:  # its entry at the old time is passed over when that comes
                        connection.parked_until = trio.current_time() + connection.keep_alive_s
                        self._schedule(connection)
                    return
            except OSError:
                data = b""
        self.unpark(connection)
        self._wake(connection, data)

    def _expire(self, now: float) -> None:
        while self._seconds and self._seconds[0] <= now:
            for connection in self._due.pop(heapq.heappop(self._seconds)):
                if connection.parked_until <= now and self.unpark(connection):
                    self._wake(connection, keep_alive_ran_out())
