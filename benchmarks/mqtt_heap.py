"""The Python heap an idle MQTT device holds on a broker, by tracemalloc: a dev-mode node runs in this process, its
clients in another; N clients connect and stay idle (then leave), then N more connect and each subscribes (QoS 1) to
a topic of its own under one rocket topic and stays idle. Each figure is the heap's growth over the clients, taken
25 s after the last answer (the subscriptions' first receives done, every connection parked), divided by N.

    python benchmarks/mqtt_heap.py [--clients 1000]

RSS (benchmarks/mqtt.py) also counts what a burst took and Python keeps for reuse; this counts what is held. The
last line reads `mqtt_heap: connection=A subscriber=B` (bytes per client). tracemalloc slows the node about 3x.
"""

from __future__ import annotations

import argparse
import gc
import shutil
import subprocess
import sys
import tempfile
import tracemalloc
from pathlib import Path

import trio

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rocket.client import Admin, connect  # noqa: E402
from rocket.node import run_node  # noqa: E402
from rocket.transport.listen import free_ports  # noqa: E402
from tests.conftest import node_config  # noqa: E402

SETTLE_S = 25.0  # after the last answer: the subscriptions' first receives are done and every connection parked
CLIENTS = f"""
import sys, time
sys.path.insert(0, {str(ROOT)!r})
from benchmarks.mqtt import idle_clients
from rocket.gateway.mqtt.codec import encode
from rocket.gateway.mqtt.packets import Subscribe, Subscription, V311
port, count, prefix, subscribe = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4] == "1"
clients = idle_clients(port, count, prefix)
if subscribe:
    for index, client in enumerate(clients):
        client.sendall(encode(Subscribe(1, [Subscription(f"bench/device-{{index}}", 1)]), V311))
    for client in clients:
        client.recv(100)
print("ready", flush=True)
time.sleep(3600)
"""


async def held_per_client(port: int, count: int, subscribe: bool) -> int:
    """The heap's growth over count clients (subscribed or not), per client; the clients leave afterwards."""
    await trio.sleep(2)
    gc.collect()
    before = tracemalloc.take_snapshot()
    arguments = [str(port), str(count), "sub" if subscribe else "idle", "1" if subscribe else "0"]
    process = await trio.lowlevel.open_process([sys.executable, "-c", CLIENTS, *arguments], stdout=subprocess.PIPE)
    try:
        assert process.stdout is not None
        said = b""
        while b"ready" not in said:
            said += await process.stdout.receive_some(100)
        await trio.sleep(SETTLE_S)
        gc.collect()
        grown = sum(stat.size_diff for stat in tracemalloc.take_snapshot().compare_to(before, "filename"))
    finally:
        process.kill()
        await process.wait()
    return round(grown / count)


async def measure(count: int, data: Path) -> dict:
    port, = free_ports(1)
    async with trio.open_nursery() as nursery:
        ready = await nursery.start(lambda task_status: run_node(
            node_config(data, mqtt_listen=f"127.0.0.1:{port}"), handle_signals=False, task_status=task_status))
        async with connect(f"127.0.0.1:{ready.tcp_port}") as channel:
            await Admin(channel).create_topic("bench", 8)
        result = {"clients": count, "heap_bytes_per_idle_connection": await held_per_client(port, count, False),
                  "heap_bytes_per_idle_subscriber": await held_per_client(port, count, True)}
        nursery.cancel_scope.cancel()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=1000)
    arguments = parser.parse_args()
    directory = Path(tempfile.mkdtemp(prefix="rocket-mqtt-heap-"))
    try:
        tracemalloc.start()
        result = trio.run(measure, arguments.clients, directory / "data")
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    print(result)
    print(f"mqtt_heap: connection={result['heap_bytes_per_idle_connection']} "
          f"subscriber={result['heap_bytes_per_idle_subscriber']}")


if __name__ == "__main__":
    main()
