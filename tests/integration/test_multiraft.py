"""Three multi-raft hosts on real TCP: many groups replicate with one fsync per round for all of them,
survive the loss of a node, and a restarted node recovers from its WAL and catches up (by a snapshot file
fetched from its leader when the log it lacks was compacted)."""

from __future__ import annotations

from contextlib import asynccontextmanager

import pytest
import trio

from rocket.errors import Code, RocketError
from rocket.model import Address
from rocket.raft.core import Role
from rocket.raft.host import RaftHost
from rocket.transport.links import PeerLinks
from rocket.raft.wal import Wal
from rocket.transport.pool import ChannelPool
from rocket.transport.lifecycle import Lifecycle
from rocket.transport.rpc import Dispatcher
from rocket.transport.tcp import serve_tcp

GROUPS = 10
VOTERS = (1, 2, 3)


class ListMachine:
    """Appends every value; keeps only the newest `keep` when given, so its snapshots stay small. A snapshot
    has one chunk per value."""

    def __init__(self, keep: int | None = None):
        self.values: list[bytes] = []
        self.keep = keep

    def apply(self, entries, positions) -> list:
        self.values.extend(entry.data for entry in entries if entry.data)
        if self.keep is not None:
            del self.values[:-self.keep]
        return [None] * len(entries)

    def snapshot(self) -> list[bytes]:
        return list(self.values)

    def restore(self, chunks) -> None:
        self.values = list(chunks)


class Node:
    def __init__(self, node_id: int, directory, addresses: dict[int, tuple[str, int]], wal_segment_bytes: int = 1 << 26,
                 keep: int | None = None):
        self.wal_segment_bytes = wal_segment_bytes
        self.keep = keep
        self.node_id = node_id
        self.directory = directory
        self.addresses = addresses
        self.scope: trio.CancelScope | None = None
        self.host: RaftHost | None = None
        self.machines: dict[int, ListMachine] = {}
        self.fetch_addresses: dict[int, tuple[str, int]] = {}  # where to fetch other nodes' snapshots, if not there
        self.fetched: list[tuple[int, int, int | Code]] = []  # each snapshot fetch: (group, offset, bytes or error)

    async def start(self, nursery: trio.Nursery) -> None:
        self.scope = trio.CancelScope()
        await nursery.start(self._run)

    async def _run(self, task_status):
        with self.scope:
            links = PeerLinks(self.node_id, self.addresses)
            self.host = RaftHost(self.node_id, Wal.open(self.directory, self.wal_segment_bytes), links.post, tick_s=0.02)
            self.machines = {group: ListMachine(self.keep) for group in range(1, GROUPS + 1)}
            for group, machine in self.machines.items():
                self.host.add_group(group, VOTERS, machine)
            dispatcher = Dispatcher()

            async def raft_step(request):
                self.host.receive(request["payload"])
                return {}

            async def raft_snapshot_chunk(request):
                return {"data": await self.host.snapshot_chunk(request["group"], request["name"], request["offset"])}

            pool = ChannelPool()

            async def fetch_snapshot_chunk(node: int, group: int, name: str, offset: int) -> bytes:
                address = Address(*self.fetch_addresses.get(node, self.addresses[node]))
                request = {"group": group, "name": name, "offset": offset}
                try:
                    data = (await pool.call(address, "RaftSnapshotChunk", request))["data"]
                except RocketError as error:
                    self.fetched.append((group, offset, error.code))
                    raise
                self.fetched.append((group, offset, len(data)))
                return data

            dispatcher.handle("RaftStep", raft_step)
            dispatcher.handle("RaftSnapshotChunk", raft_snapshot_chunk)
            self.host.fetch_snapshot_chunk = fetch_snapshot_chunk
            try:
                async with trio.open_nursery() as nursery:
                    _, port = self.addresses.get(self.node_id, ("127.0.0.1", 0))
                    port = await nursery.start(serve_tcp, dispatcher, Lifecycle(), "127.0.0.1", port)
                    self.addresses[self.node_id] = ("127.0.0.1", port)
                    await nursery.start(pool.run)
                    await nursery.start(links.run)
                    await nursery.start(self.host.run)
                    task_status.started()
            finally:
                self.host.wal.close()

    def stop(self) -> None:
        self.scope.cancel()


@asynccontextmanager
async def running_nodes(directory, **options):
    """Three started nodes sharing one address book, and the nursery they run in (cancelled on exit)."""
    addresses: dict[int, tuple[str, int]] = {}
    nodes = [Node(node_id, directory / f"node{node_id}", addresses, **options) for node_id in VOTERS]
    async with trio.open_nursery() as nursery:
        for node in nodes:
            await node.start(nursery)
        yield nodes, nursery
        nursery.cancel_scope.cancel()


async def leaders(nodes: list[Node]) -> dict[int, Node]:
    """Wait until every group has a leader among the running nodes."""
    with trio.fail_after(20):
        while True:
            found = {}
            for node in nodes:
                for group, hosted in node.host.groups.items():
                    if hosted.core.role == Role.LEADER:
                        found[group] = node
            if len(found) == GROUPS:
                return found
            await trio.sleep(0.02)


async def propose(nodes: list[Node], group: int, data: bytes) -> None:
    """Propose data to the group through its leader, retrying where leadership moved."""
    while True:
        leader = (await leaders(nodes))[group]
        try:
            await leader.host.propose(group, data, 5)
            return
        except RocketError as error:
            assert error.code == Code.UNAVAILABLE, error  # not the leader, or lost: never committed
            await trio.sleep(0.05)


async def propose_everywhere(nodes: list[Node], prefix: bytes, count: int) -> None:
    """Propose count values to every group through its leader, retrying where leadership moved."""

    async def one_group(group: int) -> None:
        for number in range(count):
            await propose(nodes, group, b"%s-%d-%d" % (prefix, group, number))

    async with trio.open_nursery() as nursery:
        for group in range(1, GROUPS + 1):
            nursery.start_soon(one_group, group)


async def wait_applied(nodes: list[Node], expected: dict[int, list[bytes]]) -> None:
    with trio.fail_after(20):
        while not all(node.machines[g].values[-len(v):] == v for node in nodes for g, v in expected.items()):
            await trio.sleep(0.02)


async def test_many_groups_replicate_survive_a_loss_and_recover(tmp_path):
    """Every group commits on all nodes; with one node down the rest continue; it restarts and catches up."""
    async with running_nodes(tmp_path) as (nodes, nursery):
        await propose_everywhere(nodes, b"a", 5)
        await wait_applied(nodes, {g: [b"a-%d-%d" % (g, n) for n in range(5)] for g in range(1, GROUPS + 1)})

        # A burst of 100 entries over 10 groups costs each node far fewer than 100 fsyncs.
        before = [node.host.rounds.fsyncs for node in nodes]
        by_group = await leaders(nodes)
        async with trio.open_nursery() as burst:
            for group, node in by_group.items():
                for number in range(10):
                    burst.start_soon(node.host.propose, group, b"burst-%d-%d" % (group, number), 10)
        with trio.fail_after(20):
            while not all(len(node.machines[g].values) == 15 for node in nodes for g in node.machines):
                await trio.sleep(0.02)
        spent = [node.host.rounds.fsyncs - old for node, old in zip(nodes, before)]
        assert all(count <= 30 for count in spent), f"one fsync serves many groups: {spent}"

        nodes[2].stop()
        await trio.sleep(0.1)
        await propose_everywhere(nodes[:2], b"b", 3)

        await nodes[2].start(nursery)  # same WAL, same port
        tail = {g: [b"b-%d-%d" % (g, n) for n in range(3)] for g in range(1, GROUPS + 1)}
        await wait_applied(nodes, tail)
        for group in range(1, GROUPS + 1):
            assert nodes[2].machines[group].values == nodes[0].machines[group].values  # rebuilt from its WAL
            assert len(nodes[2].machines[group].values) == 18


async def test_idle_groups_go_quiet_and_a_dead_leader_is_replaced(tmp_path):
    """Idle groups stop ticking and stop persisting; when the node leading them dies, the others notice
    through the node heartbeat, wake those groups and elect new leaders."""
    async with running_nodes(tmp_path) as (nodes, nursery):
        await propose_everywhere(nodes, b"q", 1)
        with trio.fail_after(20):
            while not all(node.host.rounds.quiet_groups() == GROUPS for node in nodes):
                await trio.sleep(0.05)
        fsyncs = [node.host.rounds.fsyncs for node in nodes]
        await trio.sleep(0.5)  # 25 ticks: a group that was awake would persist heartbeats' commits and more
        assert [node.host.rounds.fsyncs for node in nodes] == fsyncs
        assert all(node.host.rounds.quiet_groups() == GROUPS for node in nodes)

        by_group = await leaders(nodes)
        victim = max(nodes, key=lambda node: sum(1 for leader in by_group.values() if leader is node))
        survivors = [node for node in nodes if node is not victim]
        victim.stop()
        started = trio.current_time()
        with trio.fail_after(20):
            while True:
                led = {g for node in survivors for g, h in node.host.groups.items() if h.core.role == Role.LEADER}
                if len(led) == GROUPS:
                    break
                await trio.sleep(0.02)
        assert trio.current_time() - started < 10
        await propose_everywhere(survivors, b"after", 1)


async def test_logs_compact_and_a_returning_node_installs_a_snapshot(tmp_path, monkeypatch):
    """Groups snapshot their state machines and the WAL drops old segments; a node that was away while
    that happened catches up through InstallSnapshot and ends with the same state."""
    from rocket import limits

    monkeypatch.setattr(limits, "raft_log_entries_max", 20)
    monkeypatch.setattr(limits, "raft_wal_segments_max", 2)
    monkeypatch.setattr(limits, "raft_catch_up_heard_s", 0.0)  # node 3's recent silence holds no compaction back
    async with running_nodes(tmp_path, wal_segment_bytes=1 << 20, keep=10) as (nodes, nursery):
        await propose_everywhere(nodes, b"x", 2)
        nodes[2].stop()
        await trio.sleep(0.1)
        payload = bytes(10_000)
        for number in range(300):
            await propose(nodes[:2], 1, payload + b"%d" % number)
        assert all(node.host.groups[1].core.snapshot.index > 250 for node in nodes[:2])
        assert all(len(list(node.directory.glob("*.log"))) <= 4 for node in nodes[:2]), "old WAL segments deleted"
        await nodes[2].start(nursery)
        with trio.fail_after(20):
            while nodes[2].machines[1].values != nodes[0].machines[1].values:
                await trio.sleep(0.05)
        assert nodes[2].host.groups[1].core.snapshot.index > 250


async def test_linearizable_reads_through_read_index_and_lease(tmp_path):
    """After a write is acknowledged, a read barrier on the leader (by ReadIndex or by lease) sees it;
    a follower is refused."""
    async with running_nodes(tmp_path) as (nodes, nursery):
        await propose_everywhere(nodes, b"r", 1)
        leader = (await leaders(nodes))[1]
        for lease in (False, True):
            await leader.host.propose(1, b"written-%d" % lease, 5)
            await leader.host.read_barrier(1, lease=lease, timeout_s=5)
            assert leader.machines[1].values[-1] == b"written-%d" % lease
        follower = next(node for node in nodes if node is not leader)
        with pytest.raises(RocketError) as refused:
            await follower.host.read_barrier(1, timeout_s=5)
        assert refused.value.code == Code.UNAVAILABLE
