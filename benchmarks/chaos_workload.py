"""The workload of benchmarks/chaos.py, each part a client of the cluster that keeps the history its checks need: KV
clients (linearizability), delayed messages (none early or lost), transactions read by a rebalancing group (committed
ones read, rolled-back ones never), and FIFO message groups (received in order). The writers of the normal topic are
tests/integration/test_cluster.py's."""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import random
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import trio

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from linearizable import Op  # noqa: E402

from rocket.client import connect, open_consumer  # noqa: E402
from rocket.client.kv import KV  # noqa: E402
from rocket.client.producer import Sequencer  # noqa: E402
from rocket.client.simple import SimpleConsumer  # noqa: E402
from rocket.client.transaction import Outcome, TransactionProducer  # noqa: E402
from rocket.errors import Code, RocketError  # noqa: E402
from rocket.model import Message, queue_for_key  # noqa: E402
from rocket.serde import batch as batch_codec  # noqa: E402
from rocket.transport.channel import Channel  # noqa: E402
from tests.integration.test_cluster import FAILOVER  # noqa: E402

WRITE_TIMEOUT_S = 5.0  # a produce that takes longer (a held partition) is sent again, as the same request, elsewhere
RESEND = (*FAILOVER, Code.DISK_FULL)  # ... as is one refused while two storage nodes' disks are full
KV_BUCKET = "chaos"
KV_KEYS = 4
KV_CLIENTS = 4
KV_TIMEOUT_S = 10.0  # an operation that takes longer has an unknown outcome: its client starts afresh
KV_DEFINITE = {Code.CAS_FAILED, Code.NOT_FOUND}  # answers that say the operation did not change anything
DELAYED_TOPIC = "chaos-delayed"
DELAYED_QUEUES = 4
DELAY_S = (1.0, 10.0)  # from a delayed message's send to its delivery time
DELAYED_GAP_S = 0.05  # between two delayed sends: about 20 a second
DELAYED_CONSUMERS = 2
DELAYED_INVISIBLE_S = 10.0
TXN_TOPIC = "chaos-txn"
TXN_QUEUES = 4
TXN_GAP_S = 0.1  # between two transactions
TXN_CHECKED = 0.2  # the share of transactions left open for the check-back to end
TXN_CHECK_S = 5  # the nodes' transaction_check_s: an open transaction is checked back this often after the first time
TXN_CHECKS_RECONNECT_S = 10.0  # a checker connects again this often (its broker may have gone)
TXN_GROUP = "chaos-txn-readers"
TXN_READERS = 3
FIFO_TOPIC = "chaos-fifo"
FIFO_QUEUES = 4
FIFO_KEYS = 8  # message groups, each sent in order by one producer, each to be received in that order
FIFO_GAP_S = 0.05  # between two FIFO sends
FIFO_GROUP = "chaos-fifo-readers"
FIFO_READERS = 2
FIFO_INVISIBLE_S = 5.0
TXN_MEMBER_S = (3.0, 20.0)  # a reader stays in its group this long, then leaves and joins again: the group rebalances


async def send_in_turn(servers: list[str], stop: trio.Event, errors: collections.Counter,
                       next_request: Callable[[], tuple[object, dict]],
                       acknowledged: Callable[[Channel, object, dict], Awaitable[None]], gap_s: float) -> None:
    """One idempotent producer's sends, one at a time, failing over between the brokers: next_request() gives what
    the next one is and its Produce request (numbered by a Sequencer), once the one before was acknowledged
    (acknowledged(channel, what, reply) then ran). A request of unknown outcome goes again, as the same request, to
    the next broker. Returns once stop is set, between two sends."""
    server, pending = 0, None
    while True:
        try:
            async with connect(servers[server % len(servers)]) as channel:
                while True:
                    if pending is None:
                        if stop.is_set():
                            return
                        pending = next_request()
                    reply = await channel.call("Produce", pending[1], timeout_s=WRITE_TIMEOUT_S)
                    what, pending = pending[0], None
                    await acknowledged(channel, what, reply)
                    await trio.sleep(gap_s)
        except RocketError as error:
            if error.code not in RESEND:
                raise
            errors[error.code.name] += 1
        server += 1
        await trio.sleep(0.05)


async def receive_in_turn(servers: list[str], index: int, topic: str, group: str, invisible_s: float, count: int,
                          drained: trio.Event, errors: collections.Counter,
                          arrived: Callable[[list[Message]], None]) -> None:
    """One receiver of a pop consumer group, failing over between the brokers until drained: arrived(messages) sees
    each receive's messages, which are then acked (a stale receipt's message comes again, and is seen again)."""
    server = index
    while not drained.is_set():
        try:
            async with connect(servers[server % len(servers)]) as channel:
                consumer = SimpleConsumer(channel, topic, group, invisible_s=invisible_s)
                while not drained.is_set():
                    messages = await consumer.receive(count, wait_s=1.0)
                    arrived(messages)
                    if messages:
                        with contextlib.suppress(RocketError):
                            await consumer.ack(*messages)
        except RocketError as error:
            errors[f"read {error.code.name}"] += 1
        server += 1
        await trio.sleep(0.05)


@dataclasses.dataclass
class KvClients:
    """Clients doing get, put and compare-and-set on KV_KEYS keys through the brokers, every operation recorded."""

    servers: list[str]
    seed: int
    stop: trio.Event = dataclasses.field(default_factory=trio.Event)
    history: list[Op] = dataclasses.field(default_factory=list)
    errors: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    next_client: int = 0

    def _client(self) -> int:
        self.next_client += 1
        return self.next_client

    async def run(self, index: int) -> None:
        chooser = random.Random(self.seed * 1000 + index)
        client, written, server = self._client(), 0, index
        while not self.stop.is_set():
            try:
                async with connect(self.servers[server % len(self.servers)]) as channel:
                    kv = KV(channel)
                    while not self.stop.is_set():
                        key = f"k{chooser.randrange(KV_KEYS)}"
                        kind = chooser.choice(("get", "put", "cas", "cas"))
                        written += 1
                        value = f"{client}:{written}".encode()
                        if kind == "cas":  # from what this client last read of the key, or from absent
                            seen = [op for op in self.history[-50:] if op.key == key and op.kind == "get"]
                            expected = seen[-1].result if seen else None
                        else:
                            expected = None
                        op = await self._call(kv, client, kind, key, value, expected)
                        self.history.append(op)
                        if op.completed is None:
                            client = self._client()  # its operation stays open for ever: a new client goes on
                            break
            except RocketError as error:
                self.errors[error.code.name] += 1
            server += 1
            await trio.sleep(0.05)

    async def _call(self, kv: KV, client: int, kind: str, key: str, value: bytes, expected: bytes | None) -> Op:
        op = Op(client=client, key=key, kind=kind, value=None if kind == "get" else value,
                expected=expected if kind == "cas" else None, invoked=trio.current_time(), completed=None, ok=None,
                result=None)
        result, ok = None, True
        try:
            with trio.fail_after(KV_TIMEOUT_S):
                if kind == "get":
                    result = (await kv.get(KV_BUCKET, key)).value
                elif kind == "put":
                    await kv.put(KV_BUCKET, key, value)
                else:
                    await kv.compare_and_set(KV_BUCKET, key, expected, value)
        except RocketError as error:
            self.errors[error.code.name] += 1
            if error.code not in KV_DEFINITE:
                return op  # open: it may have taken effect, now or later
            ok = kind == "get"  # a get of an absent key reads None; a refused compare-and-set changed nothing
        except trio.TooSlowError:
            self.errors["timeout"] += 1
            return op
        return dataclasses.replace(op, completed=trio.current_time(), ok=ok, result=result)


@dataclasses.dataclass
class Delayed:
    """Delayed messages: one idempotent producer (each message's delivery DELAY_S from its send, resent as the same
    request on an unknown outcome) and DELAYED_CONSUMERS receivers of one group (pop: receive, then ack), each
    message's first delivery timed on the harness's wall clock. Early: delivered before its time."""

    servers: list[str]
    stop: trio.Event = dataclasses.field(default_factory=trio.Event)  # the producer's
    drained: trio.Event = dataclasses.field(default_factory=trio.Event)  # the receivers'
    acked: dict[str, int] = dataclasses.field(default_factory=dict)  # id -> the delivery time sent (epoch ms)
    received: dict[str, int] = dataclasses.field(default_factory=dict)  # id -> first delivery (epoch ms)
    early: list[tuple[str, int, int]] = dataclasses.field(default_factory=list)  # (id, ms before its time, when)
    errors: collections.Counter = dataclasses.field(default_factory=collections.Counter)

    async def produce(self, seed: int) -> None:
        chooser, sequencer, count = random.Random(seed), Sequencer(), 0

        def next_request() -> tuple[object, dict]:
            nonlocal count
            count += 1
            at = int(time.time() * 1000 + chooser.uniform(*DELAY_S) * 1000)
            message = Message(b"delayed", properties={"id": f"d{count}", "at": str(at)}, deliver_at_ms=at)
            return (f"d{count}", at), sequencer.produce_request(DELAYED_TOPIC, count % DELAYED_QUEUES,
                                                               batch_codec.encode([message], at))

        async def acknowledged(channel, sent, reply: dict) -> None:
            self.acked[sent[0]] = sent[1]

        await send_in_turn(self.servers, self.stop, self.errors, next_request, acknowledged, DELAYED_GAP_S)

    async def consume(self, index: int) -> None:
        def arrived(messages: list[Message]) -> None:
            now = int(time.time() * 1000)
            for message in messages:
                key, at = message.properties["id"], int(message.properties["at"])
                if key not in self.received:
                    self.received[key] = now
                    if now < at:
                        self.early.append((key, at - now, now))

        await receive_in_turn(self.servers, index, DELAYED_TOPIC, "chaos-delayed", DELAYED_INVISIBLE_S, 32,
                              self.drained, self.errors, arrived)

    async def drain(self, timeout_s: float) -> None:
        """Until every acknowledged message was delivered, or timeout_s; then the receivers stop."""
        with trio.move_on_after(timeout_s):
            while not set(self.acked) <= set(self.received):
                await trio.sleep(0.2)
        self.drained.set()

    def lost(self) -> list[str]:
        return sorted(set(self.acked) - set(self.received))


@dataclasses.dataclass
class Transactions:
    """Transactions on a transaction topic: one idempotent producer sends each one's half messages (resent as the same
    request on an unknown outcome), then commits it, rolls it back, or leaves it open for the check-back, which every
    broker's checker answers from the decision taken before it was sent. Readers of one consumer group (pull, from
    the earliest) leave and join again now and then, so the group rebalances while they read."""

    servers: list[str]
    stop: trio.Event = dataclasses.field(default_factory=trio.Event)  # the producer's
    drained: trio.Event = dataclasses.field(default_factory=trio.Event)  # the readers' and checkers'
    decided: dict[str, tuple[bool, int]] = dataclasses.field(default_factory=dict)  # id -> (commit?, messages)
    acked: set[str] = dataclasses.field(default_factory=set)  # ids whose half messages were acknowledged
    read: collections.Counter = dataclasses.field(default_factory=collections.Counter)  # (id, index) -> reads
    offsets: dict[int, set[int]] = dataclasses.field(default_factory=dict)  # queue -> offsets read
    highest: dict[int, int] = dataclasses.field(default_factory=dict)  # queue -> the highest offset read
    reordered: list[str] = dataclasses.field(default_factory=list)
    rebalances: int = 0
    errors: collections.Counter = dataclasses.field(default_factory=collections.Counter)

    async def produce(self, seed: int) -> None:
        chooser, sequencer, count = random.Random(seed), Sequencer(), 0

        def next_request() -> tuple[object, dict]:
            nonlocal count
            count += 1
            key, size, commit = f"t{count}", chooser.randint(1, 3), chooser.random() < 0.6
            by_check = chooser.random() < TXN_CHECKED
            self.decided[key] = (commit, size)  # before it is sent: a check-back may come first
            messages = [Message(b"txn", properties={"txn": key, "index": str(index)}) for index in range(size)]
            return (key, by_check), sequencer.produce_request(TXN_TOPIC, count % TXN_QUEUES, batch_codec.encode(
                messages, int(time.time() * 1000), transaction=True))

        async def acknowledged(channel, sent, reply: dict) -> None:
            key, by_check = sent
            self.acked.add(key)
            if not by_check:
                await self._end(channel, key, reply)

        await send_in_turn(self.servers, self.stop, self.errors, next_request, acknowledged, TXN_GAP_S)

    async def _end(self, channel, key: str, reply: dict) -> None:
        """Commit or roll back as decided; an unknown outcome leaves it to the check-back."""
        try:
            await channel.call("EndTransaction", {"topic": TXN_TOPIC, "queue": reply["queue"],
                                                  "offset": reply["base_offset"], "count": reply["count"],
                                                  "commit": self.decided[key][0]}, timeout_s=WRITE_TIMEOUT_S)
        except RocketError as error:
            if error.code not in (*RESEND, Code.NOT_FOUND):  # NOT_FOUND: a check-back ended it first
                raise
            self.errors[f"end {error.code.name}"] += 1

    async def check(self, transaction, messages: list[Message]) -> Outcome:
        decided = self.decided.get(messages[0].properties.get("txn", ""))
        return Outcome.UNKNOWN if decided is None else Outcome.COMMIT if decided[0] else Outcome.ROLLBACK

    async def check_backs(self, server: str) -> None:
        """Answer the check-backs a broker sends, on a connection made again now and then (one may have broken)."""
        while not self.drained.is_set():
            with contextlib.suppress(RocketError):
                async with connect(server) as channel:
                    producer = TransactionProducer(channel, TXN_TOPIC, TXN_QUEUES, self.check)
                    with trio.move_on_after(TXN_CHECKS_RECONNECT_S):
                        await producer.answer_checks()
            await trio.sleep(0.05)

    async def consume(self, index: int) -> None:
        """One reader: joins the group, reads for a while, leaves, and joins again. A queue's offsets are read in
        order: one read for the first time below one read before is a message skipped and read late. (Reading again
        from the last commit, after a rebalance, is not: its offsets were all read before.)"""
        chooser, server = random.Random(index), index
        while not self.drained.is_set():
            try:
                async with connect(self.servers[server % len(self.servers)]) as channel:
                    async with open_consumer(channel, TXN_TOPIC, TXN_GROUP, start="earliest", wait_ms=500) as reader:
                        with trio.move_on_after(chooser.uniform(*TXN_MEMBER_S)):
                            while not self.drained.is_set():
                                for message in await reader.poll():
                                    read = self.offsets.setdefault(message.queue, set())
                                    highest = self.highest.get(message.queue, -1)
                                    if message.offset not in read and message.offset < highest:
                                        self.reordered.append(f"{message.queue}/{message.offset} after {highest}")
                                    read.add(message.offset)
                                    self.highest[message.queue] = max(highest, message.offset)
                                    self.read[(message.properties["txn"], message.properties["index"])] += 1
                                await reader.commit()
                self.rebalances += 1
            except RocketError as error:
                self.errors[f"read {error.code.name}"] += 1
            server += 1
            await trio.sleep(0.05)

    def committed(self) -> set[tuple[str, str]]:
        return {(key, str(index)) for key in self.acked if self.decided[key][0]
                for index in range(self.decided[key][1])}

    async def drain(self, timeout_s: float) -> None:
        """Until every committed transaction's messages were read, or timeout_s; then the readers stop."""
        with trio.move_on_after(timeout_s):
            while not self.committed() <= set(self.read):
                await trio.sleep(0.5)
        self.drained.set()

    def outcome(self) -> dict:
        committed = self.committed()
        rolled_back = {(key, str(index)) for key in self.acked if not self.decided[key][0]
                       for index in range(self.decided[key][1])}
        lost = sorted(committed - set(self.read))
        leaked = sorted(rolled_back & set(self.read))
        return {"transactions": len(self.acked), "committed_messages": len(committed),
                "rolled_back_messages": len(rolled_back), "lost": len(lost), "lost_first": lost[:20],
                "leaked": len(leaked), "leaked_first": leaked[:20],
                "read_twice": sum(1 for count in self.read.values() if count > 1),
                "reordered": len(self.reordered), "reordered_first": self.reordered[:20],
                "rebalances": self.rebalances, "errors": dict(self.errors)}


@dataclasses.dataclass
class Fifo:
    """Messages of FIFO_KEYS message groups (keys) on a FIFO topic, numbered per group and sent one at a time by one
    idempotent producer (resent as the same request on an unknown outcome), received by a pop consumer group that
    acks each. A group's messages must first arrive in the order they were sent, and every acknowledged one must."""

    servers: list[str]
    stop: trio.Event = dataclasses.field(default_factory=trio.Event)  # the producer's
    drained: trio.Event = dataclasses.field(default_factory=trio.Event)  # the receivers'
    acked: collections.Counter = dataclasses.field(default_factory=collections.Counter)  # key -> messages acked
    arrived: dict[str, list[int]] = dataclasses.field(default_factory=dict)  # key -> numbers, by first arrival
    errors: collections.Counter = dataclasses.field(default_factory=collections.Counter)

    async def produce(self, seed: int) -> None:
        chooser, sequencer, sent = random.Random(seed), Sequencer(), collections.Counter()

        def next_request() -> tuple[object, dict]:
            key = f"g{chooser.randrange(FIFO_KEYS)}"
            message = Message(b"fifo", key=key, properties={"n": str(sent[key])})
            sent[key] += 1
            return key, sequencer.produce_request(FIFO_TOPIC, queue_for_key(key, FIFO_QUEUES),
                                                  batch_codec.encode([message], int(time.time() * 1000)))

        async def acknowledged(channel, key, reply: dict) -> None:
            self.acked[key] += 1

        await send_in_turn(self.servers, self.stop, self.errors, next_request, acknowledged, FIFO_GAP_S)

    async def consume(self, index: int) -> None:
        def arrived(messages: list[Message]) -> None:
            for message in messages:
                numbers = self.arrived.setdefault(message.key, [])
                if int(message.properties["n"]) not in numbers:
                    numbers.append(int(message.properties["n"]))

        await receive_in_turn(self.servers, index, FIFO_TOPIC, FIFO_GROUP, FIFO_INVISIBLE_S, 16, self.drained,
                              self.errors, arrived)

    def missing(self) -> list[str]:
        """Each acknowledged message that did not arrive, with the highest number of its group that did: one below it
        was skipped, one above it waits behind its group's messages before it."""
        return [f"{key}/{number} ({key}/{max(self.arrived.get(key, [-1]))} arrived)"
                for key, count in sorted(self.acked.items()) for number in range(count)
                if number not in self.arrived.get(key, [])]

    async def drain(self, timeout_s: float) -> None:
        """Until every acknowledged message arrived, or timeout_s; then the receivers stop."""
        with trio.move_on_after(timeout_s):
            while self.missing():
                await trio.sleep(0.5)
        self.drained.set()

    def outcome(self) -> dict:
        missing = self.missing()
        out_of_order = {key: numbers for key, numbers in self.arrived.items() if numbers != sorted(numbers)}
        return {"acknowledged": sum(self.acked.values()), "lost": len(missing), "lost_first": missing[:20],
                "reordered": len(out_of_order), "reordered_first": {key: numbers[:50] for key, numbers in
                                                                     list(out_of_order.items())[:4]},
                "errors": dict(self.errors)}

