"""systemd, for real: `rocket run` under a NOTIFY_SOCKET this test holds, as systemd's Type=notify would set it, says
READY=1 once it serves, WATCHDOG=1 at half the WatchdogSec= a unit asked for (WATCHDOG_USEC), and STOPPING=1 on
SIGTERM; and the example units pass `systemd-analyze verify` (where systemd is installed; CI installs it)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
WAIT_S = 30.0  # for a datagram that follows at once on a quiet machine; generous for a loaded one


@pytest.fixture
def notify(tmp_path, monkeypatch) -> socket.socket:
    """The datagram socket systemd would hold, named to `rocket run` by NOTIFY_SOCKET."""
    path = tmp_path / "notify"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    listener.bind(str(path))
    monkeypatch.setenv("NOTIFY_SOCKET", str(path))
    monkeypatch.delenv("WATCHDOG_USEC", raising=False)
    monkeypatch.delenv("WATCHDOG_PID", raising=False)
    yield listener
    listener.close()


def received_until(listener: socket.socket, wanted: str, seen: list[str]) -> list[str]:
    """Every message, appended to seen, until `wanted` has come (a failure if it does not within WAIT_S)."""
    deadline = time.monotonic() + WAIT_S
    while wanted not in seen:
        listener.settimeout(max(0.01, deadline - time.monotonic()))
        try:
            seen.append(listener.recv(4096).decode())
        except TimeoutError:
            pytest.fail(f"no {wanted} in {WAIT_S} s; received {seen}")
    return seen


def test_ready_watchdog_and_stopping_reach_the_notify_socket(notify, server_process, monkeypatch):
    monkeypatch.setenv("WATCHDOG_USEC", "400000")  # WatchdogSec=0.4s: a ping every 0.2 s
    server = server_process().start()  # returns once the ready line is out
    seen = received_until(notify, "READY=1", [])
    watchdogs = 0
    while watchdogs < 3:  # the pings go on after READY=1
        watchdogs += received_until(notify, "WATCHDOG=1", []).count("WATCHDOG=1")
    assert server.terminate() == 0
    seen = received_until(notify, "STOPPING=1", seen)
    assert set(seen) <= {"READY=1", "WATCHDOG=1", "STOPPING=1"}, seen
    assert seen.count("READY=1") == 1 and seen.index("READY=1") < seen.index("STOPPING=1")


@pytest.mark.parametrize("usec, pid", [(None, None), ("400000", "1")], ids=["no-watchdog", "another-pid"])
def test_no_watchdog_pings_unless_the_unit_asks_this_process(notify, server_process, monkeypatch, usec, pid):
    """Without WATCHDOG_USEC, or with a WATCHDOG_PID of another process (sd_watchdog_enabled(3)), nothing pings."""
    for name, value in (("WATCHDOG_USEC", usec), ("WATCHDOG_PID", pid)):
        if value is not None:
            monkeypatch.setenv(name, value)
    server = server_process().start()
    seen = received_until(notify, "READY=1", [])
    time.sleep(1.0)  # five intervals of the watchdog asked for
    assert server.terminate() == 0
    assert received_until(notify, "STOPPING=1", seen) == ["READY=1", "STOPPING=1"]


def test_a_notify_socket_nobody_holds_is_logged_not_fatal(tmp_path, server_process, monkeypatch):
    monkeypatch.setenv("NOTIFY_SOCKET", str(tmp_path / "nobody-listens"))
    monkeypatch.setenv("WATCHDOG_USEC", "400000")
    server = server_process().start()
    assert server.terminate() == 0
    assert "did not take READY=1" in server.log_path.read_text()


@pytest.mark.parametrize("unit, instance", [("rocket.service", "rocket.service"),
                                            ("systemd/rocket@.service", "rocket@ns1.service"),
                                            ("systemd/rocket-train.service", "rocket-train.service"),
                                            ("systemd/rocket-train.timer", "rocket-train.timer")])
def test_the_example_units_verify(tmp_path, unit, instance):
    """`systemd-analyze verify` finds nothing to say, with ExecStart pointed at this install's rocket (the examples
    name /usr/local/bin/rocket, which a test machine need not have). A template is verified as an instance."""
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        if os.environ.get("CI") == "true":
            pytest.fail("CI: systemd-analyze is missing (./test installs Debian's systemd)")
        pytest.skip("systemd-analyze is not installed (Debian: systemd)")
    rocket = Path(sys.executable).parent / "rocket"
    assert rocket.exists(), f"no rocket console script beside {sys.executable}"
    if unit.endswith(".timer"):  # verified with the service it starts
        service = unit.replace(".timer", ".service")
        (tmp_path / service.split("/")[-1]).write_text(
            (EXAMPLES / service).read_text().replace("/usr/local/bin/rocket", str(rocket)))
    text = (EXAMPLES / unit).read_text()
    assert "ExecStart=/usr/local/bin/rocket " in text or unit.endswith(".timer")
    (tmp_path / unit.split("/")[-1]).write_text(text.replace("/usr/local/bin/rocket", str(rocket)))
    if instance != unit.split("/")[-1]:
        (tmp_path / instance).symlink_to(unit.split("/")[-1])
    verified = subprocess.run([analyze, "verify", str(tmp_path / instance)], capture_output=True, text=True,
                              timeout=60)
    assert verified.returncode == 0 and not verified.stdout.strip() and not verified.stderr.strip(), \
        verified.stdout + verified.stderr
