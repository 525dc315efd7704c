"""Azurite, Microsoft's Azure Storage emulator (npm `azurite`, installed in tests/node), run on 127.0.0.1 for the
tier's Azure Blob tests: blob service only, data in a temporary directory; a missing binary fails under CI=true."""

from __future__ import annotations

import os
import socket
import subprocess
import time
from pathlib import Path

import pytest

from rocket.transport.listen import free_ports

BINARY = Path(__file__).resolve().parents[1] / "node" / "node_modules" / ".bin" / "azurite-blob"
ACCOUNT = "devstoreaccount1"
# Azurite's well-known development account key (public: every emulator has it).
KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="


class Azurite:
    """The blob service on a free port; stop() and start() again keep its data (in location)."""

    def __init__(self, location: Path, log_path: Path):
        if not BINARY.exists():
            message = f"azurite is not installed ({BINARY}): npm ci --prefix tests/node"
            if os.environ.get("CI") == "true":
                pytest.fail(message)
            pytest.skip(message)
        self.port = free_ports(1)[0]
        self.location = location
        self.log_path = log_path
        self.process: subprocess.Popen | None = None

    @property
    def account_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/{ACCOUNT}"

    @property
    def connection_string(self) -> str:
        return (f"DefaultEndpointsProtocol=http;AccountName={ACCOUNT};AccountKey={KEY};"
                f"BlobEndpoint={self.account_url};")

    def start(self) -> "Azurite":
        self.location.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                [str(BINARY), "--blobHost", "127.0.0.1", "--blobPort", str(self.port), "--location",
                 str(self.location), "--silent", "--skipApiVersionCheck", "--loose"], stdout=log, stderr=log)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.5).close()
                return self
            except OSError:
                if self.process.poll() is not None:
                    raise AssertionError(f"azurite exited: {self.log_path.read_text()[-2000:]}")
                time.sleep(0.1)
        raise AssertionError(f"azurite did not listen on {self.port} within 30 s")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()  # it keeps its data on disk; a SIGTERM waits on open connections
            self.process.wait(10)

    def create_container(self, name: str) -> str:
        """A new empty container (Azure's synchronous client, from the test's own thread)."""
        from azure.storage.blob import BlobServiceClient
        BlobServiceClient.from_connection_string(self.connection_string).create_container(name)
        return name
