"""The shipped examples work: every TOML config under examples/ loads, and examples/cluster/cluster.sh starts
the 8-node cluster (3 nameservers, 3 storage nodes, 2 brokers) as a user would, serves a topic through
both brokers, reports all 8 nodes, and stops leaving no process behind.

The cluster runs on a free range of ports (PORT_BASE) under the test's tmp_path; its node logs are in
tmp_path/cluster/<node>/node.log.
"""

from __future__ import annotations

import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from rocket import config as config_module

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
CLUSTER_SH = EXAMPLES / "cluster" / "cluster.sh"
CLUSTER_NODES = {"ns1": 1, "ns2": 2, "ns3": 3, "storage1": 11, "storage2": 12, "storage3": 13,
                 "broker1": 21, "broker2": 22}
BROKER_HTTP2_OFFSET = 10  # broker N serves HTTP/2 on PORT_BASE + N + 10
PORT_OFFSETS = sorted({*CLUSTER_NODES.values(), 31, 32})


def test_every_example_config_loads():
    """Each TOML file under examples/ is a valid node config; the cluster's agree on their nameservers."""
    paths = sorted(EXAMPLES.rglob("*.toml"))
    assert {path.stem for path in paths} >= {*CLUSTER_NODES, "ns1", "storage1", "broker1"}
    for path in paths:
        config_module.load(path, {}, {})  # raises ConfigError naming the key on anything wrong

    cluster = {path.stem: config_module.load(path, {}, {}) for path in (EXAMPLES / "cluster").glob("*.toml")}
    assert set(cluster) == set(CLUSTER_NODES)
    groups = {config.nameservers for config in cluster.values()}
    assert len(groups) == 1, "every node of the cluster must be given the same nameserver list"
    for name, config in cluster.items():
        assert config.node_id == CLUSTER_NODES[name], name
        assert config.listen.port == 9100 + config.node_id, f"{name}: cluster.sh assumes port = 9100 + node id"
        assert (config.http2_listen is None) == (config.roles != ("broker",)), name
        assert not config.data_dir.is_absolute(), f"{name}: data_dir should be relative; cluster.sh sets it"


def free_port_base(attempts: int = 200) -> int:
    """A PORT_BASE whose cluster ports all bind now, below the kernel's ephemeral range."""
    for _ in range(attempts):
        base = random.randrange(20_000, 32_000, 100)
        sockets = []
        try:
            for offset in PORT_OFFSETS:
                each = socket.socket()
                sockets.append(each)
                each.bind(("127.0.0.1", base + offset))
            return base
        except OSError:
            continue
        finally:
            for each in sockets:
                each.close()
    raise RuntimeError("no free port range for the cluster")


def processes_of(base: Path) -> list[int]:
    """Live (non-zombie) processes whose command line names a path under base: the cluster's nodes."""
    marker = f"{base}/"
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = (entry / "stat").read_text().rpartition(")")[2].split()[0]
        except OSError:
            continue
        if marker in command and "rocket" in command and state != "Z":
            found.append(int(entry.name))
    return found


def run(command: list[str], environment: dict, stdin: bytes | None = None,
        timeout_s: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(command, input=stdin, capture_output=True, env=environment, timeout=timeout_s)


def show(result: subprocess.CompletedProcess) -> str:
    return f"exit {result.returncode}\n--- stdout\n{result.stdout.decode()}\n--- stderr\n{result.stderr.decode()}"


def node_logs(base: Path) -> str:
    return "\n".join(f"--- {log}\n{log.read_text()[-1500:]}" for log in sorted(base.glob("*/node.log")))


def test_cluster_script_starts_serves_and_stops(tmp_path):
    base = tmp_path / "cluster"
    environment = {key: value for key, value in os.environ.items() if not key.startswith("ROCKET_")}
    environment.update(ROCKET_BIN=f"{sys.executable} -m rocket", START_TIMEOUT_S="90", STOP_TIMEOUT_S="25")
    rocket = [sys.executable, "-m", "rocket"]
    stopped = None
    try:
        for attempt in range(3):  # another process may take one of the ports between the probe and the bind
            port_base = free_port_base()
            environment["PORT_BASE"] = str(port_base)
            started = run(["bash", str(CLUSTER_SH), "start", str(base)], environment, timeout_s=240)
            if started.returncode == 0 or b"Address already in use" not in started.stderr or attempt == 2:
                break
        assert started.returncode == 0, show(started) + node_logs(base)
        assert started.stdout.count(b"rocket ready ") == 8, show(started)
        assert b"nameservers [1, 2, 3]" in started.stdout, show(started)  # it printed `rocket cluster status`
        broker1 = ["--server", f"127.0.0.1:{port_base + 21}"]
        broker2 = ["--server", f"127.0.0.1:{port_base + 22}"]

        created = run([*rocket, "topic", "create", "orders", "--queues", "8", *broker1], environment)
        assert created.returncode == 0, show(created)
        lines = b"".join(b"%d\n" % number for number in range(1, 1001))
        sent = run([*rocket, "send", "orders", "--file", "-", *broker1], environment, stdin=lines)
        assert sent.returncode == 0 and b"sent 1,000 messages" in sent.stdout, show(sent)
        consumed = run([*rocket, "consume", "orders", "--group", "examples", "--count", "1000", "--format", "raw",
                        *broker2], environment)
        assert consumed.returncode == 0, show(consumed)
        assert sorted(int(line) for line in consumed.stdout.split()) == list(range(1, 1001))

        listed = run(["bash", str(CLUSTER_SH), "status", str(base)], environment)
        assert listed.returncode == 0 and listed.stdout.count(b"running (pid ") == 8, show(listed)

        # Every node reports to the nameservers by heartbeat; give the last ones a moment to be seen.
        deadline = time.monotonic() + 15
        while True:
            status = run([*rocket, "cluster", "status", "--json", *broker2], environment)
            assert status.returncode == 0, show(status)
            nodes = {node["id"]: node for node in json.loads(status.stdout)["nodes"]}
            if len(nodes) == 8 or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        listed_nodes = [(node["id"], node["roles"], node["state"]) for node in nodes.values()]
        assert sorted(nodes) == sorted(CLUSTER_NODES.values()), f"cluster status lists {listed_nodes}"
        for name, node_id in CLUSTER_NODES.items():
            assert nodes[node_id]["address"] == f"127.0.0.1:{port_base + node_id}", name
            assert nodes[node_id]["state"] == "up", name
    finally:
        try:
            stopped = run(["bash", str(CLUSTER_SH), "stop", str(base)], environment, timeout_s=120)
        except subprocess.TimeoutExpired:
            stopped = None
        leftovers = processes_of(base)
        for pid in leftovers:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    assert stopped is not None and stopped.returncode == 0, show(stopped) if stopped else "cluster.sh stop hung"
    assert leftovers == [], f"rocket processes of {base} left after cluster.sh stop: {leftovers}"
    assert b"SIGKILL" not in stopped.stderr, "a node did not stop on SIGTERM in time:\n" + show(stopped)
    for log in sorted(base.glob("*/node.log")):
        assert "rocket.node: stopped" in log.read_text(), f"{log} shows no graceful stop"


def test_kv_checkpoint_survives_kill_9_without_repeating_or_skipping_a_line(server_process, tmp_path):
    """examples/kv_checkpoint.py is killed with SIGKILL again and again while it tails a file of 100,000 lines,
    and restarted each time; in the end each line is in the bucket exactly once (version 1: never written twice),
    in order, and the position is the file's end."""
    from rocket.client import connect
    from rocket.client.kv import KV
    import trio

    server = server_process().start()
    path = tmp_path / "access.log"
    lines = [f"GET /item/{number} 200 {random.Random(number).randint(1, 10**6)}" for number in range(100_000)]
    path.write_text("".join(line + "\n" for line in lines))
    command = [sys.executable, str(EXAMPLES / "kv_checkpoint.py"), str(path), "--bucket", "tail", "--source", "web",
               "--server", server.server]
    kills = 0
    for delay_s in (0.7, 0.8, 0.9, 1.0, 1.1):
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        time.sleep(delay_s)
        if process.poll() is None:
            process.send_signal(signal.SIGKILL)
            kills += 1
        process.wait()
    finished = subprocess.run(command, capture_output=True, timeout=120)
    assert finished.returncode == 0, finished.stderr.decode()[-2000:]
    assert finished.stdout == b"100000 lines checkpointed\n" and kills >= 3

    async def stored() -> list:
        async with connect(server.server) as channel:
            return [entry async for entry in KV(channel).range("tail", "{web}/line/")]

    entries = trio.run(stored)
    assert [entry.value.decode() for entry in entries] == lines
    assert {entry.version for entry in entries} == {1}
