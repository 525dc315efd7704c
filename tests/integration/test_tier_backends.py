"""Tiered storage end to end on the other remote backends: a real `rocket run` with `tier_backend = azure`
(Azurite), `gcs` (fake-gcs-server) or `hdfs` (a WebHDFS server written to Hadoop's documentation), started here on
127.0.0.1, offloads many small pieces under a key prefix, drops local data once offloaded, and serves every message
back byte for byte from the store, to pull and pop consumers, before and after a kill -9 and restart. (S3's own
end-to-end tests are test_tier.py's.)"""

from __future__ import annotations

import uuid

import pytest

from rocket.tier.azure import open_azure_store
from rocket.tier.gcs import open_gcs_store
from rocket.tier.hdfs import open_hdfs_store
from rocket.transport.listen import free_ports
from tests.integration.azurite import Azurite
from tests.integration.gcs_server import FakeGcsServer
from tests.integration.webhdfs_server import WebHdfsServer
from tests.integration.test_tier import (QUEUES, all_cold, consume_everything, expected, pop_everything, produce,
                                         setup_topic, wait_until)


@pytest.mark.parametrize("backend", ["azure", "gcs", "hdfs"])
async def test_offload_and_consume_everything_cold_through_each_backend(backend, server_process, tmp_path,
                                                                        monkeypatch):
    name = f"tier-{uuid.uuid4().hex[:12]}"
    if backend == "azure":
        emulator = Azurite(tmp_path / "azurite", tmp_path / "azurite.log").start()
        emulator.create_container(name)
        monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", emulator.connection_string)
        settings = f'tier_azure_container = "{name}"\ntier_azure_prefix = "rocket"\n'
        store = open_azure_store(name, connection_string=emulator.connection_string, prefix="rocket/")
    elif backend == "hdfs":
        emulator = WebHdfsServer(tmp_path / "webhdfs", tmp_path / "webhdfs.log")
        emulator.start()
        settings = f'tier_hdfs_url = "{emulator.url}"\ntier_hdfs_root = "/{name}"\ntier_hdfs_user = "rocket"\n'
        store = open_hdfs_store(emulator.url, root=f"/{name}", user="rocket")
    else:
        emulator = FakeGcsServer(free_ports(1)[0], tmp_path / "fake-gcs.log").start()
        emulator.create_bucket(name)
        settings = (f'tier_gcs_bucket = "{name}"\ntier_gcs_endpoint = "{emulator.endpoint}"\n'
                    'tier_gcs_prefix = "rocket"\n')
        store = open_gcs_store(name, endpoint_url=emulator.endpoint, anonymous=True, prefix="rocket/")
    config = tmp_path / "rocket.toml"
    config.write_text(f'tier_backend = "{backend}"\n{settings}tier_piece_bytes = 4096\ntier_piece_age_s = 0.3\n')
    try:
        node = server_process(tmp_path / "data").start(extra=("--config", str(config)))
        await setup_topic(node.server)
        await produce(node.server, 0, 150)
        rows = await wait_until(node.server, lambda rows: all_cold(rows, 150))
        assert all(row["pieces"] >= 10 and row["local_bytes"] == 0 for row in rows)
        async with store as objects:
            keys = [info.key for info in await objects.list("orders/")]
        assert sum(key.endswith(".seg") for key in keys) == sum(row["pieces"] for row in rows), keys
        assert await consume_everything(node.server, "billing") == expected(150)
        node.kill()
        node = server_process(tmp_path / "data").start(extra=("--config", str(config)))
        assert await consume_everything(node.server, "after-restart") == expected(150)
        assert await pop_everything(node.server, "workers", QUEUES * 150) == expected(150)
    finally:
        emulator.stop()
