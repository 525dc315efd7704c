"""Tiered storage under an object store that fails: a real `rocket run` offloads to moto's S3 server through the
fault proxy (tests/integration/fault_proxy.py: 503 SlowDown and 500 answers, resets after the store applied a put,
stalls, slow bandwidth, the store down), all on 127.0.0.1. Nothing is lost, dropped or reordered; local data goes
only once its piece is in the store; no object is left that no piece names; cold reads answer UNAVAILABLE while the
store is down, never INTERNAL, and resume; a kill -9 mid-offload changes none of that."""

from __future__ import annotations

import sys

import pytest
import trio

from rocket.errors import Code, RocketError
from rocket.serde.piece import range_of_key
from rocket.transport.listen import free_ports
from tests.integration.fault_proxy import FaultProxy
from tests.integration.test_tier import (PREFIX, all_cold, consume_everything, expected, produce, setup_topic,
                                         tier_keys, tier_rows, wait_until)
from tests.integration.test_tier_objectstore import MotoServer, only_local_network  # noqa: F401 (a fixture)

pytestmark = pytest.mark.skipif(sys.flags.dev_mode, reason="aiohttp rejects moto's duplicate Server header in -X dev")

FAULTY = {"error_rate": 0.25, "reset_rate": 0.1, "stall_s": 0.02, "bandwidth_bytes_s": 2_000_000}


@pytest.fixture
def store(tmp_path):
    moto = MotoServer(free_ports(1)[0], tmp_path / "moto.log").start()
    proxy = FaultProxy(free_ports(1)[0], f"127.0.0.1:{moto.port}", tmp_path / "proxy.log").start()
    yield moto, proxy
    proxy.stop()
    moto.stop()


def start_node(server_process, tmp_path, proxy: FaultProxy, bucket: str):
    config = tmp_path / "rocket.toml"
    config.write_text(f'tier_backend = "s3"\ntier_s3_endpoint = "{proxy.url}"\ntier_s3_bucket = "{bucket}"\n'
                      f'tier_s3_prefix = "{PREFIX}"\ntier_piece_bytes = 4096\ntier_piece_age_s = 0.3\n')
    return server_process(tmp_path / "data").start(extra=("--config", str(config)))


async def no_orphans(moto: MotoServer, bucket: str, node_server: str, topic: str = "orders") -> None:
    """Each queue's objects are its pieces, end to end: every offset in exactly one object, no object beside them."""
    rows = await tier_rows(node_server, topic)
    keys = await tier_keys(moto, bucket)
    for row in rows:
        ranges = sorted(range_of_key(key) for key in keys
                        if key.startswith(f"{PREFIX}/{topic}/{row['queue']}/") and key.endswith(".seg"))
        assert ranges[0][0] == row["first_offset"] and ranges[-1][1] == row["next_offset"], (row, ranges)
        assert all(previous[1] == following[0] for previous, following in zip(ranges, ranges[1:])), ranges
    assert sum(key.endswith(".seg") for key in keys) == sum(row["pieces"] for row in rows)


async def offloaded(node, messages: int, timeout_s: float = 120.0) -> None:
    """Wait until everything is offloaded and local data went. The node must live through the store's faults: a
    reset once killed it (trio-asyncio raised aiohttp's background errors into Trio, fixed in 1ae4152)."""
    with trio.fail_after(timeout_s):
        while True:
            assert node.process.poll() is None, f"the node died under the store's faults " \
                                                f"(exit status {node.process.returncode})"
            try:
                if all_cold(await tier_rows(node.server), messages):
                    return
            except RocketError as error:
                if error.code != Code.UNAVAILABLE:
                    raise
            await trio.sleep(0.3)


async def test_a_failing_store_loses_nothing_and_a_down_one_is_unavailable(server_process, tmp_path, store):
    moto, proxy = store
    bucket = moto.create_bucket()
    proxy.faults(**FAULTY)
    node = start_node(server_process, tmp_path, proxy, bucket)
    await setup_topic(node.server)
    await produce(node.server, 0, 150)
    await offloaded(node, 150)
    counts = proxy.faults()["counts"]
    assert counts["errors"] > 0 and counts["resets"] > 0, counts  # the faults were met
    await no_orphans(moto, bucket, node.server)

    proxy.faults(down=True)  # before any cold read: none is in the node's cache of pieces
    with trio.fail_after(60), pytest.raises(RocketError) as down:
        await consume_everything(node.server, "while-down")
    assert down.value.code == Code.UNAVAILABLE and "object store" in down.value.message, down.value
    proxy.faults(down=False)
    assert await consume_everything(node.server, "under-faults") == expected(150)


async def test_a_kill_mid_offload_under_faults_leaves_no_orphan(server_process, tmp_path, store):
    moto, proxy = store
    bucket = moto.create_bucket()
    proxy.faults(**FAULTY)
    node = start_node(server_process, tmp_path, proxy, bucket)
    await setup_topic(node.server)
    await produce(node.server, 0, 200)
    await wait_until(node.server, lambda rows: any(row["pieces"] > 0 for row in rows), timeout_s=120)
    node.kill()  # pieces half offloaded, some objects perhaps put and not yet recorded
    node = start_node(server_process, tmp_path, proxy, bucket)
    await offloaded(node, 200)
    await no_orphans(moto, bucket, node.server)
    assert await consume_everything(node.server, "billing") == expected(200)
