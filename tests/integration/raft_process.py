"""A node process for the Raft kill test: a RaftHost with --groups groups over real TCP and a WAL in --dir.
It writes to the groups it leads, records each acknowledged write in --acks, publishes the groups it
leads in --status, and on SIGTERM dumps every group's applied values to --dump."""

from __future__ import annotations

import argparse
import json
import os
import signal
from pathlib import Path

import trio

from rocket.errors import RocketError
from rocket.raft.core import Role
from rocket.raft.host import RaftHost
from rocket.raft.links import PeerLinks
from rocket.raft.wal import Wal
from rocket.transport.rpc import Dispatcher, Lifecycle
from rocket.transport.tcp import serve_tcp


class Values:
    def __init__(self):
        self.values: list[str] = []

    def apply(self, entries, positions) -> list:
        self.values.extend(entry.data.decode() for entry in entries if entry.data)
        return [None] * len(entries)

    def snapshot(self) -> bytes:
        return "\n".join(self.values).encode()

    def restore(self, data: bytes) -> None:
        self.values = data.decode().split("\n") if data else []


def write_atomically(path: Path, text: str) -> None:
    temporary = path.with_suffix(".tmp")
    temporary.write_text(text)
    os.replace(temporary, path)


async def main(arguments) -> None:
    ports = [int(port) for port in arguments.ports.split(",")]
    addresses = {index + 1: ("127.0.0.1", port) for index, port in enumerate(ports)}
    links = PeerLinks(arguments.id, addresses)
    host = RaftHost(arguments.id, Wal.open(Path(arguments.dir)), links.post, tick_s=0.05)
    machines = {group: Values() for group in range(1, arguments.groups + 1)}
    for group, machine in machines.items():
        host.add_group(group, tuple(addresses), machine)
    dispatcher = Dispatcher()

    async def raft_step(request):
        host.receive(request["payload"])
        return {}

    dispatcher.handle("RaftStep", raft_step)
    acks = open(arguments.acks, "a", buffering=1)
    sequence = 0

    async def write_forever(group: int) -> None:
        nonlocal sequence
        while host.groups[group].core.role == Role.LEADER:
            sequence += 1
            value = f"{arguments.id}-{group}-{sequence}"
            try:
                await host.propose(group, value.encode(), 5)
            except RocketError:
                return
            acks.write(f"{group} {value}\n")  # only after the write was applied, so acknowledged

    async def writers(nursery: trio.Nursery) -> None:
        writing: set[int] = set()
        while True:
            for group, hosted in host.groups.items():
                if hosted.core.role == Role.LEADER and group not in writing:
                    writing.add(group)
                    nursery.start_soon(lambda g=group: _track(write_forever(g), writing, g))
            led = [g for g, h in host.groups.items() if h.core.role == Role.LEADER]
            write_atomically(Path(arguments.status), json.dumps({"leads": led}))
            await trio.sleep(0.1)

    with trio.open_signal_receiver(signal.SIGTERM) as signals:
        async with trio.open_nursery() as nursery:
            await nursery.start(serve_tcp, dispatcher, Lifecycle(), "127.0.0.1", addresses[arguments.id][1])
            await nursery.start(links.run)
            await nursery.start(host.run)
            nursery.start_soon(writers, nursery)
            async for _ in signals:
                break
            write_atomically(Path(arguments.dump), json.dumps({g: m.values for g, m in machines.items()}))
            nursery.cancel_scope.cancel()


async def _track(coroutine, writing: set[int], group: int) -> None:
    try:
        await coroutine
    finally:
        writing.discard(group)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    for name in ("--ports", "--dir", "--status", "--acks", "--dump"):
        parser.add_argument(name, required=True)
    parser.add_argument("--id", type=int, required=True)
    parser.add_argument("--groups", type=int, default=100)
    trio.run(main, parser.parse_args())
