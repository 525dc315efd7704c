"""PeerHello (rocket/transport/peer_auth.py): what a node proves when it opens a connection to another, and which
methods need it."""

from __future__ import annotations

import pytest

from rocket.errors import Code, RocketError
from rocket.transport.peer_auth import PeerAuth
from rocket.transport.methods import METHODS

SECRET = b"a cluster secret of some length"


class Clock:
    def __init__(self) -> None:
        self.ms = 1_800_000_000_000

    def __call__(self) -> int:
        return self.ms


def refused(auth: PeerAuth, hello: dict, why: str) -> None:
    with pytest.raises(RocketError) as error:
        auth.check(hello)
    assert error.value.code == Code.UNAUTHENTICATED and why in error.value.message


def test_a_hello_of_the_same_secret_is_accepted_once():
    clock = Clock()
    sender, receiver = PeerAuth(SECRET, 2, clock), PeerAuth(SECRET, 1, clock)
    hello = sender.hello()[1]
    receiver.check(hello)
    refused(receiver, hello, "replayed")
    receiver.check(sender.hello()[1])  # a new nonce


def test_other_secrets_tampering_truncation_and_skew_are_refused():
    clock = Clock()
    receiver = PeerAuth(SECRET, 1, clock)
    refused(receiver, PeerAuth(b"another cluster's secret", 2, clock).hello()[1], "signature")
    hello = PeerAuth(SECRET, 2, clock).hello()[1]
    refused(receiver, {**hello, "node": 3}, "signature")  # another node's name on it
    refused(receiver, {**hello, "time_ms": hello["time_ms"] + 1}, "signature")
    refused(receiver, {**hello, "mac": hello["mac"][:-2]}, "signature")
    refused(receiver, {**hello, "mac": ""}, "signature")
    clock.ms += 61_000  # the sender's clock is 61 s behind
    refused(receiver, hello, "clock")


def test_the_methods_between_nodes_are_internal_and_the_clients_ones_are_not():
    internal = {name for name, spec in METHODS.items() if spec.internal}
    assert {"RaftStep", "RaftSnapshotChunk", "NodeHeartbeat", "StorageAppend", "StorageRead", "MetaCreateTopic",
            "MetaUpdateTopic", "GetRoute", "ControllerAlterSyncStateSet", "MetaLoadShare"} <= internal
    assert all(name.startswith(("Storage", "Meta", "Raft", "Controller")) or name in ("NodeHeartbeat", "GetRoute")
               for name in internal)
    assert not internal & {"Produce", "Pull", "CreateTopic", "StorageClasses", "ClusterStatus", "PeerHello", "Ping",
                           "DrainNode", "KvPut", "Receive"}


def test_the_secret_is_long_enough_and_never_printed():
    from rocket import config
    with pytest.raises(config.ConfigError, match="at least 16"):
        config.load(None, {"ROCKET_CLUSTER_SECRET": "short"}, {})
    loaded = config.load(None, {"ROCKET_CLUSTER_SECRET": "s" * 32}, {})
    assert loaded.cluster_secret == "s" * 32 and "s" * 32 not in repr(loaded)
