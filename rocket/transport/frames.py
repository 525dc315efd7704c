"""TCP frame codec, sans I/O: feed bytes in, take whole frames out; encode frames to buffers. The layout is Frame's."""

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
_message_length = struct.Struct(">I")
FLAG_ATTACHMENT = 0x01
FLAG_ATTACHMENTS = 0x02
FLAGS_KNOWN = FLAG_ATTACHMENT | FLAG_ATTACHMENTS


class Kind(enum.IntEnum):
    REQUEST = 1
    RESPONSE = 2
    ERROR = 3
    STREAM_ITEM = 4
    STREAM_END = 5
    CANCEL = 6
    POST = 7  # a request nobody answers, errors included: served in the read loop (Raft's messages between nodes)


POST_SINCE_SCHEMA = 4  # the first schema version (serde/schema.py) whose servers take POST frames


@dataclasses.dataclass(slots=True)
class Frame:
    """length u32 | version u8 | kind u8 | serde u8 | flags u8 | request_id u64 | method_len u16 | method | body
    (length counts every byte after itself; integers are big-endian). With FLAG_ATTACHMENT the body is
    message_len u32 | message | attachment: raw bytes (a produce batch) that bypass the serde, uncopied. With
    FLAG_ATTACHMENTS it is message_len u32 | message | count u32 | count x length u32 | the attachments back to
    back (the batches of a pull response)."""
    kind: Kind
    serde: int
    request_id: int
    method: str
    body: bytes | memoryview
    attachment: memoryview | list[memoryview] | None = None  # a list with FLAG_ATTACHMENTS


class FrameError(RocketError):
    """The framing is broken; after this the connection cannot be trusted and is closed."""

    def __init__(self, code: Code, message: str, request_id: int = 0):
        super().__init__(code, message)
        self.request_id = request_id


def encode_parts(kind: Kind, serde: int, request_id: int, body: bytes | memoryview = b"", method: str = "",
                 attachment: bytes | memoryview | list[bytes | memoryview] | None = None) -> list[bytes | memoryview]:
    """A frame as buffers to send one after another, so that large attachments are never joined; a small frame
    without attachments is one buffer (its copy costs less than a buffer of its own). A list of attachments travels
    with their lengths (FLAG_ATTACHMENTS)."""
    method_bytes = method.encode("ascii")
    if attachment is None:
        header = _header.pack(_after_length + len(method_bytes) + len(body), VERSION, kind, serde, 0, request_id,
                              len(method_bytes))
        if len(body) <= limits.frame_joined_bytes_max:
            return [b"".join((header, method_bytes, body))]
        return [header, method_bytes, body]
    parts: list[bytes | memoryview] = [b"", method_bytes]
    if isinstance(attachment, list):
        flags = FLAG_ATTACHMENTS
        lengths = struct.pack(f">{len(attachment) + 1}I", len(attachment), *map(len, attachment))
        parts += [_message_length.pack(len(body)), body, lengths, *attachment]
    else:
        flags = FLAG_ATTACHMENT
        parts += [_message_length.pack(len(body)), body, attachment]
    length = _after_length + sum(map(len, parts))
    parts[0] = _header.pack(length, VERSION, kind, serde, flags, request_id, len(method_bytes))
    return parts


def encode(kind: Kind, serde: int, request_id: int, body: bytes | memoryview = b"", method: str = "",
           attachment: bytes | memoryview | None = None) -> bytes:
    return b"".join(encode_parts(kind, serde, request_id, body, method, attachment))


def _grown(held: int, end: int) -> int:
    """The size of a large frame's next buffer, of a frame end bytes long, once held bytes of it filled the last."""
    size = held * limits.frame_buffer_growth
    return end if end - size <= limits.frame_buffer_slack_bytes else size


class FrameDecoder:
    """Accumulates received bytes and yields whole frames; raises FrameError on broken framing.

    With reuse, large frames are received into the last few buffers again once nothing holds a view of
    them any more (a pull response's batches are views into its frame until they are decoded). A new
    buffer is zeroed, and on a VM faulted in page by page: 6-9% of a consumer's profile. A client keeps
    them; a server, with a connection per producer, does not.

    Without reuse (a server's), memory follows the bytes that arrived, not the length a header claims: a large
    frame stays in the shared buffer until limits.frame_shared_buffer_bytes_max of it arrived, then gets a buffer
    limits.frame_buffer_growth times that (or the whole frame, if at most limits.frame_buffer_slack_bytes more),
    grown by that factor each time it fills. So a frame held is at most that factor times what arrived plus the
    slack, and a frame of up to that factor times the first read (a 1 MiB batch's) is received into one buffer,
    with no copy. held_bytes says what a connection holds."""

    def __init__(self, frame_bytes_max: int = limits.frame_bytes_max, reuse: bool = False):
        self._buffer = bytearray()
        self._frame_bytes_max = frame_bytes_max
        self._large: memoryview | None = None  # the frame being received into its own buffer, or its first part
        self._large_filled = 0
        self._large_end = 0  # the whole frame's length: len(self._large) once it is all allocated
        self._grows = not reuse
        self._spares: list[bytearray] = []  # with reuse: the newest first
        self._spares_max = limits.frame_spare_buffers_max if reuse else 0

    def feed(self, data: bytes | bytearray | memoryview) -> None:
        if self._large is None:
            self._buffer += data
            return
        view = memoryview(data)
        while len(view):
            target = self.writable()
            if target is None or not len(target):  # the frame is whole: the rest begins the next ones
                self._buffer += view
                return
            taken = min(len(view), len(target))
            target[:taken] = view[:taken]
            self._large_filled += taken
            view = view[taken:]

    def writable(self) -> memoryview | None:
        """Where received bytes may be written directly (the rest of a large frame), saving a copy."""
        if self._large is None:
            return None
        if self._large_filled == len(self._large) < self._large_end:  # full, and more to come: grow it
            grown = memoryview(bytearray(_grown(len(self._large), self._large_end)))
            grown[: self._large_filled] = self._large
            self._large = grown
        return self._large[self._large_filled :]

    def wrote(self, count: int) -> None:
        """Count bytes written into writable()."""
        self._large_filled += count

    @property
    def buffered_bytes(self) -> int:
        return len(self._buffer) + self._large_filled

    @property
    def held_bytes(self) -> int:
        """The memory this decoder holds for frames not yet whole: the shared buffer and a large frame's buffer."""
        return len(self._buffer) + (len(self._large) if self._large is not None else 0)

    def next_frame(self) -> Frame | None:
        if self._large is not None:
            if self._large_filled < self._large_end:
                return None
            frame, self._large, self._large_filled, self._large_end = self._large, None, 0, 0
            return self._parse(frame)
        buffer = self._buffer
        if len(buffer) < HEADER_BYTES:
            return None
        end = 4 + self._check_header(buffer)
        if len(buffer) < end:
            if end > limits.frame_shared_buffer_bytes_max:
                if not self._grows:
                    self._large = self._large_buffer(end)
                elif len(buffer) >= limits.frame_shared_buffer_bytes_max:  # enough arrived to be worth a buffer
                    self._large = memoryview(bytearray(_grown(len(buffer), end)))
                else:  # a header, perhaps with nothing behind it: no more memory than what came
                    return None
                self._large[: len(buffer)] = buffer
                self._large_filled = len(buffer)
                self._large_end = end
                buffer.clear()
            return None
        frame = self._parse(memoryview(bytes(buffer[:end])))
        del buffer[:end]
        return frame

    def _large_buffer(self, size: int) -> memoryview:
        for spare in self._spares:
            if len(spare) >= size and _unexported(spare):
                return memoryview(spare)[:size]
        if not self._spares_max:
            return memoryview(bytearray(size))
        buffer = bytearray(-(-size // limits.MiB) * limits.MiB)  # whole MiB, so that the next frame fits too
        self._spares = [buffer, *self._spares[: self._spares_max - 1]]
        return memoryview(buffer)[:size]

    def _check_header(self, buffer: bytearray) -> int:
        length, version, kind, _serde, flags, request_id, method_len = _header.unpack_from(buffer)
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
        if flags & ~FLAGS_KNOWN or flags == FLAGS_KNOWN:
            raise FrameError(Code.BAD_FRAME, f"unknown frame flags {flags:#x}", request_id)
        if method_len > limits.method_name_bytes_max:
            raise FrameError(Code.BAD_FRAME, f"method name of {method_len} bytes is too long", request_id)
        return length

    def _parse(self, frame: memoryview) -> Frame:
        _, _, kind, serde, flags, request_id, method_len = _header.unpack_from(frame)
        method_end = HEADER_BYTES + method_len
        try:
            method = str(frame[HEADER_BYTES:method_end], "ascii")
        except UnicodeDecodeError:
            raise FrameError(Code.BAD_FRAME, "method name is not ASCII", request_id) from None
        body = frame[method_end:]
        attachment = None
        if flags:
            if len(body) < _message_length.size:
                raise FrameError(Code.BAD_FRAME, "attachment frame without a message length", request_id)
            (message_len,) = _message_length.unpack_from(body)
            if _message_length.size + message_len > len(body):
                raise FrameError(Code.BAD_FRAME, f"message length {message_len} runs past the frame", request_id)
            attachment = body[_message_length.size + message_len :]
            body = body[_message_length.size : _message_length.size + message_len]
            if flags & FLAG_ATTACHMENTS:
                attachment = _split_attachments(attachment, request_id)
        return Frame(Kind(kind), serde, request_id, method, body, attachment)


def _unexported(buffer: bytearray) -> bool:
    """Whether no view of buffer is alive: Python resizes a bytearray only then (here by a byte and back)."""
    try:
        buffer.append(0)
    except BufferError:
        return False
    del buffer[-1]
    return True


def _split_attachments(data: memoryview, request_id: int) -> list[memoryview]:
    """count u32 | count x length u32 | the attachments: views into the frame, which they must fill exactly."""
    if len(data) < _message_length.size:
        raise FrameError(Code.BAD_FRAME, "attachments without a count", request_id)
    (count,) = _message_length.unpack_from(data)
    table_end = _message_length.size * (count + 1)
    if table_end > len(data):
        raise FrameError(Code.BAD_FRAME, f"{count} attachment lengths run past the frame", request_id)
    lengths = struct.unpack_from(f">{count}I", data, _message_length.size)
    if table_end + sum(lengths) != len(data):
        raise FrameError(Code.BAD_FRAME, "attachment lengths do not add up to the frame", request_id)
    attachments: list[memoryview] = []
    position = table_end
    for length in lengths:
        attachments.append(data[position : position + length])
        position += length
    return attachments
