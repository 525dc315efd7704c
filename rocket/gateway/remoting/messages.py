"""RocketMQ's message layouts as remoting clients read and write them (pure): the stored-message layout of pull
and lookup answers (apache/rocketmq's MessageDecoder), the batch body of SEND_BATCH_MESSAGE, the properties
string, message ids (commit_log_offset), and delay levels.
"""

from __future__ import annotations

import ipaddress
import struct
import zlib
from typing import Any

import zstandard
from lz4 import frame as lz4_frame  # pyright: ignore[reportMissingTypeStubs]: untyped; used through LZ4 below

from rocket import limits
from rocket.gateway.properties import BORN_HOST_PROPERTY
from rocket.model import ID_PROPERTY, KEYS_PROPERTY, Message

MAGIC_V1 = -626843481  # 0xDAA320A7: topic length in one byte
MAGIC_V2 = -626843477  # 0xDAA320AB: topic length in two bytes (topics longer than 127 bytes)
SYSFLAG_COMPRESSED = 1
SYSFLAG_MULTI_TAGS = 2
SYSFLAG_TRANSACTION_PREPARED = 1 << 2
SYSFLAG_TRANSACTION_MASK = 3 << 2
SYSFLAG_BORNHOST_V6 = 1 << 4  # a stored message's born host is 16 bytes (IPv6), not 4
SYSFLAG_STOREHOST_V6 = 1 << 5  # and its store host
SYSFLAG_COMPRESSION_TYPE_MASK = 7 << 8  # 5.x: which compression (LZ4 1, Zstandard 2, zlib 3; 0 is zlib too)
NAME_VALUE = "\x01"
PROPERTY = "\x02"
KEYS = "KEYS"
TAGS = "TAGS"
UNIQ_KEY = "UNIQ_KEY"
DELAY = "DELAY"
TIMER_DELIVER_MS = "TIMER_DELIVER_MS"
TIMER_DELAY_SEC = "TIMER_DELAY_SEC"
TIMER_DELAY_MS = "TIMER_DELAY_MS"
RETRY_TOPIC = "RETRY_TOPIC"
ORIGIN_MESSAGE_ID = "ORIGIN_MESSAGE_ID"
RECONSUME_TIME = "RECONSUME_TIME"
MAX_RECONSUME_TIMES = "MAX_RECONSUME_TIMES"
TRANSACTION_PREPARED = "TRAN_MSG"
PRODUCER_GROUP = "PGROUP"
CLIENT_ONLY = frozenset({DELAY, TIMER_DELIVER_MS, TIMER_DELAY_SEC, TIMER_DELAY_MS, "WAIT", TRANSACTION_PREPARED})
RENAMED = frozenset({KEYS, TAGS, UNIQ_KEY})  # kept in rocket's fields, or in the gateways' shared properties
# RocketMQ's messageDelayLevel default: level N waits DELAY_LEVELS_S[N - 1]
DELAY_LEVELS_S = (1, 5, 10, 30, 60, 120, 180, 240, 300, 360, 420, 480, 540, 600, 1200, 1800, 3600, 7200)

_HASH_BITS, _QUEUE_BITS, _OFFSET_BITS = 9, 10, 34
# A stored message (MessageDecoder): the head, up to the born timestamp; the born host (4 or 16 bytes) and its port;
# the store timestamp; the store host and its port; then reconsume times, prepared transaction offset, body length.
_stored_head = struct.Struct(">iiiiiqqiq")
_stored_tail = struct.Struct(">iqi")
_batch_head = struct.Struct(">iiiii")


class BadMessage(ValueError):
    """A message the client sent that cannot be read: the reason, one line."""


def properties_text(properties: dict[str, str]) -> str:
    return "".join(f"{name}{NAME_VALUE}{value}{PROPERTY}" for name, value in properties.items())


def parse_properties(text: str) -> dict[str, str]:
    properties: dict[str, str] = {}
    for pair in text.split(PROPERTY):
        if pair:
            name, separator, value = pair.partition(NAME_VALUE)
            if not separator:
                raise BadMessage(f"property {pair[:40]!r} has no value separator")
            properties[name] = value
    return properties


def commit_log_offset(topic: str, queue: int, offset: int) -> int:
    """The 8-byte "commit log offset" of a message id (offsetMsgId), which is RocketMQ's: the broker's IPv4 address
    and port, then this. rocket has no commit log offsets: a message is (topic, queue, offset). The 8 bytes carry that
    identity in 53 bits, because JavaScript clients (ali-ons) read the offset into a double:
        bits 52-44: crc32(topic) & 0x1FF | bits 43-34: queue (rocket's topics have at most 1024) | bits 33-0: offset
    so an id, and the commitLogOffset a client sends back, names the message. The topic is found among those the
    request names (a send-back: the group's retry topic and the message's topic) and then among all topics whose
    name hashes alike; an offset past 2**34 (17 billion messages in one queue) wraps, and the lookup takes the
    latest message it can be (unwrap_offset)."""
    return ((topic_hash(topic) << (_QUEUE_BITS + _OFFSET_BITS)) | (queue << _OFFSET_BITS)
            | (offset & ((1 << _OFFSET_BITS) - 1)))


def topic_hash(topic: str) -> int:
    return zlib.crc32(topic.encode()) & ((1 << _HASH_BITS) - 1)


def split_commit_log_offset(value: int) -> tuple[int, int, int]:
    """(topic hash, queue, offset modulo 2**34) of a commitLogOffset rocket gave out."""
    if not 0 <= value < 1 << (_HASH_BITS + _QUEUE_BITS + _OFFSET_BITS):
        raise BadMessage(f"commit log offset {value} is not one rocket gave out")
    return (value >> (_QUEUE_BITS + _OFFSET_BITS), (value >> _OFFSET_BITS) & ((1 << _QUEUE_BITS) - 1),
            value & ((1 << _OFFSET_BITS) - 1))


def unwrap_offset(low: int, next_offset: int) -> int:
    """The latest offset below next_offset whose low 34 bits are low."""
    span = 1 << _OFFSET_BITS
    if next_offset <= span:
        return low
    candidate = (next_offset - 1) // span * span + low
    return candidate if candidate < next_offset else candidate - span


def message_id(host: bytes, port: int, offset: int) -> str:
    return (host + struct.pack(">iq", port, offset)).hex().upper()


def parse_message_id(text: str) -> tuple[str, int]:
    """(broker address, commit log offset) of an offsetMsgId: an IPv4 broker's (32 hex digits) or an IPv6 one's (56)."""
    try:
        raw = bytes.fromhex(text)
    except ValueError:
        raise BadMessage(f"message id {text[:40]!r} is not hex") from None
    if len(raw) not in (16, 28):
        raise BadMessage(f"message id {text[:40]!r} is not 16 or 28 bytes (32 or 56 hex digits)")
    host_length = len(raw) - 12
    port, offset = struct.unpack(">iq", raw[host_length:])
    host = ipaddress.ip_address(raw[:host_length])
    return (f"{host}:{port}" if host.version == 4 else f"[{host}]:{port}"), offset


def host_bytes(address: str) -> tuple[bytes, int]:
    """An "ip:port" (IPv6 with or without brackets) as 4 bytes (IPv4, or IPv6 that maps one) or 16, and a port, as
    RocketMQ's stored messages and ids hold hosts; other addresses as 0.0.0.0."""
    host, _, port = address.rpartition(":")
    port_number = int(port) if port.isdigit() else 0
    try:
        parsed = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return bytes(4), port_number
    if isinstance(parsed, ipaddress.IPv6Address) and parsed.ipv4_mapped is not None:
        parsed = parsed.ipv4_mapped
    return parsed.packed, port_number


def encode_stored(message: Message, topic: str, store_host: tuple[bytes, int], reconsume_times: int = 0,
                  properties: dict[str, str] | None = None) -> bytes:
    """One message in RocketMQ's stored-message layout (MessageDecoder.decode reads it). Bodies are stored plain,
    so the compressed flag is never set; the born host is the producer's address where a gateway kept it. An IPv6
    host takes 16 bytes, with its flag set in sysFlag (SYSFLAG_BORNHOST_V6, SYSFLAG_STOREHOST_V6)."""
    topic_bytes = topic.encode()
    born = host_bytes(message.properties.get(BORN_HOST_PROPERTY, ""))
    props = properties_text(properties if properties is not None else message.properties).encode()
    if len(props) > 0x7FFF:
        props = b""  # a client reads a signed 16-bit length; rocket's own properties can be longer
    v2 = len(topic_bytes) > 127
    offset_id = commit_log_offset(topic, message.queue, message.offset)
    sys_flag = (SYSFLAG_BORNHOST_V6 if len(born[0]) == 16 else 0) | (SYSFLAG_STOREHOST_V6 if len(store_host[0]) == 16
                                                                     else 0)
    head = _stored_head.pack(
        0, MAGIC_V2 if v2 else MAGIC_V1, zlib.crc32(message.body) & 0x7FFFFFFF, message.queue, 0, message.offset,
        offset_id, sys_flag, message.timestamp_ms)
    hosts = (born[0] + struct.pack(">i", born[1]) + struct.pack(">q", message.timestamp_ms) + store_host[0]
             + struct.pack(">i", store_host[1]))
    topic_length = struct.pack(">h", len(topic_bytes)) if v2 else struct.pack(">b", len(topic_bytes))
    parts = [head, hosts, _stored_tail.pack(reconsume_times, 0, len(message.body)), message.body, topic_length,
             topic_bytes, struct.pack(">h", len(props)), props]
    total = sum(map(len, parts))
    return struct.pack(">i", total) + b"".join(parts)[4:]


def decode_batch(body: bytes) -> list[tuple[bytes, int, dict[str, str]]]:
    """SEND_BATCH_MESSAGE's body (MessageDecoder.encodeMessages): per message total size, magic, body CRC, flag,
    body, properties; as (body, flag, properties)."""
    messages: list[tuple[bytes, int, dict[str, str]]] = []
    position = 0
    view = memoryview(body)
    while position < len(body):
        if len(messages) >= limits.batch_messages_max:
            raise BadMessage("too many messages in one batch")
        try:
            total, _magic, _crc, flag, body_length = _batch_head.unpack_from(view, position)
            start = position + _batch_head.size
            if total < _batch_head.size + 2 or position + total > len(body) or body_length < 0 \
                    or start + body_length + 2 > position + total:
                raise BadMessage(f"message {len(messages)} of the batch: sizes {total}/{body_length} do not fit")
            message_body = bytes(view[start:start + body_length])
            (properties_length,) = struct.unpack_from(">h", view, start + body_length)
            props_start = start + body_length + 2
            if properties_length < 0 or props_start + properties_length > position + total:
                raise BadMessage(f"message {len(messages)} of the batch: properties length {properties_length}")
            properties = parse_properties(bytes(view[props_start:props_start + properties_length]).decode())
        except struct.error:
            raise BadMessage(f"message {len(messages)} of the batch is cut short") from None
        except UnicodeDecodeError:
            raise BadMessage(f"message {len(messages)} of the batch: properties are not UTF-8") from None
        messages.append((message_body, flag, properties))
        position += total
    return messages


def uncompress(body: bytes, sys_flag: int) -> bytes:
    """A body sent compressed (sysFlag bit 0): with zlib (4.x's only compression, and 5.x's default: compression type
    0 or 3 in sysFlag bits 8-10, as CompressionType.findByValue reads them), or an LZ4 (1) or Zstandard (2) frame, as
    RocketMQ 5's Lz4Compressor and ZstdCompressor write them. Each inflates to at most limits.message_bytes_max; a
    stream cut short, or one of another kind, is refused."""
    if not sys_flag & SYSFLAG_COMPRESSED:
        return body
    kind = (sys_flag & SYSFLAG_COMPRESSION_TYPE_MASK) >> 8
    inflate = _INFLATE.get(kind)
    if inflate is None:
        raise BadMessage(f"compression type {kind} is not one RocketMQ knows (zlib is 0 or 3, LZ4 1, Zstandard 2)")
    limit = limits.message_bytes_max
    try:
        plain, complete = inflate(body, limit + 1)  # a byte past the limit: too big
    except (zlib.error, RuntimeError, zstandard.ZstdError) as error:  # lz4.frame raises RuntimeError
        raise BadMessage(f"the compressed body does not inflate: {error}") from None
    if len(plain) > limit:
        raise BadMessage(f"the body inflates past {limit} bytes")
    if not complete:
        raise BadMessage("the compressed body is cut short")
    return plain


def _zlib(body: bytes, limit: int) -> tuple[bytes, bool]:
    """(at most limit bytes of the inflated body, whether its stream ended)"""
    decompressor = zlib.decompressobj()
    return decompressor.decompress(body, limit), decompressor.eof


def _lz4(body: bytes, limit: int) -> tuple[bytes, bool]:
    decompressor = LZ4.LZ4FrameDecompressor()
    plain: bytes = decompressor.decompress(body, max_length=limit)
    return plain, bool(decompressor.eof)


def _zstd(body: bytes, limit: int) -> tuple[bytes, bool]:
    """Fed limits.remoting_zstd_feed_bytes at a time (its decompressor takes no output bound)."""
    decompressor = zstandard.ZstdDecompressor().decompressobj()
    pieces: list[bytes] = []
    size = 0
    step = limits.remoting_zstd_feed_bytes
    for start in range(0, len(body), step):
        piece = decompressor.decompress(body[start:start + step])
        pieces.append(piece)
        size += len(piece)
        if size >= limit:
            break
    return b"".join(pieces)[:limit], decompressor.eof


LZ4: Any = lz4_frame
_INFLATE = {0: _zlib, 3: _zlib, 1: _lz4, 2: _zstd}


def delay_of(properties: dict[str, str], now_ms: int) -> int:
    """The delivery time (epoch ms, 0: at once) that a message's delay properties ask for: DELAY (levels 1-18),
    or 5.x's TIMER_DELIVER_MS, TIMER_DELAY_SEC, TIMER_DELAY_MS."""
    try:
        if TIMER_DELIVER_MS in properties:
            return max(1, int(properties[TIMER_DELIVER_MS]))
        if TIMER_DELAY_SEC in properties:
            return now_ms + int(properties[TIMER_DELAY_SEC]) * 1000
        if TIMER_DELAY_MS in properties:
            return now_ms + int(properties[TIMER_DELAY_MS])
        level = int(properties.get(DELAY, "0") or 0)
    except ValueError:
        raise BadMessage("a delay property is not an integer") from None
    if level <= 0:
        return 0
    return now_ms + DELAY_LEVELS_S[min(level, len(DELAY_LEVELS_S)) - 1] * 1000


def to_rocket(body: bytes, properties: dict[str, str], born_ms: int, now_ms: int, born_host: str = "") -> Message:
    """A remoting message as rocket's, kept as the gRPC gateway keeps its messages (rocket/gateway/properties.py):
    the first of its KEYS is rocket's key (several go to __rmq.keys), TAGS its tag, UNIQ_KEY __rmq.id, the
    producer's address __rmq.born_host, the rest its properties; the delay properties become its delivery time."""
    keys = properties.get(KEYS, "").split()
    deliver_at_ms = delay_of(properties, now_ms)
    kept = {name: value for name, value in properties.items() if name not in CLIENT_ONLY and name not in RENAMED}
    if len(keys) > 1:
        kept[KEYS_PROPERTY] = " ".join(keys)
    if properties.get(UNIQ_KEY):
        kept[ID_PROPERTY] = properties[UNIQ_KEY]
    if born_host:
        kept[BORN_HOST_PROPERTY] = born_host
    return Message(body, key=keys[0] if keys else "", tag=properties.get(TAGS, ""), properties=kept,
                   timestamp_ms=born_ms or now_ms, deliver_at_ms=deliver_at_ms)


def remoting_properties(message: Message) -> dict[str, str]:
    """rocket's message's properties as a remoting client reads them: KEYS, TAGS and UNIQ_KEY put back (a message
    sent over gRPC reads alike), the producer's address left out (it goes in the layout's born host)."""
    properties = dict(message.properties)
    keys = properties.pop(KEYS_PROPERTY, "") or message.key
    if keys:
        properties[KEYS] = keys
    if message.tag:
        properties[TAGS] = message.tag
    unique = properties.pop(ID_PROPERTY, "")
    if unique:
        properties[UNIQ_KEY] = unique
    properties.pop(BORN_HOST_PROPERTY, None)
    return properties
