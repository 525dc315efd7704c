"""rocket's MQTT gateway against Mosquitto 2 (with persistence on), on this machine, in one run: QoS 1 publish
throughput of 100-byte messages, alone and beside idle connected clients, and memory per idle connection.

    python benchmarks/mqtt.py [--seconds 10] [--publishers 4] [--window 100] [--idle 10000] [--wake]
                              [--idle-subscribers N]

Both servers get the same load from one generator: each publisher connection sends --window pre-encoded QoS 1
PUBLISHes (MQTT 3.1.1) at once and waits for their PUBACKs, again and again; a message counts once its PUBACK came.
rocket runs in dev mode (one process, every role) and fsyncs each batch before the PUBACK; Mosquitto keeps QoS 1
messages in memory and writes its persistence file every autosave_interval. Idle clients connect (CONNECT and
CONNACK, 60 s keep-alive, clean sessions) and stay; memory per idle connection is the server's RSS growth over
them, divided by their count, measured first, on a fresh server. Then the publishes beside the idle clients, and
alone once they left. --wake adds what waking a parked connection costs a publish (wake_cost), --idle-subscribers
what idle subscribed clients cost (idle_subscribers). The last line reads
`mqtt: qos1 rocket=R/s mosquitto=M/s ratio=X idle_bytes rocket=A mosquitto=B ratio=Y`.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from rocket.gateway.mqtt.codec import Connect, Publish, Subscribe, Subscription, encode  # noqa: E402
from rocket.transport.listen import free_ports  # noqa: E402

V311 = 4
PUBACK_BYTES = 4  # an MQTT 3.1.1 PUBACK: 0x40, length 2, the packet id


def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


def wait_for_port(port: int, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"nothing listens on {port}")


def connected(port: int, client_id: str) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=60)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.sendall(encode(Connect(client_id, V311, True, 60), V311))
    answer = b""
    while len(answer) < 4:
        chunk = sock.recv(4 - len(answer))
        if not chunk:
            raise RuntimeError(f"{client_id}: the server closed the connection")
        answer += chunk
    if answer[0] != 0x20 or answer[3] != 0:
        raise RuntimeError(f"{client_id}: CONNACK {answer.hex()}")
    return sock


def publish_for(port: int, topic: str, seconds: float, publishers: int, window: int, body: bytes) -> float:
    """QoS 1 PUBLISHes acknowledged per second, over publishers connections."""
    counts = [0] * publishers

    def publisher(index: int) -> None:
        sock = connected(port, f"bench-pub-{index}-{os.getpid()}")
        burst = b"".join(encode(Publish(f"{topic}/p{index}/{n % 8}", body, 1, packet_id=n + 1), V311)
                         for n in range(window))
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            sock.sendall(burst)
            waiting = window * PUBACK_BYTES
            while waiting:
                chunk = sock.recv(65536)
                if not chunk:
                    raise RuntimeError("the server closed a publisher's connection")
                waiting -= len(chunk)
            counts[index] += window
        sock.close()

    threads = [threading.Thread(target=publisher, args=(index,)) for index in range(publishers)]
    started = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return sum(counts) / (time.monotonic() - started)


def wake_cost(port: int, topic: str, rounds: int = 2, publishes: int = 12) -> dict:
    """One client's QoS 1 publish-to-PUBACK round trip, median ms, publishing every 0.3 s (its connection stays
    served) and every 2 s (rocket parks it in between, and each publish wakes it), alternated rounds times."""
    sock = connected(port, f"bench-wake-{os.getpid()}")
    medians: dict[str, list[float]] = {"served_ms": [], "parked_ms": []}
    for _ in range(rounds):
        for gap_s, name in ((0.3, "served_ms"), (2.0, "parked_ms")):
            took = []
            for n in range(publishes):
                time.sleep(gap_s)
                started = time.perf_counter()
                sock.sendall(encode(Publish(f"{topic}/wake", b"x" * 100, 1, packet_id=n + 1), V311))
                answer = b""
                while len(answer) < PUBACK_BYTES:
                    answer += sock.recv(PUBACK_BYTES - len(answer))
                took.append((time.perf_counter() - started) * 1000)
            medians[name].append(round(statistics.median(took[2:]), 2))  # the first two: the change of pace
    sock.close()
    return medians


def idle_clients(port: int, count: int, prefix: str) -> list[socket.socket]:
    return [connected(port, f"{prefix}-{index}") for index in range(count)]


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime and stime


def idle_subscribers(pid: int, port: int, topic: str, count: int) -> dict:
    """count clients, each subscribed (QoS 1) to a topic of its own under topic, and idle: the server's RSS growth
    per subscriber, 10 s after the last SUBACK, and the CPU the server uses over the next 20 s, in cores."""
    before = rss_bytes(pid)
    clients = idle_clients(port, count, f"sub-{pid}")
    for index, client in enumerate(clients):
        client.sendall(encode(Subscribe(1, [Subscription(f"{topic}/device-{index}", 1)]), V311))
    for client in clients:
        answer = b""
        while len(answer) < 5:  # SUBACK: 0x90, length 3, the packet id, the granted QoS
            answer += client.recv(5 - len(answer))
    time.sleep(10)
    per_subscriber = (rss_bytes(pid) - before) / count
    started, used = time.monotonic(), cpu_seconds(pid)
    time.sleep(20)
    cores = (cpu_seconds(pid) - used) / (time.monotonic() - started)
    for client in clients:
        client.close()
    return {"idle_subscribers": count, "bytes_per_idle_subscriber": round(per_subscriber),
            "cores_while_subscribers_idle": round(cores, 3)}


def measure(name: str, pid: int, port: int, topic: str, arguments) -> dict:
    """Memory first, while the server's heap is fresh: what a run of publishes freed would take new connections in
    without the RSS growing (rocket's Python heap does that)."""
    body = b"x" * 100
    for client in idle_clients(port, 100, f"warm-{name}"):  # the connection paths' first use
        client.close()
    time.sleep(1)
    before = rss_bytes(pid)
    clients = idle_clients(port, arguments.idle, f"idle-{name}")
    time.sleep(2)
    per_connection = (rss_bytes(pid) - before) / max(1, arguments.idle)
    publish_for(port, topic, 2, arguments.publishers, arguments.window, body)  # warm up
    beside = publish_for(port, topic, arguments.seconds, arguments.publishers, arguments.window, body)
    for client in clients:
        client.close()
    time.sleep(1)
    alone = publish_for(port, topic, arguments.seconds, arguments.publishers, arguments.window, body)
    subscribers = idle_subscribers(pid, port, topic, arguments.idle_subscribers) if arguments.idle_subscribers else {}
    result = {"server": name, "qos1_per_s": round(alone), "qos1_per_s_with_idle": round(beside),
              "idle_connections": arguments.idle, "bytes_per_idle_connection": round(per_connection), **subscribers}
    print(json.dumps(result), flush=True)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--publishers", type=int, default=4)
    parser.add_argument("--window", type=int, default=100, help="QoS 1 publishes in flight per publisher")
    parser.add_argument("--idle", type=int, default=10_000, help="idle clients connected for the second figures")
    parser.add_argument("--wake", action="store_true", help="also rocket's publish round trip served and parked")
    parser.add_argument("--idle-subscribers", type=int, default=0,
                        help="then this many idle subscribers: memory per subscriber, CPU while they wait")
    arguments = parser.parse_args()
    mosquitto = shutil.which("mosquitto") or "/usr/sbin/mosquitto"
    if not os.path.exists(mosquitto):
        sys.exit("no mosquitto (apt-get install mosquitto)")
    wanted = arguments.idle + 1024
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < wanted:  # the generator's sockets, and the servers' (they inherit it)
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(max(wanted, soft), max(hard, wanted)), max(hard, wanted)))
    rocket_port, mosquitto_port, tcp_port = free_ports(3)
    results = []
    with tempfile.TemporaryDirectory(prefix="rocket-mqtt-") as directory:
        data = Path(directory)
        server = subprocess.Popen([sys.executable, "-m", "rocket", "run", "--data-dir", str(data / "rocket"),
                                   "--listen", f"127.0.0.1:{tcp_port}", "--http2-listen", "off",
                                   "--mqtt-listen", f"127.0.0.1:{rocket_port}", "--log-level", "warning"],
                                  stdout=subprocess.PIPE)
        try:
            server.stdout.readline()  # ready
            subprocess.run([sys.executable, "-m", "rocket", "topic", "create", "bench", "--queues", "8", "--server",
                            f"127.0.0.1:{tcp_port}"], check=True, capture_output=True)
            results.append(measure("rocket", server.pid, rocket_port, "bench", arguments))
            if arguments.wake:
                print(json.dumps({"server": "rocket", "publish_round_trip": wake_cost(rocket_port, "bench")}),
                      flush=True)
        finally:
            server.terminate()
            server.wait(30)
        config = data / "mosquitto.conf"
        (data / "mosquitto").mkdir()
        config.write_text(f"listener {mosquitto_port} 127.0.0.1\nallow_anonymous true\npersistence true\n"
                          f"persistence_location {data / 'mosquitto'}/\nmax_inflight_messages 0\n"
                          "max_queued_messages 0\nset_tcp_nodelay true\n")
        broker = subprocess.Popen([mosquitto, "-c", str(config)], stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL)
        try:
            wait_for_port(mosquitto_port)
            results.append(measure("mosquitto", broker.pid, mosquitto_port, "bench", arguments))
        finally:
            broker.terminate()
            broker.wait(30)
    ours, theirs = results
    throughput = ours["qos1_per_s"] / theirs["qos1_per_s"]
    memory = ours["bytes_per_idle_connection"] / max(1, theirs["bytes_per_idle_connection"])
    print(json.dumps({"throughput_ratio": round(throughput, 3), "idle_memory_ratio": round(memory, 3),
                      "throughput_ratio_with_idle": round(ours["qos1_per_s_with_idle"] /
                                                          theirs["qos1_per_s_with_idle"], 3)}))
    print(f"mqtt: qos1 rocket={ours['qos1_per_s']}/s mosquitto={theirs['qos1_per_s']}/s ratio={throughput:.2f} "
          f"idle_bytes rocket={ours['bytes_per_idle_connection']} mosquitto={theirs['bytes_per_idle_connection']} "
          f"ratio={memory:.2f}")


if __name__ == "__main__":
    main()
