"""Hostile HTTP/2 clients against `rocket run` (issue 35): 100 streams of large bodies that never end, and
slowloris connections. The server's RSS stays bounded, it still serves, and the slowloris connections are closed."""

from __future__ import annotations

from pathlib import Path

import h2.events
import trio

from rocket import limits
from rocket.client import connect
from tests.unit.test_http2_bounds import PRODUCE, RawClient

CONNECTIONS = 4
STREAMS = 100
IDLE_S = 2.0
REQUEST_S = 12.0  # the stuffing must end before this: 4 s was not enough under the whole suite's load (4.06 s)


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def test_hostile_http2_clients_leave_the_server_bounded_and_serving(server_process, tmp_path):
    config = tmp_path / "rocket.toml"
    config.write_text(f"http2_idle_s = {IDLE_S}\nhttp2_request_s = {REQUEST_S}\n")
    server = server_process().start(extra=("--config", str(config)))
    pid = server.process.pid
    before = rss_bytes(pid)
    figures: dict[str, int] = {}

    async def main() -> None:
        streams = [await trio.open_tcp_stream("127.0.0.1", server.http2_port) for _ in range(CONNECTIONS)]
        hostile = [RawClient(stream) for stream in streams]
        slowloris = [await trio.open_tcp_stream("127.0.0.1", server.http2_port) for _ in range(4)]
        await slowloris[0].send_all(b"PRI * HTTP/2.0\r\n")  # half a preface
        await slowloris[1].send_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")  # a preface, then nothing
        for each in hostile:
            await each.open()
        opened = 0
        for index, each in enumerate(hostile):  # 100 streams over the connections, each a Produce never ended
            count = STREAMS // CONNECTIONS + (index < STREAMS % CONNECTIONS)
            ids = list(range(1, 2 * count, 2))
            for stream_id in ids:
                each.h2.send_headers(stream_id, PRODUCE)
            opened += len(ids)
            each.ids = ids
        assert opened == STREAMS
        started = trio.current_time()
        async with trio.open_nursery() as nursery:
            for each in hostile:
                nursery.start_soon(each.stuff, each.ids, bytes(limits.http2_frame_bytes_max), limits.frame_bytes_max)
        assert trio.current_time() - started < REQUEST_S, "the stuffing must end before the server times it out"
        figures["peak"] = rss_bytes(pid)
        async with connect(f"127.0.0.1:{server.http2_port}", transport="http2") as client:
            assert (await client.call("Ping", {}))["version"]  # still serving, beside the hostile connections
        # The request timeout resets every stalled stream, then the idle timeout closes every connection.
        with trio.fail_after(REQUEST_S + IDLE_S + 10):
            for each in hostile:
                await each.receive(30)
                assert each.closed
                resets = [event for event in each.events if isinstance(event, h2.events.StreamReset)]
                assert {event.stream_id for event in resets} == set(each.ids)
            for each in slowloris:
                while await each.receive_some(65536):
                    pass
        figures["after"] = rss_bytes(pid)

    trio.run(main)
    grown = figures["peak"] - before
    print(f"\nserver RSS: {before / limits.MiB:.0f} MiB before, {figures['peak'] / limits.MiB:.0f} MiB with "
          f"{STREAMS} stalled streams, {figures['after'] / limits.MiB:.0f} MiB after the timeouts")
    per_connection = (limits.http2_connection_held_bytes_max + limits.http2_connection_window_bytes
                      + limits.frame_bytes_max + STREAMS // CONNECTIONS * limits.http2_stream_window_bytes)
    assert grown < 2 * CONNECTIONS * per_connection  # bytes held once, plus the allocator's slack
    assert grown < 400 * limits.MiB  # fuzzing saw 472 MB - 74 MB = 398 MB from 48 streams on one connection
