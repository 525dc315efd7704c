"""Schema versions: every released schema set (schemas/versions/<N>.json), kept, so that a node talks to peers of
other releases; the newer side adapts (for_peer), the older one knows nothing. Parsed schemas are cached per
(version, type).
"""

from __future__ import annotations

import functools
import io
import json
import sys
from pathlib import Path
from types import ModuleType
from typing import Any, cast

import fastavro

from rocket.errors import Code, RocketError
from rocket.serde import avro_codec, lane, schema
from rocket.serde.schema import SCHEMA_VERSION

VERSIONS_DIRECTORY = schema.SCHEMA_DIRECTORY / "versions"
_PRIMITIVES = {"null", "boolean", "int", "long", "float", "double", "bytes", "string"}


def version_path(version: int) -> Path:
    return VERSIONS_DIRECTORY / f"{version}.json"


@functools.cache
def definitions(version: int) -> dict[str, dict]:
    """A version's schema set: full type name -> definition (as in its .avsc file)."""
    if version == SCHEMA_VERSION:
        return schema.raw_definitions()
    path = version_path(version)
    if not path.exists():
        raise KeyError(f"no frozen schema version {version} ({path.name})")
    return json.loads(path.read_text())


def frozen_versions() -> list[int]:
    return sorted(int(path.stem) for path in VERSIONS_DIRECTORY.glob("*.json"))


def expanded(version: int, type_name: str, keep_docs: bool = True):
    """A type's schema with every named type it refers to written out (once; later references by name)."""
    return _expand(schema.full_name(type_name), definitions(version), set(), keep_docs)


def _expand(node, defined: dict[str, dict], seen: set[str], keep_docs: bool):
    if isinstance(node, str):
        if node in _PRIMITIVES:
            return node
        full = schema.full_name(node)
        if full in seen or full not in defined:
            return full
        seen.add(full)
        return _expand(defined[full], defined, seen, keep_docs)
    if isinstance(node, list):
        return [_expand(branch, defined, seen, keep_docs) for branch in node]
    result = {key: value for key, value in node.items() if keep_docs or key != "doc"}
    kind = node["type"]
    if kind in ("record", "error", "enum", "fixed"):
        seen.add(f"{node['namespace']}.{node['name']}" if "namespace" in node else schema.full_name(node["name"]))
    if kind in ("record", "error"):
        result["fields"] = [{**{key: value for key, value in field.items() if keep_docs or key != "doc"},
                             "type": _expand(field["type"], defined, seen, keep_docs)} for field in node["fields"]]
    elif kind == "array":
        result["items"] = _expand(node["items"], defined, seen, keep_docs)
    elif kind == "map":
        result["values"] = _expand(node["values"], defined, seen, keep_docs)
    elif kind not in ("enum", "fixed"):
        result["type"] = _expand(kind, defined, seen, keep_docs)
    return result


@functools.cache
def parsed(version: int, type_name: str):
    """A version's parsed schema of a type (the current version's is schema.avro_schema)."""
    if version == SCHEMA_VERSION:
        return schema.avro_schema(type_name)
    return fastavro.parse_schema(expanded(version, type_name))


@functools.cache
def changed_since(version: int) -> frozenset[str]:
    """The types (short names) whose schema, named types it uses included, differs between version and now.
    Types the version did not have are not among them: a peer of that version never sends or asks for them."""
    old = definitions(version)
    changed = set()
    for type_name in schema.known_types():
        if schema.full_name(type_name) not in old:
            continue
        if expanded(version, type_name, keep_docs=False) != expanded(SCHEMA_VERSION, type_name, keep_docs=False):
            changed.add(type_name)
    return frozenset(changed)


class OlderPeerAvro:
    """The Avro serde as it talks to a peer of an older schema version: the types that changed since are written
    with the peer's schema and read with it as the writer's; the others go to the plain avro codec."""

    def __init__(self, codec: ModuleType, version: int):
        self._codec = codec
        self.version = version
        self.name = codec.name
        self.content_type = codec.content_type
        self._changed = changed_since(version)

    def encode(self, type_name: str, message: dict) -> bytes:
        if type_name not in self._changed:
            return self._codec.encode(type_name, message)
        buffer = io.BytesIO()
        try:
            fastavro.schemaless_writer(buffer, parsed(self.version, type_name), message)
        except (TypeError, ValueError, KeyError, AttributeError) as error:
            raise RocketError(Code.BAD_REQUEST, f"message does not fit {type_name} of schema version "
                              f"{self.version}: {error}") from None
        return buffer.getvalue()

    def decode(self, type_name: str, data: bytes | memoryview) -> dict:
        if type_name not in self._changed:
            return self._codec.decode(type_name, data)
        buffer = io.BytesIO(data)
        try:
            message = fastavro.schemaless_reader(buffer, parsed(self.version, type_name), parsed(SCHEMA_VERSION, type_name))
        except Exception as error:  # fastavro raises many types on garbage; all mean the same here
            raise RocketError(Code.UNDECODABLE, f"body is not valid Avro for {type_name} of schema version "
                              f"{self.version}: {type(error).__name__}") from None
        if buffer.tell() != len(data):
            raise RocketError(Code.UNDECODABLE, f"{len(data) - buffer.tell()} bytes follow the Avro {type_name}")
        return cast(dict, message)  # a record schema reads as a dict

    def __repr__(self) -> str:
        return f"<avro for schema version {self.version}>"


@functools.cache
def for_peer(codec: ModuleType, peer_version: int) -> ModuleType:
    """The serde to talk to a peer of peer_version with: the codec itself unless the peer is older and it is Avro or
    the lane. The lane of an older version lays its types out as that version's schemas do; a peer older than the
    lane that speaks it anyway is read as this version's (a client asks spoken() before it speaks).

    Peers say their version when they connect (the Hello method on TCP, the rocket-schema header on HTTP/2; a peer
    that says nothing is version 1). For a peer of an older version the Avro codec decodes with that version's schema
    as the writer's and the current one as the reader's (fastavro's schema resolution: fields the peer does not know
    get their defaults), and encodes with that version's schema (fields the peer does not know are left out). Only
    the types that differ between the two versions take that path; a peer of the same version or newer gets the plain
    codec module itself, at no cost per message. JSON needs no adapting: decoding ignores unknown keys and fills
    defaults (schema.from_json_ready)."""
    if peer_version >= SCHEMA_VERSION or codec.name == "json" or not changed_since(max(peer_version, 1)):
        return codec
    # A Lane and an OlderPeerAvro are typed as the codec modules they stand in for. And pyright takes a module
    # itself for unhashable, though for_peer caches by it: avro_codec's cast.
    if codec.name == "lane":
        if peer_version < lane.LANE_SINCE_SCHEMA:
            return codec
        return cast(ModuleType, lane.Lane(lane.layouts_of(definitions(peer_version), schema.raw_definitions()),
                                          for_peer(cast(ModuleType, avro_codec), peer_version)))
    return cast(ModuleType, OlderPeerAvro(codec, max(peer_version, 1)))


def spoken(codec: ModuleType, server_version: int) -> ModuleType:
    """The serde a client speaks to a server of server_version, having chosen codec: Avro for the lane to a server
    older than the lane."""
    return avro_codec if codec.name == "lane" and server_version < lane.LANE_SINCE_SCHEMA else codec


def peer_version_of(value: object) -> int:
    """A peer's version as it said it (a header's text, a Hello's field); nothing or nonsense: version 1."""
    try:
        version = int(cast(Any, value))  # whatever the peer sent: int() raises on what is not a number
    except (TypeError, ValueError):
        return 1
    return version if version >= 1 else 1


def freeze(force: bool = False) -> Path:
    """Write the current .avsc files as version SCHEMA_VERSION; refuse to change a version already frozen.

    Each released set is frozen in schemas/versions/<N>.json (full type name -> its .avsc definition) by
    `python -m rocket.serde.versions freeze`. A schema change is only additive: a new field has a default, a new type
    is new. Raise SCHEMA_VERSION and freeze; tests/unit/test_schema_versions.py fails while the .avsc files differ
    from the newest frozen set, and checks that every frozen version resolves against the new schemas both ways."""
    current = {name: definition for name, definition in sorted(schema.raw_definitions().items())}
    path = version_path(SCHEMA_VERSION)
    if path.exists() and json.loads(path.read_text()) != current and not force:
        raise SystemExit(f"{path} is frozen and differs from the .avsc files: a released version never changes. "
                         f"Raise SCHEMA_VERSION in rocket/serde/schema.py to {SCHEMA_VERSION + 1} and freeze again.")
    VERSIONS_DIRECTORY.mkdir(exist_ok=True)
    path.write_text(json.dumps(current, indent=1, sort_keys=True) + "\n")
    return path


if __name__ == "__main__":
    if sys.argv[1:2] != ["freeze"]:
        raise SystemExit("usage: python -m rocket.serde.versions freeze")
    print(f"wrote {freeze()}")
