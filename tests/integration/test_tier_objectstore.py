"""S3ObjectStore on a moto server started here on 127.0.0.1: what only S3 does (pages of 1000, prefixes, the caller's
asyncio loop, ETags, error codes), and its faults: a stopped server, and one restarted mid-retry. The contract every
backend keeps is test_tier_contract.py's."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import botocore.exceptions
import pytest
import trio
import trio_asyncio

from rocket.errors import Code, RocketError
from rocket.tier import ObjectInfo, open_s3_store
from rocket.transport.listen import free_ports

# aiohttp in Python's dev mode refuses moto's responses (they carry two Server headers).
pytestmark = pytest.mark.skipif(sys.flags.dev_mode, reason="aiohttp rejects moto's duplicate Server header in -X dev")

CREDENTIALS = {"access_key_id": "testing", "secret_access_key": "testing", "region": "us-east-1"}
# Only 127.0.0.1: no proxy, no instance metadata lookups, no stray AWS configuration.
SAFE_ENVIRONMENT = {"AWS_EC2_METADATA_DISABLED": "true", "NO_PROXY": "127.0.0.1,localhost",
                    "no_proxy": "127.0.0.1,localhost", "AWS_CONFIG_FILE": os.devnull,
                    "AWS_SHARED_CREDENTIALS_FILE": os.devnull, "AWS_ACCESS_KEY_ID": "testing",
                    "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}
PROXY_VARIABLES = ["HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"]
NO_PROXY_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


# moto_server's own entry point, after creating the buckets a restarted server must have: created over
# HTTP once it listens, a bucket could be missing when a retrying call reaches the server (NoSuchBucket).
MOTO_SERVER = """
import sys
from moto.core import DEFAULT_ACCOUNT_ID
from moto.s3.models import s3_backends
from moto.server import main
for bucket in sys.argv[2:]:
    s3_backends[DEFAULT_ACCOUNT_ID]["aws"].create_bucket(bucket, "us-east-1")
main(["-H", "127.0.0.1", "-p", sys.argv[1]])
"""


class MotoServer:
    """moto's standalone S3 server on 127.0.0.1:port, stoppable and restartable on the same port; it keeps
    state in memory, so start() recreates the buckets it was asked for (empty)."""

    def __init__(self, port: int, log_path: Path):
        self.port = port
        self.log_path = log_path
        self.buckets: list[str] = []
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 20.0) -> "MotoServer":
        environment = {key: value for key, value in os.environ.items() if key not in PROXY_VARIABLES}
        environment.update(SAFE_ENVIRONMENT)
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen([sys.executable, "-c", MOTO_SERVER, str(self.port), *self.buckets],
                                            stdout=log, stderr=subprocess.STDOUT, env=environment)
        deadline = time.monotonic() + timeout_s
        while not self._answers():
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"moto_server did not start: {self.log_path.read_text()[-2000:]}")
            time.sleep(0.05)
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

    def create_bucket(self) -> str:
        bucket = f"rocket-{uuid.uuid4().hex[:16]}"
        self._create(bucket)
        self.buckets.append(bucket)
        return bucket

    def _answers(self) -> bool:
        try:
            with NO_PROXY_OPENER.open(f"{self.url}/", timeout=1.0):
                return True
        except urllib.error.HTTPError:
            return True
        except OSError:
            return False

    def _create(self, bucket: str) -> None:
        # moto does not check signatures, so a bare PUT creates the bucket.
        request = urllib.request.Request(f"{self.url}/{bucket}", method="PUT")
        with NO_PROXY_OPENER.open(request, timeout=10.0) as response:
            assert response.status == 200, response.status


@pytest.fixture(autouse=True)
def only_local_network(monkeypatch):
    for variable in PROXY_VARIABLES:
        monkeypatch.delenv(variable, raising=False)
    for variable, value in SAFE_ENVIRONMENT.items():
        monkeypatch.setenv(variable, value)


@pytest.fixture(scope="module")
def moto(tmp_path_factory):
    """One moto server for the contract tests; each test gets its own bucket."""
    server = MotoServer(free_ports(1)[0], tmp_path_factory.mktemp("moto") / "moto.log").start()
    yield server
    server.stop()


@pytest.fixture
def own_moto(tmp_path):
    """A moto server for one test, which may stop and restart it."""
    server = MotoServer(free_ports(1)[0], tmp_path / "moto.log").start()
    yield server
    server.stop()


def s3_store(server: MotoServer, bucket: str, **options):
    return open_s3_store(bucket, endpoint_url=server.url, path_style=True, **CREDENTIALS, **options)


def md5_hex(data: bytes) -> str:
    return hashlib.md5(data).hexdigest()


async def expect_error(code: Code, call, *arguments) -> RocketError:
    with pytest.raises(RocketError) as caught:
        await call(*arguments)
    assert caught.value.code == code, caught.value
    return caught.value


@pytest.mark.slow
async def test_s3_list_default_pages_of_1000(moto):
    """With S3's own page size, 1100 objects come back whole and sorted (two ListObjectsV2 pages)."""
    keys = [f"many/{index:05d}" for index in range(1100)]
    async with s3_store(moto, moto.create_bucket()) as store:
        limiter = trio.CapacityLimiter(16)

        async def put(key: str) -> None:
            async with limiter:
                await store.put(key, key.encode())

        async with trio.open_nursery() as nursery:
            for key in reversed(keys):
                nursery.start_soon(put, key)
        listed = await store.list("many/")
    assert [info.key for info in listed] == keys
    assert all(info.size == 10 for info in listed)


async def test_s3_prefix_keeps_stores_apart(moto):
    """Two stores on one bucket with different key prefixes see only their own objects, by their own keys."""
    bucket = moto.create_bucket()
    async with (s3_store(moto, bucket, prefix="cluster-1/") as first,
                s3_store(moto, bucket, prefix="cluster-2/") as second):
        await first.put("a/x", b"1")
        await second.put("a/x", b"2")
        assert [info.key for info in await first.list()] == ["a/x"]
        assert await first.get("a/x") == b"1" and await second.get("a/x") == b"2"
    async with s3_store(moto, bucket) as whole:
        assert [info.key for info in await whole.list()] == ["cluster-1/a/x", "cluster-2/a/x"]


async def test_s3_reuses_the_callers_asyncio_loop(moto):
    """Inside an open trio-asyncio loop, open_s3_store runs on that loop instead of opening a second one."""
    async with trio_asyncio.open_loop() as loop:
        async with s3_store(moto, moto.create_bucket()) as store:
            assert store._loop is loop
            await store.put("k", b"v")
            assert await store.get("k") == b"v"


async def test_s3_put_with_wrong_etag_is_corrupt_data(moto, monkeypatch):
    """A put whose returned ETag is not the MD5 of the data sent is CORRUPT_DATA."""
    async with s3_store(moto, moto.create_bucket()) as store:
        real_put = store._client.put_object

        async def put_returning_wrong_etag(**arguments):
            response = await real_put(**arguments)
            return {**response, "ETag": '"' + "0" * 32 + '"'}

        monkeypatch.setattr(store._client, "put_object", put_returning_wrong_etag)
        error = await expect_error(Code.CORRUPT_DATA, store.put, "k", b"payload")
        assert "'k'" in error.message and md5_hex(b"payload") in error.message


async def test_s3_missing_bucket_is_unavailable(moto):
    """A bucket that does not exist makes put, get and list UNAVAILABLE at once, saying so."""
    async with s3_store(moto, "rocket-no-such-bucket", attempts_max=3) as store:
        error = await expect_error(Code.UNAVAILABLE, store.put, "k", b"v")
        assert "bucket does not exist" in error.message
        await expect_error(Code.UNAVAILABLE, store.get, "k")
        await expect_error(Code.UNAVAILABLE, store.list, "")


async def test_s3_stopped_server_retries_then_unavailable(own_moto):
    """With S3 down, a call is tried attempts_max times with backoff, then UNAVAILABLE within retry_s_max."""
    retry_s_max = 3.0
    async with s3_store(own_moto, own_moto.create_bucket(), attempts_max=4, retry_s_max=retry_s_max,
                        backoff_s_min=0.05, backoff_s_max=0.2, connect_timeout_s=0.5, read_timeout_s=1.0) as store:
        await store.put("segment", b"data")
        own_moto.stop()
        for call, arguments in [(store.get, ("segment",)), (store.put, ("segment", b"x")), (store.list, ("",)),
                                (store.head, ("segment",)), (store.delete, ("segment",))]:
            with trio.fail_after(retry_s_max + 5):  # a liveness bound, with slack for a slow machine
                error = await expect_error(Code.UNAVAILABLE, call, *arguments)
            operation = call.__name__
            assert error.message.startswith(f"{operation} '{arguments[0]}' in S3 bucket "), error.message
            assert "after 4 attempts" in error.message, error.message
        # A time bound shorter than the attempts ends the call by its deadline instead.
        store.retries.attempts_max, store.retries.retry_s_max = 1000, 0.5
        with trio.fail_after(0.5 + 5):
            error = await expect_error(Code.UNAVAILABLE, store.get, "segment")
        assert "out of time" in error.message and "'segment'" in error.message


async def test_s3_restart_during_retries_succeeds(own_moto):
    """A put made while S3 is down succeeds once S3 comes back within the retry bounds."""
    async with s3_store(own_moto, own_moto.create_bucket(), attempts_max=200, retry_s_max=25.0,
                        backoff_s_min=0.05, backoff_s_max=0.2, connect_timeout_s=0.5) as store:
        await store.put("before", b"old")
        own_moto.stop()
        stored: list[ObjectInfo] = []

        async def put_while_down() -> None:
            stored.append(await store.put("segment", b"written across a restart"))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(put_while_down)
            await trio.sleep(0.5)
            assert stored == []  # still retrying: the server is down
            await trio.to_thread.run_sync(own_moto.start)  # same port; recreates the (empty) bucket
        assert stored == [ObjectInfo("segment", 24, md5_hex(b"written across a restart"))]
        assert await store.get("segment") == b"written across a restart"
        assert await store.head("before") is None  # moto lost its memory: the restart was real


async def test_s3_cancelled_call_leaves_store_usable(moto):
    """A call cancelled by the caller's deadline raises trio.Cancelled into the caller only; the store still works."""
    async with s3_store(moto, moto.create_bucket()) as store:
        await store.put("k", b"v" * 100_000)
        for _ in range(5):
            with trio.move_on_after(0.001) as scope:
                await store.get("k")
        assert scope.cancelled_caught
        assert await store.get("k") == b"v" * 100_000


def client_error(status: int, code: str) -> botocore.exceptions.ClientError:
    return botocore.exceptions.ClientError(
        {"Error": {"Code": code, "Message": f"scripted {code}"}, "ResponseMetadata": {"HTTPStatusCode": status}},
        "GetObject")


async def test_s3_error_codes_map_to_rocket_errors(moto, monkeypatch):
    """Throttling and 5xx are retried until S3 answers; refused credentials are UNAVAILABLE and other 4xx
    BAD_REQUEST, both at once; none of them escapes as a botocore exception."""
    async with s3_store(moto, moto.create_bucket(), backoff_s_min=0.01, backoff_s_max=0.02) as store:
        await store.put("k", b"value")
        real_get = store._client.get_object
        script: list[Exception] = []
        calls: list[str] = []

        async def scripted_get(**arguments):
            calls.append(arguments["Key"])
            if script:
                raise script.pop(0)
            return await real_get(**arguments)

        monkeypatch.setattr(store._client, "get_object", scripted_get)
        script[:] = [client_error(503, "SlowDown"), client_error(500, "InternalError"),
                     client_error(400, "RequestTimeout"), client_error(429, "TooManyRequests")]
        assert await store.get("k") == b"value" and len(calls) == 5
        for status, code, expected in [(403, "AccessDenied", Code.UNAVAILABLE),
                                       (403, "InvalidAccessKeyId", Code.UNAVAILABLE),
                                       (400, "InvalidArgument", Code.BAD_REQUEST)]:
            calls.clear()
            script[:] = [client_error(status, code)]
            error = await expect_error(expected, store.get, "k")
            assert code in error.message and "'k'" in error.message and len(calls) == 1
        calls.clear()
        script[:] = [client_error(503, "SlowDown")] * 20
        error = await expect_error(Code.UNAVAILABLE, store.get, "k")
        assert "SlowDown" in error.message and len(calls) == store.retries.attempts_max


async def test_s3_errors_leave_the_store_context_as_rocket_errors(moto):
    """An error inside `async with open_s3_store()` leaves as that RocketError, not wrapped in an ExceptionGroup,
    and so do bad store options."""
    with pytest.raises(RocketError) as caught:
        async with s3_store(moto, moto.create_bucket()) as store:
            await store.get("missing")
    assert caught.value.code == Code.NOT_FOUND
    with pytest.raises(RocketError) as caught:
        async with s3_store(moto, "rocket-any", attempts_max=0):
            pass
    assert caught.value.code == Code.CONFIG_INVALID
