"""TCP frame codec, sans I/O: feed bytes in, take whole frames out; encode frames to bytes.

Frame: length u32 | version u8 | kind u8 | serde u8 | flags u8 | request_id u64 | method_len u16 | method | body
(length counts every byte after itself; integers are big-endian).
"""

from __future__ import annotations

import dataclasses
import enum
import struct

from rocket import limits
from rocket.errors import Code, RocketError

VERSION = 1
_header = struct.Struct(">IBBBBQH")
HEADER_BYTES = _header.size
_after_length = HEADER_BYTES - 4


class Kind(enum.IntEnum):
    REQUEST = 1
    RESPONSE = 2
    ERROR = 3
    STREAM_ITEM = 4
    STREAM_END = 5
    CANCEL = 6


@dataclasses.dataclass(slots=True)
class Frame:
    kind: Kind
    serde: int
    request_id: int
    method: str
    body: bytes


class FrameError(RocketError):
    """The framing is broken; after this the connection cannot be trusted and is closed."""

    def __init__(self, code: Code, message: str, request_id: int = 0):
        super().__init__(code, message)
        self.request_id = request_id


def encode(kind: Kind, serde: int, request_id: int, body: bytes | memoryview = b"", method: str = "") -> bytes:
    method_bytes = method.encode("ascii")
    length = _after_length + len(method_bytes) + len(body)
    head = _header.pack(length, VERSION, kind, serde, 0, request_id, len(method_bytes))
    return b"".join((head, method_bytes, body))


class FrameDecoder:
    """Accumulates received bytes and yields whole frames; raises FrameError on broken framing."""

    def __init__(self, frame_bytes_max: int = limits.frame_bytes_max):
        self._buffer = bytearray()
        self._frame_bytes_max = frame_bytes_max

    def feed(self, data: bytes | bytearray | memoryview) -> None:
        self._buffer += data

    @property
    def buffered_bytes(self) -> int:
        return len(self._buffer)

    def next_frame(self) -> Frame | None:
        buffer = self._buffer
        if len(buffer) < HEADER_BYTES:
            return None
        length, version, kind, serde, _flags, request_id, method_len = _header.unpack_from(buffer)
        if version != VERSION:
            raise FrameError(Code.BAD_FRAME, f"unknown frame version {version}")
        if length > self._frame_bytes_max:
            raise FrameError(
                Code.FRAME_TOO_LARGE, f"frame of {length} bytes exceeds the limit of {self._frame_bytes_max}", request_id
            )
        if length < _after_length + method_len:
            raise FrameError(Code.BAD_FRAME, f"frame length {length} is shorter than its header", request_id)
        if kind not in Kind._value2member_map_:
            raise FrameError(Code.BAD_FRAME, f"unknown frame kind {kind}", request_id)
        if method_len > limits.method_name_bytes_max:
            raise FrameError(Code.BAD_FRAME, f"method name of {method_len} bytes is too long", request_id)
        end = 4 + length
        if len(buffer) < end:
            return None
        method_end = HEADER_BYTES + method_len
        try:
            method = buffer[HEADER_BYTES:method_end].decode("ascii")
        except UnicodeDecodeError:
            raise FrameError(Code.BAD_FRAME, "method name is not ASCII", request_id) from None
        body = bytes(buffer[method_end:end])
        del buffer[:end]
        return Frame(Kind(kind), serde, request_id, method, body)
