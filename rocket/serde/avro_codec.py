"""The Avro serde (fastavro, schemaless binary): RPC messages by the versioned .avsc schemas."""

from __future__ import annotations

import io
from typing import cast

import fastavro

from rocket.errors import Code, RocketError
from rocket.serde import schema

name = "avro"
content_type = "application/avro"


def encode(type_name: str, message: dict) -> bytes:
    buffer = io.BytesIO()
    try:
        fastavro.schemaless_writer(buffer, schema.avro_schema(type_name), message)
    except (TypeError, ValueError, KeyError, AttributeError) as error:
        raise RocketError(Code.BAD_REQUEST, f"message does not fit {type_name}: {error}") from None
    return buffer.getvalue()


def decode(type_name: str, data: bytes | memoryview) -> dict:
    buffer = io.BytesIO(data)
    try:
        message = fastavro.schemaless_reader(buffer, schema.avro_schema(type_name), None)
    except Exception as error:  # fastavro raises many types on garbage; all mean the same here
        raise RocketError(Code.UNDECODABLE, f"body is not valid Avro for {type_name}: {type(error).__name__}") from None
    if buffer.tell() != len(data):
        raise RocketError(Code.UNDECODABLE, f"{len(data) - buffer.tell()} bytes follow the Avro {type_name}")
    return cast(dict, message)  # a record schema reads as a dict
