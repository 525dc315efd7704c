"""The byte movers of a TCP connection, which the server (tcp.py) and the client (tcp_client.py) share: frames
received into the decoder's buffer, buffers sent without joining them, and the outbox a connection's one writer
empties."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import trio

from rocket import limits
from rocket.transport.frames import FrameDecoder


async def receive_into(stream: trio.abc.ReceiveStream, decoder: FrameDecoder) -> int:
    """Receive what the peer sent into the decoder; 0 once the peer closed or reset the connection.
    The rest of a large frame goes straight from the kernel into that frame's buffer, with no copy (over TLS, one)."""
    target = decoder.writable()
    if target is None:
        data = await stream.receive_some(limits.tcp_receive_bytes)
        decoder.feed(data)
        return len(data)
    if not isinstance(stream, trio.SocketStream):  # TLS: the decrypted bytes, copied in
        data = await stream.receive_some(min(len(target), limits.tcp_receive_bytes))
        target[:len(data)] = data
        decoder.wrote(len(data))
        return len(data)
    try:
        received = await stream.socket.recv_into(target)
    except OSError:
        received = 0  # reset by the peer: the same as a close here
    decoder.wrote(received)
    return received


async def send_parts(stream: trio.abc.SendStream, parts) -> None:
    """Send buffers in order, joining none of them: as many per sendmsg as the kernel takes (over TLS, joined, as
    each record is encrypted from one buffer anyway)."""
    if not isinstance(stream, trio.SocketStream):
        await stream.send_all(b"".join(parts))
        return
    pending = list(parts)
    while pending:
        batch = pending[:limits.tcp_send_buffers_max]
        try:
            sent = await stream.socket.sendmsg(batch)
        except OSError as error:
            if stream.socket.fileno() == -1:
                raise trio.ClosedResourceError("the connection was closed") from None
            raise trio.BrokenResourceError(f"the connection broke: {error}") from error
        if sent == sum(map(len, batch)):  # as a rule: all of them
            del pending[:len(batch)]
            continue
        whole = 0
        while sent >= len(pending[whole]):
            sent -= len(pending[whole])
            whole += 1
        del pending[:whole]
        pending[0] = memoryview(pending[0])[sent:]


class Outbox:
    """Frames queued by code that does not wait (a call's answer, a request sent without a task) for the one task that
    writes them: everything queued meanwhile goes in one write. put's count says how many calls the parts answer:
    write_each hands that count to sent() once they are written (or the write failed or was cancelled), so that a
    call holds its place (an in-flight slot) until its answer has left, and a client that stops reading stops the
    server's answers from piling up."""

    def __init__(self) -> None:
        self.parts: list = []
        self.count = 0  # the calls that the parts queued answer
        self._ready = trio.Event()

    def put(self, parts: list, count: int = 0) -> None:
        self.parts += parts
        self.count += count
        self._ready.set()

    def wake(self) -> None:
        """Have write_each look at done() again."""
        self._ready.set()

    async def write_each(self, write: Callable[..., Awaitable[None]], done: Callable[[], bool] = lambda: False,
                         sent: Callable[[int], None] | None = None) -> None:
        """Write what is queued with write(*parts) as it comes, until done() holds and nothing is queued."""
        while not (done() and not self.parts):
            await self._ready.wait()
            self._ready = trio.Event()
            if self.parts:
                parts, self.parts = self.parts, []
                count, self.count = self.count, 0
                try:
                    await write(*parts)
                finally:
                    if count and sent is not None:
                        sent(count)
