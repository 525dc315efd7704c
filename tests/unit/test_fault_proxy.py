"""The TCP fault proxy of benchmarks/faults.py, in process on loopback: only lower bounds on time, never upper."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
import trio

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import faults  # noqa: E402


async def ping_answer(stream: trio.SocketStream, timeout_s: float) -> bytes | None:
    """What a ping through the stream gets back: None if the connection was reset (ECONNRESET), b"" if closed."""
    with trio.fail_after(timeout_s):
        try:
            await stream.send_all(b"ping")
            return await stream.receive_some(65536)
        except trio.BrokenResourceError:
            return None


async def echo(stream: trio.SocketStream) -> None:
    async with stream:
        try:
            while data := await stream.receive_some(65536):
                await stream.send_all(data)
        except trio.BrokenResourceError:
            pass


async def sink(stream: trio.SocketStream) -> None:
    """Counts nothing: reads until EOF, then answers with one byte so the sender knows all arrived."""
    async with stream:
        while await stream.receive_some(65536):
            pass
        await stream.send_all(b"!")


@pytest.fixture
async def proxy(nursery, tmp_path):
    """start(handler, **settings) -> (client stream factory, control file path)."""

    async def start(handler, **settings):
        control = tmp_path / "proxy.json"
        faults.write_control(control, settings)
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        target_port = listeners[0].socket.getsockname()[1]
        nursery.start_soon(trio.serve_listeners, handler, listeners)
        port = await nursery.start(faults.run_proxy, ("127.0.0.1", 0), ("127.0.0.1", target_port), control)
        return (lambda: trio.open_tcp_stream("127.0.0.1", port)), control

    return start


async def round_trip_s(connect, payload: bytes = b"ping") -> float:
    async with await connect() as stream:
        started = trio.current_time()
        await stream.send_all(payload)
        received = b""
        while len(received) < len(payload):
            received += await stream.receive_some(65536)
        assert received == payload
        return trio.current_time() - started


async def test_forwards_bytes_intact(proxy):
    """Four MiB of varied bytes come back through the proxy unchanged, in order."""
    connect, _ = await proxy(echo)
    payload = bytes(range(256)) * (16 * 1024)
    async with await connect() as stream:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(stream.send_all, payload)
            received = bytearray()
            while len(received) < len(payload):
                received += await stream.receive_some(65536)
    assert bytes(received) == payload


async def test_latency_delays_each_direction(proxy):
    """With 100 ms latency both ways, a round trip takes at least 200 ms."""
    connect, _ = await proxy(echo, latency_ms=100)
    assert await round_trip_s(connect) >= 0.2


async def test_bandwidth_limit(proxy):
    """One MB through a 2 MB/s limit takes at least 0.4 s."""
    connect, _ = await proxy(sink, bandwidth_bytes_per_s=2_000_000)
    async with await connect() as stream:
        started = trio.current_time()
        await stream.send_all(b"x" * 1_000_000)
        await stream.send_eof()
        assert await stream.receive_some(1) == b"!"
        assert trio.current_time() - started >= 0.4


async def test_reset_closes_the_client_connection(proxy):
    """With reset probability 1, the first chunk makes the proxy reset the client's connection."""
    connect, _ = await proxy(echo, reset=1.0)
    async with await connect() as stream:
        await stream.send_all(b"ping")
        with trio.fail_after(10):
            try:
                data = await stream.receive_some(65536)
            except trio.BrokenResourceError:
                data = None  # ECONNRESET
        assert not data


async def test_loss_stalls(proxy):
    """With loss probability 1, every chunk stalls for a retransmission timeout: a round trip takes >= 0.4 s."""
    connect, _ = await proxy(echo, loss=1.0)
    assert await round_trip_s(connect) >= 2 * faults.LOSS_STALL_S


async def test_control_file_changes_take_effect(proxy):
    """Latency written to the control file while the proxy runs applies to connections after the next poll."""
    connect, control = await proxy(echo)
    await round_trip_s(connect)
    faults.write_control(control, {"latency_ms": 300})
    await trio.sleep(3 * faults.CONTROL_POLL_S)
    assert await round_trip_s(connect) >= 0.6


def test_bad_settings_are_refused():
    """Unknown keys and out-of-range values raise instead of silently applying."""
    with pytest.raises(ValueError):
        faults.settings_from(faults.LinkSettings, {"latency": 5})
    with pytest.raises(ValueError):
        faults.settings_from(faults.LinkSettings, {"loss": 2})


def test_a_loss_run_writes_the_loss_to_the_proxy_and_labels_it_a_link_fault(tmp_path):
    """`run --kind link --loss --severity 5` sets the proxy's loss to 0.05 for the run, clears it after, and appends
    a "link" label whose "fault" says what was injected; --loss on another kind is refused."""
    (tmp_path / "storage2").mkdir()
    control = tmp_path / "storage2" / "proxy.json"
    faults.write_control(control, {})
    seen = []
    original = faults.write_control
    faults.write_control = lambda path, values: (seen.append(values), original(path, values))
    try:
        label = faults.run(tmp_path, "storage2", "link", 5, 0, 0, tmp_path / "labels.jsonl", loss=True)
    finally:
        faults.write_control = original
    assert seen == [{"loss": 0.05}, {}]
    assert label["kind"] == "link" and label["fault"] == {"loss": 0.05} and label["node_id"] == 12
    assert json.loads((tmp_path / "labels.jsonl").read_text()) == label
    with pytest.raises(faults.FaultError):
        faults.fault_actions(tmp_path, "storage2", "cpu", 4, loss=True)


class Talker:
    """A target that records what it receives and sends a dot every 20 ms, so each direction shows on its own."""

    def __init__(self):
        self.received = bytearray()

    async def __call__(self, stream: trio.SocketStream) -> None:
        async with stream:
            try:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self._dots, stream)
                    while data := await stream.receive_some(65536):
                        self.received += data
                    nursery.cancel_scope.cancel()
            except trio.BrokenResourceError:
                pass

    async def _dots(self, stream: trio.SocketStream) -> None:
        while True:
            await stream.send_all(b".")
            await trio.sleep(0.02)


async def received_within(stream: trio.SocketStream, seconds: float) -> bytes:
    received = b""
    with trio.move_on_after(seconds):
        while True:
            received += await stream.receive_some(65536)
    return received


async def partition(control, **settings) -> None:
    faults.write_control(control, settings)
    await trio.sleep(3 * faults.CONTROL_POLL_S)


async def test_a_one_way_partition_holds_one_direction_and_heals(proxy):
    """Cut to the target, the client's bytes wait while the target's still arrive; cut from it, the reverse; healed,
    what waited arrives, in order."""
    talker = Talker()
    connect, control = await proxy(talker)
    async with await connect() as stream:
        assert await received_within(stream, 0.2)
        await partition(control, partition="to_target")
        await stream.send_all(b"held")
        assert await received_within(stream, 0.5), "the target's bytes pass a cut to the target"
        assert b"held" not in talker.received
        await partition(control, partition="from_target")
        assert talker.received.endswith(b"held"), "healed toward the target, what waited arrived"
        await received_within(stream, 0.1)  # what was on its way before the cut
        await stream.send_all(b"passes")
        assert not await received_within(stream, 0.5), "nothing from the target passes a cut from it"
        assert talker.received.endswith(b"passes")
        await partition(control)
        assert await received_within(stream, 0.5)


async def test_a_two_way_partition_holds_new_connections_until_healed(proxy):
    """Cut both ways, a new connection is accepted but nothing comes back; healed, its round trip completes."""
    connect, control = await proxy(echo)
    await partition(control, partition="both")
    async with await connect() as stream:
        await stream.send_all(b"ping")
        assert not await received_within(stream, 0.5)
        await partition(control)
        with trio.fail_after(10):
            received = b""
            while len(received) < 4:
                received += await stream.receive_some(65536)
        assert received == b"ping"


async def test_a_partition_in_reset_mode_resets_connections(proxy):
    """In reset mode a new connection is reset at once, and so is an open one when a chunk meets the cut."""
    connect, control = await proxy(echo)
    async with await connect() as open_stream:
        await open_stream.send_all(b"ping")
        assert await open_stream.receive_some(65536) == b"ping"
        await partition(control, partition="to_target", partition_mode="reset")
        for stream in (open_stream, await connect()):
            assert not await ping_answer(stream, 10)


def test_bad_partition_settings_are_refused():
    """A partition names directions and a mode the proxy knows."""
    with pytest.raises(ValueError):
        faults.settings_from(faults.LinkSettings, {"partition": "sideways"})
    with pytest.raises(ValueError):
        faults.settings_from(faults.LinkSettings, {"partition": "both", "partition_mode": "drop"})


def test_routes_resolve_a_node_address_to_its_proxy(monkeypatch):
    """benchmarks/routed.py: a routed HOST:PORT resolves to its proxy, numeric hosts included; others as before."""
    import socket

    import routed

    monkeypatch.setattr(socket, "getaddrinfo", socket.getaddrinfo)  # restored after the test
    routed.install(routed.parse_routes('{"127.0.0.1:7002": "127.0.0.1:7102"}'))
    assert {info[4][1] for info in socket.getaddrinfo("127.0.0.1", 7002, type=socket.SOCK_STREAM)} == {7102}
    assert {info[4][1] for info in socket.getaddrinfo("127.0.0.1", "7002")} == {7102}
    assert {info[4][1] for info in socket.getaddrinfo("127.0.0.1", 7003)} == {7003}
    with pytest.raises(ValueError):
        routed.parse_routes('{"127.0.0.1": "127.0.0.1:7102"}')


@pytest.mark.skipif(sys.byteorder != "little", reason="the kernel prints addresses in host byte order")
def test_parses_proc_net_tcp_lines():
    """/proc/net/tcp{,6} print addresses as little-endian hex words: (local, remote, inode); IPv4 mapped into IPv6
    reads as IPv4; the header is None."""
    parse = faults.parse_proc_net_tcp_line
    assert parse("  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode") \
        is None
    assert parse("   3: 0100007F:1F90 0100007F:D431 01 00000000:00000000 00:00000000 00000000  1000        0 48213 1 "
                 "0000000000000000 20 4 30 10 -1") == (("127.0.0.1", 8080), ("127.0.0.1", 54321), 48213)
    assert parse("   0: 00000000:07E8 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 341 1 "
                 "00000000a3326d6a 100 0 0 10 0") == (("0.0.0.0", 2024), ("0.0.0.0", 0), 341)
    assert parse("   1: 00000000000000000000000001000000:1F90 00000000000000000000000001000000:D431 01 "
                 "00000000:00000000 00:00000000 00000000     0        0 77 1 0000000000000000 20 4 30 10 -1") \
        == (("::1", 8080), ("::1", 54321), 77)
    assert parse("   2: 0000000000000000FFFF00000100007F:1F90 0000000000000000FFFF00000100007F:D431 01 "
                 "00000000:00000000 00:00000000 00000000     0        0 78 1 0000000000000000 20 4 30 10 -1") \
        == (("127.0.0.1", 8080), ("127.0.0.1", 54321), 78)


def test_partition_from_settings():
    """partition_from is a JSON list of non-empty strings, read as a tuple; it limits a partition, never widens it."""
    settings = faults.settings_from(faults.LinkSettings, {"partition": "both", "partition_from": ["marker-a"]})
    assert settings.partition_from == ("marker-a",) and hash(settings)
    assert settings.blocks("to_target", "python node.py marker-a") and not settings.blocks("to_target", "marker-b")
    assert not settings.blocks("to_target", "")
    assert faults.LinkSettings(partition="both").blocks("from_target", "")
    assert not faults.LinkSettings(partition="to_target", partition_from=("a",)).blocks("from_target", "a")
    for bad in ("marker-a", [""], [5]):
        with pytest.raises(ValueError):
            faults.settings_from(faults.LinkSettings, {"partition_from": bad})


async def echo_behind_proxy(nursery, holder: faults.Holder) -> int:
    """The port of a proxy with holder's settings in front of an echo server."""
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    nursery.start_soon(trio.serve_listeners, echo, listeners)
    target = ("127.0.0.1", listeners[0].socket.getsockname()[1])
    return await nursery.start(faults.serve_proxy, ("127.0.0.1", 0), target, holder)


CLIENT = """
import socket, sys
with socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=5) as connection:
    try:
        connection.sendall(b"ping")
        received = b""
        while len(received) < 4 and (data := connection.recv(4)):
            received += data
    except OSError:  # reset
        received = b""
print(received.decode() or "cut")
"""


async def test_partition_from_cuts_only_the_named_processes(nursery):
    """Cut both ways in reset mode from processes whose command line has marker-a: marker-a's connection is reset,
    marker-b's echoes, both through the same proxy."""
    holder = faults.Holder(faults.LinkSettings(partition="both", partition_mode="reset", partition_from=("marker-a",)))
    port = await echo_behind_proxy(nursery, holder)
    printed = {}

    async def client(marker: str) -> None:
        done = await trio.run_process([sys.executable, "-c", CLIENT, str(port), marker], capture_stdout=True)
        printed[marker] = done.stdout.decode().strip()

    with trio.fail_after(60):  # two Pythons start, on a machine the suite keeps busy
        async with trio.open_nursery() as clients:
            clients.start_soon(client, "marker-a")
            clients.start_soon(client, "marker-b")
    assert printed == {"marker-a": "cut", "marker-b": "ping"}


async def test_partition_from_knows_the_test_process_and_cuts_its_open_connection(nursery):
    """A connection from this process is found to come from this process's command line; a partition_from partition
    naming another process leaves it alone, and one naming this process resets it while it is open."""
    own = faults.command_line(os.getpid())
    assert own
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    sources = []

    async def record(stream: trio.SocketStream) -> None:
        sources.append(await faults.client_command_line(stream))
        await stream.aclose()

    nursery.start_soon(trio.serve_listeners, record, listeners)
    async with await trio.open_tcp_stream("127.0.0.1", listeners[0].socket.getsockname()[1]) as stream:
        with trio.fail_after(5):
            assert await stream.receive_some(1) == b""
    assert sources == [own]

    holder = faults.Holder(faults.LinkSettings())
    port = await echo_behind_proxy(nursery, holder)
    async with await trio.open_tcp_stream("127.0.0.1", port) as stream:
        holder.settings = faults.LinkSettings(partition="both", partition_mode="reset", partition_from=("marker-b",))
        await round_trip_s(lambda: trio.open_tcp_stream("127.0.0.1", port))  # a new connection passes
        await stream.send_all(b"ping")  # and so does the open one
        assert await stream.receive_some(65536) == b"ping"
        holder.settings = faults.LinkSettings(partition="both", partition_mode="reset", partition_from=(own,))
        assert not await ping_answer(stream, 5)
