"""Runs rocket's command line with some HOST:PORT addresses resolved to others, in this process only: ROCKET_ROUTES
is JSON {"HOST:PORT": "HOST:PORT", ...}. Each node of a local cluster can so reach each other node through a fault
proxy of its own (benchmarks/faults.py), as a partition between two nodes needs: a proxy in front of a node cannot
tell its callers apart, and a node advertises one address to all.

    ROCKET_ROUTES='{"127.0.0.1:7002": "127.0.0.1:7102"}' python benchmarks/routed.py run --node-id 1 ...

Every connection a node opens resolves its address with socket.getaddrinfo (trio's open_tcp_stream calls it, numeric
hosts included), so the routes cover all of a node's calls to other nodes: nameserver Raft, storage Raft, broker to
storage, heartbeats. Addresses not in the table resolve as usual.
"""

from __future__ import annotations

import json
import os
import socket
import sys

ROUTES_VARIABLE = "ROCKET_ROUTES"


def parse_routes(text: str) -> dict[tuple[str, int], tuple[str, int]]:
    """{(host, port): (host, port)} from the JSON of ROCKET_ROUTES; ValueError saying what is wrong."""
    def address(value: str) -> tuple[str, int]:
        host, separator, port = value.rpartition(":")
        if not separator or not host or not port.isdigit():
            raise ValueError(f"{ROUTES_VARIABLE}: expected HOST:PORT, got {value!r}")
        return host, int(port)

    routes = json.loads(text)
    if not isinstance(routes, dict):
        raise ValueError(f"{ROUTES_VARIABLE}: expected a JSON object of HOST:PORT to HOST:PORT")
    return {address(source): address(destination) for source, destination in routes.items()}


def install(routes: dict[tuple[str, int], tuple[str, int]]) -> None:
    """Make socket.getaddrinfo, in this process, resolve each route's source address as its destination."""
    resolve = socket.getaddrinfo

    def getaddrinfo(host, port, *args, **kwargs):
        try:
            key = (host.decode() if isinstance(host, bytes) else host, int(port))
        except (TypeError, ValueError):  # a service name, or no port: never routed
            key = None
        if key in routes:
            host, port = routes[key]
        return resolve(host, port, *args, **kwargs)

    socket.getaddrinfo = getaddrinfo


def main() -> None:
    install(parse_routes(os.environ.get(ROUTES_VARIABLE, "{}")))
    from rocket.cli import main as rocket_main  # after install: nothing has resolved anything yet

    sys.argv[0] = "rocket"
    rocket_main()


if __name__ == "__main__":
    main()
