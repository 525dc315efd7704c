"""The gRPC wire format, with no I/O: status codes, GrpcError, length-prefixed message framing (also used by
rocket's own HTTP/2 streams), grpc-timeout parsing and grpc-message encoding."""

from __future__ import annotations

import struct
from collections.abc import Callable

from rocket import limits

message_prefix = struct.Struct(">BI")  # gRPC framing: compressed flag (always 0), big-endian message length
GRPC_TIMEOUT_UNITS = {"H": 3600.0, "M": 60.0, "S": 1.0, "m": 1e-3, "u": 1e-6, "n": 1e-9}


class GrpcStatus:
    """gRPC status codes (grpc/doc/statuscodes.md) that this transport answers with."""
    OK = 0
    CANCELLED = 1
    UNKNOWN = 2
    INVALID_ARGUMENT = 3
    DEADLINE_EXCEEDED = 4
    PERMISSION_DENIED = 7
    RESOURCE_EXHAUSTED = 8
    UNIMPLEMENTED = 12
    INTERNAL = 13
    UNAVAILABLE = 14
    UNAUTHENTICATED = 16


class GrpcError(Exception):
    """Raised by a gRPC handler (or the transport) to end a call with a non-OK grpc-status."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status
        self.message = message


def check_grpc_prefix(flag: int, length: int) -> None:
    """What gRPC forbids in a message prefix, as its statuses."""
    if flag == 1:
        raise GrpcError(GrpcStatus.UNIMPLEMENTED, "compressed messages are not supported (no grpc-encoding)")
    if flag != 0:
        raise GrpcError(GrpcStatus.INTERNAL, f"malformed message prefix: compressed flag {flag}")
    if length > limits.grpc_message_bytes_max:
        raise GrpcError(GrpcStatus.RESOURCE_EXHAUSTED,
                        f"message of {length} bytes exceeds the limit of {limits.grpc_message_bytes_max}")


def grpc_timeout_s(value: str | None) -> float | None:
    """grpc-timeout: at most 8 digits and a unit; None when absent (a malformed one is INVALID_ARGUMENT)."""
    if value is None:
        return None
    digits, unit = value[:-1], value[-1:]
    if not digits.isdigit() or len(digits) > 8 or unit not in GRPC_TIMEOUT_UNITS:
        raise GrpcError(GrpcStatus.INVALID_ARGUMENT, f"malformed grpc-timeout {value[:32]!r}")
    timeout_s = int(digits) * GRPC_TIMEOUT_UNITS[unit]
    return None if timeout_s > limits.grpc_timeout_s_max else timeout_s


def is_grpc(headers: dict[str, str]) -> bool:
    content_type = headers.get("content-type", "")
    return content_type == "application/grpc" or content_type.startswith(("application/grpc+", "application/grpc;"))


def grpc_message_text(text: str) -> str:
    """grpc-message is percent-encoded UTF-8 (gRPC over HTTP/2, "Responses")."""
    return "".join(char if " " <= char <= "~" and char != "%" else "".join(f"%{byte:02X}" for byte in char.encode())
                   for char in text[:limits.header_text_chars_max])


def split_messages(buffer: bytearray, check: Callable[[int, int], None]) -> list[bytes]:
    """Remove and return the complete length-prefixed messages at the front of buffer (gRPC's framing:
    1 flag byte, 4-byte length); check(flag, length) refuses a prefix."""
    messages: list[bytes] = []
    offset = 0
    while len(buffer) - offset >= message_prefix.size:
        flag, length = message_prefix.unpack_from(buffer, offset)
        check(flag, length)
        end = offset + message_prefix.size + length
        if len(buffer) < end:
            break
        messages.append(bytes(buffer[offset + message_prefix.size:end]))
        offset = end
    del buffer[:offset]
    return messages
