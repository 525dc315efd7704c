"""Serdes for RPC messages (JSON, Avro and the lane, by serde id: SERDE_IDS) and the formats the codecs here define:
the produce batch, the offload piece, a pop response, the KV export file. Schemas: schemas/*.avsc (schema.py), some
typed too (typed.py); every released set is kept for peers of other versions (versions.py).
"""

from __future__ import annotations

from types import ModuleType

from rocket.errors import Code, RocketError
from rocket.serde import avro_codec, json_codec, lane

SERDE_IDS: dict[int, ModuleType] = {1: json_codec, 2: avro_codec, 3: lane}
SERDE_NAMES: dict[str, ModuleType] = {module.name: module for module in SERDE_IDS.values()}
SERDE_ID_OF: dict[str, int] = {module.name: number for number, module in SERDE_IDS.items()}
SERDE_BY_CONTENT_TYPE: dict[str, ModuleType] = {module.content_type: module for module in SERDE_IDS.values()}


def serde_named(name: str) -> ModuleType:
    try:
        return SERDE_NAMES[name]
    except KeyError:
        raise RocketError(Code.UNSUPPORTED_SERDE, f"serde {name!r} is not one of {sorted(SERDE_NAMES)}") from None

__all__ = ["SERDE_BY_CONTENT_TYPE", "SERDE_IDS", "SERDE_ID_OF", "avro_codec", "batch", "json_codec", "kv_export",
           "piece", "receive", "schema", "serde_named", "typed", "versions"]
