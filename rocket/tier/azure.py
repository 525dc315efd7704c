"""AzureBlobStore: the tier on Azure Blob Storage (or Azurite), through azure-storage-blob's asyncio client running
inside the Trio process by trio-asyncio. Transient failures are retried (Retries) and then become UNAVAILABLE; no
Azure exception escapes."""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any, TypeVar

import aiohttp
import trio_asyncio
try:
    from azure.core.exceptions import (AzureError, ClientAuthenticationError, HttpResponseError,
                                       ResourceNotFoundError, ServiceRequestError, ServiceResponseError)
    from azure.storage.blob import ContentSettings
    from azure.storage.blob.aio import BlobServiceClient, ContainerClient
except ImportError as missing:  # an extra: pip install 'rocket[azure]'
    raise ImportError(f"the azure tier backend needs pip install 'rocket[azure]': {missing}") from missing

from rocket.errors import Code, RocketError
from rocket.limits.tier import s3_connect_timeout_s, s3_read_timeout_s
from rocket.tier.objectstore import (ObjectInfo, check_data, check_key, check_prefix, check_range, data_md5,
                                     list_objects_max)
from rocket.tier.retries import ClosingStore, Retries, asyncio_loop

Result = TypeVar("Result")
TRANSIENT_EXCEPTIONS = (ServiceRequestError, ServiceResponseError, aiohttp.ClientError, TimeoutError, OSError)
NOT_FOUND_CODES = frozenset({"BlobNotFound", "ResourceNotFound"})


class AzureBlobStore(ClosingStore):
    """An ObjectStore on one container (and key prefix). Open it with open_azure_store(), which owns the client.

    Error mapping: throttling (429, 503 ServerBusy), 5xx, timeouts and connection errors are retried, then
    UNAVAILABLE naming the operation and key. A missing blob is NOT_FOUND on get (None on head; nothing on delete). A
    missing container, refused credentials or permissions are UNAVAILABLE: an operator must act. Other 4xx describe
    the request and are BAD_REQUEST. A blob whose bytes do not match their Content-MD5 is CORRUPT_DATA."""

    def __init__(self, container: ContainerClient | None, loop: trio_asyncio.TrioEventLoop, name: str, *,
                 prefix: str = "", **retry_bounds: Any):
        if prefix:
            check_prefix(prefix)
            if not prefix.endswith("/"):
                raise RocketError(Code.CONFIG_INVALID, f"Azure key prefix {prefix!r} must end with '/'")
        self.retries = Retries(f"Azure container {name!r}", self._classify, **retry_bounds)
        self._container = container
        self._loop = loop
        self.name = name
        self.prefix = prefix

    @property
    def container(self) -> ContainerClient:
        if self._closed or self._container is None:
            raise RocketError(Code.UNAVAILABLE, f"the Azure store for container {self.name!r} is closed")
        return self._container

    async def put(self, key: str, data: bytes, md5: str | None = None) -> ObjectInfo:
        check_key(key)
        data = check_data(key, data)
        digest = data_md5(key, data, md5)
        container = self.container

        async def upload() -> object:
            # validate_content: the service checks the body against its MD5; content_md5: kept as the blob's own
            # (what head, list and whole gets compare with), even for a blob uploaded in blocks.
            return await container.upload_blob(self.prefix + key, data, overwrite=True, validate_content=True,
                                               content_settings=ContentSettings(content_md5=bytearray(digest)))

        await self._call("put", key, upload)
        return ObjectInfo(key, len(data), digest.hex())

    async def get(self, key: str, start: int = 0, end: int | None = None) -> bytes:
        check_key(key)
        check_range(key, start, end)
        if end == start:  # HTTP cannot ask for zero bytes; the blob must still exist
            if await self.head(key) is None:
                raise RocketError(Code.NOT_FOUND, f"no object {key!r} in Azure container {self.name!r}")
            return b""
        container = self.container
        ranged = start > 0 or end is not None

        async def download() -> tuple[bytes, str]:
            stream = await container.download_blob(self.prefix + key, offset=start if ranged else None,
                                                   length=None if end is None else end - start)
            return await stream.readall(), _md5_hex(stream.properties)

        try:
            data, md5 = await self._call("get", key, download)
        except RocketError as error:
            if error.code == Code.OFFSET_OUT_OF_RANGE:
                return b""  # the range starts at or past the end: the blob exists, like a slice past it
            raise
        if not ranged and md5 and hashlib.md5(data).hexdigest() != md5:  # the whole blob: checked
            raise RocketError(Code.CORRUPT_DATA, f"Azure blob {key!r} in container {self.name!r} does not match its "
                                                 f"Content-MD5 {md5}")
        return data

    async def head(self, key: str) -> ObjectInfo | None:
        check_key(key)
        blob = self.container.get_blob_client(self.prefix + key)
        try:
            properties = await self._call("head", key, blob.get_blob_properties)
        except RocketError as error:
            if error.code == Code.NOT_FOUND:
                return None
            raise
        return ObjectInfo(key, properties.size, _md5_hex(properties) or properties.etag.strip('"').lower())

    async def list(self, prefix: str = "") -> list[ObjectInfo]:
        check_prefix(prefix)
        container = self.container

        async def list_blobs() -> list[ObjectInfo]:
            found = []
            async for blob in container.list_blobs(name_starts_with=self.prefix + prefix):
                found.append(ObjectInfo(blob.name[len(self.prefix):], blob.size,
                                        _md5_hex(blob) or blob.etag.strip('"').lower()))
                if len(found) > list_objects_max:
                    raise RocketError(Code.OVERLOADED, f"more than {list_objects_max} objects start with {prefix!r} "
                                                       f"in Azure container {self.name!r}; list a narrower prefix")
            return sorted(found, key=lambda info: info.key)

        return await self._call("list", prefix, list_blobs)

    async def delete(self, key: str) -> None:
        check_key(key)
        container = self.container
        try:
            await self._call("delete", key, lambda: container.delete_blob(self.prefix + key))
        except RocketError as error:
            if error.code != Code.NOT_FOUND:
                raise

    async def _call(self, operation: str, key: str, call: Callable[[], Awaitable[Result]]) -> Result:
        return await self.retries.run(operation, key, trio_asyncio.aio_as_trio(call, loop=self._loop))

    def _classify(self, operation: str, key: str, error: BaseException) -> str | None:
        """A description of a transient error, to retry; raises RocketError for all others."""
        where = f"{operation} {key!r} in Azure container {self.name!r}"
        if isinstance(error, TRANSIENT_EXCEPTIONS):
            return f"{type(error).__name__}: {error}"
        if isinstance(error, ClientAuthenticationError):
            raise RocketError(Code.UNAVAILABLE, f"{where}: Azure refused the credentials ({_first_line(error)}); "
                                                "check the connection string or account key") from None
        if isinstance(error, ResourceNotFoundError):
            if getattr(error, "error_code", "") == "ContainerNotFound":
                raise RocketError(Code.UNAVAILABLE, f"{where}: the container does not exist") from None
            raise RocketError(Code.NOT_FOUND, f"{where}: no such object") from None
        if isinstance(error, HttpResponseError):
            status = error.status_code or 0
            code = getattr(error, "error_code", "") or ""
            code = str(getattr(code, "value", code))  # the SDK's StorageErrorCode, a str enum: its value
            if status >= 500 or status in (408, 429):
                return f"HTTP {status} {code}: {_first_line(error)}"
            if status == 416 or code == "InvalidRange":
                raise RocketError(Code.OFFSET_OUT_OF_RANGE, f"{where}: range not satisfiable") from None
            if code in ("Md5Mismatch", "InvalidMd5"):
                raise RocketError(Code.CORRUPT_DATA, f"{where}: Azure refused the upload, its Content-MD5 does not "
                                                     f"match the bytes it received ({code})") from None
            if status in (401, 403):
                raise RocketError(Code.UNAVAILABLE, f"{where}: Azure refused the request ({code}); check the "
                                                    "credentials and the container's permissions") from None
            raise RocketError(Code.BAD_REQUEST, f"{where}: Azure refused the request with HTTP {status} {code}: "
                                                f"{_first_line(error)}") from None
        if isinstance(error, AzureError):
            raise RocketError(Code.UNAVAILABLE, f"{where}: {type(error).__name__}: {_first_line(error)}") from None
        return None


def _md5_hex(properties: Any) -> str:
    """The blob's Content-MD5 as lowercase hex; '' when it has none."""
    md5 = properties.content_settings.content_md5
    return bytes(md5).hex() if md5 else ""


def _first_line(error: BaseException) -> str:
    return (str(error).strip().splitlines() or [type(error).__name__])[0]


@asynccontextmanager
async def open_azure_store(container: str, *, connection_string: str | None = None, account_url: str | None = None,
                           credential: Any = None, prefix: str = "",
                           **retry_bounds: Any) -> AsyncIterator[AzureBlobStore]:
    """Yield an AzureBlobStore on container, closing its client on exit. The account: a connection string (as the
    Azure portal and Azurite give it), or account_url with a credential (an account key, a SAS token, or an
    azure-identity credential; none for a URL that carries a SAS). In a trio-asyncio loop if the caller runs one,
    else one opened for the store's lifetime. Azure's own retries are off: Retries bounds them (retry_bounds)."""
    if not container or not isinstance(container, str):
        raise RocketError(Code.CONFIG_INVALID, f"Azure container name must be a non-empty string, not {container!r}")
    if bool(connection_string) == bool(account_url):
        raise RocketError(Code.CONFIG_INVALID, "give an Azure connection string or an account URL, not both or none")
    async with asyncio_loop() as loop:
        store = AzureBlobStore(None, loop, container, prefix=prefix, **retry_bounds)
        options = {"retry_total": 0, "connection_timeout": s3_connect_timeout_s,
                   "read_timeout": s3_read_timeout_s}

        async def open_client() -> BlobServiceClient:
            if connection_string:
                return BlobServiceClient.from_connection_string(connection_string, **options)
            return BlobServiceClient(str(account_url), credential=credential, **options)

        try:
            service = await trio_asyncio.aio_as_trio(open_client, loop=loop)()
        except (ValueError, AzureError) as error:
            raise RocketError(Code.CONFIG_INVALID, f"cannot create an Azure Blob client for container "
                                                   f"{container!r}: {_first_line(error)}") from None
        store._container = service.get_container_client(container)
        store._close = trio_asyncio.aio_as_trio(service.close, loop=loop)
        try:
            yield store
        finally:
            await store.aclose()

