"""The floor under a server's cost per batch on this machine: what a request of the batch's size costs a server that
does nothing with it, and what writing it durably costs, measured beside rocket in one run.

    python benchmarks/floor.py --size 16384 --requests 20000 --in-flight 1,8

Four figures, each per request of --size bytes, as server CPU (user and system) the way benchmarks/produce.py
counts rocket's (`server_cpu_us_per_batch`):
- trio: an echo server on Trio, rocket's runtime (trio.serve_tcp; each request a length-prefixed frame read with
  receive_some, answered with an 8-byte frame by send_all): the least any server on this runtime spends to take a
  request and answer it;
- sockets: the same server on blocking sockets in one thread, no event loop: the kernel's loopback TCP and the
  interpreter's few lines;
- trio-durable: the Trio echo that makes each read's whole requests durable before it answers them: written to a
  file in the event loop's thread, fdatasync in a worker thread (trio.to_thread), as rocket's single node does:
  the least a durable server on this runtime spends per batch, with group commit as the window allows;
- disk: write(2) of the bytes, then fdatasync(2), in this process: one write made durable, unshared.
The client is this process, on blocking sockets, with --in-flight requests outstanding (its CPU is not counted).
benchmarks/produce.py --floor runs this before each round and sets rocket's CPU per batch against it.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import socket
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

REPLY = struct.pack(">I", 4) + b"done"
KINDS = ("trio", "sockets", "trio-durable")


def _whole_requests(held: bytearray) -> tuple[int, int]:
    """How many whole length-prefixed requests held starts with, and how many bytes they take."""
    count = end = 0
    while len(held) >= end + 4 and len(held) >= (after := end + 4 + int.from_bytes(held[end:end + 4], "big")):
        count, end = count + 1, after
    return count, end


def _serve_trio(port: int, durable: bool, directory: str | None) -> None:
    """The Trio echo; durable: each read's whole requests are first written to a file in the event loop's thread and
    fdatasync'd in a worker thread, then answered (what rocket's single node does, and more)."""
    import trio

    if durable:
        handle, path = tempfile.mkstemp(prefix="rocket-floor-", dir=directory)
        os.unlink(path)

    async def serve(stream) -> None:
        held = bytearray()
        while data := await stream.receive_some(1 << 20):
            held += data
            count, end = _whole_requests(held)
            if count:
                if durable:
                    os.write(handle, held[:end])
                    await trio.to_thread.run_sync(os.fdatasync, handle)
                del held[:end]
                await stream.send_all(REPLY * count)

    async def main() -> None:
        await trio.serve_tcp(serve, port, host="127.0.0.1")

    trio.run(main)


def _serve_sockets(port: int) -> None:
    listener = socket.create_server(("127.0.0.1", port))
    while True:
        connection, _ = listener.accept()
        connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        held = bytearray()
        while data := connection.recv(1 << 20):
            held += data
            count, end = _whole_requests(held)
            if count:
                del held[:end]
                connection.sendall(REPLY * count)
        connection.close()


def process_cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def echo(kind: str, size: int, requests: int, in_flight: int, directory: str | None = None) -> dict:
    """Server CPU and wall time per request of size bytes, in_flight outstanding, against a fresh server."""
    port = _free_port()
    server = subprocess.Popen([sys.executable, __file__, "--serve", kind, "--port", str(port)]
                              + (["--data-parent", directory] if directory else []))
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                client = socket.create_connection(("127.0.0.1", port))
                break
            except ConnectionRefusedError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        request, pending = struct.pack(">I", size) + os.urandom(size), bytearray()
        for _ in range(200):  # warm up: the server's imports and first allocations are not the figure
            client.sendall(request)
            _replies(client, pending)
        result = drive(client, server.pid, lambda number: request, lambda: _replies(client, pending), requests,
                       in_flight)
        client.close()
    finally:
        server.kill()
        server.wait()
    return result


def drive(client: socket.socket, pid: int, request: Callable[[int], bytes], replies: Callable[[], int],
          requests: int, in_flight: int) -> dict:
    """Send request(n) for n = 1..requests, in_flight outstanding, replies() receiving until at least one answer is
    whole and saying how many: the server's (pid's) CPU and the wall time per request."""
    cpu_before, started = process_cpu_s(pid), time.perf_counter()
    sent = answered = 0
    while answered < requests:
        while sent < requests and sent - answered < in_flight:
            sent += 1
            client.sendall(request(sent))
        answered += replies()
    seconds = time.perf_counter() - started
    cpu = process_cpu_s(pid) - cpu_before
    return {"server_cpu_us_per_request": cpu / requests * 1e6, "wall_us_per_request": seconds / requests * 1e6}


def _replies(client: socket.socket, pending: bytearray) -> int:
    """Receive until at least one reply is whole; how many are."""
    while len(pending) < len(REPLY):
        data = client.recv(65536)
        if not data:
            raise ConnectionError("the echo server closed the connection")
        pending += data
    whole = len(pending) // len(REPLY)
    del pending[:whole * len(REPLY)]
    return whole


def disk(size: int, writes: int, directory: str | None) -> dict:
    """CPU and wall time of write(2) of size bytes then fdatasync(2), one after the other, in this process."""
    handle, path = tempfile.mkstemp(prefix="rocket-floor-", dir=directory)
    data = os.urandom(size)
    try:
        usage, started = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
        for _ in range(writes):
            os.write(handle, data)
            os.fdatasync(handle)
        seconds = time.perf_counter() - started
        after = resource.getrusage(resource.RUSAGE_SELF)
    finally:
        os.close(handle)
        os.unlink(path)
    cpu = after.ru_utime + after.ru_stime - usage.ru_utime - usage.ru_stime
    return {"cpu_us_per_write": cpu / writes * 1e6, "wall_us_per_write": seconds / writes * 1e6}


def measure(size: int, requests: int, in_flights: list[int], directory: str | None = None) -> dict:
    result: dict = {"size": size, "requests": requests}
    for in_flight in in_flights:
        for kind in KINDS:
            result[f"{kind}_in_flight_{in_flight}"] = echo(kind, size, requests, in_flight, directory)
    result["disk"] = disk(size, max(200, requests // 10), directory)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", type=int, default=16384)
    parser.add_argument("--requests", type=int, default=20000)
    parser.add_argument("--in-flight", default="1,8", help="comma-separated windows of outstanding requests")
    parser.add_argument("--data-parent", default=None, help="where the disk figure writes (default: the temporary "
                                                             "directory)")
    parser.add_argument("--serve", choices=KINDS, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    arguments = parser.parse_args()
    if arguments.serve:
        if arguments.serve == "sockets":
            _serve_sockets(arguments.port)
        else:
            _serve_trio(arguments.port, arguments.serve == "trio-durable", arguments.data_parent)
        return
    in_flights = [int(each) for each in arguments.in_flight.split(",")]
    print(json.dumps(measure(arguments.size, arguments.requests, in_flights, arguments.data_parent), indent=2))


if __name__ == "__main__":
    main()
