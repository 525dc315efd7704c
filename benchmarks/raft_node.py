"""One node of the Raft benchmark (started by benchmarks/raft.py): hosts G groups on a RaftHost with
its WAL under --dir, serves RaftStep over TCP, proposes to the groups it leads for --seconds, and prints
one JSON line of what it measured."""

from __future__ import annotations

import argparse
import json
import resource
import time
from pathlib import Path

import trio

from rocket.errors import RocketError
from rocket.raft.core import Role
from rocket.raft.host import RaftHost
from rocket.transport.links import PeerLinks
from rocket.raft.wal import Wal
from rocket.transport.lifecycle import Lifecycle
from rocket.transport.rpc import Dispatcher
from rocket.transport.tcp import serve_tcp


class CountingMachine:
    def __init__(self):
        self.entries = 0
        self.bytes = 0

    def apply(self, entries, positions) -> list:
        self.entries += len(entries)
        self.bytes += sum(len(entry.data) for entry in entries)
        return [None] * len(entries)

    def snapshot(self) -> bytes:
        return b"%d %d" % (self.entries, self.bytes)

    def restore(self, data: bytes) -> None:
        self.entries, self.bytes = (int(x) for x in data.split()) if data else (0, 0)


def cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def main(arguments) -> None:
    ports = [int(port) for port in arguments.ports.split(",")]
    addresses = {index + 1: ("127.0.0.1", port) for index, port in enumerate(ports)}
    voters = tuple(addresses)
    links = PeerLinks(arguments.id, addresses)
    host = RaftHost(arguments.id, Wal.open(Path(arguments.dir)), links.post)
    machines = {group: CountingMachine() for group in range(1, arguments.groups + 1)}
    for group, machine in machines.items():
        host.add_group(group, voters, machine)
    dispatcher = Dispatcher()

    async def raft_step(request):
        host.receive(request["payload"])
        return {}

    dispatcher.handle("RaftStep", raft_step)
    result: dict = {"node": arguments.id}
    started = trio.current_time()
    async with trio.open_nursery() as nursery:
        await nursery.start(serve_tcp, dispatcher, Lifecycle(), "127.0.0.1", addresses[arguments.id][1])
        await nursery.start(links.run)
        await nursery.start(host.run)
        with trio.move_on_after(arguments.settle_s):
            while True:  # wait until every group has a leader somewhere (each node sees its own)
                known = sum(1 for hosted in host.groups.values() if hosted.core.leader)
                if known == arguments.groups:
                    break
                await trio.sleep(0.1)
        result["elected_s"] = round(trio.current_time() - started, 2)
        await trio.sleep(1)
        if arguments.mode == "load":
            result.update(await load(host, arguments))
        else:
            await trio.sleep(arguments.settle_s)
            result["quiet_groups"] = host.rounds.quiet_groups()
            cpu_before, started = cpu_s(), time.perf_counter()
            await trio.sleep(arguments.seconds)
            result["idle_cpu_percent"] = round(100 * (cpu_s() - cpu_before) / (time.perf_counter() - started), 2)
            result["quiet_groups_after"] = host.rounds.quiet_groups()
        nursery.cancel_scope.cancel()
    print(json.dumps(result), flush=True)


async def load(host: RaftHost, arguments) -> dict:
    payload = bytes(arguments.size)
    led = [group for group, hosted in host.groups.items() if hosted.core.role == Role.LEADER]
    committed = 0
    failures = 0
    fsyncs_before, cpu_before = host.rounds.fsyncs, cpu_s()
    started = time.perf_counter()

    async def writer(group: int) -> None:
        nonlocal committed, failures
        while time.perf_counter() - started < arguments.seconds:
            try:
                await host.propose(group, payload, 10)
                committed += 1
            except RocketError:
                failures += 1
                await trio.sleep(0.05)

    async with trio.open_nursery() as writers:
        writers.start_soon(trio.sleep, arguments.seconds)  # followers stay up for the whole run
        for group in led:
            for _ in range(max(1, arguments.in_flight // max(1, len(led)))):
                writers.start_soon(writer, group)
    elapsed = time.perf_counter() - started
    return {"led_groups": len(led), "committed": committed, "failures": failures, "seconds": round(elapsed, 2),
            "entries_per_s": round(committed / elapsed), "mb_per_s": round(committed * arguments.size / elapsed / 1e6, 2),
            "fsyncs_per_s": round((host.rounds.fsyncs - fsyncs_before) / elapsed), "cpu_percent":
            round(100 * (cpu_s() - cpu_before) / elapsed, 1)}


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--id", type=int, required=True)
    parser.add_argument("--ports", required=True)
    parser.add_argument("--dir", required=True)
    parser.add_argument("--groups", type=int, default=1)
    parser.add_argument("--mode", choices=["load", "idle"], default="load")
    parser.add_argument("--size", type=int, default=1024)
    parser.add_argument("--in-flight", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=10)
    parser.add_argument("--settle-s", type=float, default=60)
    trio.run(main, parser.parse_args())
