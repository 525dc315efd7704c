"""How the round loop persists rounds: written in the event loop's thread into the page cache, made durable by one
syncer thread that goes on while rounds were written during its fsync, and a round the disk refused (ENOSPC) written
again by a worker thread once space returns, with nothing acknowledged before it is durable."""

from __future__ import annotations

import errno
import threading

import trio

from rocket import limits
from rocket.raft import codec
from rocket.raft.core import MessageType, Role
from rocket.raft.host import RaftHost
from rocket.raft.wal import Wal
from tests.unit.test_raft_restart import ListMachine


def open_host(directory) -> RaftHost:
    return RaftHost(1, Wal.open(directory, 64 * limits.MiB), lambda node, payload: None, tick_s=0.01)


async def test_concurrent_proposals_are_durable_with_fewer_fsyncs_than_rounds_and_survive_a_restart(tmp_path):
    """Many proposers at once: every proposal answers only once durable (it is in the WAL after a reopen), and the
    syncer's fsyncs cover several rounds each instead of one thread started per round."""
    host = open_host(tmp_path)
    host.add_group(1, (1,), ListMachine())
    values = [f"v{i}".encode() for i in range(400)]

    async with trio.open_nursery() as nursery:
        await nursery.start(host.run)

        async def propose(value: bytes) -> None:
            await host.propose(1, value, timeout_s=10)

        async with trio.open_nursery() as proposers:
            for value in values:
                proposers.start_soon(propose, value)
        assert host.rounds.fsyncs <= host.rounds.planner.written
        with trio.fail_after(5):  # a round written after the last answer (a tick's) may still be in its fsync
            while host.rounds._rounds_synced < host.rounds.planner.written:
                await trio.sleep(0.01)
        assert host.rounds._rounds_synced == host.rounds._rounds_on_disk == host.rounds.planner.written
        nursery.cancel_scope.cancel()
    assert not host.rounds._syncing
    host.wal.close()

    reopened = open_host(tmp_path)
    machine = ListMachine()
    reopened.add_group(1, (1,), machine)
    replayed = {entry.data for entry in reopened.groups[1].core.log}
    assert set(values) <= replayed
    reopened.wal.close()


async def test_a_round_the_full_disk_refused_is_written_again_once_space_returns(tmp_path, monkeypatch):
    """The first writes fail with ENOSPC: the node refuses new data (disk_refusal), the round is written again by a
    worker thread until the disk takes it, and the proposal is answered only then."""
    host = open_host(tmp_path)
    host.add_group(1, (1,), ListMachine())
    monkeypatch.setattr(limits, "disk_full_retry_s_min", 0.01)
    write = host.wal.write
    refusals = []

    def refusing(updates):
        if any(update.entries for update in updates) and len(refusals) < 3:
            refusals.append(1)
            raise OSError(errno.ENOSPC, "No space left on device")
        return write(updates)

    async with trio.open_nursery() as nursery:
        await nursery.start(host.run)
        await host.propose(1, b"warm", timeout_s=10)  # the group leads: its first round is written
        monkeypatch.setattr(host.wal, "write", refusing)
        await host.propose(1, b"after a full disk", timeout_s=10)
        assert len(refusals) == 3
        assert "is full" in host.disk_refusal
        nursery.cancel_scope.cancel()
    host.wal.close()

    reopened = open_host(tmp_path)
    reopened.add_group(1, (1,), ListMachine())
    assert b"after a full disk" in {entry.data for entry in reopened.groups[1].core.log}
    reopened.wal.close()


async def test_a_leaders_appends_go_out_before_its_fsync_with_the_commit_already_durable(tmp_path):
    """Two nodes, node 1 leading: while node 1's fsync is held, its append of a new entry reaches node 2 (which
    writes and fsyncs it meanwhile, the Raft thesis's 10.2.1), carrying no commit the held fsync would justify; the
    proposal is answered only once node 1's own fsync is done."""
    hosts: dict[int, RaftHost] = {}
    seen: list = []  # per append with entries to node 2: (commit carried, node 1's durable commit, rounds durable)

    def deliver(node: int, payload) -> None:
        for group, message in codec.decode_messages(bytes(payload)):
            if message.type == MessageType.APPEND and message.entries and node == 2:
                seen.append((message.commit, hosts[1].groups[2].durable_commit, hosts[1].rounds.planner.durable))
        hosts[node].receive(payload)

    for node in (1, 2):
        hosts[node] = RaftHost(node, Wal.open(tmp_path / str(node), 64 * limits.MiB), deliver, tick_s=0.01)
        hosts[node].add_group(2, (1, 2), ListMachine())  # group 2 of voters 1, 2: node 1 asks first
    leader, follower = hosts[1].groups[2], hosts[2].groups[2]
    async with trio.open_nursery() as nursery:
        for host in hosts.values():
            await nursery.start(host.run)
        with trio.fail_after(5):
            while leader.core.role != Role.LEADER:
                await trio.sleep(0.01)
        await hosts[1].propose(2, b"warm", timeout_s=10)
        held, sync = threading.Event(), hosts[1].wal.sync

        def held_sync() -> None:
            held.wait(10)
            sync()
        hosts[1].wal.sync = held_sync
        seen.clear()
        answered = trio.Event()

        async def propose() -> None:
            await hosts[1].propose(2, b"during the held fsync", timeout_s=10)
            answered.set()
        nursery.start_soon(propose)
        with trio.fail_after(5):  # before the tree that sends appends early, nothing comes while the fsync is held
            while not seen:
                await trio.sleep(0.01)
        durable_then = hosts[1].rounds.planner.durable
        assert all(commit <= durable_commit for commit, durable_commit, _ in seen), seen
        with trio.fail_after(5):  # node 2 holds the entry durably: its fsync was not held
            while (follower.core.stable_index < leader.core.last_index
                   or hosts[2].rounds._rounds_synced < hosts[2].rounds.planner.written):
                await trio.sleep(0.01)
        await trio.sleep(0.1)
        assert not answered.is_set() and hosts[1].rounds.planner.durable == durable_then  # not durable yet
        held.set()
        with trio.fail_after(5):
            await answered.wait()
        nursery.cancel_scope.cancel()
    for host in hosts.values():
        host.wal.close()
