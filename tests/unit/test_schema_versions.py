"""Schema versions (rocket/serde/versions.py): the .avsc files are the newest frozen version, every frozen version
resolves against them both ways, and a peer of an older version is read and written in its own schemas."""

from __future__ import annotations

import io
import json

import fastavro
import fastavro.utils
import pytest
import trio

from rocket.errors import Code, RocketError
from rocket.serde import avro_codec, json_codec, schema, versions
from rocket.serde.schema import SCHEMA_VERSION
from rocket.transport.h2_client import open_http2_channel
from rocket.transport.h2_server import serve_http2
from rocket.transport.lifecycle import Lifecycle
from rocket.transport.rpc import Dispatcher
from rocket.transport.tcp import serve_tcp
from rocket.transport.tcp_client import TcpChannel, open_tcp_channel

HEARTBEAT = {"node": 7, "address": "127.0.0.1:9000", "roles": ["storage"],
             "load": {"groups": 1, "leads": [3], "bytes": 10, "free_disk_bytes": 20, "lagging": []},
             "assignment_version": 4, "version": "0.1.0"}


def test_the_avsc_files_are_the_newest_frozen_version():
    """Whoever changes a schema raises SCHEMA_VERSION and runs `python -m rocket.serde.versions freeze`."""
    assert versions.frozen_versions() == list(range(1, SCHEMA_VERSION + 1))
    frozen = json.loads(versions.version_path(SCHEMA_VERSION).read_text())
    current = schema.raw_definitions()
    changed = sorted(name for name in frozen.keys() | current.keys() if frozen.get(name) != current.get(name))
    assert not changed, (f"{changed} differ from frozen schema version {SCHEMA_VERSION}: raise SCHEMA_VERSION in "
                         "rocket/serde/schema.py and run `python -m rocket.serde.versions freeze`")


def test_version_1_is_the_schema_set_of_the_first_release():
    """Version 1 is what nodes that say no version (commit 18caf45 and before) speak; it must never change."""
    one = versions.definitions(1)
    assert len(one) == 120 and "rocket.v1.Hello" not in one
    assert [field["name"] for field in one["rocket.v1.NodeHeartbeatRequest"]["fields"]][-1] == "version"


@pytest.mark.parametrize("version", versions.frozen_versions()[:-1] or [1])
def test_every_frozen_version_resolves_against_the_current_schemas(version):
    """Both ways: the current reader takes what an older writer wrote (added fields need defaults), and a current
    message written in the older schema is whole (fields the older schema has that the current lacks need defaults)."""
    for type_name in schema.known_types():
        if schema.full_name(type_name) not in versions.definitions(version):
            continue
        old, new = versions.parsed(version, type_name), versions.parsed(SCHEMA_VERSION, type_name)
        for message in fastavro.utils.generate_many(old, 3):
            buffer = io.BytesIO()
            fastavro.schemaless_writer(buffer, old, message)
            buffer.seek(0)
            fastavro.schemaless_reader(buffer, old, new)
        for message in fastavro.utils.generate_many(new, 3):
            buffer = io.BytesIO()
            fastavro.schemaless_writer(buffer, old, message)
            buffer.seek(0)
            fastavro.schemaless_reader(buffer, old, old)


def test_only_changed_types_take_the_resolving_path_and_the_same_version_costs_nothing():
    assert versions.for_peer(avro_codec, SCHEMA_VERSION) is avro_codec
    assert versions.for_peer(avro_codec, SCHEMA_VERSION + 1) is avro_codec  # a newer peer adapts to us
    assert versions.for_peer(json_codec, 1) is json_codec
    if SCHEMA_VERSION >= 2:
        assert {"NodeHeartbeatRequest", "NodeStatus", "ClusterStatusResponse"} <= versions.changed_since(1)
        assert "TopicRequest" not in versions.changed_since(1)
        assert versions.for_peer(avro_codec, 1) is versions.for_peer(avro_codec, 1)  # cached


def filled(type_name: str, message: dict) -> dict:
    """The message with every default the current schema gives."""
    return avro_codec.decode(type_name, avro_codec.encode(type_name, message))


def old_encode(type_name: str, message: dict, version: int = 1) -> bytes:
    """What a node of the old version writes: its own schema, knowing nothing of later ones."""
    buffer = io.BytesIO()
    fastavro.schemaless_writer(buffer, versions.parsed(version, type_name), message)
    return buffer.getvalue()


def old_decode(type_name: str, data: bytes, version: int = 1) -> dict:
    buffer = io.BytesIO(data)
    message = fastavro.schemaless_reader(buffer, versions.parsed(version, type_name), None)
    assert buffer.tell() == len(data)
    return message


def test_an_older_peers_message_decodes_with_the_added_fields_defaulted():
    older = versions.for_peer(avro_codec, 1)
    decoded = older.decode("NodeHeartbeatRequest", old_encode("NodeHeartbeatRequest", HEARTBEAT))
    assert decoded == filled("NodeHeartbeatRequest", {**HEARTBEAT, "schema_version": 1})
    with pytest.raises(RocketError) as caught:  # without resolution, this is what an upgrade broke
        avro_codec.decode("NodeHeartbeatRequest", old_encode("NodeHeartbeatRequest", HEARTBEAT))
    assert caught.value.code == Code.UNDECODABLE


def test_a_message_for_an_older_peer_is_written_in_its_schema():
    older = versions.for_peer(avro_codec, 1)
    data = older.encode("NodeHeartbeatRequest", {**HEARTBEAT, "schema_version": SCHEMA_VERSION})
    assert old_decode("NodeHeartbeatRequest", data) == old_decode("NodeHeartbeatRequest",
                                                                   old_encode("NodeHeartbeatRequest", HEARTBEAT))
    status = {"id": 1, "address": "a", "roles": [], "state": "up", "heartbeat_age_ms": 5, "load": HEARTBEAT["load"],
              "health": "", "health_reason": "", "version": "0.1.0", "schema_version": 2}
    without = {key: value for key, value in status.items() if key != "schema_version"}
    assert old_decode("NodeStatus", older.encode("NodeStatus", status)) == old_decode("NodeStatus",
                                                                                      old_encode("NodeStatus", without))


def test_json_peers_of_other_versions_need_no_adapting():
    """JSON decoding fills defaults for fields an older peer leaves out and ignores keys a newer peer adds."""
    older = json.dumps({**HEARTBEAT}).encode()
    assert json_codec.decode("NodeHeartbeatRequest", older)["schema_version"] == 1
    newer = json.dumps({**HEARTBEAT, "schema_version": 9, "a_field_of_version_9": [1, 2]}).encode()
    assert json_codec.decode("NodeHeartbeatRequest", newer) == filled("NodeHeartbeatRequest", {**HEARTBEAT, "schema_version": 9})


def test_peer_version_of_what_a_peer_said():
    assert versions.peer_version_of(None) == 1
    assert versions.peer_version_of("3") == 3
    assert versions.peer_version_of("x") == 1
    assert versions.peer_version_of(0) == 1


def test_expanded_schema_writes_each_named_type_once():
    expanded = versions.expanded(1, "ClusterStatusResponse")
    text = json.dumps(expanded)
    assert text.count('"name": "NodeLoad"') == 1
    fastavro.parse_schema(expanded)


async def serve(dispatcher: Dispatcher, nursery: trio.Nursery) -> int:
    return (await nursery.start(serve_tcp, dispatcher, Lifecycle(), "127.0.0.1", 0))


async def test_tcp_client_and_server_agree_on_the_older_version():
    """A current client says Hello; a server of version 1 answers UNKNOWN_METHOD, so the client writes and reads
    version 1. A client that says nothing is version 1 to a current server."""
    seen = []

    async def heartbeat(request: dict) -> dict:
        seen.append(request)
        return {"version": 1, "groups": [], "nodes": [], "unchanged": True}

    dispatcher = Dispatcher()
    dispatcher.handle("NodeHeartbeat", heartbeat)
    async with trio.open_nursery() as nursery:
        port = await serve(dispatcher, nursery)
        async with open_tcp_channel("127.0.0.1", port, "avro") as channel:  # current to current
            assert channel.peer_version == SCHEMA_VERSION
            await channel.call("NodeHeartbeat", {**HEARTBEAT, "schema_version": SCHEMA_VERSION})
        assert seen[-1]["schema_version"] == SCHEMA_VERSION

        # A client of version 1: no Hello, its own schema. Simulated by a channel that skips hello() and writes
        # with version 1's schemas.
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        async with stream, trio.open_nursery() as inner:
            channel = TcpChannel(stream, avro_codec)
            inner.start_soon(channel.read_loop)
            channel._serde = OldAvro()
            await channel.call("NodeHeartbeat", HEARTBEAT)
            inner.cancel_scope.cancel()
        assert seen[-1] == filled("NodeHeartbeatRequest", {**HEARTBEAT, "schema_version": 1})

        # A server that knows no Hello (version 1) answers UNKNOWN_METHOD: the client writes version 1, which
        # this server, taking the connection for version 1's, reads (as a current one it could not: trailing bytes).
        old = Dispatcher()
        old._handlers.pop("Hello")
        old.handle("NodeHeartbeat", heartbeat)
        old_port = await serve(old, nursery)
        async with open_tcp_channel("127.0.0.1", old_port, "avro") as channel:
            assert channel.peer_version == 1
            await channel.call("NodeHeartbeat", {**HEARTBEAT, "schema_version": SCHEMA_VERSION})
        assert seen[-1] == filled("NodeHeartbeatRequest", {**HEARTBEAT, "schema_version": 1})
        nursery.cancel_scope.cancel()


class OldAvro:
    """Avro as a node of version 1 writes and reads it."""
    name = "avro"
    content_type = "application/avro"

    def encode(self, type_name: str, message: dict) -> bytes:
        return old_encode(type_name, message)

    def decode(self, type_name: str, data) -> dict:
        return old_decode(type_name, bytes(data))


async def test_http2_client_and_server_agree_on_the_older_version():
    """Over HTTP/2 the client asks Hello before its first call and says in rocket-schema the version its body is in;
    a server that knows no Hello is version 1, and gets version 1's schemas."""
    seen = []

    async def heartbeat(request: dict) -> dict:
        seen.append(request)
        return {"version": 1, "groups": [], "nodes": [], "unchanged": True}

    current, old = Dispatcher(), Dispatcher()
    old._handlers.pop("Hello")
    for dispatcher in (current, old):
        dispatcher.handle("NodeHeartbeat", heartbeat)
    async with trio.open_nursery() as nursery:
        port = await nursery.start(serve_http2, current, Lifecycle(), "127.0.0.1", 0)
        old_port = await nursery.start(serve_http2, old, Lifecycle(), "127.0.0.1", 0)
        async with open_http2_channel("127.0.0.1", port, "avro") as channel:
            await channel.call("NodeHeartbeat", {**HEARTBEAT, "schema_version": SCHEMA_VERSION})
            assert channel.peer_version == SCHEMA_VERSION
        assert seen[-1]["schema_version"] == SCHEMA_VERSION
        async with open_http2_channel("127.0.0.1", old_port, "avro") as channel:
            await channel.call("NodeHeartbeat", {**HEARTBEAT, "schema_version": SCHEMA_VERSION})
            assert channel.peer_version == 1
        assert seen[-1] == filled("NodeHeartbeatRequest", {**HEARTBEAT, "schema_version": 1})
        nursery.cancel_scope.cancel()
