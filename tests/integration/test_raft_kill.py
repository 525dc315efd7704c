"""Three Raft node processes hosting 100 groups each, written to continuously: SIGKILL the node leading
the most groups, and every acknowledged write is still there once the survivors have re-elected."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

GROUPS = 100
PROGRAM = Path(__file__).parent / "raft_process.py"


def free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    for each in sockets:
        each.bind(("127.0.0.1", 0))
    ports = [each.getsockname()[1] for each in sockets]
    for each in sockets:
        each.close()
    return ports


def leads(path: Path) -> set[int]:
    try:
        return set(json.loads(path.read_text())["leads"])
    except (FileNotFoundError, json.JSONDecodeError):
        return set()


def wait_until(condition, timeout_s: float, what: str) -> float:
    started = time.monotonic()
    while time.monotonic() - started < timeout_s:
        if condition():
            return time.monotonic() - started
        time.sleep(0.05)
    raise AssertionError(f"{what} did not happen within {timeout_s} s")


def acknowledged(path: Path) -> list[tuple[str, str]]:
    lines = path.read_text().splitlines() if path.exists() else []
    return [tuple(line.split(" ", 1)) for line in lines if " " in line]


def test_sigkill_of_the_busiest_leader_loses_no_acknowledged_write(tmp_path):
    """Kill -9 mid-write; leadership of all groups returns to the survivors within a bound; no ack is lost."""
    ports = ",".join(map(str, free_ports(3)))
    files = {node: {kind: tmp_path / f"{kind}{node}" for kind in ("status", "acks", "dump", "wal")} for node in (1, 2, 3)}
    processes = {
        node: subprocess.Popen([sys.executable, str(PROGRAM), "--id", str(node), "--ports", ports, "--groups", str(GROUPS),
                                "--dir", str(f["wal"]), "--status", str(f["status"]), "--acks", str(f["acks"]),
                                "--dump", str(f["dump"])])
        for node, f in files.items()}
    try:
        wait_until(lambda: len(set().union(*(leads(f["status"]) for f in files.values()))) == GROUPS, 90,
                   "every group electing a leader")
        time.sleep(2)
        victim = max(files, key=lambda node: len(leads(files[node]["status"])))
        led_by_victim = len(leads(files[victim]["status"]))
        processes[victim].send_signal(signal.SIGKILL)
        processes[victim].wait()
        before_kill = acknowledged(files[victim]["acks"])
        survivors = [node for node in files if node != victim]
        for node in survivors:
            files[node]["status"].unlink(missing_ok=True)  # only fresh reports count from here on
        seconds = wait_until(lambda: len(set().union(*(leads(files[n]["status"]) for n in survivors))) == GROUPS,
                             60, "the survivors leading every group")
        print(f"node {victim} led {led_by_victim} groups; survivors led all {GROUPS} after {seconds:.1f} s")
        assert seconds < 30
        time.sleep(2)
        for node in survivors:
            processes[node].send_signal(signal.SIGTERM)
        for node in survivors:
            assert processes[node].wait(30) == 0
    finally:
        for process in processes.values():
            if process.poll() is None:
                process.kill()
    applied = {node: {int(g): set(values) for g, values in json.loads(files[node]["dump"].read_text()).items()}
               for node in survivors}
    all_acks = [ack for node in files for ack in acknowledged(files[node]["acks"])]
    assert len(before_kill) > 100 and len(all_acks) > len(before_kill)
    for group, value in all_acks:
        assert any(value in applied[node][int(group)] for node in survivors), f"acknowledged {value} lost"
    for group, value in before_kill:
        assert all(value in applied[node][int(group)] for node in survivors), f"{value} missing on a survivor"
