"""HdfsObjectStore: the tier on HDFS through its WebHDFS REST API (namenode redirects to datanodes), with httpx's
AsyncClient running natively under Trio. Transient failures are retried (Retries), then UNAVAILABLE; no httpx
exception escapes."""

from __future__ import annotations

import hashlib
import json
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any, TypeVar
from urllib.parse import quote

try:
    import httpx
except ImportError as missing:  # an extra: pip install 'rocket[hdfs]'
    raise ImportError(f"the hdfs tier backend needs pip install 'rocket[hdfs]': {missing}") from missing
import trio

from rocket.errors import Code, RocketError
# HDFS has no limits of its own: its calls share the S3 backend's retry, timeout and pool bounds.
from rocket.limits.tier import s3_connect_timeout_s, s3_connections_max, s3_read_timeout_s
from rocket.tier.objectstore import (ObjectInfo, check_data, check_key, check_prefix, check_range, data_md5,
                                     list_objects_max)
from rocket.tier.retries import ClosingStore, Retries

Result = TypeVar("Result")
MD5_XATTR = "user.rocket.md5"  # the object's MD5, set on the temporary file before it is renamed onto the key
TEMPORARY_PREFIX = ".rocket-put-"  # hidden names in the key's directory: no key has a segment starting with '.'
TRANSIENT_REMOTE = frozenset({"StandbyException", "RetriableException", "SafeModeException",
                              "ConnectException", "SocketTimeoutException"})
CREDENTIAL_REMOTE = frozenset({"AccessControlException", "SecurityException", "AuthorizationException",
                               "InvalidToken", "AuthenticationException"})
WHOLE_READ_TRIES = 3  # a whole get whose bytes and MD5 came from different versions (a put between) is read again


class WebHdfsError(Exception):
    """A WebHDFS answer that is not the one expected: its HTTP status and the RemoteException it carried, if any."""

    def __init__(self, status: int, exception: str, message: str):
        super().__init__(f"HTTP {status} {exception}: {message}" if exception else f"HTTP {status}: {message}")
        self.status = status
        self.exception = exception
        self.message = message


class HdfsObjectStore(ClosingStore):
    """An ObjectStore on one HDFS directory (root), through WebHDFS. Open it with open_hdfs_store().

    A key is the file root/key. put writes a hidden temporary file in the key's directory (CREATE, redirected to a
    datanode), sets its MD5 as the xattr user.rocket.md5, and renames it onto the key with renameoptions=OVERWRITE:
    one namenode operation, so readers see the old object or the new one, never part of one. etag is that MD5.

    Error mapping: StandbyException, RetriableException, SafeModeException, 5xx, 408/429, timeouts and connection
    errors are retried, then UNAVAILABLE naming the operation and key. FileNotFoundException is NOT_FOUND on get
    (None on head; nothing on delete). AccessControlException, SecurityException and 401/403 without another
    exception are UNAVAILABLE: an operator must act. Other 4xx are BAD_REQUEST. A whole get whose bytes do not match
    the stored MD5, or a put whose file has not the size sent, is CORRUPT_DATA."""

    def __init__(self, client: httpx.AsyncClient | None, namenode_url: str, *, root: str = "/rocket",
                 user: str | None = None, **retry_bounds: Any):
        self.namenode_url = namenode_url.rstrip("/")
        self.root = _check_root(root)
        self.user = user
        self.retries = Retries(f"HDFS {self.namenode_url}{self.root}", self._classify, **retry_bounds)
        self._client = client
        self._close = client.aclose if client is not None else None

    async def put(self, key: str, data: bytes, md5: str | None = None) -> ObjectInfo:
        check_key(key)
        data = check_data(key, data)
        md5 = data_md5(key, data, md5).hex()
        directory, _, _ = key.rpartition("/")
        temporary = f"{directory}/{TEMPORARY_PREFIX}{uuid.uuid4().hex}" if directory else \
            f"{TEMPORARY_PREFIX}{uuid.uuid4().hex}"

        async def write_temporary() -> None:
            # One try is the whole sequence: CREATE overwrite=true makes a new file (no xattr), so a retry starts over.
            await self._create(temporary, data)
            await self._request("PUT", temporary, "SETXATTR", {"xattr.name": MD5_XATTR, "xattr.value": "0x" + md5,
                                                               "flag": "CREATE"}, empty_ok=True)
            status = await self._file_status(temporary)
            if int(status.get("length", -1)) != len(data):
                raise RocketError(Code.CORRUPT_DATA, f"HDFS put {key!r}: the written file holds "
                                                     f"{status.get('length')} bytes, not the {len(data)} sent")

        renamed = False
        try:
            await self._call("put", key, write_temporary)
            try:
                await self._call("put", key, lambda: self._rename_onto(temporary, key))
            except RocketError as error:
                if error.code != Code.NOT_FOUND:
                    raise
                # The temporary file is gone: a rename whose answer was lost moved it, if the key holds it now.
                info = await self.head(key)
                if info is None or info.etag != md5 or info.size != len(data):
                    raise RocketError(Code.UNAVAILABLE, f"HDFS put {key!r}: the temporary file vanished before it "
                                                        f"was renamed onto the key ({error.message})") from None
            renamed = True
        finally:
            if not renamed:
                await self._discard(temporary)
        return ObjectInfo(key, len(data), md5)

    async def get(self, key: str, start: int = 0, end: int | None = None) -> bytes:
        check_key(key)
        check_range(key, start, end)
        if start > 0 or end is not None:
            return await self._call("get", key, lambda: self._get_range(key, start, end))
        for _ in range(WHOLE_READ_TRIES):
            expected, data = await self._call("get", key, lambda: self._get_whole(key))
            if not expected or hashlib.md5(data).hexdigest() == expected:
                return data
            # The bytes may belong to a put that replaced the object after its MD5 was read: read the MD5 again.
            if await self._call("get", key, lambda: self._md5(key)) == expected:
                raise RocketError(Code.CORRUPT_DATA, f"HDFS object {key!r} under {self.root!r} does not match its "
                                                     f"MD5 {expected}")
        raise RocketError(Code.UNAVAILABLE, f"HDFS get {key!r} under {self.root!r}: the object changed during each "
                                            f"of {WHOLE_READ_TRIES} reads")

    async def _get_whole(self, key: str) -> tuple[str, bytes]:
        expected = await self._md5(key)  # FileNotFoundException when there is no such path
        return expected, await self._open(key, {})

    async def _get_range(self, key: str, start: int, end: int | None) -> bytes:
        status = await self._file_status(key)
        if status.get("type") != "FILE":
            raise WebHdfsError(404, "FileNotFoundException", f"{self._path(key)} is not a file")
        size = int(status.get("length", 0))
        stop = size if end is None else min(end, size)
        if start >= stop:
            return b""  # past the end (or an empty range): the object exists, like a slice past it
        return await self._open(key, {"offset": str(start), "length": str(stop - start)})

    async def head(self, key: str) -> ObjectInfo | None:
        check_key(key)

        async def head_file() -> ObjectInfo | None:
            status = await self._file_status(key)
            if status.get("type") != "FILE":
                return None  # a directory: other keys start with key + '/'
            return ObjectInfo(key, int(status.get("length", 0)), await self._md5(key))

        try:
            return await self._call("head", key, head_file)
        except RocketError as error:
            if error.code == Code.NOT_FOUND:
                return None
            raise

    async def list(self, prefix: str = "") -> list[ObjectInfo]:
        check_prefix(prefix)
        directory, _, name_prefix = prefix.rpartition("/")
        found: list[ObjectInfo] = []
        # (directory relative to root, name prefix its entries must have): a string prefix, not a directory.
        pending: list[tuple[str, str]] = [(directory, name_prefix)]
        directories = 0
        while pending:
            where, start = pending.pop()
            directories += 1
            if directories > list_objects_max:
                raise RocketError(Code.OVERLOADED, f"more than {list_objects_max} directories under {prefix!r} in "
                                                   f"HDFS {self.root!r}; list a narrower prefix")
            for entry in await self._list_directory(prefix, where):
                name = str(entry.get("pathSuffix", ""))
                if not name or name.startswith(".") or not name.startswith(start):
                    continue  # the path itself (a file), a temporary file, or outside the prefix
                relative = f"{where}/{name}" if where else name
                if entry.get("type") == "DIRECTORY":
                    pending.append((relative, ""))
                elif entry.get("type") == "FILE":
                    found.append(ObjectInfo(relative, int(entry.get("length", 0)), ""))
                if len(found) > list_objects_max:
                    raise RocketError(Code.OVERLOADED, f"more than {list_objects_max} objects start with {prefix!r} "
                                                       f"in HDFS {self.root!r}; list a narrower prefix")
        found.sort(key=lambda info: info.key)
        listed = []
        for info in found:
            try:
                md5 = await self._call("list", info.key, lambda: self._md5(info.key))
            except RocketError as error:
                if error.code == Code.NOT_FOUND:
                    continue  # deleted since its directory was listed
                raise
            listed.append(ObjectInfo(info.key, info.size, md5))
        return listed

    async def _list_directory(self, prefix: str, where: str) -> list[dict[str, Any]]:
        async def list_status() -> list[dict[str, Any]]:
            answer = await self._request("GET", where, "LISTSTATUS", {})
            return list(answer["FileStatuses"]["FileStatus"])

        try:
            return await self._call("list", prefix, list_status)
        except RocketError as error:
            if error.code == Code.NOT_FOUND:
                return []  # no such directory: nothing starts with the prefix
            raise

    async def delete(self, key: str) -> None:
        check_key(key)
        try:
            # recursive=false: a directory with other keys under it is not this object, and stays.
            await self._call("delete", key, lambda: self._request("DELETE", key, "DELETE", {"recursive": "false"}))
        except RocketError as error:
            if error.code != Code.NOT_FOUND:
                raise

    async def _discard(self, relative: str) -> None:
        """Remove a temporary file of a failed put, best effort: a leftover is hidden from list."""
        if self._closed:
            return
        with trio.move_on_after(s3_read_timeout_s):
            try:
                await self._request("DELETE", relative, "DELETE", {"recursive": "false"})
            except Exception:  # noqa: BLE001 - best effort; the put's own error is the one that matters
                pass

    async def _create(self, relative: str, data: bytes) -> None:
        """CREATE: the namenode redirects (307) to a datanode, which takes the bytes (201)."""
        location = await self._redirect("PUT", relative, "CREATE", {"overwrite": "true"})
        response = await self.client.put(location, content=data,
                                         headers={"Content-Type": "application/octet-stream"})
        if response.status_code not in (200, 201):
            raise _failure(response)

    async def _open(self, relative: str, params: dict[str, str]) -> bytes:
        """OPEN: the namenode redirects (307) to a datanode, which sends the bytes (200)."""
        location = await self._redirect("GET", relative, "OPEN", params)
        response = await self.client.get(location)
        if response.status_code != 200:
            raise _failure(response)
        return response.content

    async def _redirect(self, method: str, relative: str, op: str, params: dict[str, str]) -> str:
        response = await self.client.request(method, self._url(relative), params=self._params(op, params))
        if response.status_code != 307:
            raise _failure(response)
        location = response.headers.get("Location", "")
        if not location.startswith(("http://", "https://")):
            raise WebHdfsError(307, "", f"{op} redirected to {location[:200]!r}, not to an HTTP datanode")
        return location

    async def _rename_onto(self, temporary: str, key: str) -> None:
        answer = await self._request("PUT", temporary, "RENAME", {"destination": self._path(key),
                                                                 "renameoptions": "OVERWRITE"}, empty_ok=True)
        if answer.get("boolean") is False:
            raise WebHdfsError(403, "IOException", f"RENAME of {temporary!r} onto {key!r} returned false")

    async def _file_status(self, relative: str) -> dict[str, Any]:
        return dict((await self._request("GET", relative, "GETFILESTATUS", {}))["FileStatus"])

    async def _md5(self, relative: str) -> str:
        """The MD5 put stored with the file, as lowercase hex; '' for a file written by something else."""
        answer = await self._request("GET", relative, "GETXATTRS", {"encoding": "hex"})
        for xattr in answer.get("XAttrs") or []:
            if xattr.get("name") == MD5_XATTR:
                value = str(xattr.get("value") or "").lower()
                return value[2:] if value.startswith("0x") else ""
        return ""

    async def _request(self, method: str, relative: str, op: str, params: dict[str, str], *,
                       empty_ok: bool = False) -> dict[str, Any]:
        """A namenode operation answered 200 with JSON (or, when empty_ok, with nothing: {})."""
        response = await self.client.request(method, self._url(relative), params=self._params(op, params))
        if response.status_code != 200:
            raise _failure(response)
        if empty_ok and not response.content.strip():
            return {}
        answer = response.json()
        if not isinstance(answer, dict):
            raise json.JSONDecodeError(f"{op} answered with JSON that is not an object", response.text[:200], 0)
        return answer

    @property
    def client(self) -> httpx.AsyncClient:
        if self._closed or self._client is None:
            raise RocketError(Code.UNAVAILABLE, f"the HDFS store for {self.namenode_url}{self.root} is closed")
        return self._client

    def _path(self, relative: str) -> str:
        return f"{self.root}/{relative}" if relative else self.root

    def _url(self, relative: str) -> str:
        path = "/".join(quote(segment, safe="") for segment in self._path(relative).split("/"))
        return f"{self.namenode_url}/webhdfs/v1{path}"

    def _params(self, op: str, params: dict[str, str]) -> dict[str, str]:
        params = {"op": op, **params}
        if self.user:
            params["user.name"] = self.user
        return params

    async def _call(self, operation: str, key: str, call: Callable[[], Awaitable[Result]]) -> Result:
        if self._closed:
            raise RocketError(Code.UNAVAILABLE, f"the HDFS store for {self.namenode_url}{self.root} is closed "
                                                f"({operation} {key!r})")
        return await self.retries.run(operation, key, call)

    def _classify(self, operation: str, key: str, error: BaseException) -> str | None:
        """A description of a transient error, to retry; raises RocketError for all others."""
        where = f"{operation} {key!r} in HDFS {self.namenode_url}{self.root}"
        if isinstance(error, RocketError):
            return None  # ours (closed, CORRUPT_DATA): leaves as it is
        if isinstance(error, (httpx.TransportError, OSError, json.JSONDecodeError, KeyError, TypeError,
                              ValueError)):
            # Cannot connect, reset, timeouts, a truncated answer, or one that is not WebHDFS JSON (a proxy's page).
            return f"{type(error).__name__}: {error}"
        if isinstance(error, (httpx.HTTPError, httpx.InvalidURL, httpx.StreamError, httpx.CookieConflict)):
            raise RocketError(Code.UNAVAILABLE, f"{where}: {type(error).__name__}: {error}") from None
        if not isinstance(error, WebHdfsError):
            return None
        status, exception = error.status, error.exception
        if exception in TRANSIENT_REMOTE or status >= 500 or status in (408, 429) or status < 400:
            return str(error)
        if exception == "FileNotFoundException":
            raise RocketError(Code.NOT_FOUND, f"{where}: no such object ({error.message})") from None
        if operation == "delete" and exception == "PathIsNotEmptyDirectoryException":
            raise RocketError(Code.NOT_FOUND, f"{where}: a directory, not an object") from None
        if exception in CREDENTIAL_REMOTE or (status in (401, 403) and not exception) or status == 404:
            # 404 without FileNotFoundException: no WebHDFS at that address (disabled, a wrong URL).
            raise RocketError(Code.UNAVAILABLE, f"{where}: HDFS refused the request ({error}); check the user, "
                                                "the permissions of the root directory and the namenode URL") from None
        raise RocketError(Code.BAD_REQUEST, f"{where}: HDFS refused the request: {error}") from None


def _failure(response: httpx.Response) -> WebHdfsError:
    """The WebHdfsError of an unexpected answer, with its RemoteException when it carries one."""
    exception, message = "", response.text[:300]
    try:
        remote = response.json()["RemoteException"]
        exception = str(remote.get("exception") or str(remote.get("javaClassName", "")).rpartition(".")[2])
        message = str(remote.get("message", ""))[:300]
    except (ValueError, KeyError, TypeError, AttributeError):
        pass
    return WebHdfsError(response.status_code, exception, message)


def _check_root(root: str) -> str:
    if not isinstance(root, str) or not root.startswith("/"):
        raise RocketError(Code.CONFIG_INVALID, f"HDFS root must be an absolute path, not {root!r}")
    stripped = root.rstrip("/")
    if stripped:
        try:
            check_prefix(stripped[1:] + "/")
        except RocketError as error:
            raise RocketError(Code.CONFIG_INVALID, f"HDFS root {root!r}: {error.message}") from None
    return stripped


@asynccontextmanager
async def open_hdfs_store(namenode_url: str, *, root: str = "/rocket", user: str | None = None,
                          **retry_bounds: Any) -> AsyncIterator[HdfsObjectStore]:
    """Yield an HdfsObjectStore on the directory root of the HDFS whose namenode serves WebHDFS at namenode_url
    (http://host:9870), closing its client on exit. user is sent as user.name (simple authentication); without it
    the namenode's default web user applies. retry_bounds go to Retries."""
    if not isinstance(namenode_url, str) or not namenode_url.startswith(("http://", "https://")):
        raise RocketError(Code.CONFIG_INVALID, f"the namenode URL must be http:// or https://, not {namenode_url!r}")
    if user is not None and (not isinstance(user, str) or not user):
        raise RocketError(Code.CONFIG_INVALID, f"HDFS user must be a non-empty string, not {user!r}")
    store = HdfsObjectStore(None, namenode_url, root=root, user=user, **retry_bounds)  # checks before connecting
    # Per request: connects and socket reads are bounded, a whole transfer is not (objects reach 5 GiB).
    timeout = httpx.Timeout(connect=s3_connect_timeout_s, read=s3_read_timeout_s, write=s3_read_timeout_s,
                            pool=s3_read_timeout_s)
    limits = httpx.Limits(max_connections=s3_connections_max, max_keepalive_connections=s3_connections_max)
    # Redirects are followed by hand: a CREATE must not send its bytes to the namenode.
    store._client = client = httpx.AsyncClient(timeout=timeout, limits=limits, follow_redirects=False, trust_env=True)
    store._close = client.aclose
    try:
        yield store
    finally:
        await store.aclose()
