"""A replica that was away while its group compacted catches up through a snapshot file of many chunks, fetched
from its leader over real TCP while the connection carrying the fetch is dropped mid-way: it resumes from its
partial file and ends with the leader's state."""

from __future__ import annotations

import trio

from rocket import limits
from rocket.errors import Code
from rocket.raft import snapshots
from tests.integration.test_multiraft import leaders, propose, propose_everywhere, running_nodes


class CuttingProxy:
    """Forwards TCP connections to target; once cut_after bytes came back from it, drops the connection that
    carries them (once), as a failing network would."""

    def __init__(self, target: tuple[str, int], cut_after: int):
        self.target = target
        self.cut_after = cut_after
        self.returned = 0
        self.cuts = 0
        self.port = 0

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        self.port = listeners[0].socket.getsockname()[1]
        async with trio.open_nursery() as nursery:
            task_status.started()
            await trio.serve_listeners(self._forward, listeners, handler_nursery=nursery)

    async def _forward(self, client: trio.SocketStream) -> None:
        async with client, await trio.open_tcp_stream(*self.target) as server, trio.open_nursery() as pipes:
            pipes.start_soon(self._pipe, client, server, False, pipes.cancel_scope)
            pipes.start_soon(self._pipe, server, client, True, pipes.cancel_scope)

    async def _pipe(self, source, sink, returning: bool, connection: trio.CancelScope) -> None:
        try:
            async for data in source:
                if returning:
                    self.returned += len(data)
                    if not self.cuts and self.returned >= self.cut_after:
                        self.cuts += 1
                        break  # mid-response: both directions close
                await sink.send_all(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        connection.cancel()


async def away_while_group_1_grows(nodes, away: int = 2) -> None:
    """nodes[away] stops while group 1 takes 300 entries of 10 KB (with raft_log_entries_max at 20, many
    compactions)."""
    nodes[away].stop()
    await trio.sleep(0.1)
    for number in range(300):
        await propose([node for index, node in enumerate(nodes) if index != away], 1, b"%d-" % number + bytes(10_000))


async def test_a_lagging_replica_fetches_a_snapshot_of_many_chunks_across_a_dropped_connection(tmp_path, monkeypatch):
    """Node 3 is down while group 1 takes 300 entries of 10 KB and compacts (a snapshot of one chunk per entry);
    back, it fetches the file in ranges of 16 KiB, the connection drops a third of the way, the fetch resumes at
    the byte it had reached (nothing is fetched twice), and node 3 ends with the leader's values."""
    monkeypatch.setattr(limits, "raft_log_entries_max", 20)
    monkeypatch.setattr(limits, "snapshot_chunk_bytes_max", 16 * limits.KiB)
    monkeypatch.setattr(limits, "snapshot_fetch_retry_s", 0.05)
    monkeypatch.setattr(limits, "raft_catch_up_heard_s", 0.0)  # node 3's silence holds no compaction back
    async with running_nodes(tmp_path) as (nodes, nursery):
        await propose_everywhere(nodes, b"x", 1)
        await away_while_group_1_grows(nodes)
        proxies = []
        for node in nodes[:2]:  # node 3 fetches snapshots from either through a proxy that drops once
            proxy = CuttingProxy(node.addresses[node.node_id], cut_after=1_000_000)  # a third of the snapshot
            await nursery.start(proxy.run)
            nodes[2].fetch_addresses[node.node_id] = ("127.0.0.1", proxy.port)
            proxies.append(proxy)

        await nodes[2].start(nursery)
        with trio.fail_after(30):
            while not len(nodes[2].machines[1].values) == 301 == len(nodes[0].machines[1].values):
                await trio.sleep(0.05)

        assert nodes[2].machines[1].values == nodes[0].machines[1].values == nodes[1].machines[1].values
        installed = nodes[2].host.groups[1].core.snapshot
        size = snapshots.Descriptor.decode(installed.data).size
        assert installed.index > 250 and size > 250 * 10_000
        assert sum(proxy.cuts for proxy in proxies) == 1
        fetched = [(offset, outcome) for group, offset, outcome in nodes[2].fetched if group == 1]
        dropped = [number for number, (_, outcome) in enumerate(fetched) if isinstance(outcome, Code)]
        assert len(dropped) == 1 and fetched[dropped[0]][1] == Code.CONNECTION_LOST, fetched
        at = fetched[dropped[0]][0]
        assert 0 < at < size and fetched[dropped[0] + 1] == (at, limits.snapshot_chunk_bytes_max), "resumed there"
        offsets = [offset for offset, outcome in fetched if not isinstance(outcome, Code)]
        assert offsets[0] == 0 and offsets == sorted(set(offsets)) and len(offsets) > 100  # many chunks, none twice
        assert sum(outcome for _, outcome in fetched if not isinstance(outcome, Code)) == size
        held = sorted(path.name for path in (nodes[2].directory / snapshots.DIRECTORY).iterdir())
        assert held == [snapshots.name_of(1, installed)]  # no partial file left


async def test_a_replica_away_for_a_short_while_catches_up_from_the_log(tmp_path, monkeypatch):
    """The same absence, but node 3 was heard from within limits.raft_catch_up_heard_s: its leader holds compaction
    back (the log is far below limits.raft_catch_up_log_bytes_max), so node 3 catches up from entries, with no
    snapshot to fetch, as etcd keeps entries for a slow follower."""
    monkeypatch.setattr(limits, "raft_log_entries_max", 20)
    async with running_nodes(tmp_path) as (nodes, nursery):
        await propose_everywhere(nodes, b"x", 1)
        leader = (await leaders(nodes))[1]
        away = next(index for index, node in enumerate(nodes) if node is not leader)  # a follower the leader heard
        await away_while_group_1_grows(nodes, away)
        await nodes[away].start(nursery)
        with trio.fail_after(30):
            while not len(nodes[away].machines[1].values) == 301 == len(leader.machines[1].values):
                await trio.sleep(0.05)
        assert nodes[away].machines[1].values == leader.machines[1].values
        # Had its leader compacted past what it held meanwhile, it would have fetched a snapshot. (Once it has caught
        # up, the leader compacts again.)
        assert not [fetch for fetch in nodes[away].fetched if fetch[0] == 1], "it fetched a snapshot"
