"""Shared fixtures: an in-process node on free ports, and a real `rocket run` subprocess."""

from __future__ import annotations

import importlib.util
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rocket import config as config_module

READY = re.compile(rb"rocket ready tcp=[^ ]*:(\d+) http2=(?:[^ ]*:)?(\d+|off)")  # an IPv6 host has colons
READY_HTTP = re.compile(rb" http=(?:[^: ]+:)?(\d+|off)")
READY_MQTT = re.compile(rb" mqtt=(?:[^ ]*:)?(\d+|off)")


# The fast lane (`./test fast`): folders whose tests need nothing outside Python and this package's test extra: no
# external server, Java, Node or browser. A test there that skips is a test that belongs in another lane, so its skip
# fails loudly instead of hiding (tests/integration, tests/e2e and tests/jobs are the full lane's).
FAST_LANE = {Path(__file__).parent / "unit", Path(__file__).parent / "sim"}


def pytest_collection_modifyitems(items) -> None:
    """The long tests (marked slow) first. Under xdist's --dist loadfile, files start in collection order
    (--no-loadscope-reorder, pyproject.toml), so a file of minutes no longer starts last while the other worker, done,
    waits: xdist's own order (the most tests first) put test_chaos.py's one six-minute test at the very end."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)  # stable: the rest keep their order


def in_fast_lane(path: Path) -> bool:
    return any(folder in Path(path).parents for folder in FAST_LANE)


def _no_skip_in_fast_lane(report, path: Path) -> None:
    if report.skipped and not hasattr(report, "wasxfail") and in_fast_lane(path):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        report.outcome = "failed"
        report.longrepr = (f"{reason}: a test of the fast lane (tests/unit, tests/sim) may not skip; what it needs "
                           f"makes it a full-lane test (tests/integration)")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    _no_skip_in_fast_lane(outcome.get_result(), item.path)


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    outcome = yield
    if isinstance(collector, pytest.Module):
        _no_skip_in_fast_lane(outcome.get_result(), collector.path)


def skip_module_without_fuse(what: str) -> None:
    """Skip a whole test module where a FUSE file system cannot mount: no /dev/fuse, or no pyfuse3."""
    if not os.path.exists("/dev/fuse"):
        pytest.skip(f"no /dev/fuse on this machine: {what} cannot mount", allow_module_level=True)
    if importlib.util.find_spec("pyfuse3") is None:
        pytest.skip("pyfuse3 is not installed (pip install pyfuse3; needs Debian libfuse3-dev fuse3 pkg-config)",
                    allow_module_level=True)


def node_config(data_dir: Path, **overrides) -> config_module.NodeConfig:
    flags = {"data_dir": data_dir, "listen": "127.0.0.1:0", "http2_listen": "127.0.0.1:0", **overrides}
    return config_module.load(None, {}, flags)


@pytest.fixture
async def node(nursery, tmp_path):
    """An in-process dev-mode node; yields its Ready (ports). Cancelled with the test's nursery."""
    from rocket.node import run_node

    return await nursery.start(lambda task_status: run_node(node_config(tmp_path / "data"), handle_signals=False,
                                                            task_status=task_status))


class ServerProcess:
    """`python -m rocket run` as a user would start it, on free ports, killable and restartable."""

    def __init__(self, data_dir: Path, log_path: Path):
        self.data_dir = data_dir
        self.log_path = log_path
        self.process: subprocess.Popen | None = None
        self.tcp_port = 0
        self.http2_port = 0
        self.http_port = 0
        self.mqtt_port = 0

    def start(self, timeout_s: float = 30.0, extra: tuple[str, ...] = ()) -> "ServerProcess":
        command = [sys.executable, "-m", "rocket", "run", "--data-dir", str(self.data_dir),
                   "--listen", "127.0.0.1:0", "--http2-listen", "127.0.0.1:0", *extra]
        log = open(self.log_path, "ab")
        self.process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=log)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            line = self.process.stdout.readline()
            if not line:
                raise RuntimeError(f"rocket run exited with {self.process.wait()}: {self.log_path.read_text()[-2000:]}")
            match = READY.search(line)
            if match:
                self.tcp_port = int(match.group(1))
                self.http2_port = int(match.group(2)) if match.group(2) != b"off" else 0
                http = READY_HTTP.search(line)
                self.http_port = int(http.group(1)) if http and http.group(1) != b"off" else 0
                mqtt = READY_MQTT.search(line)
                self.mqtt_port = int(mqtt.group(1)) if mqtt and mqtt.group(1) != b"off" else 0
                return self
        raise RuntimeError("rocket run did not become ready")

    @property
    def server(self) -> str:
        return f"127.0.0.1:{self.tcp_port}"

    def kill(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait()

    def terminate(self, timeout_s: float = 20.0) -> int:
        self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout_s)


@pytest.fixture
def server_process(tmp_path):
    servers: list[ServerProcess] = []

    def make(data_dir: Path | None = None) -> ServerProcess:
        server = ServerProcess(data_dir or tmp_path / "data", tmp_path / "server.log")
        servers.append(server)
        return server

    yield make
    for server in servers:
        server.kill()
