"""Loads the versioned Avro schemas (schemas/*.avsc) that define every RPC message, for both serdes. JSON follows
the same schemas (to_json_ready, from_json_ready).
"""

from __future__ import annotations

import base64
import binascii
import functools
import json
from pathlib import Path
from typing import Any

import fastavro.schema

from rocket.errors import Code, RocketError

NAMESPACE = "rocket.v1"
# The schema set's version (see versions.py): raise it, and freeze, whenever a .avsc file changes, or what nodes of a
# version do on the wire (4: the same schemas as 3; a node of 4 on takes POST frames, transport/frames.py; 5: the same
# schemas as 4; a node of 5 on speaks the lane, lane.py; 6 adds group to PullRequest; 7 adds the deletes
# (DeleteTopic, DeleteGroup, StorageDrop: a storage group of 7 applies DROP entries), retention and a request id at
# CreateTopic, a request id at CreateStorageClass; 8 adds the standalone controller's calls: ControllerHeartbeat,
# ControllerGroups, ControllerHandover, ControllerHandOverFrom, ControllerMembers). Schema versions came with issue
# 34: version 1 is the set of commit 18caf45, whose nodes say no version. Version 2 added Hello, and schema_version
# (default 1) in NodeHeartbeatRequest and NodeStatus: the nameserver leader keeps each node's, and `rocket cluster
# status` shows it beside the rocket version, so a rolling upgrade shows node by node (an old leader knows no schema
# versions: it shows 1 for all). tests/integration/test_upgrade.py runs three nodes of 18caf45 and upgrades them one at
# a time to this tree, under produce (JSON) and consume (Avro) load: every phase keeps serving, heartbeats cross
# versions both ways, and every acknowledged message is consumed.
SCHEMA_VERSION = 10  # 10 adds read replicas: a topic's read_replicas, a group's readers
SCHEMA_DIRECTORY = Path(__file__).parent / "schemas"
_int_bounds = {"int": (-(2**31), 2**31 - 1), "long": (-(2**63), 2**63 - 1)}


def full_name(type_name: str) -> str:
    return type_name if "." in type_name else f"{NAMESPACE}.{type_name}"


@functools.cache
def avro_schema(type_name: str):
    """The parsed schema for a message type, e.g. 'ProduceRequest'."""
    path = SCHEMA_DIRECTORY / f"{full_name(type_name)}.avsc"
    if not path.exists():
        raise KeyError(f"no schema {path.name}")
    return fastavro.schema.load_schema(str(path))


@functools.cache
def raw_definitions() -> dict[str, dict]:
    """The current schema set: full type name -> its .avsc definition."""
    definitions = {}
    for path in SCHEMA_DIRECTORY.glob("*.avsc"):
        definition = json.loads(path.read_text())
        definitions[f"{definition['namespace']}.{definition['name']}"] = definition
    return definitions


def known_types() -> list[str]:
    return sorted(name.rsplit(".", 1)[1] for name in raw_definitions())


def to_json_ready(type_name: str, value: dict) -> dict:
    """Turn bytes into base64 so orjson can write the message. JSON follows the Avro schemas: bytes fields travel as
    base64 strings."""
    try:
        return _compiled(full_name(type_name), False)(value)
    except Exception:  # the walk below says what is wrong, with the field's path
        return _walk(raw_definitions()[full_name(type_name)], value, "", decoding=False)


def from_json_ready(type_name: str, value: object) -> dict:
    """Validate a parsed JSON message against its schema and turn base64 back into bytes. Types and required fields
    are checked so that a bad request gets BAD_REQUEST naming the field."""
    try:
        return _compiled(full_name(type_name), True)(value)
    except Exception:
        return _walk(raw_definitions()[full_name(type_name)], value, "", decoding=True)


class _Mismatch(Exception):
    """A value does not fit its schema: _walk, run again, finds where and says so."""


_MISSING = object()


@functools.cache
def _compiled(name: str, decoding: bool):
    """_walk for one named type, done once: a function of a message that does what _walk does to it when it fits
    (each field converted, defaults filled, other keys dropped), and raises when it does not. Built on first use, so
    that a message costs no walk of its schema, no lookups of its types and no path of each field."""
    convert = _compile(raw_definitions()[name], decoding)
    return convert if convert is not None else (lambda value: value)


def _compile(schema, decoding: bool):
    """A function that converts a value of schema as _walk does, or None where _walk returns the value unchanged."""
    if isinstance(schema, str):
        if schema in _int_bounds:
            if not decoding:
                return None
            low, high = _int_bounds[schema]

            def integer(value):
                if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
                    raise _Mismatch
                return value
            return integer
        if schema in ("string", "boolean"):
            kind = str if schema == "string" else bool
            return _checked(kind) if decoding else None
        if schema == "bytes":
            return _from_base64 if decoding else _to_base64
        if schema in ("double", "float"):
            return _to_float if decoding else float
        named = full_name(schema)
        return lambda value: _compiled(named, decoding)(value)  # looked up at use: a type may refer to itself
    kind = schema["type"]
    if kind == "array":
        item = _compile(schema["items"], decoding)

        def array(value):
            if not isinstance(value, list):
                raise _Mismatch
            return value if item is None else [item(each) for each in value]
        return array
    if kind == "record":
        fields = [(field["name"], _compile(field["type"], decoding), "default" in field, field.get("default"))
                  for field in schema["fields"]]

        def record(value):
            if not isinstance(value, dict):
                raise _Mismatch
            result = {}
            for name, convert, has_default, default in fields:
                each = value.get(name, _MISSING)
                if each is not _MISSING:
                    result[name] = each if convert is None else convert(each)
                elif has_default:
                    result[name] = default
                else:
                    raise _Mismatch
            return result
        return record
    return _compile(kind, decoding)


def _checked(kind: type):
    def check(value):
        if not isinstance(value, kind):
            raise _Mismatch
        return value
    return check


def _to_base64(value) -> str:
    return base64.b64encode(value).decode("ascii")


def _from_base64(value):
    if not isinstance(value, str):
        raise _Mismatch
    return base64.b64decode(value, validate=True)


def _to_float(value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _Mismatch
    return float(value)


def _bad(path: str, problem: str) -> RocketError:
    return RocketError(Code.BAD_REQUEST, f"field {path or '<body>'}: {problem}")


def _walk(schema, value, path: str, decoding: bool) -> Any:  # a value of schema's type
    if isinstance(schema, str):
        if schema in _int_bounds:
            if decoding:
                low, high = _int_bounds[schema]
                if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
                    raise _bad(path, f"expected an {schema}")
            return value
        if schema == "string":
            if decoding and not isinstance(value, str):
                raise _bad(path, "expected a string")
            return value
        if schema == "bytes":
            if not decoding:
                return base64.b64encode(value).decode("ascii")
            if not isinstance(value, str):
                raise _bad(path, "expected base64 text")
            try:
                return base64.b64decode(value, validate=True)
            except (binascii.Error, ValueError):
                raise _bad(path, "invalid base64") from None
        if schema in ("double", "float"):
            if decoding and (isinstance(value, bool) or not isinstance(value, (int, float))):
                raise _bad(path, "expected a number")
            return float(value)
        if schema == "boolean":
            if decoding and not isinstance(value, bool):
                raise _bad(path, "expected true or false")
            return value
        return _walk(raw_definitions()[full_name(schema)], value, path, decoding)
    kind = schema["type"]
    if kind == "array":
        if not isinstance(value, list):
            raise _bad(path, "expected an array")
        return [_walk(schema["items"], item, f"{path}[{index}]", decoding) for index, item in enumerate(value)]
    if kind == "record":
        if not isinstance(value, dict):
            raise _bad(path, "expected an object")
        result = {}
        for field in schema["fields"]:
            name = field["name"]
            child = f"{path}.{name}" if path else name
            if name in value:
                result[name] = _walk(field["type"], value[name], child, decoding)
            elif "default" in field:
                result[name] = field["default"]
            else:
                raise _bad(child, "is required")
        return result
    return _walk(kind, value, path, decoding)
