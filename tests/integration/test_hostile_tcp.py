"""Hostile TCP peers against a `rocket run` process (issue 35): headers that claim the largest frame cost the server
what arrived, not what they claim; slow senders (slowloris) are closed once a frame takes longer than tcp_frame_s,
silent connections once idle for tcp_idle_s; and the server serves everyone else meanwhile. Also: a long poll and a
stream are not idle, and a pooled client reconnects by itself after its idle connection was closed."""

from __future__ import annotations

import resource
import struct
import time
from pathlib import Path

import pytest
import trio

from rocket import limits
from rocket.client import connect
from rocket.model import Message
from rocket.serde import batch as batch_codec
from rocket.serde import json_codec
from rocket.transport import frames
from rocket.transport.frames import Kind

CLAIMERS = 1000
SLOW = 200
FRAME_S = 8.0  # the server's tcp_frame_s here (ROCKET_TCP_FRAME_S)
IDLE_S = 4.0  # and its tcp_idle_s
GROWTH_BYTES_MAX = 150 * limits.MiB  # the server's RSS with all of them connected, over what it was before


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def claiming_header() -> bytes:
    """The 24-byte header of a request frame that claims the largest frame a server accepts, and a method's first byte."""
    return struct.pack(">IBBBBQH", limits.frame_bytes_max, frames.VERSION, Kind.REQUEST, 1, 0, 1, 7) + b"P"


@pytest.fixture
def many_files():
    """Room for 1,200+ sockets here and in the server (which inherits the limit)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = CLAIMERS + SLOW + 512
    if hard != resource.RLIM_INFINITY and hard < wanted:
        pytest.skip(f"RLIMIT_NOFILE's hard limit {hard} is under {wanted}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, wanted), hard))
    yield
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


@pytest.fixture
def hostile_server(server_process, tmp_path, monkeypatch, many_files):
    monkeypatch.setenv("ROCKET_TCP_FRAME_S", str(FRAME_S))
    monkeypatch.setenv("ROCKET_TCP_IDLE_S", str(IDLE_S))
    return server_process(tmp_path / "data").start()


async def closed_within(stream: trio.SocketStream, timeout_s: float) -> float | None:
    """Seconds until the server closed the connection (what it sent first is read and dropped); None if it did not."""
    started = trio.current_time()
    with trio.move_on_after(timeout_s):
        while True:
            try:
                if not await stream.receive_some(65536):
                    return trio.current_time() - started
            except trio.BrokenResourceError:
                return trio.current_time() - started
    return None


async def serves(server: str, topic: str) -> None:
    """A produce and a read of it, through the client."""
    batch = batch_codec.encode([Message(b"still here")], 1_700_000_000_000)
    async with connect(server) as channel:
        with trio.fail_after(10):
            await channel.call("CreateTopic", {"topic": topic, "queues": 1})
            produced = await channel.call("Produce", {"topic": topic, "queue": 0, "batch": batch})
            pulled = await channel.call("Pull", {"topic": topic, "queues": [{"queue": 0, "offset": produced["base_offset"]}],
                                                 "max_bytes": 1 << 20, "wait_ms": 0})
    assert [message.body for each in pulled["batches"] for message in batch_codec.decode(each["batch"])] \
        == [b"still here"]


async def test_claimed_frames_and_slowloris_cost_little_and_are_closed(hostile_server):
    server = hostile_server
    host, port = "127.0.0.1", server.tcp_port
    await serves(server.server, "before")
    before = rss_bytes(server.process.pid)

    claimers = []
    for _ in range(CLAIMERS):
        stream = await trio.open_tcp_stream(host, port)
        await stream.send_all(claiming_header())
        claimers.append(stream)

    slow_closed: list[float] = []
    slow_started = time.monotonic()

    async def slowloris() -> None:
        """A header of a small frame, one byte a second, until the server closes the connection."""
        data = frames.encode(Kind.REQUEST, 1, 3, b"{}" * 40, "Ping")
        async with await trio.open_tcp_stream(host, port) as stream:
            for byte in data:
                try:
                    await stream.send_all(bytes([byte]))
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    break
                with trio.move_on_after(1):
                    if not await _receive_or_eof(stream):
                        break
            slow_closed.append(time.monotonic() - slow_started)

    async with trio.open_nursery() as nursery:
        for _ in range(SLOW):
            nursery.start_soon(slowloris)
        await trio.sleep(3)  # every claimer's header and every slow connection's first bytes are in
        during = rss_bytes(server.process.pid)
        growth = during - before
        print(f"server RSS {before / limits.MiB:.0f} MiB before, {during / limits.MiB:.0f} MiB with {CLAIMERS} "
              f"claimed {limits.frame_bytes_max}-byte frames and {SLOW} slow connections open: "
              f"+{growth / limits.MiB:.0f} MiB")
        assert growth < GROWTH_BYTES_MAX
        await serves(server.server, "during")  # it serves everyone else meanwhile
        # The claimers' frames never arrive: each is closed once its frame took FRAME_S, with a TIMEOUT said first.
        closed = [await closed_within(stream, FRAME_S + 10) for stream in claimers[:20]]
        assert None not in closed, closed
    # A slow connection sends its first 6 bytes (6 s: they decide the protocol), then its frame gets FRAME_S.
    assert len(slow_closed) == SLOW and max(slow_closed) < 6 + FRAME_S + 8, max(slow_closed)
    with trio.fail_after(FRAME_S + 10):  # the rest of the claimers too
        for stream in claimers:
            assert await closed_within(stream, FRAME_S + 10) is not None
            await stream.aclose()
    await serves(server.server, "after")
    print(f"slow connections closed after {min(slow_closed):.1f}-{max(slow_closed):.1f} s; server RSS at the end "
          f"{rss_bytes(server.process.pid) / limits.MiB:.0f} MiB")


async def _receive_or_eof(stream: trio.SocketStream) -> bool:
    """False once the server closed the connection."""
    try:
        return bool(await stream.receive_some(65536))
    except trio.BrokenResourceError:
        return False


async def test_idle_connections_close_but_long_polls_streams_and_pools_live_on(hostile_server):
    server = hostile_server
    batch = batch_codec.encode([Message(b"late")], 1_700_000_000_000)
    async with connect(server.server) as channel:
        await channel.call("CreateTopic", {"topic": "polls", "queues": 1})

    # A raw connection that asked once and went silent is closed after IDLE_S.
    stream = await trio.open_tcp_stream("127.0.0.1", server.tcp_port)
    await stream.send_all(frames.encode(Kind.REQUEST, 1, 1, b"{}", "Ping"))
    closed = await closed_within(stream, IDLE_S + 5)
    assert closed is not None and closed >= IDLE_S - 0.5, closed

    # A remoting frame begun (its first bytes say remoting: codec.looks_like_remoting) and never finished: closed
    # after FRAME_S; one whole remoting request and then silence: closed after IDLE_S.
    begun = await trio.open_tcp_stream("127.0.0.1", server.tcp_port)
    await begun.send_all(struct.pack(">IB", 1000, 0) + b"\x00\x00\x10{")
    header = b'{"code":34,"flag":0,"language":"JAVA","opaque":1,"serializeTypeCurrentRPC":"JSON","version":399}'
    asked = await trio.open_tcp_stream("127.0.0.1", server.tcp_port)
    await asked.send_all(struct.pack(">II", 4 + len(header), len(header)) + header)
    async with trio.open_nursery() as nursery:
        times = {}

        async def watch(name: str, stream: trio.SocketStream) -> None:
            times[name] = await closed_within(stream, FRAME_S + 5)

        nursery.start_soon(watch, "begun", begun)
        nursery.start_soon(watch, "asked", asked)
    assert times["begun"] is not None and FRAME_S - 0.5 <= times["begun"], times
    assert times["asked"] is not None and IDLE_S - 0.5 <= times["asked"] < FRAME_S, times

    # A long poll longer than IDLE_S is answered, and its connection kept: a call is in flight.
    async with connect(server.server) as channel:
        started = time.monotonic()
        pulled = await channel.call("Pull", {"topic": "polls", "queues": [{"queue": 0, "offset": 0}],
                                             "max_bytes": 1 << 20, "wait_ms": int((IDLE_S + 2) * 1000)})
        assert pulled["batches"] == [] and time.monotonic() - started >= IDLE_S + 1
        assert (await channel.call("Ping", {}))["roles"]

    # A stream open longer than IDLE_S is not idle either: it gets what is produced after.
    async with connect(server.server) as channel, trio.open_nursery() as nursery:
        async def produce_later() -> None:
            await trio.sleep(IDLE_S + 2)
            async with connect(server.server) as producer:
                await producer.call("Produce", {"topic": "polls", "queue": 0, "batch": batch})

        nursery.start_soon(produce_later)
        with trio.fail_after(IDLE_S + 10):
            async for response in channel.stream("Subscribe", {"topic": "polls", "queues": [{"queue": 0, "offset": 0}],
                                                               "max_bytes": 1 << 20, "wait_ms": 1000}):
                if response["batches"]:
                    break

    # A pooled client (several servers, or discover) reconnects by itself when its idle connection was closed.
    async with connect(f"{server.server},{server.server}") as channel:
        assert (await channel.call("Ping", {}))["roles"]
        await trio.sleep(IDLE_S + 1.5)
        assert (await channel.call("Ping", {}))["roles"]


async def test_past_the_partial_frames_budget_the_biggest_holder_is_closed(nursery, monkeypatch):
    """Connections that hold frames not yet whole past limits.tcp_partial_frames_bytes_max together: the one holding
    the most is told OVERLOADED and closed; the others go on and are answered."""
    from rocket.errors import Code
    from rocket.transport.frames import FrameDecoder
    from rocket.transport.lifecycle import Lifecycle
    from rocket.transport.rpc import Dispatcher
    from rocket.transport.tcp import serve_tcp

    monkeypatch.setattr(limits, "tcp_partial_frames_bytes_max", 8 * limits.MiB)
    port = await nursery.start(serve_tcp, Dispatcher(), Lifecycle(), "127.0.0.1", 0)

    def ping(request_id: int, size: int) -> bytes:  # a Ping whose body is mostly blanks, size bytes in all
        return frames.encode(Kind.REQUEST, 1, request_id, b" " * (size - frames.HEADER_BYTES - 6) + b"{}", "Ping")

    sizes = {"a": 3_000_000, "b": 4_000_000, "c": 2_000_000}  # 7 MB held by a and b fit; c's 2 MB more do not
    streams, data = {}, {}
    for request_id, (name, size) in enumerate(sizes.items(), 1):
        data[name] = ping(request_id, size)
        streams[name] = await trio.open_tcp_stream("127.0.0.1", port)
        await streams[name].send_all(data[name][:-1])  # all but its last byte
        await trio.sleep(0.5)

    async def frames_until_closed(stream: trio.SocketStream, expect: int) -> tuple[list[frames.Frame], bool]:
        decoder, got = FrameDecoder(), []
        with trio.move_on_after(3):
            while len(got) < expect:
                chunk = await stream.receive_some(65536)
                if not chunk:
                    return got, True
                decoder.feed(chunk)
                while (frame := decoder.next_frame()) is not None:
                    got.append(frame)
        return got, False

    (refusal,), closed = await frames_until_closed(streams["b"], 2)
    assert closed and refusal.kind == Kind.ERROR and refusal.request_id == 0
    assert json_codec.decode("Error", refusal.body)["code"] == Code.OVERLOADED.name
    for name in ("a", "c"):  # their last byte: each frame is whole and answered, and the connection lives on
        await streams[name].send_all(data[name][-1:])  # (UNKNOWN_METHOD: this dispatcher serves nothing)
        answers, closed = await frames_until_closed(streams[name], 1)
        assert not closed and [answer.request_id for answer in answers] == [list(sizes).index(name) + 1], name
    for stream in streams.values():
        await stream.aclose()
