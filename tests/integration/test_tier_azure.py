"""AzureBlobStore on Azurite (started here on 127.0.0.1): what the contract suite does not cover, its faults: a
missing container, refused credentials, a stopped service, and one restarted while a call retries."""

from __future__ import annotations

import uuid

import pytest
import trio

from rocket.errors import Code, RocketError
from rocket.tier.azure import open_azure_store
from tests.integration.azurite import Azurite


@pytest.fixture
def azurite(tmp_path):
    """An Azurite for one test, which may stop and restart it (its data stays on disk)."""
    server = Azurite(tmp_path / "data", tmp_path / "azurite.log").start()
    yield server
    server.stop()


def container(server: Azurite) -> str:
    return server.create_container(f"tier-{uuid.uuid4().hex[:12]}")


async def test_a_missing_container_and_refused_credentials_are_unavailable(azurite):
    async with open_azure_store("no-such-container", connection_string=azurite.connection_string) as store:
        with pytest.raises(RocketError) as missing:
            await store.put("a/b", b"x")
    assert missing.value.code == Code.UNAVAILABLE and "does not exist" in missing.value.message
    wrong = azurite.connection_string.replace("AccountKey=Eby8", "AccountKey=AAAA")
    async with open_azure_store(container(azurite), connection_string=wrong) as store:
        with pytest.raises(RocketError) as refused:
            await store.get("a/b")
    assert refused.value.code == Code.UNAVAILABLE and "credentials" in refused.value.message, refused.value
    with pytest.raises(RocketError) as neither:
        async with open_azure_store("c"):
            pass
    assert neither.value.code == Code.CONFIG_INVALID


async def test_a_stopped_service_is_unavailable_and_a_restart_mid_retry_succeeds(azurite):
    name = container(azurite)
    async with open_azure_store(name, connection_string=azurite.connection_string, attempts_max=4,
                                retry_s_max=3.0, backoff_s_min=0.05, backoff_s_max=0.2) as store:
        await store.put("segment", b"data")
        await trio.sleep(6)  # Azurite saves its metadata every 5 s: the restarted one knows the container
        azurite.stop()
        for call, arguments in [(store.get, ("segment",)), (store.put, ("segment", b"x")), (store.list, ("",)),
                                (store.head, ("segment",)), (store.delete, ("segment",))]:
            with trio.fail_after(3.0 + 5), pytest.raises(RocketError) as down:
                await call(*arguments)
            assert down.value.code == Code.UNAVAILABLE, down.value
            assert down.value.message.startswith(f"{call.__name__} '{arguments[0]}' in Azure container "), down.value
        store.retries.attempts_max, store.retries.retry_s_max = 200, 25.0

        async def restart_soon() -> None:
            await trio.sleep(1.0)
            await trio.to_thread.run_sync(azurite.start)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(restart_soon)
            assert await store.get("segment") == b"data"  # retried until the service came back
