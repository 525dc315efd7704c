"""The JSON serde (orjson): RPC messages as JSON objects shaped by the Avro schemas."""

from __future__ import annotations

import orjson

from rocket.errors import Code, RocketError
from rocket.serde import schema

name = "json"
content_type = "application/json"


def encode(type_name: str, message: dict) -> bytes:
    return orjson.dumps(schema.to_json_ready(type_name, message))


def decode(type_name: str, data: bytes | memoryview) -> dict:
    try:
        parsed = orjson.loads(data)
    except orjson.JSONDecodeError as error:
        raise RocketError(Code.UNDECODABLE, f"body is not valid JSON: {error}") from None
    return schema.from_json_ready(type_name, parsed)
