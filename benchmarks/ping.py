"""The empty request: a node's server CPU per `Ping` against a bare Trio echo's per request, in one run (issue 50's
goal: at most 1.5x).

    python benchmarks/ping.py [--requests 20000] [--in-flight 1,8,64] [--rounds 2] [--serde json|avro]

Each round, for each window of requests in flight: floor.py's Trio echo (32-byte requests, 8-byte answers), then a
fresh dev-mode node (`rocket run`, started as benchmarks/produce.py starts it) answering Ping over TCP frames. Both
are driven by the same client: this process, on a blocking socket, the window kept full, its CPU not counted. Server
CPU is user plus system time from /proc, over the timed requests only (after 300 untimed ones). Not part of CI.
"""

from __future__ import annotations

import argparse
import json
import re
import socket
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # floor.py and produce.py beside this file

from floor import drive, echo  # noqa: E402
from produce import start_nodes  # noqa: E402

from rocket.serde import SERDE_ID_OF  # noqa: E402
from rocket.transport import frames  # noqa: E402
from rocket.transport.frames import Kind  # noqa: E402

EMPTY = {"json": b"{}", "avro": b""}


def _answers(client: socket.socket, held: bytearray) -> int:
    """Receive until at least one frame is whole; how many are (each must be a RESPONSE)."""
    count = 0
    while True:
        while len(held) >= 4 and len(held) >= (end := 4 + int.from_bytes(held[:4], "big")):
            if held[5] != Kind.RESPONSE:
                raise RuntimeError(f"Ping was not answered: {bytes(held[:end])!r}")
            del held[:end]
            count += 1
        if count:
            return count
        data = client.recv(65536)
        if not data:
            raise ConnectionError("the node closed the connection")
        held += data


def ping(requests: int, in_flight: int, serde: str) -> dict:
    """Server CPU and wall time per Ping, in_flight outstanding, against a fresh node."""
    serde_id = SERDE_ID_OF[serde]
    with tempfile.TemporaryDirectory() as directory:
        node = start_nodes(Path(directory), 1)[0]
        try:
            port = int(re.search(rb"tcp=[^:]+:(\d+)", node.stdout.readline()).group(1))
            client = socket.create_connection(("127.0.0.1", port))
            client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

            def request(request_id: int) -> bytes:
                return b"".join(frames.encode_parts(Kind.REQUEST, serde_id, request_id, EMPTY[serde], "Ping"))

            held = bytearray()
            for request_id in range(1, 301):  # warm up: imports and first allocations are not the figure
                client.sendall(request(request_id))
                _answers(client, held)
            result = drive(client, node.pid, lambda number: request(1000 + number), lambda: _answers(client, held),
                           requests, in_flight)
            client.close()
        finally:
            node.kill()
            node.wait()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=20000)
    parser.add_argument("--in-flight", default="1,8,64", help="comma-separated windows of outstanding requests")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--serde", choices=sorted(EMPTY), default="json")
    arguments = parser.parse_args()
    rows = []
    for round_number in range(1, arguments.rounds + 1):
        for in_flight in (int(each) for each in arguments.in_flight.split(",")):
            trio_echo = echo("trio", 32, arguments.requests, in_flight)
            rocket = ping(arguments.requests, in_flight, arguments.serde)
            ratio = rocket["server_cpu_us_per_request"] / trio_echo["server_cpu_us_per_request"]
            rows.append({"round": round_number, "in_flight": in_flight, "trio_echo": trio_echo, "rocket_ping": rocket,
                         "ratio": round(ratio, 2)})
            print(f"round {round_number}, {in_flight} in flight: server CPU per request: Trio echo "
                  f"{trio_echo['server_cpu_us_per_request']:.1f} us, rocket Ping "
                  f"{rocket['server_cpu_us_per_request']:.1f} us: {ratio:.2f}x", flush=True)
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
