"""A fault proxy for object stores: an HTTP/1.1 reverse proxy (Trio, h11) in front of one (moto's S3 server, say)
that injects 500 and 503 SlowDown answers, stalls, connection resets after the store applied a request, slow
bandwidth, and a store that is down. Run it as a program; tests and examples/cluster drive it over HTTP:

    python tests/integration/fault_proxy.py --listen 127.0.0.1:9600 --upstream 127.0.0.1:9601
    curl -X POST 127.0.0.1:9600/__faults -d '{"error_rate": 0.3, "reset_rate": 0.1, "stall_s": 0.05}'
    curl 127.0.0.1:9600/__faults          # the faults set, and what the proxy did (counters)
"""

from __future__ import annotations

import argparse
import json
import random
import socket
import struct
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

FAULTS = {
    "error_rate": 0.0,  # a request answered 503 SlowDown or 500 InternalError (alternately) without reaching the store
    "reset_rate": 0.0,  # a request forwarded, applied by the store, then its connection reset without an answer
    "stall_s": 0.0,  # each forwarded request waits this long first
    "bandwidth_bytes_s": 0,  # answers' bodies are sent at this rate (0: as fast as the socket takes them)
    "down": False,  # every connection is reset at once: the store is unreachable
}
SLOW_DOWN = (b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>SlowDown</Code><Message>Please reduce your request '
             b'rate.</Message></Error>')
INTERNAL = (b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>InternalError</Code><Message>We encountered an '
            b'internal error. Please try again.</Message></Error>')
HOP_BY_HOP = {b"connection", b"keep-alive", b"transfer-encoding", b"te", b"trailer", b"upgrade", b"proxy-connection"}


def serve(listen: tuple[str, int], upstream: tuple[str, int], seed: int) -> None:
    import h11
    import trio

    faults = dict(FAULTS)
    counts = {"requests": 0, "errors": 0, "resets": 0, "refused": 0, "forwarded": 0}
    rolls = random.Random(seed)

    async def read_message(connection, stream) -> tuple[object, bytes]:
        """The next request or response of connection (h11), and its body."""
        head, body = None, bytearray()
        while True:
            event = connection.next_event()
            if event is h11.NEED_DATA:
                if connection.our_role is h11.SERVER and connection.they_are_waiting_for_100_continue:
                    await send(connection, stream, h11.InformationalResponse(status_code=100, headers=[]))
                data = await stream.receive_some(65536)
                connection.receive_data(data)
                continue
            if isinstance(event, (h11.Request, h11.Response)):
                head = event
            elif isinstance(event, h11.Data):
                body += event.data
            elif isinstance(event, h11.EndOfMessage):
                return head, bytes(body)
            elif isinstance(event, h11.ConnectionClosed) or event is h11.PAUSED:
                return None, b""

    async def send(connection, stream, *events) -> None:
        for event in events:
            data = connection.send(event)
            if data:
                await stream.send_all(data)

    async def reset(stream) -> None:
        """Close with an RST, not a FIN: the client sees a reset connection."""
        stream.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        await stream.aclose()

    async def forward(request, body: bytes) -> tuple[int, list, bytes]:
        stream = await trio.open_tcp_stream(*upstream)
        async with stream:
            connection = h11.Connection(h11.CLIENT)
            headers = [(name, value) for name, value in request.headers  # the whole body is here: no Expect
                       if name.lower() not in HOP_BY_HOP and name.lower() != b"expect"]
            await send(connection, stream, h11.Request(method=request.method, target=request.target, headers=headers),
                       h11.Data(data=body), h11.EndOfMessage())
            response, answer = await read_message(connection, stream)
            if response is None:
                raise ConnectionError("the store closed the connection")
            return response.status_code, list(response.headers), answer

    async def answer(connection, stream, status: int, headers: list, body: bytes, rate: int,
                     head: bool = False) -> None:
        """The answer; to a HEAD, the store's own Content-Length (of the object) and no body."""
        headers = [(name, value) for name, value in headers
                   if name.lower() not in HOP_BY_HOP and (head or name.lower() != b"content-length")]
        if not head:
            headers.append((b"content-length", str(len(body)).encode()))
        await send(connection, stream, h11.Response(status_code=status, headers=headers))
        step = max(1, rate // 10) if rate else len(body) or 1
        for start in range(0, len(body), step):
            await send(connection, stream, h11.Data(data=body[start:start + step]))
            if rate:
                await trio.sleep(step / rate)
        await send(connection, stream, h11.EndOfMessage())

    async def handle(stream) -> None:
        connection = h11.Connection(h11.SERVER)
        try:
            while True:
                request, body = await read_message(connection, stream)
                if request is None:
                    return
                if request.target.startswith(b"/__faults"):
                    if request.method == b"POST":
                        changes = json.loads(body or b"{}")
                        unknown = set(changes) - set(FAULTS)
                        if unknown:
                            raise ValueError(f"unknown faults {sorted(unknown)}")
                        faults.update(changes)
                    reply = json.dumps({"faults": faults, "counts": counts}).encode()
                    await answer(connection, stream, 200, [(b"content-type", b"application/json")], reply, 0)
                elif faults["down"]:
                    counts["refused"] += 1
                    await reset(stream)
                    return
                else:
                    counts["requests"] += 1
                    roll = rolls.random()
                    if roll < faults["error_rate"]:
                        counts["errors"] += 1
                        status, text = (503, SLOW_DOWN) if counts["errors"] % 2 else (500, INTERNAL)
                        await answer(connection, stream, status, [(b"content-type", b"application/xml")], text, 0)
                    else:
                        if faults["stall_s"]:
                            await trio.sleep(faults["stall_s"])
                        status, headers, reply = await forward(request, body)
                        counts["forwarded"] += 1
                        if roll < faults["error_rate"] + faults["reset_rate"]:
                            counts["resets"] += 1  # applied by the store; its answer never arrives
                            await reset(stream)
                            return
                        await answer(connection, stream, status, headers, reply, faults["bandwidth_bytes_s"],
                                     head=request.method == b"HEAD")
                if connection.our_state is h11.MUST_CLOSE or connection.their_state is h11.MUST_CLOSE:
                    return
                connection.start_next_cycle()
        except (trio.BrokenResourceError, trio.ClosedResourceError, h11.ProtocolError, OSError, ConnectionError):
            return
        finally:
            with trio.move_on_after(1):
                await stream.aclose()

    async def main() -> None:
        listeners = await trio.open_tcp_listeners(listen[1], host=listen[0])
        print(f"fault proxy on {listen[0]}:{listen[1]} -> {upstream[0]}:{upstream[1]}", flush=True)
        await trio.serve_listeners(handle, listeners)

    trio.run(main)


class FaultProxy:
    """The proxy as a subprocess, for tests: start(), faults(**changes) -> the faults and counters, stop()."""

    def __init__(self, port: int, upstream: str, log_path: Path, seed: int = 7):
        self.port = port
        self.upstream = upstream
        self.log_path = log_path
        self.seed = seed
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> "FaultProxy":
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen([sys.executable, __file__, "--listen", f"127.0.0.1:{self.port}",
                                             "--upstream", self.upstream, "--seed", str(self.seed)],
                                            stdout=log, stderr=log)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                self.faults()
                return self
            except OSError:
                if self.process.poll() is not None:
                    raise AssertionError(f"the fault proxy exited: {self.log_path.read_text()[-2000:]}")
                time.sleep(0.05)
        raise AssertionError("the fault proxy did not answer within 20 s")

    def faults(self, **changes) -> dict:
        request = urllib.request.Request(f"{self.url}/__faults", data=json.dumps(changes).encode() if changes else None,
                                         method="POST" if changes else "GET")
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        with opener.open(request, timeout=5) as reply:
            return json.loads(reply.read())

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)


def _address(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host, int(port)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--listen", required=True, help="HOST:PORT the proxy listens on")
    parser.add_argument("--upstream", required=True, help="HOST:PORT of the object store")
    parser.add_argument("--seed", type=int, default=7, help="of the random draws that pick which requests fail")
    options = parser.parse_args()
    serve(_address(options.listen), _address(options.upstream), options.seed)
