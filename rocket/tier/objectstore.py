"""The ObjectStore interface of the tier: whole-object put, ranged get, head, list and delete by key, every method
async under Trio. Keys are '/'-separated relative names, checked here the same way for every backend (check_key), so
that a key that works on a local directory works on S3 and back."""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from rocket.errors import Code, RocketError

from rocket.limits.tier import (list_objects_max, object_bytes_max, object_key_bytes_max,  # noqa: F401
                                object_key_segment_bytes_max)


MD5_HEX = re.compile(r"[0-9a-f]{32}")


@dataclass(frozen=True, slots=True)
class ObjectInfo:
    """One stored object. etag is the lowercase hex MD5 of the object's bytes on both backends,
    except for S3 objects whose ETag is not an MD5 (multipart or SSE-KMS), where it is S3's ETag as is."""

    key: str
    size: int
    etag: str


@runtime_checkable
class ObjectStore(Protocol):
    """Objects by key. Errors are RocketError: BAD_REQUEST for a bad key or range, NOT_FOUND for a
    missing object on get, CORRUPT_DATA when bytes fail their checksum, UNAVAILABLE when the backend is."""

    async def put(self, key: str, data: bytes, md5: str | None = None) -> ObjectInfo:
        """Store data under key, replacing any object there, atomically: readers see all or nothing. md5 is the
        data's MD5 (hex) when the caller has it, so the store need not compute it again: a wrong one is CORRUPT_DATA,
        from the put where the service checks bodies against it, else from the whole read."""
        ...

    async def get(self, key: str, start: int = 0, end: int | None = None) -> bytes:
        """The bytes data[start:end] of the object (end exclusive, None = to the end), clamped like a
        Python slice: a range past the end returns fewer bytes, or none. A whole-object read is checked
        against the object's checksum."""
        ...

    async def head(self, key: str) -> ObjectInfo | None:
        """The object's info, or None when there is no object under key."""
        ...

    async def list(self, prefix: str = "") -> list[ObjectInfo]:
        """Every object whose key starts with prefix (a string prefix, not a directory), sorted by key."""
        ...

    async def delete(self, key: str) -> None:
        """Remove the object; removing a missing object is not an error."""
        ...

    async def aclose(self) -> None:
        """Release the store's resources; later calls fail with UNAVAILABLE."""
        ...


def check_key(key: str) -> str:
    """key if it is a valid object key, else RocketError(BAD_REQUEST) saying what is wrong."""
    if not isinstance(key, str) or not key:
        raise RocketError(Code.BAD_REQUEST, f"object key must be a non-empty string, not {key!r}")
    _check_name(key, "object key")
    if key.endswith("/"):
        raise RocketError(Code.BAD_REQUEST, f"object key {key!r} ends with '/'")
    return key


def check_prefix(prefix: str) -> str:
    """prefix if it can start a valid key ('' lists everything), else RocketError(BAD_REQUEST)."""
    if not isinstance(prefix, str):
        raise RocketError(Code.BAD_REQUEST, f"object prefix must be a string, not {prefix!r}")
    if prefix:
        _check_name(prefix, "object prefix")
    return prefix


def check_range(key: str, start: int, end: int | None) -> None:
    if not isinstance(start, int) or start < 0:
        raise RocketError(Code.BAD_REQUEST, f"get {key!r}: range start must be an integer >= 0, not {start!r}")
    if end is not None and (not isinstance(end, int) or end < start):
        raise RocketError(Code.BAD_REQUEST, f"get {key!r}: range end must be None or an integer >= start "
                                            f"({start}), not {end!r}")


def check_data(key: str, data: bytes) -> bytes:
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise RocketError(Code.BAD_REQUEST, f"put {key!r}: data must be bytes, not {type(data).__name__}")
    data = bytes(data) if not isinstance(data, bytes) else data
    if len(data) > object_bytes_max:
        raise RocketError(Code.BAD_REQUEST, f"put {key!r}: {len(data)} bytes is more than the "
                                            f"{object_bytes_max} an object may hold")
    return data


def data_md5(key: str, data: bytes, md5: str | None) -> bytes:
    """The data's MD5 digest: md5 (hex) as given, or computed."""
    if md5 is None:
        return hashlib.md5(data).digest()
    if not isinstance(md5, str) or not MD5_HEX.fullmatch(md5):
        raise RocketError(Code.BAD_REQUEST, f"put {key!r}: md5 must be 32 lowercase hex digits, not {md5!r}")
    return bytes.fromhex(md5)


def _check_name(name: str, what: str) -> None:
    if len(name.encode("utf-8", "surrogatepass")) > object_key_bytes_max:
        raise RocketError(Code.BAD_REQUEST, f"{what} is longer than {object_key_bytes_max} bytes: {name[:64]!r}...")
    if name.startswith("/"):
        raise RocketError(Code.BAD_REQUEST, f"{what} {name!r} starts with '/'; keys are relative")
    if any(ord(character) < 0x20 or character in "\x7f\\" for character in name):
        raise RocketError(Code.BAD_REQUEST, f"{what} {name!r} holds a control character or a backslash")
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        raise RocketError(Code.BAD_REQUEST, f"{what} {name!r} is not valid Unicode text") from None
    segments = name.split("/")
    last = len(segments) - 1
    for index, segment in enumerate(segments):
        if segment == "" and index == last:
            continue  # a trailing '/' (allowed in prefixes; check_key refuses it for keys)
        if segment in ("", ".", ".."):
            raise RocketError(Code.BAD_REQUEST, f"{what} {name!r} has an empty, '.' or '..' segment")
        if segment.startswith("."):
            # The local store keeps its temporary files under hidden names; keys never look like them.
            raise RocketError(Code.BAD_REQUEST, f"{what} {name!r} has a segment starting with '.'")
        if len(segment.encode("utf-8")) > object_key_segment_bytes_max:
            raise RocketError(Code.BAD_REQUEST, f"{what} {name!r} has a segment longer than "
                                                f"{object_key_segment_bytes_max} bytes")
