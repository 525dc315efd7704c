"""A KV workload on the simulated roles: clients put, get, compare-and-set (by value, by revision, if absent),
delete, swap in a transaction and range over single keys of a bucket with several shards, through the brokers' KV
methods, while shard leaders crash, are cut off, or are split from the other nodes (the clients still reaching
them). The history goes to the linearizability checker, one register per key; a call without an answer (TIMEOUT,
UNAVAILABLE, CONNECTION_LOST) has an unknown outcome.

Every write puts a value written nowhere else, so a key's revision names the value it holds: a put with
if_revision=R is a compare-and-set from the value written at R (from absent when R is 0), and two answers that
give one revision of a shard to two different writes are a failure of their own.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from pathlib import Path

import trio

from rocket.errors import Code, RocketError
from rocket.model import bucket_topic, shard_of
from rocket.roles.nameserver.metadata import META_GROUP
from rocket.roles.peers import RETRYABLE
from tests.sim.linearizability import ABSENT, INFINITY, Operation, describe, linearizable
from tests.sim.roles_sim import Network, NetworkFaults, SimNode, cluster, start_nodes

BUCKET = "sim"
SHARDS = 3
KEYS = ("k0", "k1", "k2", "k3", "k4", "k5")  # two per shard, none a prefix of another: a prefix range reads one key
CALL_TIMEOUT_S = 20.0  # longer than the broker's retries (limits.storage_retry_s_max): its own answer comes first
OPERATIONS = {"put": 3, "get": 4, "range": 2, "cas": 3, "cas_revision": 3, "create": 2, "delete": 2, "swap": 2}


@dataclasses.dataclass
class KvScenario:
    faults: NetworkFaults
    clients: int = 8
    rounds: int = 3  # faults, one after the other
    crash: float = 0.4  # chance a fault is a crash
    isolate: float = 0.3  # chance the victim is cut off from everyone, running and believing it leads; otherwise
    # it is split from the other nodes alone, and the clients still reach it
    think_s_max: float = 0.05  # a client waits up to this between two operations


class KvClients:
    """Concurrent clients, each one operation at a time through a random live node, recording the history."""

    def __init__(self, network: Network, clients: int, think_s_max: float):
        self.network = network
        self.random = network.random
        self.clients = clients
        self.think_s_max = think_s_max
        self.history: list[Operation] = []
        self.revisions: dict[tuple[int, int], tuple[str, bytes]] = {}  # (shard, revision) -> (key, value) written
        self.conflicts: list[str] = []
        self.counts: Counter = Counter()  # per operation: answered; per operation + " unknown": not answered

    async def run(self, stop: trio.Event, done: trio.Event) -> None:
        async with trio.open_nursery() as nursery:
            for client in range(self.clients):
                nursery.start_soon(self._client, client, stop)
        done.set()

    async def _client(self, client: int, stop: trio.Event) -> None:
        known: dict[str, tuple[bytes | None, int]] = {}  # key -> (value, revision) this client saw last
        written = 0
        while not stop.is_set():
            key = self.random.choice(KEYS)
            kind = self.random.choices(list(OPERATIONS), list(OPERATIONS.values()))[0]
            written += 1
            await self.operate(kind, key, known, f"c{client}.{written}".encode())
            await trio.sleep(self.random.uniform(0, self.think_s_max))

    async def call(self, method: str, request: dict) -> dict:
        live = [node for node in self.network.nodes.values() if node.up]
        if not live:
            raise RocketError(Code.UNAVAILABLE, "no node is up")
        address = self.random.choice(live).config.listen
        return await self.network.call(0, (address.host, address.port), method, {"bucket": BUCKET, **request},
                                       CALL_TIMEOUT_S)

    def saw(self, known: dict, key: str, value: bytes | None, revision: int) -> None:
        """Note what an answer says key holds at revision (absent at 0); one revision of a shard names one write."""
        known[key] = (value, revision)
        if value is ABSENT:
            return
        at = (shard_of(key, SHARDS), revision)
        if self.revisions.setdefault(at, (key, value)) != (key, value):
            self.conflicts.append(f"shard {at[0]} revision {revision}: {self.revisions[at]} and {(key, value)}")

    async def operate(self, kind: str, key: str, known: dict, value: bytes) -> None:
        """One operation, recorded with its register meaning: (checker kind, argument) and the result it got."""
        expected, revision = known.get(key, (ABSENT, 0))
        if kind == "cas" and self.random.random() < 0.3:
            expected = self.random.choice([ABSENT, b"c0.1", value])  # most likely wrong: the compare must fail
        meaning = {"put": ("put", (value,)), "get": ("get", ()), "range": ("get", ()), "delete": ("delete", ()),
                   "swap": ("swap", (value,)), "cas": ("cas", (expected, value)),
                   "cas_revision": ("cas", (expected, value)), "create": ("cas", (ABSENT, value))}[kind]
        invoked = trio.current_time()
        try:
            result = await getattr(self, "_" + kind)(key, known, value, expected, revision)
        except RocketError as error:
            if error.code not in RETRYABLE:
                raise
            self.counts[kind + " unknown"] += 1
            if meaning[0] != "get":  # a read without an answer changed nothing
                self.history.append(Operation(len(self.history), key, *meaning, invoked))
            return
        self.counts[kind] += 1
        self.history.append(Operation(len(self.history), key, *meaning, invoked, trio.current_time(), result))

    async def _put(self, key, known, value, expected, revision):
        self.saw(known, key, value, (await self.call("KvPut", {"key": key, "value": value}))["revision"])

    async def _get(self, key, known, value, expected, revision):
        try:
            found = (await self.call("KvGet", {"key": key}))["entries"][0]
        except RocketError as error:
            if error.code != Code.NOT_FOUND:
                raise
            self.saw(known, key, ABSENT, 0)
            return ABSENT
        self.saw(known, key, bytes(found["value"]), found["revision"])
        return bytes(found["value"])

    async def _range(self, key, known, value, expected, revision):
        found = (await self.call("KvRange", {"prefix": key, "limit": 10}))["entries"]
        assert [entry["key"] for entry in found] in ([], [key]), found
        if not found:
            self.saw(known, key, ABSENT, 0)
            return ABSENT
        self.saw(known, key, bytes(found[0]["value"]), found[0]["revision"])
        return bytes(found[0]["value"])

    async def _cas(self, key, known, value, expected, revision):
        """RIP-22's compare-and-set, as the client's compare_and_set sends it: a transaction."""
        compare = {"key": key, "target": "value", "op": "==", "number": 0, "value": expected}
        if expected is ABSENT:
            compare = {"key": key, "target": "create_revision", "op": "==", "number": 0, "value": b""}
        result = await self.call("KvTxn", {"compare": [compare], "success": [op("put", key, value)],
                                           "failure": [op("get", key)]})
        if result["succeeded"]:
            self.saw(known, key, value, result["results"][0]["revision"])
        else:
            found = result["results"][0]["entries"]
            self.saw(known, key, *((bytes(found[0]["value"]), found[0]["revision"]) if found else (ABSENT, 0)))
        return result["succeeded"]

    async def _cas_revision(self, key, known, value, expected, revision):
        return await self._put_if(key, known, value, {"if_revision": revision})

    async def _create(self, key, known, value, expected, revision):
        return await self._put_if(key, known, value, {"if_absent": True})

    async def _put_if(self, key, known, value, condition: dict) -> bool:
        try:
            answer = await self.call("KvPut", {"key": key, "value": value, **condition})
        except RocketError as error:
            if error.code != Code.CAS_FAILED:
                raise
            return False
        self.saw(known, key, value, answer["revision"])
        return True

    async def _delete(self, key, known, value, expected, revision):
        deleted = (await self.call("KvDelete", {"key": key}))["deleted"]
        self.saw(known, key, ABSENT, 0)
        return bool(deleted)

    async def _swap(self, key, known, value, expected, revision):
        """A transaction of a get and a put of one key: the value it replaced, atomically."""
        result = await self.call("KvTxn", {"success": [op("get", key), op("put", key, value)]})
        assert result["succeeded"], result
        self.saw(known, key, value, result["results"][1]["revision"])
        found = result["results"][0]["entries"]
        return bytes(found[0]["value"]) if found else ABSENT


def op(name: str, key: str, value: bytes = b"") -> dict:
    """A transaction's operation as the client sends it (ttl_ms -1: the bucket's)."""
    return {"op": name, "key": key, "value": value, "ttl_ms": -1}


def pending(history: list[Operation]) -> int:
    """How many operations got no answer."""
    return sum(operation.responded == INFINITY for operation in history)


def leader_of(nodes: dict[int, SimNode], group: int) -> int | None:
    """The live node that leads group, as its own Raft core sees it (None while there is none)."""
    leaders = [number for number, node in nodes.items() if node.up and node.host.leads(group)]
    return leaders[0] if leaders else None


async def create_bucket(network: Network, address: tuple[str, int]) -> None:
    """The bucket, created through the node at address. BUCKET_EXISTS is a success: a broker that lost the answer of
    the nameserver that created it asks the next one, which finds it (the scenario is its only creator)."""
    try:
        await network.call(0, address, "KvCreateBucket", {"bucket": BUCKET, "shards": SHARDS}, 30.0, True)
    except RocketError as error:
        if error.code != Code.BUCKET_EXISTS:
            raise


async def run_kv(seed: int, base: Path, scenario: KvScenario) -> dict:
    """Three all-role nodes serve a bucket of SHARDS shards to the clients; scenario.rounds times the leader of
    a random shard (now and then the nameserver leader) crashes and restarts, or is cut off or split off for a while.
    Then every key is read once more, and the history is checked."""
    network, nodes = cluster(seed, base, scenario.faults, groups=6)
    report: dict = {"seed": seed, "faults": []}
    async with trio.open_nursery() as nursery:
        await start_nodes(nursery, nodes)
        first = nodes[1].config.listen
        await create_bucket(network, (first.host, first.port))
        route = await network.call(0, (first.host, first.port), "GetRoute", {"topic": bucket_topic(BUCKET)}, 30.0, True)
        with trio.fail_after(30):  # the shards' groups elect their leaders as the first work reaches them
            while any(leader_of(nodes, group) is None for group in route["queue_groups"]):
                await trio.sleep(0.05)
        clients = KvClients(network, scenario.clients, scenario.think_s_max)
        stop, finished = trio.Event(), trio.Event()
        nursery.start_soon(clients.run, stop, finished)
        for _ in range(scenario.rounds):
            await trio.sleep(1 + network.random.random())
            if network.random.random() < 0.2:
                what, victim = "nameserver leader", leader_of(nodes, META_GROUP) or 1
            else:
                shard = network.random.randrange(SHARDS)
                what, victim = f"leader of shard {shard}", leader_of(nodes, route["queue_groups"][shard]) or 1
            chance = network.random.random()
            fault = "crash" if chance < scenario.crash else "isolate" if chance < scenario.crash + scenario.isolate \
                else "split"
            report["faults"].append(f"{fault} {what} (node {victim})")
            if fault == "crash":
                nodes[victim].crash()
                await nodes[victim].stopped.wait()
            else:
                (network.isolated if fault == "isolate" else network.split).add(victim)
            await trio.sleep(1.5 + network.random.random() * 1.5)
            if fault == "crash":
                await nursery.start(nodes[victim].run)
            else:
                (network.isolated if fault == "isolate" else network.split).discard(victim)
        await trio.sleep(1)
        stop.set()
        await finished.wait()
        for key in KEYS:  # the last word: what each key holds once everything is healed
            await clients.operate("get", key, {}, b"")
        report.update(clients.counts, calls=network.calls, answers_lost=network.lost,
                      simulated_s=round(trio.current_time(), 1))
        for node in nodes.values():
            node.crash()
    ok, problem = linearizable(clients.history)
    report.update(operations=len(clients.history), pending=pending(clients.history), linearizable=ok,
                  problem=problem, conflicts=clients.conflicts)
    if not ok:  # the first key whose history alone has no legal order
        key = next(key for key in KEYS if not linearizable([o for o in clients.history if o.key == key])[0])
        report["failing history"] = describe(clients.history, key)
    return report
