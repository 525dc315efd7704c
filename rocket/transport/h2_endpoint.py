"""What the HTTP/2 client and server share: the h2 connection with its one writer task and flow-controlled
sends (Endpoint), and how rocket's calls map onto HTTP/2: POST /rocket.v1/<Method>, content-type as serde,
HTTP statuses, rocket-status trailers."""

from __future__ import annotations

from types import ModuleType

import h2.config
import h2.connection
import h2.settings
import trio

from rocket import limits
from rocket.errors import Code, RocketError
from rocket.serde import SERDE_BY_CONTENT_TYPE, json_codec
from rocket.transport.lifecycle import Traffic
from rocket.transport.methods import method_spec

DEFAULT_WINDOW_BYTES = 65_535  # RFC 9113's initial connection window, which we raise at start: a format constant
path_prefix = "/rocket.v1/"

STATUS_OF_CODE = {
    Code.UNKNOWN_METHOD: 404, Code.UNKNOWN_TOPIC: 404, Code.TOPIC_EXISTS: 409, Code.FRAME_TOO_LARGE: 413,
    Code.UNSUPPORTED_SERDE: 415, Code.INTERNAL: 500, Code.CORRUPT_DATA: 500, Code.OVERLOADED: 503,
    Code.UNAVAILABLE: 503, Code.TIMEOUT: 504,
}  # every other code is the caller's mistake: 400


class RouteError(RocketError):
    """An error whose HTTP status is not its code's usual one, such as 405 for a method other than POST."""

    def __init__(self, status: int, code: Code, message: str):
        super().__init__(code, message)
        self.status = status


def status_of(error: RocketError | None) -> int:
    if error is None:
        return 200
    return getattr(error, "status", None) or STATUS_OF_CODE.get(error.code, 400)


def rocket_trailers(error: RocketError | None) -> list[tuple[str, str]]:
    if error is None:
        return [("rocket-status", "0")]
    return [("rocket-status", str(int(error.code))), ("rocket-error", error.code.name),
            ("rocket-message", header_text(error.message))]


def header_text(text: str) -> str:
    """Header values may not hold control characters or surrounding whitespace."""
    return "".join(char if char.isprintable() else " " for char in text)[:limits.header_text_chars_max].strip()


def header_dict(pairs) -> dict[str, str]:
    # header_encoding=None hands us bytes, so a peer's invalid UTF-8 cannot raise inside h2.
    return {bytes(name).decode("ascii", "replace"): bytes(value).decode("utf-8", "replace") for name, value in pairs}


def _local_settings(client_side: bool) -> dict[int, int]:
    settings: dict[int, int] = {
        h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: limits.http2_stream_window_bytes,
        h2.settings.SettingCodes.MAX_FRAME_SIZE: limits.http2_frame_bytes_max,
    }
    if client_side:
        settings[h2.settings.SettingCodes.ENABLE_PUSH] = 0
    else:
        settings[h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS] = limits.http2_streams_per_connection_max
    return settings


def method_of(headers: dict[str, str]) -> str:
    path = headers.get(":path", "").split("?", 1)[0]
    if not path.startswith(path_prefix):
        raise RouteError(404, Code.UNKNOWN_METHOD, f"{path!r}: calls are POST {path_prefix}<Method>")
    if headers.get(":method") != "POST":
        raise RouteError(405, Code.BAD_REQUEST, f"{headers.get(':method')} {path}: calls are POST")
    name = path[len(path_prefix):]
    method_spec(name)
    return name


def serde_of(headers: dict[str, str]) -> ModuleType:
    content_type = headers.get("content-type")
    if content_type is None:
        return json_codec
    serde = SERDE_BY_CONTENT_TYPE.get(content_type.split(";", 1)[0].strip().lower())
    if serde is None:
        raise RocketError(Code.UNSUPPORTED_SERDE,
                          f"content-type {content_type!r} is not one of {', '.join(sorted(SERDE_BY_CONTENT_TYPE))}")
    return serde


class Endpoint:
    """What client and server share: the h2 state machine, the one task that writes to the socket, and
    sends that respect the peer's flow-control windows."""

    def __init__(self, socket_stream: trio.abc.Stream, client_side: bool, traffic: Traffic | None = None):
        self.socket_stream = socket_stream
        self.traffic = traffic or Traffic()  # bytes received (counted by the read loop) and sent
        self.client_side = client_side
        config = h2.config.H2Configuration(client_side=client_side, header_encoding=None)
        self.connection = h2.connection.H2Connection(config=config)
        self.closed = False
        self._data_waiting = trio.Event()
        self._flushes_requested = 0
        self._flushes_done = 0
        self._flush_progress = trio.Event()
        self._window_opened = trio.Event()

    def start(self) -> None:
        self.connection.initiate_connection()
        self.connection.update_settings(_local_settings(self.client_side))
        # h2 raises its frame-size check only on the peer's ACK, and applies it from the next receive_data;
        # large DATA frames in the same read as the ACK would fail with FRAME_SIZE_ERROR. Accepting them
        # early is safe: it is the size we just advertised.
        self.connection.max_inbound_frame_size = limits.http2_frame_bytes_max
        self.connection.increment_flow_control_window(limits.http2_connection_window_bytes - DEFAULT_WINDOW_BYTES)
        self.wake_writer()

    def wake_writer(self) -> None:
        self._data_waiting.set()

    async def flush(self) -> None:
        """Wait until everything h2 has queued so far is on the socket: backpressure for whoever queued it."""
        self._flushes_requested += 1
        target = self._flushes_requested
        self.wake_writer()
        while self._flushes_done < target and not self.closed:
            await self._flush_progress.wait()

    async def write_loop(self) -> None:
        """The only task that sends on the socket, so a cancelled call never leaves half a frame behind."""
        try:
            while True:
                await self._data_waiting.wait()
                self._data_waiting = trio.Event()
                target = self._flushes_requested
                data = self.connection.data_to_send()
                if data:
                    await self.socket_stream.send_all(data)
                    self.traffic.sent_bytes += len(data)
                self._flushes_done = target
                self._announce_flush()
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            self.mark_closed()

    def mark_closed(self) -> None:
        self.closed = True
        self._announce_flush()
        self.open_window()

    def _announce_flush(self) -> None:
        self._flush_progress.set()
        self._flush_progress = trio.Event()

    def open_window(self) -> None:
        """Wake senders waiting for flow control: a window grew, settings changed or a stream was reset."""
        self._window_opened.set()
        self._window_opened = trio.Event()

    async def send_data(self, stream_id: int, data: bytes) -> None:
        """Queue data as the peer's windows allow, waiting for WINDOW_UPDATE while they are shut.
        Raises h2's StreamClosedError if the peer resets the stream meanwhile."""
        view = memoryview(data)
        while len(view) and not self.closed:
            allowed = min(self.connection.local_flow_control_window(stream_id),
                          self.connection.max_outbound_frame_size, len(view))
            if allowed <= 0:
                await self._window_opened.wait()
                continue
            self.connection.send_data(stream_id, view[:allowed])
            view = view[allowed:]
            await self.flush()
