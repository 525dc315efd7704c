"""A small blocking remoting client over a socket, built on rocket's codec, for protocol-level tests: any header,
either serialization, raw bytes."""

from __future__ import annotations

import socket
import struct

import orjson

from rocket.gateway.remoting import codec
from rocket.gateway.remoting.codec import Command


class RemotingClient:
    def __init__(self, port: int, host: str = "127.0.0.1", timeout_s: float = 30.0):
        self.sock = socket.create_connection((host, port), timeout=timeout_s)
        self.reader = codec.FrameReader()
        self.opaque = 0
        self.pushed: list[Command] = []  # requests the server sent us

    def close(self) -> None:
        self.sock.close()

    def send_raw(self, data: bytes) -> None:
        self.sock.sendall(data)

    def request(self, code: int, ext: dict | None = None, body: bytes = b"", serialize: int = codec.JSON,
                oneway: bool = False) -> Command | None:
        self.opaque += 1
        command = Command(code, self.opaque, codec.FLAG_ONEWAY if oneway else 0,
                          ext={name: str(value) for name, value in (ext or {}).items()}, body=body, serialize=serialize)
        self.sock.sendall(b"".join(codec.encode(command)))
        return None if oneway else self.response(self.opaque)

    def response(self, opaque: int) -> Command:
        while True:
            command = self.next_command()
            if command.is_response and command.opaque == opaque:
                return command
            if not command.is_response:
                self.pushed.append(command)

    def next_command(self) -> Command:
        while (frame := self.reader.next_frame()) is None:
            data = self.sock.recv(1 << 16)
            if not data:
                raise ConnectionError("the server closed the connection")
            self.reader.feed(data)
        return codec.decode(frame)

    def json(self, code: int, ext: dict | None = None, body: bytes = b"", **options) -> dict:
        response = self.request(code, ext, body, **options)
        assert response.code == 0, (response.code, response.remark)
        return orjson.loads(response.body)


def json_frame(header: bytes, body: bytes = b"", serialize: int = 0) -> bytes:
    """A frame around any header bytes."""
    return struct.pack(">II", 4 + len(header) + len(body), (serialize << 24) | len(header)) + header + body
