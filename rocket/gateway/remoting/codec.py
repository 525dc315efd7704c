"""Apache RocketMQ's remoting protocol, sans I/O: frames and the RemotingCommand header (Command) in both
serializations, JSON and ROCKETMQ binary; a response goes out in the request's serialization.
"""

from __future__ import annotations

import dataclasses
import struct

import orjson

from rocket import limits

JSON = 0
ROCKETMQ = 1
FLAG_RESPONSE = 1  # bit 0: a response; bit 1: oneway (no response expected)
FLAG_ONEWAY = 2

_prefix = struct.Struct(">II")
_binary_fixed = struct.Struct(">hBhii")
_u16 = struct.Struct(">H")
_i32 = struct.Struct(">i")

LANGUAGES = ("JAVA", "CPP", "DOTNET", "PYTHON", "DELPHI", "ERLANG", "RUBY", "OTHER", "HTTP", "GO", "PHP", "OMS",
             "RUST", "NODE_JS")


class RequestCode:
    SEND_MESSAGE = 10
    PULL_MESSAGE = 11
    QUERY_MESSAGE = 12
    QUERY_CONSUMER_OFFSET = 14
    UPDATE_CONSUMER_OFFSET = 15
    UPDATE_AND_CREATE_TOPIC = 17
    GET_ALL_TOPIC_CONFIG = 21
    GET_BROKER_RUNTIME_INFO = 28
    SEARCH_OFFSET_BY_TIMESTAMP = 29
    GET_MAX_OFFSET = 30
    GET_MIN_OFFSET = 31
    GET_EARLIEST_MSG_STORETIME = 32
    VIEW_MESSAGE_BY_ID = 33
    HEART_BEAT = 34
    UNREGISTER_CLIENT = 35
    CONSUMER_SEND_MSG_BACK = 36
    END_TRANSACTION = 37
    GET_CONSUMER_LIST_BY_GROUP = 38
    CHECK_TRANSACTION_STATE = 39
    NOTIFY_CONSUMER_IDS_CHANGED = 40
    LOCK_BATCH_MQ = 41
    UNLOCK_BATCH_MQ = 42
    PUT_KV_CONFIG = 100
    GET_KV_CONFIG = 101
    DELETE_KV_CONFIG = 102
    GET_ROUTEINFO_BY_TOPIC = 105
    GET_BROKER_CLUSTER_INFO = 106
    GET_TOPIC_STATS_INFO = 202
    GET_CONSUMER_CONNECTION_LIST = 203
    GET_ALL_TOPIC_LIST_FROM_NAMESERVER = 206
    DELETE_TOPIC_IN_BROKER = 215
    DELETE_TOPIC_IN_NAMESRV = 216
    GET_KV_CONFIG_BY_VALUE = 217
    GET_KVLIST_BY_NAMESPACE = 219
    SEND_MESSAGE_V2 = 310
    SEND_BATCH_MESSAGE = 320


class ResponseCode:
    SUCCESS = 0
    SYSTEM_ERROR = 1
    SYSTEM_BUSY = 2
    REQUEST_CODE_NOT_SUPPORTED = 3
    FLUSH_SLAVE_TIMEOUT = 12
    MESSAGE_ILLEGAL = 13
    SERVICE_NOT_AVAILABLE = 14
    NO_PERMISSION = 16
    TOPIC_NOT_EXIST = 17
    PULL_NOT_FOUND = 19
    PULL_RETRY_IMMEDIATELY = 20
    PULL_OFFSET_MOVED = 21
    QUERY_NOT_FOUND = 22
    SUBSCRIPTION_PARSE_FAILED = 23
    CONSUMER_NOT_ONLINE = 206


class RemotingError(Exception):
    """Malformed input, with the one-line reason."""


@dataclasses.dataclass(slots=True)
class Command:
    """A RemotingCommand. Frame: length u32 | serialize type u8 | header length u24 | header | body (integers
    big-endian; length counts every byte after itself). The header is JSON (type 0) or ROCKETMQ binary (type 1):
        code i16 | language u8 | version i16 | opaque i32 | flag i32 | remark (len i32, bytes) | extFields (len i32,
        then key len i16, key, value len i32, value, ...)
    Layouts from apache/rocketmq's RemotingCommand and RocketMQSerializable."""
    code: int
    opaque: int = 0
    flag: int = 0
    remark: str | None = None
    ext: dict[str, str] = dataclasses.field(default_factory=dict)
    body: bytes = b""
    language: str = "JAVA"
    version: int = 0
    serialize: int = JSON

    @property
    def is_response(self) -> bool:
        return bool(self.flag & FLAG_RESPONSE)

    @property
    def is_oneway(self) -> bool:
        return bool(self.flag & FLAG_ONEWAY)

    def reply(self, code: int = ResponseCode.SUCCESS, remark: str | None = None, ext: dict | None = None,
              body: bytes = b"") -> "Command":
        """The response to this request: same opaque and serialization; ext values become strings; the remark is
        one line (what a client echoed back in it included) of at most limits.error_excerpt_chars_max."""
        fields = {name: _text(value) for name, value in (ext or {}).items() if value is not None}
        if remark is not None:
            remark = " ".join(remark.split())[:limits.error_excerpt_chars_max]
        return Command(code, self.opaque, FLAG_RESPONSE, remark, fields, body, "JAVA", self.version, self.serialize)


def json_body(command: Command) -> dict:
    """A request's JSON body (heartbeats, queue locks) as an object; ValueError says what is wrong with it."""
    try:
        value = orjson.loads(command.body or b"{}")
    except orjson.JSONDecodeError as error:
        raise ValueError(f"the body is not JSON: {error}") from None
    if not isinstance(value, dict):
        raise ValueError("the body is not a JSON object")
    return value


def objects(value, name: str) -> list[dict]:
    """A JSON field that holds a list of objects (absent or null: none)."""
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(item, dict) for item in value):
        raise ValueError(f"{name} is not a list of objects")
    return value


def _text(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def encode(command: Command) -> list[bytes]:
    """The frame as buffers to send one after the other (the body is not joined)."""
    header = _encode_binary(command) if command.serialize == ROCKETMQ else _encode_json(command)
    if len(header) > limits.remoting_header_bytes_max:
        raise RemotingError(f"a header of {len(header)} bytes is over {limits.remoting_header_bytes_max}")
    return [_prefix.pack(4 + len(header) + len(command.body), (command.serialize << 24) | len(header)), header,
            command.body]


def _encode_json(command: Command) -> bytes:
    header = {"code": command.code, "language": command.language, "version": command.version,
              "opaque": command.opaque, "flag": command.flag, "extFields": command.ext,
              "serializeTypeCurrentRPC": "JSON"}
    if command.remark is not None:
        header["remark"] = command.remark
    return orjson.dumps(header)


def _encode_binary(command: Command) -> bytes:
    language = LANGUAGES.index(command.language) if command.language in LANGUAGES else LANGUAGES.index("OTHER")
    remark = (command.remark or "").encode()
    parts = [_binary_fixed.pack(command.code, language, command.version, command.opaque, command.flag)]
    parts += [_i32.pack(len(remark)) if command.remark is not None else _i32.pack(0), remark]
    fields = []
    for name, value in command.ext.items():
        key, data = name.encode(), value.encode()
        fields += [_u16.pack(len(key)), key, _i32.pack(len(data)), data]
    joined = b"".join(fields)
    parts += [_i32.pack(len(joined)), joined]
    return b"".join(parts)


def decode(frame: bytes | memoryview) -> Command:
    """One frame's bytes after its length prefix: serialize type and header length, header, body."""
    if len(frame) < 4:
        raise RemotingError(f"a frame of {len(frame)} bytes has no header length")
    mark = _i32.unpack_from(frame, 0)[0] & 0xFFFFFFFF
    serialize, header_length = mark >> 24, mark & 0xFFFFFF
    if header_length > limits.remoting_header_bytes_max:
        raise RemotingError(f"header length {header_length} is over {limits.remoting_header_bytes_max}")
    if header_length > len(frame) - 4:
        raise RemotingError(f"header length {header_length} is past the frame's end ({len(frame) - 4} bytes)")
    header = bytes(frame[4:4 + header_length])
    body = bytes(frame[4 + header_length:])
    if serialize == JSON:
        command = _decode_json(header)
    elif serialize == ROCKETMQ:
        command = _decode_binary(header)
    else:
        raise RemotingError(f"serialize type {serialize} is neither JSON (0) nor ROCKETMQ (1)")
    command.body = body
    command.serialize = serialize
    return command


def _decode_json(header: bytes) -> Command:
    try:
        fields = orjson.loads(header)
    except orjson.JSONDecodeError as error:
        raise RemotingError(f"the JSON header does not parse: {error}") from None
    if not isinstance(fields, dict):
        raise RemotingError("the JSON header is not an object")
    try:
        ext = fields.get("extFields") or {}
        if not isinstance(ext, dict):
            raise TypeError("extFields")
        remark = fields.get("remark")
        return Command(code=_int(fields.get("code"), 16), opaque=_int(fields.get("opaque", 0), 32),
                       flag=_int(fields.get("flag", 0), 32), remark=None if remark is None else str(remark),
                       ext={str(name): _text(value) for name, value in ext.items() if value is not None},
                       language=str(fields.get("language", "JAVA")), version=_int(fields.get("version", 0), 16))
    except (TypeError, ValueError) as error:
        raise RemotingError(f"the JSON header's fields are malformed: {error}") from None


def _int(value, bits: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{value!r} is not an integer")
    if not -(1 << (bits - 1)) <= value < (1 << bits):
        raise ValueError(f"{value} does not fit {bits} bits")
    return value


def _decode_binary(header: bytes) -> Command:
    try:
        code, language, version, opaque, flag = _binary_fixed.unpack_from(header, 0)
        position = _binary_fixed.size
        remark, position = _chunk(header, position, _i32)
        ext_bytes, position = _chunk(header, position, _i32)
        ext: dict[str, str] = {}
        inner = 0
        while inner < len(ext_bytes):
            key, inner = _chunk(ext_bytes, inner, _u16)
            value, inner = _chunk(ext_bytes, inner, _i32)
            ext[key.decode()] = value.decode()
        return Command(code=code, opaque=opaque, flag=flag, remark=remark.decode() if remark else None, ext=ext,
                       language=LANGUAGES[language] if language < len(LANGUAGES) else "OTHER", version=version)
    except (struct.error, UnicodeDecodeError, RemotingError) as error:
        raise RemotingError(f"the ROCKETMQ header is malformed: {error}") from None


def _chunk(data: bytes, position: int, length: struct.Struct) -> tuple[bytes, int]:
    size = length.unpack_from(data, position)[0]
    start = position + length.size
    if size < 0 or start + size > len(data):
        raise RemotingError(f"a field of {size} bytes at {start} is past the header's end")
    return data[start:start + size], start + size


class FrameReader:
    """Feed bytes in, take whole frames (without their length prefix) out. A length over
    limits.remoting_frame_bytes_max, or too short to hold a header length, is a RemotingError."""

    def __init__(self) -> None:
        self._buffer = bytearray()

    def feed(self, data: bytes) -> None:
        self._buffer += data

    @property
    def buffered_bytes(self) -> int:
        """What arrived of frames not yet whole: memory follows it, never a length a frame claims."""
        return len(self._buffer)

    def next_frame(self) -> bytes | None:
        if len(self._buffer) < 4:
            return None
        length = struct.unpack_from(">I", self._buffer, 0)[0]
        if length < 4 or length > limits.remoting_frame_bytes_max:
            raise RemotingError(f"frame length {length} is outside 4-{limits.remoting_frame_bytes_max}")
        if len(self._buffer) < 4 + length:
            return None
        frame = bytes(self._buffer[4:4 + length])
        del self._buffer[:4 + length]
        return frame


def looks_like_remoting(first: bytes) -> bool:
    """Whether a connection's first bytes begin a remoting frame rather than one of rocket's own: rocket's
    frame has its version (1) and then its kind (1 or more) where remoting has the serialize type (0 or 1) and the
    high byte of the header length, which is 0 for every header under 64 KiB (longer ones are refused)."""
    return len(first) >= 6 and first[4] in (JSON, ROCKETMQ) and first[5] == 0
