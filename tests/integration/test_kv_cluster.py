"""KV on three all-role `rocket run` processes while one of them is killed with SIGKILL again and again (and
restarted on its data directory):
- a counter: 16 clients increment one key with get + put(if_revision) loops; the final value equals the increments
  acknowledged, plus at most those whose outcome was unknown (the server died with the request in flight);
- registers: put, get and value compare-and-set on a few keys from several clients, recorded as a history that the
  Wing–Gong checker of the simulators (tests/sim/linearizability.py) must find linearizable.
Run with -s for the figures. Node logs are in the test's tmp_path.
"""

from __future__ import annotations

import itertools
import random

import trio

from rocket.client import connect
from rocket.client.kv import KV
from rocket.errors import Code, RocketError
from rocket.transport.listen import free_ports
from tests.integration.test_cluster import NODES, Node
from tests.sim.linearizability import INFINITY, Operation, linearizable

GROUPS = 6
RUN_S = 15.0
KILL_EVERY_S = 4.0
COUNTERS = 16
REGISTER_CLIENTS = 4
REGISTERS = ("r0", "r1", "r2")
REGISTER_PAUSE_S = 0.1
UNKNOWN = (Code.CONNECTION_LOST, Code.UNAVAILABLE, Code.TIMEOUT)  # the outcome of a write is not known


class Counter:
    def __init__(self):
        self.acked = 0
        self.unknown = 0


async def count(kv: KV, counter: Counter, stop: trio.Event) -> None:
    while not stop.is_set():
        try:
            entry = await kv.get("kv", "counter")
        except RocketError:
            await trio.sleep(0.05)
            continue
        try:
            await kv.put("kv", "counter", str(int(entry.value) + 1).encode(), if_revision=entry.revision)
            counter.acked += 1
        except RocketError as error:
            if error.code in UNKNOWN:
                counter.unknown += 1
                await trio.sleep(0.05)
            elif error.code != Code.CAS_FAILED:
                raise


async def registers(kv: KV, client: int, history: list[Operation], ids, stop: trio.Event) -> None:
    randomness = random.Random(client)
    while not stop.is_set():
        await trio.sleep(REGISTER_PAUSE_S)  # keeps each key's history small enough for the checker's search
        key = randomness.choice(REGISTERS)
        kind = randomness.choice(("put", "get", "cas"))
        value = f"{client}-{next(ids)}"
        written = [o.argument[-1] for o in history[-20:] if o.key == key and o.kind != "get"]
        argument = {"put": (value,), "get": (), "cas": (randomness.choice([None, *written[-3:]]), value)}[kind]
        invoked = trio.current_time()
        try:
            if kind == "put":
                await kv.put("kv", key, value.encode())
                result = None
            elif kind == "get":
                try:
                    result = (await kv.get("kv", key)).value.decode()
                except RocketError as error:
                    if error.code != Code.NOT_FOUND:
                        raise
                    result = None
            else:
                expected = argument[0]
                try:
                    await kv.compare_and_set("kv", key, None if expected is None else expected.encode(),
                                             value.encode())
                    result = True
                except RocketError as error:
                    if error.code != Code.CAS_FAILED:
                        raise
                    result = False
            history.append(Operation(len(history), key, kind, argument, invoked, trio.current_time(), result))
        except RocketError as error:
            if error.code not in UNKNOWN:
                raise
            if kind != "get":  # a write may have happened; a read that failed did nothing
                history.append(Operation(len(history), key, kind, argument, invoked, INFINITY))
            await trio.sleep(0.05)


async def test_counter_and_registers_stay_linearizable_while_nodes_are_killed(tmp_path):
    ports = free_ports(len(NODES))
    nameservers = ",".join(f"{node}@127.0.0.1:{port}" for node, port in zip(NODES, ports))
    environment = {"ROCKET_STORAGE_GROUPS": str(GROUPS), "ROCKET_REPLICATION": "3"}
    nodes = {node: Node(node, port, nameservers, tmp_path, environment=environment)
             for node, port in zip(NODES, ports)}
    servers = ",".join(node.server for node in nodes.values())
    try:
        for node in nodes.values():
            node.start()
        for node in nodes.values():
            await node.wait_ready()
        async with connect(servers) as channel:
            kv = KV(channel)
            with trio.fail_after(60):
                tried = False
                while True:
                    try:
                        await kv.create_bucket("kv", shards=2)
                        break
                    except RocketError as error:
                        if error.code == Code.BUCKET_EXISTS and tried:
                            break  # an earlier try went through, its answer lost
                        if error.code not in UNKNOWN:
                            raise
                        tried = True
                        await trio.sleep(0.5)
                while True:
                    try:
                        await kv.put("kv", "counter", b"0")
                        break
                    except RocketError as error:
                        if error.code not in UNKNOWN:
                            raise
                        await trio.sleep(0.5)

        counter, history, ids, stop = Counter(), [], itertools.count(), trio.Event()
        kills = 0

        async def chaos() -> None:
            nonlocal kills
            randomness = random.Random(7)
            while not stop.is_set():
                await trio.sleep(KILL_EVERY_S)
                victim = nodes[randomness.choice(NODES)]
                victim.kill()
                kills += 1
                await trio.sleep(1.0)
                victim.start()
                await victim.wait_ready(60)

        async with connect(servers) as channel, trio.open_nursery() as nursery:
            kv = KV(channel)
            nursery.start_soon(chaos)
            for _ in range(COUNTERS):
                nursery.start_soon(count, kv, counter, stop)
            for client in range(REGISTER_CLIENTS):
                nursery.start_soon(registers, kv, client, history, ids, stop)
            await trio.sleep(RUN_S)
            stop.set()

        async with connect(servers) as channel:
            with trio.fail_after(60):
                while True:
                    try:
                        final = int((await KV(channel).get("kv", "counter")).value)
                        break
                    except RocketError as error:
                        if error.code not in UNKNOWN:
                            raise
                        await trio.sleep(0.5)
        print(f"\n{kills} kills; counter {final}: {counter.acked} increments acknowledged, {counter.unknown} unknown; "
              f"{len(history)} register operations")
        assert counter.acked > 0 and kills >= 2
        assert counter.acked <= final <= counter.acked + counter.unknown
        ok, problem = linearizable(history)
        assert ok, problem
    finally:
        for node in nodes.values():
            node.kill()
