"""Users, policies and the decision on each call (rocket/access.py), and their place in the metadata."""

from __future__ import annotations

import re
from pathlib import Path

import orjson
import pytest
from hypothesis import given, settings, strategies as st

from rocket import access
from rocket.errors import Code, RocketError
from rocket.raft.types import Entry
from rocket.roles.nameserver.metadata import Metadata
from rocket.parked import Slot
from rocket.transport.guard import Caller, Guard
from rocket.transport.methods import METHODS, method_spec
from rocket.transport.rpc import Dispatcher

KEY = access.cluster_key("a cluster secret of some length")


class Clock:
    def __init__(self) -> None:
        self.ms = 1_800_000_000_000
        self.s = 0.0

    def wall_ms(self) -> int:
        return self.ms

    def monotonic(self) -> float:
        return self.s


def node_access(clock: Clock, users=(("alice", "alice-secret-0123456", False), ("root", "root-secret-01234567", True)),
                policies=()) -> access.Access:
    enforcing = access.Access(KEY, clock.wall_ms, clock.monotonic)
    enforcing.update({"version": 1, "changed": True,
                      "users": [{"user": name, "sealed": access.seal(KEY, name, secret), "super": is_super,
                                 "created_ms": 0} for name, secret, is_super in users],
                      "policies": [access.Policy(*policy).to_wire() for policy in policies]})
    return enforcing


def refused(code: Code, call, *args, why: str = "") -> None:
    with pytest.raises(RocketError) as error:
        call(*args)
    assert error.value.code == code and why in error.value.message, error.value


# ---- policies ---------------------------------------------------------------------------------------------------

POLICIES = [
    access.Policy("alice", "topic:orders-*", ("pub", "sub")),
    access.Policy("alice", "topic:orders-secret", ("pub",), "deny"),
    access.Policy("alice", "group:billing", ("sub",)),
    access.Policy("alice", "bucket:cfg", ("kv-read",), cidrs=("10.0.0.0/8",)),
]


@pytest.mark.parametrize("action, resource, source, allowed", [
    ("pub", "topic:orders-eu", "127.0.0.1", True),
    ("sub", "topic:orders-eu", "127.0.0.1", True),
    ("admin", "topic:orders-eu", "127.0.0.1", False),  # an action not granted
    ("pub", "topic:orders", "127.0.0.1", False),  # the prefix is orders-, not orders
    ("pub", "topic:payments", "127.0.0.1", False),
    ("pub", "topic:orders-secret", "127.0.0.1", False),  # deny wins over the allow of orders-*
    ("sub", "topic:orders-secret", "127.0.0.1", True),  # the deny names pub only
    ("sub", "group:billing", "127.0.0.1", True),
    ("sub", "group:billing-2", "127.0.0.1", False),  # no wildcard: exactly that group
    ("kv-read", "bucket:cfg", "10.1.2.3", True),
    ("kv-read", "bucket:cfg", "127.0.0.1", False),  # outside the policy's network
    ("kv-read", "bucket:cfg", "", False),  # no address at all
    ("kv-write", "bucket:cfg", "10.1.2.3", False),
])
def test_a_call_needs_an_allow_and_no_deny(action, resource, source, allowed):
    assert (access.denial(POLICIES, [(action, resource)], source) is None) == allowed


def test_every_need_of_a_call_must_be_allowed():
    assert access.denial(POLICIES, [("sub", "topic:orders-eu"), ("sub", "group:billing")], "1.2.3.4") is None
    reason = access.denial(POLICIES, [("sub", "topic:orders-eu"), ("sub", "group:other")], "1.2.3.4")
    assert reason == "no policy allows sub on group:other from 1.2.3.4"


def test_patterns_actions_and_networks_are_checked():
    for good in ("cluster", "topic:orders", "topic:orders-*", "topic:*", "group:billing", "bucket:cfg"):
        assert access.check_resource(good) == good
    for bad in ("", "orders", "topic:", "queue:orders", "topic:or*ders", "cluster:x"):
        refused(Code.BAD_REQUEST, access.check_resource, bad, why="resource")
    assert access.check_actions(["pub", "sub", "pub"]) == ("pub", "sub")
    for bad in ([], ["publish"], ["pub", "read"]):
        refused(Code.BAD_REQUEST, access.check_actions, bad, why="actions")
    assert access.check_cidrs(["10.1.2.3/8", "::1"]) == ("10.0.0.0/8", "::1/128")
    refused(Code.BAD_REQUEST, access.check_cidrs, ["10.0.0.300/8"], why="source network")
    refused(Code.BAD_REQUEST, access.check_user_name, "bad user", why="letters")


def test_every_client_method_says_what_it_needs():
    """A method added without a line in access.py's table would need admin on the cluster: name it there."""
    for name, spec in METHODS.items():
        if not spec.internal:
            assert access.covers(name), name
    assert access.needs_of("Produce", {"topic": "t", "queue": -1}) == [("pub", "topic:t")]
    assert access.needs_of("Receive", {"topic": "t", "group": "g"}) == [("sub", "topic:t"), ("sub", "group:g")]
    assert access.needs_of("Pull", {"topic": "t"}) == [("sub", "topic:t")]
    assert access.needs_of("KvPut", {"bucket": "b"}) == [("kv-write", "bucket:b")]
    assert access.needs_of("AclGrant", {"user": "x"}) == [("admin", "cluster")]
    assert access.needs_of("ListTopics", {}) == []


# ---- secrets and hellos -----------------------------------------------------------------------------------------

def test_secrets_are_sealed_bound_to_their_user_and_key():
    sealed = access.seal(KEY, "alice", "alice-secret-0123456")
    assert b"alice-secret" not in sealed.encode() and access.unseal(KEY, "alice", sealed) == b"alice-secret-0123456"
    assert access.seal(KEY, "alice", "alice-secret-0123456") != sealed  # a fresh nonce each time
    refused(Code.UNAUTHENTICATED, access.unseal, KEY, "mallory", sealed, why="sealed")  # moved to another user
    refused(Code.UNAUTHENTICATED, access.unseal, access.cluster_key("another cluster's secret"), "alice", sealed)


def test_a_hello_signs_in_once_and_only_with_the_right_secret_and_time():
    clock = Clock()
    enforcing = node_access(clock)
    method, hello = access.Credentials("alice", "alice-secret-0123456").hello(clock.ms)
    assert method == "Authenticate" and enforcing.authenticate(hello, "1.2.3.4") == "alice"
    refused(Code.UNAUTHENTICATED, enforcing.authenticate, hello, "1.2.3.4", why="replayed")
    fresh = access.Credentials("alice", "alice-secret-0123456").hello(clock.ms)[1]
    refused(Code.UNAUTHENTICATED, enforcing.authenticate, {**fresh, "user": "root"}, "1.2.3.4", why="signature")
    refused(Code.UNAUTHENTICATED, enforcing.authenticate, {**fresh, "time_ms": clock.ms + 1}, "1.2.3.4",
            why="signature")  # tampered
    refused(Code.UNAUTHENTICATED, enforcing.authenticate, {**fresh, "mac": fresh["mac"][:20]}, "1.2.3.4",
            why="signature")  # truncated
    wrong = access.Credentials("alice", "not-alices-secret-000").hello(clock.ms)[1]
    refused(Code.UNAUTHENTICATED, enforcing.authenticate, wrong, "1.2.3.4", why="signature")
    nobody = access.Credentials("nobody", "whatever-secret-0000").hello(clock.ms)[1]
    refused(Code.UNAUTHENTICATED, enforcing.authenticate, nobody, "1.2.3.4", why="no user")
    skewed = access.Credentials("alice", "alice-secret-0123456").hello(clock.ms - 61_000)[1]
    refused(Code.UNAUTHENTICATED, enforcing.authenticate, skewed, "1.2.3.4", why="clock")
    assert enforcing.authenticate(fresh, "1.2.3.4") == "alice"  # all that did not use it up


def test_guessing_from_one_source_is_refused_unheard_for_a_minute():
    clock = Clock()
    enforcing = node_access(clock)
    for _ in range(30):
        wrong = access.Credentials("alice", "guess-guess-guess-00").hello(clock.ms)[1]
        refused(Code.UNAUTHENTICATED, enforcing.authenticate, wrong, "6.6.6.6", why="signature")
    right = access.Credentials("alice", "alice-secret-0123456").hello
    refused(Code.UNAUTHENTICATED, enforcing.authenticate, right(clock.ms)[1], "6.6.6.6", why="too many")
    assert enforcing.authenticate(right(clock.ms)[1], "7.7.7.7") == "alice"  # other sources are not held
    clock.s += 61
    assert enforcing.authenticate(right(clock.ms)[1], "6.6.6.6") == "alice"


def test_authorize_uses_the_policies_of_the_user_and_lets_super_users_through():
    clock = Clock()
    enforcing = node_access(clock, policies=[("alice", "topic:orders", ("pub",))])
    enforcing.authorize("alice", [("pub", "topic:orders")], "1.2.3.4")
    refused(Code.PERMISSION_DENIED, enforcing.authorize, "alice", [("sub", "topic:orders")], "1.2.3.4",
            why="no policy allows sub on topic:orders")
    enforcing.authorize("root", [("admin", "cluster")], "1.2.3.4")
    refused(Code.UNAUTHENTICATED, enforcing.authorize, "gone", [], "1.2.3.4", why="no longer exists")


async def test_local_calls_made_for_a_user_are_authorized_as_calls_from_the_wire():
    """Guard.authorize is the one point: a gateway's or the console's call as a user is checked as that user's
    call from the wire would be (a parked handler's too), and a refusal never reaches the handler; the node's own
    calls (no caller) are trusted."""
    clock = Clock()
    dispatcher = Dispatcher()
    dispatcher.guard.access = node_access(clock, policies=[("alice", "topic:orders", ("pub",)),
                                                     ("alice", "topic:orders", ("sub",)),
                                                     ("alice", "group:billing", ("sub",))])
    served = []

    async def pull(request):
        served.append(("Pull", request["topic"]))
        return {}

    def produce(request, slot: Slot) -> None:
        served.append(("Produce", request["topic"]))
        slot.complete({})
    dispatcher.handle("Pull", pull)
    dispatcher.handle("Produce", pull, parked=produce)
    alice = Caller(source="1.2.3.4", user="alice")
    await dispatcher.local("Produce", {"topic": "orders"}, alice)
    await dispatcher.local("Pull", {"topic": "orders", "group": "billing"}, alice)
    for name, request, why in [("Produce", {"topic": "payments"}, "pub on topic:payments"),
                               ("Pull", {"topic": "orders", "group": "audit"}, "sub on group:audit"),
                               ("Pull", {"topic": "payments", "group": ""}, "sub on topic:payments")]:
        with pytest.raises(RocketError) as denied:
            await dispatcher.local(name, request, alice)
        assert denied.value.code == Code.PERMISSION_DENIED and why in denied.value.message
    with pytest.raises(RocketError) as anonymous:
        await dispatcher.local("Pull", {"topic": "orders"}, Caller(source="1.2.3.4"))
    assert anonymous.value.code == Code.UNAUTHENTICATED
    assert dispatcher.guard.access.refusals == {"PERMISSION_DENIED": 3, "UNAUTHENTICATED": 1}
    with pytest.raises(RocketError):
        dispatcher.guard.authorize(alice, "Pull", {"topic": "payments"}, counted=False)  # a page's own look
    assert sum(dispatcher.guard.access.refusals.values()) == 4
    await dispatcher.local("Pull", {"topic": "payments"})  # the node's own call
    assert served == [("Produce", "orders"), ("Pull", "orders"), ("Pull", "payments")]


def test_the_guard_alone_admits_by_what_a_connection_proved():
    """Before a call is decoded: internal methods only for the cluster's nodes (with peers_only), and with auth on
    nothing but the open methods before a connection signs in; AclWhoAmI answers what it proved."""
    clock = Clock()
    guard = Guard()
    stranger, node = Caller(source="1.2.3.4"), Caller(source="10.0.0.2", peer=True)
    guard.admit(method_spec("StorageAppend"), stranger)  # no cluster secret: nothing to prove
    guard.peers_only = True
    refused(Code.UNAUTHENTICATED, guard.admit, method_spec("StorageAppend"), stranger, why="PeerHello")
    guard.admit(method_spec("StorageAppend"), node)
    guard.admit(method_spec("Produce"), stranger)  # auth off
    guard.access = node_access(clock)
    refused(Code.UNAUTHENTICATED, guard.admit, method_spec("Produce"), stranger, why="needs credentials")
    guard.admit(method_spec("Authenticate"), stranger)
    hello = access.Credentials("alice", "alice-secret-0123456").hello(clock.ms)[1]
    assert guard.about_connection("Authenticate", hello, stranger) == {} and stranger.user == "alice"
    guard.admit(method_spec("Produce"), stranger)
    assert guard.about_connection("AclWhoAmI", {}, stranger) == {"user": "alice", "super": False}
    assert guard.about_connection("AclWhoAmI", {}, node) == {"user": "", "super": True}


def test_the_gateways_and_the_console_decide_no_grant_themselves():
    """They prove who calls and call the node's methods as that user: no policy is evaluated outside access.py and
    Guard.authorize."""
    deciding = re.compile(r"\b(denial|_?access\.authorize)\(")
    gateways = Path(__file__).parents[2] / "rocket" / "gateway"
    found = [f"{path.relative_to(gateways)}: {line.strip()}" for path in sorted(gateways.rglob("*.py"))
             for line in path.read_text().splitlines() if deciding.search(line)]
    assert not found, found


@settings(max_examples=300, deadline=None)
@given(st.fixed_dictionaries({"user": st.text(max_size=20), "time_ms": st.integers(-2**63, 2**63 - 1),
                              "nonce": st.text(max_size=40), "mac": st.text(max_size=80)}))
def test_garbage_hellos_are_refused_with_one_code(hello):
    clock = Clock()
    with pytest.raises(RocketError) as error:
        node_access(clock).authenticate(hello, "1.2.3.4")
    assert error.value.code == Code.UNAUTHENTICATED and "\n" not in error.value.message


# ---- the metadata -----------------------------------------------------------------------------------------------

def apply(metadata: Metadata, *commands: dict) -> list:
    entries = [Entry(term=1, index=metadata.version + 1 + i, data=orjson.dumps(command))
               for i, command in enumerate(commands)]
    return metadata.apply(entries, None)


def test_users_and_policies_are_kept_in_the_metadata_and_its_snapshots():
    metadata = Metadata()
    sealed = access.seal(KEY, "alice", "alice-secret-0123456")
    policy = {"user": "alice", "resource": "topic:a", "actions": ["pub"], "effect": "allow", "cidrs": []}
    results = apply(metadata, {"op": "create_user", "user": "alice", "sealed": sealed, "super": False,
                               "created_ms": 5},
                    {"op": "create_user", "user": "alice", "sealed": sealed, "super": True, "created_ms": 6},
                    {"op": "grant", "policy": policy},
                    {"op": "grant", "policy": {**policy, "user": "bob"}},
                    {"op": "grant", "policy": {**policy, "actions": ["pub", "sub"]}})
    assert results[0] is None and isinstance(results[1], RocketError) and isinstance(results[3], RocketError)
    assert list(metadata.policies.values()) == [{**policy, "actions": ["pub", "sub"]}]  # one per resource and effect
    assert metadata.acl_version == 3
    restored = Metadata()
    restored.restore(metadata.snapshot())
    assert restored.users == metadata.users and restored.policies == metadata.policies and restored.acl_version == 3
    results = apply(restored, {"op": "revoke", "user": "alice", "resource": "topic:b", "effect": ""},
                    {"op": "delete_user", "user": "alice"})
    assert isinstance(results[0], RocketError) and results[1] is None
    assert restored.users == {} and restored.policies == {}  # a user's policies go with it
