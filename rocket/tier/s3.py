"""S3ObjectStore: the tier on S3 or an S3-compatible service (MinIO, Ceph RGW, GCS interoperability),
through aiobotocore on asyncio running inside the Trio process by trio-asyncio. Transient failures are
retried with bounded, jittered backoff and then become UNAVAILABLE; no botocore exception escapes.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any, TypeVar

import aiohttp
import botocore.exceptions
import trio_asyncio
from aiobotocore.config import AioConfig
from aiobotocore.session import get_session

from rocket.errors import Code, RocketError
from rocket.limits.tier import (s3_attempts_max, s3_backoff_s_max, s3_backoff_s_min,
                                s3_connect_timeout_s,
                                s3_connections_max, s3_list_page_keys, s3_read_timeout_s, s3_retry_s_max)
from rocket.tier.objectstore import (MD5_HEX, ObjectInfo, check_data, check_key, check_prefix, check_range, data_md5,
                                     list_objects_max)
from rocket.tier.retries import ClosingStore, Retries, asyncio_loop


Result = TypeVar("Result")
CONTENT_RANGE = re.compile(r"bytes (\d+)-(\d+)/(\d+|\*)")

# Error codes S3 and compatible services use for "try again later", whatever the HTTP status.
RETRYABLE_CODES = frozenset({
    "SlowDown", "Throttling", "ThrottlingException", "TooManyRequests", "RequestLimitExceeded",
    "RequestThrottled", "ServiceUnavailable", "InternalError", "RequestTimeout", "OperationAborted",
})
# Error codes that mean the store is misconfigured: an operator must act, so the caller gets UNAVAILABLE.
CONFIGURATION_CODES = frozenset({
    "AccessDenied", "AllAccessDisabled", "InvalidAccessKeyId", "SignatureDoesNotMatch", "ExpiredToken",
    "InvalidToken", "TokenRefreshRequired", "RequestTimeTooSkewed", "AccountProblem", "InvalidBucketName",
    "PermanentRedirect", "AuthorizationHeaderMalformed", "InvalidObjectState",
})
NOT_FOUND_CODES = frozenset({"NoSuchKey", "404", "NotFound"})
TRANSIENT_EXCEPTIONS = (
    botocore.exceptions.HTTPClientError,  # connection closed, read timeout, broken response stream
    botocore.exceptions.ConnectionError,  # cannot connect, connect timeout, proxy and TLS failures
    botocore.exceptions.IncompleteReadError,  # the body ended before its Content-Length
    aiohttp.ClientError,  # payload errors aiobotocore does not translate
    asyncio.TimeoutError,
    OSError,
)


class S3ObjectStore(ClosingStore):
    """An ObjectStore on one bucket (and key prefix). Open it with open_s3_store(), which owns the client.

    Error mapping: throttling, 5xx, timeouts and connection errors are retried, then UNAVAILABLE naming
    the operation and key. A missing object is NOT_FOUND on get (None on head; nothing on delete).
    A missing bucket, refused credentials or permissions are UNAVAILABLE: the caller cannot fix them,
    an operator must. Other 4xx describe the request and are BAD_REQUEST. A checksum mismatch on put or
    on a whole-object get is CORRUPT_DATA.
    """

    def __init__(self, client: Any, loop: trio_asyncio.TrioEventLoop, bucket: str, *, prefix: str = "",
                 attempts_max: int = s3_attempts_max, retry_s_max: float = s3_retry_s_max,
                 backoff_s_min: float = s3_backoff_s_min, backoff_s_max: float = s3_backoff_s_max,
                 list_page_keys: int = s3_list_page_keys, verify_etag: bool = True):
        if prefix:
            check_prefix(prefix)
            if not prefix.endswith("/"):
                raise RocketError(Code.CONFIG_INVALID, f"S3 key prefix {prefix!r} must end with '/'")
        if not 1 <= list_page_keys <= 1000:
            raise RocketError(Code.CONFIG_INVALID, "S3 list_page_keys must be 1..1000")
        self.retries = Retries(f"S3 bucket {bucket!r}", self._classify, attempts_max=attempts_max,
                               retry_s_max=retry_s_max, backoff_s_min=backoff_s_min, backoff_s_max=backoff_s_max)
        self._client = client
        self._loop = loop
        self.bucket = bucket
        self.prefix = prefix
        self.list_page_keys = list_page_keys
        # SSE-KMS and SSE-C objects have ETags that are not the MD5 of the data; Content-MD5, which S3
        # checks on upload, still protects puts when this is off.
        self.verify_etag = verify_etag

    async def put(self, key: str, data: bytes, md5: str | None = None) -> ObjectInfo:
        check_key(key)
        data = check_data(key, data)
        digest = data_md5(key, data, md5)
        content_md5 = base64.b64encode(digest).decode("ascii")

        async def put_object() -> dict:
            return await self._client.put_object(Bucket=self.bucket, Key=self.prefix + key, Body=data,
                                                  ContentMD5=content_md5)

        response = await self._call("put", key, put_object)
        etag = _etag(response)
        if self.verify_etag and etag != digest.hex():
            raise RocketError(Code.CORRUPT_DATA, f"S3 put {key!r} in bucket {self.bucket!r}: the stored "
                                                 f"object's ETag {etag!r} is not the MD5 of the data sent "
                                                 f"({digest.hex()})")
        return ObjectInfo(key, len(data), etag)

    async def get(self, key: str, start: int = 0, end: int | None = None) -> bytes:
        check_key(key)
        check_range(key, start, end)
        if end == start:
            # HTTP cannot ask for zero bytes; the object must still exist.
            if await self.head(key) is None:
                raise RocketError(Code.NOT_FOUND, f"no object {key!r} in S3 bucket {self.bucket!r}")
            return b""
        ranged = start > 0 or end is not None
        byte_range = f"bytes={start}-{'' if end is None else end - 1}"

        async def get_object() -> tuple[bytes, dict]:
            arguments = {"Range": byte_range} if ranged else {}
            response = await self._client.get_object(Bucket=self.bucket, Key=self.prefix + key, **arguments)
            async with response["Body"] as body:
                return await body.read(), response

        try:
            data, response = await self._call("get", key, get_object)
        except RocketError as error:
            if error.code == Code.OFFSET_OUT_OF_RANGE:
                return b""  # the range starts at or past the end: the object exists, like a slice past it
            raise
        self._check_whole_object(key, data, response, ranged, start)
        return data

    def _check_whole_object(self, key: str, data: bytes, response: dict, ranged: bool, start: int) -> None:
        """Compare a read that covers the whole object with its ETag (when the ETag is an MD5)."""
        whole = not ranged
        if ranged and start == 0:
            match = CONTENT_RANGE.fullmatch(response.get("ContentRange", ""))
            whole = bool(match) and match.group(3) != "*" and int(match.group(3)) == len(data)
        etag = _etag(response)
        if whole and self.verify_etag and MD5_HEX.fullmatch(etag) and hashlib.md5(data).hexdigest() != etag:
            raise RocketError(Code.CORRUPT_DATA, f"S3 object {key!r} in bucket {self.bucket!r} does not match "
                                                 f"its ETag {etag!r}")

    async def head(self, key: str) -> ObjectInfo | None:
        check_key(key)

        async def head_object() -> dict:
            return await self._client.head_object(Bucket=self.bucket, Key=self.prefix + key)

        try:
            response = await self._call("head", key, head_object)
        except RocketError as error:
            if error.code == Code.NOT_FOUND:
                return None
            raise
        return ObjectInfo(key, int(response["ContentLength"]), _etag(response))

    async def list(self, prefix: str = "") -> list[ObjectInfo]:
        check_prefix(prefix)
        found: list[ObjectInfo] = []
        token: str | None = None
        pages_max = list_objects_max // self.list_page_keys + 2
        for _ in range(pages_max):
            page = await self._list_page(prefix, token)
            for item in page.get("Contents", []):
                found.append(ObjectInfo(item["Key"][len(self.prefix):], int(item["Size"]), _etag(item)))
            if len(found) > list_objects_max:
                raise RocketError(Code.OVERLOADED, f"more than {list_objects_max} objects start with "
                                                   f"{prefix!r} in S3 bucket {self.bucket!r}; list a narrower prefix")
            if not page.get("IsTruncated"):
                found.sort(key=lambda info: info.key)
                return found
            token = page.get("NextContinuationToken")
            if not token:
                raise RocketError(Code.UNAVAILABLE, f"S3 list {prefix!r} in bucket {self.bucket!r}: a truncated "
                                                    "page came without a continuation token")
        raise RocketError(Code.UNAVAILABLE, f"S3 list {prefix!r} in bucket {self.bucket!r} did not end "
                                            f"within {pages_max} pages")

    async def _list_page(self, prefix: str, token: str | None) -> dict:
        async def list_objects() -> dict:
            arguments = {"ContinuationToken": token} if token else {}
            return await self._client.list_objects_v2(Bucket=self.bucket, Prefix=self.prefix + prefix,
                                                      MaxKeys=self.list_page_keys, **arguments)

        return await self._call("list", prefix, list_objects)

    async def delete(self, key: str) -> None:
        check_key(key)

        async def delete_object() -> dict:
            return await self._client.delete_object(Bucket=self.bucket, Key=self.prefix + key)

        try:
            await self._call("delete", key, delete_object)
        except RocketError as error:
            if error.code != Code.NOT_FOUND:
                raise

    async def _call(self, operation: str, key: str, call: Callable[[], Awaitable[Result]]) -> Result:
        """Run the asyncio coroutine function call on the loop, retrying transient failures (Retries); every failure
        leaves as RocketError."""
        if self._closed:
            raise RocketError(Code.UNAVAILABLE, f"S3 store for bucket {self.bucket!r} is closed "
                                                f"({operation} {key!r})")
        return await self.retries.run(operation, key, trio_asyncio.aio_as_trio(call, loop=self._loop))

    def _classify(self, operation: str, key: str, error: BaseException) -> str | None:
        """A description of a transient error, to retry; raises RocketError for all others."""
        if isinstance(error, TRANSIENT_EXCEPTIONS):
            return f"{type(error).__name__}: {error}"
        if isinstance(error, botocore.exceptions.BotoCoreError):
            # Credentials missing, bad configuration, parameters botocore refuses: not transient.
            raise RocketError(Code.UNAVAILABLE, f"{operation} {key!r} in S3 bucket {self.bucket!r}: "
                                                f"{type(error).__name__}: {error}") from None
        if not isinstance(error, botocore.exceptions.ClientError):
            return None
        code = str(error.response.get("Error", {}).get("Code", ""))
        message = str(error.response.get("Error", {}).get("Message", "")) or code
        status = int(error.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
        where = f"{operation} {key!r} in S3 bucket {self.bucket!r}"
        if status >= 500 or status == 429 or code in RETRYABLE_CODES:
            return f"HTTP {status} {code}: {message}"
        if code == "NoSuchBucket":
            raise RocketError(Code.UNAVAILABLE, f"{where}: the bucket does not exist") from None
        if code in NOT_FOUND_CODES or (status == 404 and operation in ("get", "head")):
            raise RocketError(Code.NOT_FOUND, f"{where}: no such object") from None
        if code == "InvalidRange" or status == 416:
            raise RocketError(Code.OFFSET_OUT_OF_RANGE, f"{where}: range not satisfiable") from None
        if code in ("BadDigest", "InvalidDigest"):
            raise RocketError(Code.CORRUPT_DATA, f"{where}: S3 refused the upload, its Content-MD5 does not "
                                                 f"match the bytes it received ({code})") from None
        if status in (401, 403) or code in CONFIGURATION_CODES:
            raise RocketError(Code.UNAVAILABLE, f"{where}: S3 refused the request ({code}: {message}); check the "
                                                "credentials, the bucket's region and its permissions") from None
        raise RocketError(Code.BAD_REQUEST, f"{where}: S3 refused the request with HTTP {status} "
                                            f"{code}: {message}") from None


def _etag(response: dict) -> str:
    return str(response.get("ETag", "")).strip('"').lower()


@asynccontextmanager
async def open_s3_store(bucket: str, *, endpoint_url: str | None = None, region: str | None = None,
                        access_key_id: str | None = None, secret_access_key: str | None = None,
                        session_token: str | None = None, path_style: bool = False, prefix: str = "",
                        connect_timeout_s: float = s3_connect_timeout_s, read_timeout_s: float = s3_read_timeout_s,
                        **store_options: Any) -> AsyncIterator[S3ObjectStore]:
    """Yield an S3ObjectStore on bucket, closing its client on exit.

    If the calling task already runs inside a trio-asyncio loop (trio_asyncio.open_loop()), that loop is
    used; otherwise one is opened for the store's lifetime. Either way the store may be used from any Trio
    task of this trio.run while the context is open. Credentials and region default to the usual AWS
    sources (environment, ~/.aws files, instance metadata); region falls back to us-east-1.
    path_style addresses http://endpoint/bucket/key, which MinIO, Ceph RGW and most S3-compatible
    services need. store_options go to S3ObjectStore (retry bounds, list_page_keys, verify_etag).
    """
    if not bucket or not isinstance(bucket, str):
        raise RocketError(Code.CONFIG_INVALID, f"S3 bucket name must be a non-empty string, not {bucket!r}")
    if (access_key_id is None) != (secret_access_key is None):
        raise RocketError(Code.CONFIG_INVALID, "give both access_key_id and secret_access_key, or neither")
    async with asyncio_loop() as loop:
        async with _open_store(loop, bucket, endpoint_url, region, access_key_id, secret_access_key,
                               session_token, path_style, prefix, connect_timeout_s, read_timeout_s,
                               store_options) as store:
            yield store


@asynccontextmanager
async def _open_store(loop, bucket, endpoint_url, region, access_key_id, secret_access_key, session_token,
                      path_style, prefix, connect_timeout_s, read_timeout_s,
                      store_options) -> AsyncIterator[S3ObjectStore]:
    config = AioConfig(
        s3={"addressing_style": "path" if path_style else "auto"},
        # rocket retries itself (bounded, jittered, mapped to error codes); botocore tries once.
        retries={"mode": "standard", "total_max_attempts": 1},
        connect_timeout=connect_timeout_s,
        read_timeout=read_timeout_s,
        max_pool_connections=s3_connections_max,
        # Content-MD5 protects puts; botocore's newer default CRC headers break some S3-compatible services.
        request_checksum_calculation="when_required",
        response_checksum_validation="when_required",
    )
    store = S3ObjectStore(None, loop, bucket, prefix=prefix, **store_options)  # checks options before connecting
    session = get_session()

    async def enter_client() -> tuple[Any, Any]:
        region_name = region or session.get_config_variable("region") or "us-east-1"
        context = session.create_client("s3", region_name=region_name, endpoint_url=endpoint_url,
                                        aws_access_key_id=access_key_id, aws_secret_access_key=secret_access_key,
                                        aws_session_token=session_token, config=config)
        return context, await context.__aenter__()

    try:
        context, client = await trio_asyncio.aio_as_trio(enter_client, loop=loop)()
    except (botocore.exceptions.BotoCoreError, ValueError) as error:
        raise RocketError(Code.CONFIG_INVALID, f"cannot create an S3 client for bucket {bucket!r} "
                                               f"(endpoint {endpoint_url or 'AWS'}): {error}") from None
    store._client = client

    async def close_client() -> None:
        await trio_asyncio.aio_as_trio(context.__aexit__, loop=loop)(None, None, None)

    store._close = close_client
    try:
        yield store
    finally:
        await store.aclose()
