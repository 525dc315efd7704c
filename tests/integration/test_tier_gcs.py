"""GcsObjectStore against fake-gcs-server on 127.0.0.1 (tests/integration/gcs_server.py): what the contract suite
(test_tier_contract.py) does not cover: pages of a listing, key prefixes, a missing bucket, the caller's asyncio loop, a
wrong MD5, a stopped server ending in UNAVAILABLE within the retry bounds, and credentials: a service-account file
and the metadata server, each served by FakeAuthServer on 127.0.0.1, and refused or unusable ones."""

from __future__ import annotations

import base64
import importlib.util
import json
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

import aiohttp
import gcloud.aio.auth.token as auth_token
import pytest
import tenacity
import trio
import trio_asyncio
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa

from rocket.errors import Code, RocketError
from rocket.tier import ObjectInfo
from rocket.tier.gcs import open_gcs_store
from rocket.transport.listen import free_ports
from tests.integration.test_tier_objectstore import expect_error, md5_hex
from tests.integration.gcs_server import FakeGcsServer

PROXY_VARIABLES = ["HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy",
                   "STORAGE_EMULATOR_HOST", "GOOGLE_APPLICATION_CREDENTIALS"]


@pytest.fixture(autouse=True)
def only_local_network(monkeypatch):
    for variable in PROXY_VARIABLES:
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    monkeypatch.setenv("no_proxy", "127.0.0.1,localhost")


@pytest.fixture(scope="module")
def gcs(tmp_path_factory):
    """One emulator for the module; each test gets its own bucket."""
    server = FakeGcsServer(free_ports(1)[0], tmp_path_factory.mktemp("gcs") / "fake-gcs-server.log").start()
    yield server
    server.stop()


@pytest.fixture
def own_gcs(tmp_path):
    """An emulator for one test, which may stop it."""
    server = FakeGcsServer(free_ports(1)[0], tmp_path / "fake-gcs-server.log").start()
    yield server
    server.stop()


def new_bucket(server: FakeGcsServer) -> str:
    return server.create_bucket(f"rocket-{uuid.uuid4().hex[:16]}")


def gcs_store(server: FakeGcsServer, bucket: str, **options):
    return open_gcs_store(bucket, endpoint_url=server.endpoint, anonymous=True, **options)


@pytest.fixture
async def store(gcs):
    async with gcs_store(gcs, new_bucket(gcs), list_page_keys=7) as opened:
        yield opened



async def test_list_across_pages_sorted(store):
    """With pages of 7 keys, list returns every object under a string prefix, sorted by key."""
    keys = [f"topic-a/{queue}/{offset:020d}.seg" for queue in (0, 1, 10) for offset in range(0, 50, 10)]
    keys += ["topic-b/0/00000000000000000000.seg", "topic-ab"]
    contents = {key: key.encode() * (index + 1) for index, key in enumerate(keys)}
    async with trio.open_nursery() as nursery:
        for key, data in contents.items():
            nursery.start_soon(store.put, key, data)
    expected = [ObjectInfo(key, len(contents[key]), md5_hex(contents[key])) for key in sorted(keys)]
    assert await store.list() == expected
    assert [info.key for info in await store.list("topic-a/1")] == sorted(k for k in keys if k.startswith("topic-a/1"))
    assert [info.key for info in await store.list("topic-a")] == sorted(k for k in keys if k.startswith("topic-a"))





async def test_prefix_keeps_stores_apart(gcs):
    """Two stores on one bucket with different key prefixes see only their own objects, by their own keys."""
    bucket = new_bucket(gcs)
    async with (gcs_store(gcs, bucket, prefix="cluster-1/") as first,
                gcs_store(gcs, bucket, prefix="cluster-2/") as second):
        await first.put("a/x", b"1")
        await second.put("a/x", b"2")
        assert [info.key for info in await first.list()] == ["a/x"]
        assert await first.get("a/x") == b"1" and await second.get("a/x") == b"2"
        assert await first.head("a/x") == ObjectInfo("a/x", 1, md5_hex(b"1"))
        await first.delete("a/x")
        assert await second.get("a/x") == b"2"
    async with gcs_store(gcs, bucket) as whole:
        assert [info.key for info in await whole.list()] == ["cluster-2/a/x"]
    with pytest.raises(RocketError) as caught:
        async with gcs_store(gcs, bucket, prefix="no-slash"):
            pass
    assert caught.value.code == Code.CONFIG_INVALID


async def test_missing_bucket_is_unavailable(gcs):
    """Writing to or listing a bucket that does not exist is UNAVAILABLE at once, saying so."""
    async with gcs_store(gcs, "rocket-no-such-bucket", attempts_max=3) as store:
        error = await expect_error(Code.UNAVAILABLE, store.put, "k", b"v")
        assert "bucket does not exist" in error.message
        await expect_error(Code.UNAVAILABLE, store.list, "")


async def test_reuses_the_callers_asyncio_loop(gcs):
    """Inside an open trio-asyncio loop, open_gcs_store runs on that loop; after aclose calls are UNAVAILABLE."""
    async with trio_asyncio.open_loop() as loop:
        async with gcs_store(gcs, new_bucket(gcs)) as store:
            assert store._loop is loop
            await store.put("k", b"v")
            assert await store.get("k") == b"v"
            await store.aclose()
            await expect_error(Code.UNAVAILABLE, store.get, "k")
            await expect_error(Code.UNAVAILABLE, store.put, "k", b"v")
            await expect_error(Code.UNAVAILABLE, store.list, "")


async def test_stopped_server_retries_then_unavailable(own_gcs):
    """With the server down, a call is tried attempts_max times with backoff, then UNAVAILABLE within retry_s_max."""
    retry_s_max = 3.0
    async with gcs_store(own_gcs, new_bucket(own_gcs), attempts_max=4, retry_s_max=retry_s_max, backoff_s_min=0.05,
                         backoff_s_max=0.2, connect_timeout_s=0.5, read_timeout_s=1.0) as store:
        await store.put("segment", b"data")
        own_gcs.stop()
        for call, arguments in [(store.get, ("segment",)), (store.put, ("segment", b"x")), (store.list, ("",)),
                                (store.head, ("segment",)), (store.delete, ("segment",))]:
            with trio.fail_after(retry_s_max + 5):  # a liveness bound, with slack for a slow machine
                error = await expect_error(Code.UNAVAILABLE, call, *arguments)
            assert f"{call.__name__} " in error.message and "after 4 attempts" in error.message, error.message
            assert "GCS bucket" in error.message
        # A time bound shorter than the attempts ends the call by its deadline instead.
        store.retries.attempts_max, store.retries.retry_s_max = 1000, 0.5
        with trio.fail_after(0.5 + 5):
            error = await expect_error(Code.UNAVAILABLE, store.get, "segment")
        assert "out of time" in error.message and "'segment'" in error.message


async def test_put_with_wrong_md5_is_corrupt_data(gcs, monkeypatch):
    """A put whose stored object's md5Hash is not the MD5 of the data sent is CORRUPT_DATA."""
    async with gcs_store(gcs, new_bucket(gcs)) as store:
        real_upload = store._storage.upload

        async def upload_answering_wrong_md5(*arguments, **options):
            return {**await real_upload(*arguments, **options), "md5Hash": "AAAAAAAAAAAAAAAAAAAAAA=="}

        monkeypatch.setattr(store._storage, "upload", upload_answering_wrong_md5)
        error = await expect_error(Code.CORRUPT_DATA, store.put, "k", b"payload")
        assert "'k'" in error.message and md5_hex(b"payload") in error.message


METADATA_TOKEN_PATH = "/computeMetadata/v1/instance/service-accounts/default/token"
CLIENT_EMAIL = "rocket@test.iam.gserviceaccount.com"


class FakeAuthServer(ThreadingHTTPServer):
    """On 127.0.0.1, in a thread: Google's OAuth token endpoint (POST /token: a JWT bearer assertion, its RS256
    signature checked with public_key) and the GCE metadata server's token (GET METADATA_TOKEN_PATH, only with
    Metadata-Flavor: Google). requests records (path, verdict); a good request gets token, unless refuse is set."""

    def __init__(self):
        self.port = free_ports(1)[0]
        self.token_uri = f"http://127.0.0.1:{self.port}/token"
        self.token = f"ya29.rocket-test-{uuid.uuid4().hex}"
        self.public_key: rsa.RSAPublicKey | None = None
        self.refuse = False
        self.requests: list[tuple[str, str]] = []
        super().__init__(("127.0.0.1", self.port), AuthHandler)

    def verdict(self, method: str, path: str, headers, body: bytes) -> str:
        if (method, path) == ("GET", METADATA_TOKEN_PATH):
            return "ok" if headers.get("Metadata-Flavor") == "Google" else "no Metadata-Flavor: Google"
        form = parse_qs(body.decode())
        grant = form.get("grant_type", [""])[0]
        if (method, path) != ("POST", "/token") or grant != "urn:ietf:params:oauth:grant-type:jwt-bearer":
            return f"not a JWT bearer grant: {method} {path} {grant}"
        signed, _, signature = form["assertion"][0].rpartition(".")
        if self.public_key is None:
            return "no public key"
        try:
            self.public_key.verify(unb64(signature), signed.encode(), padding.PKCS1v15(), hashes.SHA256())
        except InvalidSignature:
            return "bad signature"
        header, claims = (json.loads(unb64(part)) for part in signed.split("."))
        good = (header["alg"] == "RS256" and claims["aud"] == self.token_uri and claims["iss"] == CLIENT_EMAIL
                and claims["exp"] > time.time() and "devstorage" in claims["scope"])
        return "ok" if good else f"bad claims {claims}"


class AuthHandler(BaseHTTPRequestHandler):
    server: FakeAuthServer

    def do_POST(self) -> None:
        path, body = urlsplit(self.path).path, self.rfile.read(int(self.headers.get("Content-Length") or 0))
        verdict = self.server.verdict(self.command, path, self.headers, body)
        self.server.requests.append((path, verdict))
        status, answer = ((401, {"error": "invalid_grant", "error_description": f"refused ({verdict})"})
                          if self.server.refuse or verdict != "ok" else
                          (200, {"access_token": self.server.token, "expires_in": 3599, "token_type": "Bearer"}))
        data = json.dumps(answer).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST

    def log_message(self, *arguments) -> None:
        pass


def unb64(part: str) -> bytes:
    return base64.urlsafe_b64decode(part + "=" * (-len(part) % 4))


@pytest.fixture
def auth_server():
    server = FakeAuthServer()
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()
    thread.join()


@pytest.fixture
def gcs_authorizations(gcs, monkeypatch) -> list[str | None]:
    """The Authorization header of each request the store's HTTP session sends to the emulator (which ignores it)."""
    seen: list[str | None] = []

    async def on_request_start(session, context, params: aiohttp.TraceRequestStartParams) -> None:
        if str(params.url).startswith(gcs.endpoint):
            seen.append(params.headers.get("Authorization"))

    trace = aiohttp.TraceConfig()
    trace.on_request_start.append(on_request_start)
    session_init = aiohttp.ClientSession.__init__
    monkeypatch.setattr(aiohttp.ClientSession, "__init__",
                        lambda self, *arguments, **options: session_init(self, *arguments, trace_configs=[trace],
                                                                         **options))
    return seen


def service_account_file(tmp_path, server: FakeAuthServer, private_key: str | None = None) -> str:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    server.public_key = key.public_key()
    private_key = private_key or key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                   serialization.NoEncryption()).decode()
    path = tmp_path / "service-account.json"
    path.write_text(json.dumps({"type": "service_account", "project_id": "rocket-test", "private_key_id": "1",
                                "private_key": private_key, "client_email": CLIENT_EMAIL, "client_id": "1",
                                "token_uri": server.token_uri}))
    return str(path)


async def put_get_list(store, authorizations: list[str | None], token: str) -> None:
    await store.put("segment", b"payload")
    assert await store.get("segment") == b"payload"
    assert [info.key for info in await store.list()] == ["segment"]
    assert authorizations == [f"Bearer {token}"] * 3


async def test_service_account_file_gets_a_bearer_token(gcs, auth_server, gcs_authorizations, tmp_path):
    """With service_file, the store signs a JWT with the file's key for its token_uri, and sends the token it gets
    as the bearer of every request to the bucket: one token for all of them."""
    service_file = service_account_file(tmp_path, auth_server)
    async with open_gcs_store(new_bucket(gcs), endpoint_url=gcs.endpoint, service_file=service_file) as store:
        await put_get_list(store, gcs_authorizations, auth_server.token)
    assert auth_server.requests == [("/token", "ok")]


async def test_metadata_server_token(gcs, auth_server, gcs_authorizations, tmp_path, monkeypatch):
    """Without a service file, GOOGLE_APPLICATION_CREDENTIALS or gcloud's application default credentials, the
    store asks the metadata server at GCE_METADATA_HOST for its token (with Metadata-Flavor: Google) and uses it."""
    monkeypatch.setenv("CLOUDSDK_CONFIG", str(tmp_path))  # an empty gcloud configuration: no default credentials
    monkeypatch.setenv("GCE_METADATA_HOST", f"127.0.0.1:{auth_server.port}")
    # gcloud-aio-auth reads GCE_METADATA_HOST once, when imported: a second copy of its token module reads it now,
    # and its metadata endpoints go to the copy in use, as for a process started with the variable set.
    spec = importlib.util.spec_from_file_location("gcloud.aio.auth._token_now", auth_token.__file__)
    assert spec is not None and spec.loader is not None
    fresh = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fresh)
    for name in ("GCE_METADATA_BASE", "GCE_ENDPOINT_PROJECT", "GCE_ENDPOINT_TOKEN", "GCE_ENDPOINT_ID_TOKEN"):
        monkeypatch.setattr(auth_token, name, getattr(fresh, name))
    assert auth_token.GCE_ENDPOINT_TOKEN.startswith(f"http://127.0.0.1:{auth_server.port}{METADATA_TOKEN_PATH}?")
    async with open_gcs_store(new_bucket(gcs), endpoint_url=gcs.endpoint) as store:
        await put_get_list(store, gcs_authorizations, auth_server.token)
    assert auth_server.requests == [(METADATA_TOKEN_PATH, "ok")]


@pytest.mark.parametrize("refused", [True, False], ids=["refused", "not-a-key"])
async def test_bad_credentials_are_unavailable(gcs, auth_server, gcs_authorizations, tmp_path, monkeypatch, refused):
    """A token server refusing the file's valid assertion (401 invalid_grant), or a file whose key is none, makes
    each call UNAVAILABLE at once (not retried), saying why, and sends nothing to the bucket."""
    # gcloud-aio-auth tries for a token 5 times, waiting up to 1+2+4+8 s: no waits here, to keep the test short.
    monkeypatch.setattr(auth_token.BaseToken.acquire_access_token.retry, "wait", tenacity.wait_none())
    auth_server.refuse = refused
    service_file = service_account_file(tmp_path, auth_server, None if refused else "-----BEGIN nothing")
    async with open_gcs_store(new_bucket(gcs), endpoint_url=gcs.endpoint, service_file=service_file) as store:
        for call, arguments in [(store.put, ("k", b"v")), (store.get, ("k",)), (store.list, ("",))]:
            with trio.fail_after(20):
                error = await expect_error(Code.UNAVAILABLE, call, *arguments)
            assert f"{call.__name__} " in error.message and "attempts" not in error.message, error.message
            expected = (["HTTP 401", "invalid_grant", "check the credentials", auth_server.token_uri] if refused
                        else ["InvalidKeyError"])
            assert all(part in error.message for part in expected), error.message
    assert gcs_authorizations == []
    # Refused: each call sent a valid assertion again (a refusal is not cached). No key: nothing to send.
    assert set(auth_server.requests) == ({("/token", "ok")} if refused else set())
    assert len(auth_server.requests) >= (3 if refused else 0)
