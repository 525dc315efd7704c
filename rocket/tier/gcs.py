"""GcsObjectStore: the tier on Google Cloud Storage's JSON API (or fake-gcs-server), through gcloud-aio-storage on
asyncio running inside the Trio process by trio-asyncio. Transient failures are retried with bounded, jittered
backoff and then become UNAVAILABLE; no aiohttp or gcloud exception escapes."""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import json
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any, TypeVar

import aiohttp
import trio_asyncio
try:
    from gcloud.aio.storage import Storage
    from gcloud.aio.storage.storage import init_api_root
except ImportError as missing:  # an extra: pip install 'rocket[gcs]'
    raise ImportError(f"the gcs tier backend needs pip install 'rocket[gcs]': {missing}") from missing

from rocket.errors import Code, RocketError
# GCS has no limits of its own: its calls share the S3 backend's retry, timeout, page and pool bounds.
from rocket.limits.tier import (s3_attempts_max, s3_backoff_s_max, s3_backoff_s_min,
                                s3_connect_timeout_s, s3_connections_max, s3_list_page_keys, s3_read_timeout_s,
                                s3_retry_s_max)
from rocket.tier.objectstore import (ObjectInfo, check_data, check_key, check_prefix, check_range, data_md5,
                                     list_objects_max)
from rocket.tier.retries import ClosingStore, Retries, asyncio_loop


Result = TypeVar("Result")
CONTENT_RANGE = re.compile(r"bytes (\d+)-(\d+)/(\d+|\*)")
# GCS bucket names: lowercase letters, digits, '-', '_' and '.'; they go into URL paths unquoted.
BUCKET_NAME = re.compile(r"[a-z0-9][a-z0-9._-]{1,220}[a-z0-9]")
GCS_ROOT = "https://www.googleapis.com"
OCTET_STREAM = "application/octet-stream"
TRANSIENT_EXCEPTIONS = (
    aiohttp.ClientError,  # cannot connect, connection reset, server disconnected, broken payload
    asyncio.TimeoutError,  # connect or socket read timeout
    OSError,
    json.JSONDecodeError,  # a truncated or non-JSON answer (a proxy's error page)
)


class GcsObjectStore(ClosingStore):
    """An ObjectStore on one GCS bucket (and key prefix). Open it with open_gcs_store(), which owns the client.

    Error mapping: 429, 408, 5xx, timeouts and connection errors are retried, then UNAVAILABLE naming the
    operation and key. A missing object is NOT_FOUND on get (None on head; nothing on delete). A missing
    bucket, refused credentials or permissions are UNAVAILABLE: an operator must act. Other 4xx are
    BAD_REQUEST. A checksum mismatch on put or on a whole-object get is CORRUPT_DATA. etag is the lowercase
    hex MD5 of the bytes; for composite objects, which have no MD5, it is GCS's etag as is.
    """

    def __init__(self, storage: Any, loop: trio_asyncio.TrioEventLoop, bucket: str, *, prefix: str = "",
                 attempts_max: int = s3_attempts_max, retry_s_max: float = s3_retry_s_max,
                 backoff_s_min: float = s3_backoff_s_min, backoff_s_max: float = s3_backoff_s_max,
                 list_page_keys: int = s3_list_page_keys, connect_timeout_s: float = s3_connect_timeout_s,
                 read_timeout_s: float = s3_read_timeout_s):
        if prefix:
            check_prefix(prefix)
            if not prefix.endswith("/"):
                raise RocketError(Code.CONFIG_INVALID, f"GCS key prefix {prefix!r} must end with '/'")
        if not (1 <= list_page_keys <= 1000 and connect_timeout_s > 0 and read_timeout_s > 0):
            raise RocketError(Code.CONFIG_INVALID, "GCS timeouts must be positive and list_page_keys 1..1000")
        self.retries = Retries(f"GCS bucket {bucket!r}", self._classify, attempts_max=attempts_max,
                               retry_s_max=retry_s_max, backoff_s_min=backoff_s_min, backoff_s_max=backoff_s_max)
        self._storage = storage
        self._loop = loop
        self.bucket = bucket
        self.prefix = prefix
        self.list_page_keys = list_page_keys
        # Per request: connects and socket reads are bounded, a whole transfer is not (objects reach 5 GiB).
        # Typed Any: gcloud-aio-storage annotates timeout as int but hands it to aiohttp, which takes this.
        self._timeout: Any = aiohttp.ClientTimeout(total=None, connect=connect_timeout_s, sock_read=read_timeout_s)

    async def put(self, key: str, data: bytes, md5: str | None = None) -> ObjectInfo:
        check_key(key)
        data = check_data(key, data)
        digest = data_md5(key, data, md5)
        md5_base64 = base64.b64encode(digest).decode("ascii")

        async def put_object() -> dict[str, Any]:
            # A multipart upload whose metadata carries md5Hash: GCS refuses bytes that do not match it.
            # gcloud-aio-storage camel-cases metadata keys at '-' (and lowercases the first part): "md5-Hash"
            # becomes "md5Hash". Always one request (never resumable): a failed try is retried whole.
            return await self._storage.upload(self.bucket, self.prefix + key, data, content_type=OCTET_STREAM,
                                              metadata={"md5-Hash": md5_base64}, force_resumable_upload=False,
                                              timeout=self._timeout)

        response = await self._call("put", key, put_object)
        stored = _md5_hex(response.get("md5Hash"))
        if stored != digest.hex():
            raise RocketError(Code.CORRUPT_DATA, f"GCS put {key!r} in bucket {self.bucket!r}: the stored object's "
                                                 f"MD5 {stored or '(none)'} is not the MD5 of the data sent "
                                                 f"({digest.hex()})")
        return ObjectInfo(key, len(data), stored)

    async def get(self, key: str, start: int = 0, end: int | None = None) -> bytes:
        check_key(key)
        check_range(key, start, end)
        if end == start:
            # HTTP cannot ask for zero bytes; the object must still exist.
            if await self.head(key) is None:
                raise RocketError(Code.NOT_FOUND, f"no object {key!r} in GCS bucket {self.bucket!r}")
            return b""
        ranged = start > 0 or end is not None
        byte_range = f"bytes={start}-{'' if end is None else end - 1}"

        async def get_object() -> tuple[bytes, int, str, str]:
            headers = {"Range": byte_range} if ranged else {}  # a new dict per try: the library adds to it
            stream = await self._storage.download_stream(self.bucket, self.prefix + key, headers=headers,
                                                         timeout=self._timeout)
            async with stream as response:
                data = await response.read()
                return (data, response.status, response.headers.get("Content-Range", ""),
                        response.headers.get("X-Goog-Hash", ""))

        try:
            data, status, content_range, goog_hash = await self._call("get", key, get_object)
        except RocketError as error:
            if error.code == Code.OFFSET_OUT_OF_RANGE:
                return b""  # the range starts at or past the end: the object exists, like a slice past it
            raise
        whole = status == 200  # 200 to a ranged request: the server sent the whole object, sliced below
        if status == 206 and start == 0:
            match = CONTENT_RANGE.fullmatch(content_range)
            whole = bool(match) and match.group(3) != "*" and int(match.group(3)) == len(data)
        if whole:
            self._check_whole_object(key, data, goog_hash)
        if status == 200 and ranged:
            data = data[start:end]
        return data

    def _check_whole_object(self, key: str, data: bytes, goog_hash: str) -> None:
        """Compare a read of the whole object with the MD5 in its X-Goog-Hash header (composite objects have none)."""
        hashes = dict(part.strip().split("=", 1) for part in goog_hash.split(",") if "=" in part)
        expected = _md5_hex(hashes.get("md5"))
        if expected and hashlib.md5(data).hexdigest() != expected:
            raise RocketError(Code.CORRUPT_DATA, f"GCS object {key!r} in bucket {self.bucket!r} does not match "
                                                 f"its MD5 {expected}")

    async def head(self, key: str) -> ObjectInfo | None:
        check_key(key)

        async def head_object() -> dict[str, Any]:
            return await self._storage.download_metadata(self.bucket, self.prefix + key, timeout=self._timeout)

        try:
            metadata = await self._call("head", key, head_object)
        except RocketError as error:
            if error.code == Code.NOT_FOUND:
                return None
            raise
        return self._info(key, metadata)

    async def list(self, prefix: str = "") -> list[ObjectInfo]:
        check_prefix(prefix)
        found: list[ObjectInfo] = []
        token = ""
        pages_max = list_objects_max // self.list_page_keys + 2
        for _ in range(pages_max):
            page = await self._list_page(prefix, token)
            for item in page.get("items", []):
                found.append(self._info(str(item["name"])[len(self.prefix):], item))
            if len(found) > list_objects_max:
                raise RocketError(Code.OVERLOADED, f"more than {list_objects_max} objects start with {prefix!r} in "
                                                   f"GCS bucket {self.bucket!r}; list a narrower prefix")
            token = str(page.get("nextPageToken") or "")
            if not token:
                found.sort(key=lambda info: info.key)
                return found
        raise RocketError(Code.UNAVAILABLE, f"GCS list {prefix!r} in bucket {self.bucket!r} did not end "
                                            f"within {pages_max} pages")

    async def _list_page(self, prefix: str, token: str) -> dict[str, Any]:
        async def list_objects() -> dict[str, Any]:
            params = {"prefix": self.prefix + prefix, "maxResults": str(self.list_page_keys), "projection": "noAcl"}
            if token:
                params["pageToken"] = token
            return await self._storage.list_objects(self.bucket, params=params, timeout=self._timeout)

        return await self._call("list", prefix, list_objects)

    async def delete(self, key: str) -> None:
        check_key(key)

        async def delete_object() -> str:
            return await self._storage.delete(self.bucket, self.prefix + key, timeout=self._timeout)

        try:
            await self._call("delete", key, delete_object)
        except RocketError as error:
            if error.code != Code.NOT_FOUND:
                raise

    def _info(self, key: str, metadata: dict[str, Any]) -> ObjectInfo:
        etag = _md5_hex(metadata.get("md5Hash")) or str(metadata.get("etag", ""))
        try:
            size = int(metadata["size"])
        except (KeyError, TypeError, ValueError):
            raise RocketError(Code.UNAVAILABLE, f"GCS object {key!r} in bucket {self.bucket!r}: the answer has no "
                                                f"valid size: {str(metadata)[:200]}") from None
        return ObjectInfo(key, size, etag)

    async def _call(self, operation: str, key: str, call: Callable[[], Awaitable[Result]]) -> Result:
        """Run the asyncio coroutine function call on the loop, retrying transient failures (Retries); every failure
        leaves as RocketError."""
        if self._closed:
            raise RocketError(Code.UNAVAILABLE, f"GCS store for bucket {self.bucket!r} is closed "
                                                f"({operation} {key!r})")
        return await self.retries.run(operation, key, trio_asyncio.aio_as_trio(call, loop=self._loop))

    def _classify(self, operation: str, key: str, error: BaseException) -> str:
        """A description of a transient error, to retry; raises RocketError for all others."""
        where = f"{operation} {key!r} in GCS bucket {self.bucket!r}"
        if not isinstance(error, aiohttp.ClientResponseError):
            if isinstance(error, TRANSIENT_EXCEPTIONS):
                return f"{type(error).__name__}: {error}"
            # gcloud-aio-auth failing to make a token (a bad credentials file, a metadata server answer it does not
            # understand), or an answer missing its fields: not transient, and no library exception escapes.
            raise RocketError(Code.UNAVAILABLE, f"{where}: {type(error).__name__}: {error}") from None
        status = error.status
        message = _error_message(error.message)
        if status >= 500 or status in (408, 429) or status < 400:
            return f"HTTP {status}: {message}"
        if status == 404:
            lowered = message.lower()
            if ("bucket" in lowered and "no such object" not in lowered) or operation in ("put", "list"):
                raise RocketError(Code.UNAVAILABLE, f"{where}: the bucket does not exist ({message})") from None
            raise RocketError(Code.NOT_FOUND, f"{where}: no such object") from None
        if status == 416:
            raise RocketError(Code.OFFSET_OUT_OF_RANGE, f"{where}: range not satisfiable") from None
        if status == 400 and operation == "put" and ("md5" in message.lower() or "hash" in message.lower()):
            raise RocketError(Code.CORRUPT_DATA, f"{where}: GCS refused the upload, its MD5 does not match the "
                                                 f"bytes it received ({message})") from None
        if status in (401, 403):  # from GCS, or from the token endpoint the credentials name
            url = str(error.request_info.url).partition("?")[0] if error.request_info else "GCS"
            raise RocketError(Code.UNAVAILABLE, f"{where}: {url} refused the request (HTTP {status}: {message}); "
                                                "check the credentials and the bucket's permissions") from None
        raise RocketError(Code.BAD_REQUEST, f"{where}: GCS refused the request with HTTP {status}: "
                                            f"{message}") from None


def _md5_hex(md5_base64: Any) -> str:
    """The lowercase hex of a base64 MD5 as GCS gives it, or '' when there is none (or it is not one)."""
    if not isinstance(md5_base64, str) or not md5_base64:
        return ""
    try:
        raw = base64.b64decode(md5_base64, validate=True)
    except (binascii.Error, ValueError):
        return ""
    return raw.hex() if len(raw) == 16 else ""


def _error_message(text: str) -> str:
    """GCS's own error message out of gcloud-aio's "Reason: {json body}", shortened for a RocketError."""
    reason, _, body = text.partition(": ")
    try:
        detail = json.loads(body)["error"]["message"]
        text = f"{reason}: {detail}"
    except (ValueError, KeyError, TypeError):
        pass
    return text[:300]


@asynccontextmanager
async def open_gcs_store(bucket: str, *, endpoint_url: str | None = None, prefix: str = "",
                         service_file: str | None = None, anonymous: bool = False,
                         **store_options: Any) -> AsyncIterator[GcsObjectStore]:
    """Yield a GcsObjectStore on bucket, closing its client on exit.

    If the calling task already runs inside a trio-asyncio loop (trio_asyncio.open_loop()), that loop is
    used; otherwise one is opened for the store's lifetime. Either way the store may be used from any Trio
    task of this trio.run while the context is open. Credentials: the service-account JSON file service_file,
    else the usual Google sources (GOOGLE_APPLICATION_CREDENTIALS, gcloud's application default credentials,
    the metadata server); anonymous sends none (fake-gcs-server, public buckets). endpoint_url replaces
    https://www.googleapis.com (an emulator, a private endpoint); without it STORAGE_EMULATOR_HOST is
    honoured, anonymously, as gcloud-aio-storage does. store_options go to GcsObjectStore (retry bounds,
    list_page_keys, connect_timeout_s, read_timeout_s).
    """
    if not isinstance(bucket, str) or not BUCKET_NAME.fullmatch(bucket):
        raise RocketError(Code.CONFIG_INVALID, f"GCS bucket name must be 3 to 222 lowercase letters, digits, "
                                               f"'-', '_' or '.', not {bucket!r}")
    if anonymous and service_file is not None:
        raise RocketError(Code.CONFIG_INVALID, "give service_file or anonymous=True, not both")
    async with asyncio_loop() as loop:
        async with _open_store(loop, bucket, endpoint_url, prefix, service_file, anonymous,
                               store_options) as store:
            yield store


@asynccontextmanager
async def _open_store(loop: trio_asyncio.TrioEventLoop, bucket: str, endpoint_url: str | None, prefix: str,
                      service_file: str | None, anonymous: bool,
                      store_options: dict[str, Any]) -> AsyncIterator[GcsObjectStore]:
    store = GcsObjectStore(None, loop, bucket, prefix=prefix, **store_options)  # checks options before connecting
    if endpoint_url:
        api_root, emulator = endpoint_url.rstrip("/"), False
    else:
        emulator, api_root = init_api_root(None)  # GCS itself, or STORAGE_EMULATOR_HOST
    # api_is_dev is gcloud-aio-storage's "send no Authorization header"; its other effect, skipping TLS
    # verification, does not apply: the session below is ours, and verifies.
    api_is_dev = anonymous or emulator

    async def enter_client() -> tuple[aiohttp.ClientSession, Storage]:
        # trust_env: HTTPS_PROXY and NO_PROXY apply, as for the other Google clients.
        session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=s3_connections_max), trust_env=True)
        try:
            return session, Storage(service_file=service_file, session=session, api_root=api_root,
                                    api_is_dev=api_is_dev)
        except BaseException:
            await session.close()
            raise

    try:
        session, storage = await trio_asyncio.aio_as_trio(enter_client, loop=loop)()
    except (OSError, ValueError, KeyError, TypeError) as error:
        # An unreadable or malformed credentials file, or one of a type gcloud-aio-auth does not know.
        raise RocketError(Code.CONFIG_INVALID, f"cannot create a GCS client for bucket {bucket!r} (endpoint "
                                               f"{api_root}): {type(error).__name__}: {error}") from None
    store._storage = storage

    async def close_client() -> None:
        await trio_asyncio.aio_as_trio(session.close, loop=loop)()

    store._close = close_client
    try:
        yield store
    finally:
        await store.aclose()
