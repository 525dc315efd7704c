"""Serdes for RPC messages (JSON, Avro and the lane, chosen per call) and the produce batch format.

lane.py is the data plane's serde: fixed binary layouts for the hot methods' messages, Avro for the rest; rocket's
own client and the nodes speak it. batch.py is the produce batch (CRC-32C), piece.py the offload unit, receive.py a pop response and its receipts, and
kv_export.py the KV export file. json_codec.py and avro_codec.py are the two serdes, over the schemas in
schemas/*.avsc that schema.py loads.

Schema versions (issue 34). The schema set has a number, schema.SCHEMA_VERSION, and every released set stays in the
package as schemas/versions/N.json. versions.py keeps them and gives the codec for a peer of another version
(for_peer, OlderPeerAvro); parsed schemas are cached per (version, type). Version 1 is the set of commit 18caf45,
whose nodes say no version. Version 2 added Hello, and schema_version (default 1) in NodeHeartbeatRequest and
NodeStatus: the nameserver leader keeps each node's, and `rocket cluster status` shows it beside the rocket version,
so a rolling upgrade shows node by node (an old leader knows no schema versions: it shows 1 for all). How peers say
their version is in rocket/transport/__init__.py. tests/integration/test_upgrade.py runs three nodes of 18caf45 and
upgrades them one at a time to this tree, under produce (JSON) and consume (Avro) load: every phase keeps serving,
heartbeats cross versions both ways, and every acknowledged message is consumed.

A schema change is only additive: a new field has a default, a new type is new. Raise SCHEMA_VERSION and run
`python -m rocket.serde.versions freeze`; tests/unit/test_schema_versions.py fails until you do, and checks that
every frozen version resolves against the new schemas both ways.
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
