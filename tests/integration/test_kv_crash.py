"""A real `rocket run` killed with SIGKILL during heavy KV puts loses no acknowledged put, and a KV directory deleted
while it is down is rebuilt from the Raft log with the same digest."""

from __future__ import annotations

import shutil

import trio

from rocket.client import connect
from rocket.client.kv import KV
from rocket.errors import RocketError

WRITERS = 16


async def put_until_killed(server: str, acked: dict[str, tuple[int, bytes]], kill_after: int, kill) -> None:
    """16 writers, each rewriting its own keys; the last acknowledged value of each key is what must survive."""
    async with connect(server) as channel:
        kv = KV(channel)

        async def writer(number: int) -> None:
            for round_number in range(10_000):
                key = f"w{number}/k{round_number % 50}"
                value = f"{number}:{round_number}".encode() * 8
                try:
                    revision = await kv.put("crash", key, value)
                except RocketError:
                    return  # in flight as the server died: never acknowledged
                acked[key] = (revision, value)
                if len(acked) >= kill_after and round_number > 200:
                    kill()

        async with trio.open_nursery() as nursery:
            for number in range(WRITERS):
                nursery.start_soon(writer, number)


async def test_kill_during_puts_loses_nothing_acknowledged_and_the_kv_is_rebuilt(server_process, tmp_path):
    server = server_process().start()
    async with connect(server.server) as channel:
        await KV(channel).create_bucket("crash", shards=4, history=2)
    acked: dict[str, tuple[int, bytes]] = {}
    await put_until_killed(server.server, acked, kill_after=600, kill=server.kill)
    assert len(acked) >= 600

    server.start()
    async with connect(server.server) as channel:
        kv = KV(channel)
        for key, (revision, value) in acked.items():
            entry = await kv.get("crash", key)
            # The acknowledged put, or a later one that was in flight as the server died (same writer, same key).
            assert entry.revision >= revision, key
            if entry.revision == revision:
                assert entry.value == value
        before = await kv.describe_bucket("crash")
    server.terminate()

    shutil.rmtree(server.data_dir / "storage" / "kv")
    server.start()
    async with connect(server.server) as channel:
        kv = KV(channel)
        with trio.fail_after(30):
            after = await kv.describe_bucket("crash")
        assert [(s["revision"], s["keys"], s["digest"]) for s in after["shards"]] == \
               [(s["revision"], s["keys"], s["digest"]) for s in before["shards"]]
        assert (await kv.get("crash", next(iter(acked)))).value
