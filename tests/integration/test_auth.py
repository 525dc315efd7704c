"""A node with auth on (issue 34): every protocol refuses an unsigned call (UNAUTHENTICATED) and a call no policy allows
(PERMISSION_DENIED), and changes nothing; allowed calls are served. The matrix is user × action × resource × protocol:
rocket's own TCP and HTTP/2, RocketMQ 5's gRPC (the official client), and the remoting protocol (rocket's small
remoting client, signed as RocketMQ's AclClientRPCHook signs, and ali-ons with an access key)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from unittest import mock

import pytest
import trio

from rocket.access import Credentials
from rocket.client import Admin, connect
from rocket.errors import Code, RocketError
from rocket.gateway.remoting.codec import RequestCode as R, ResponseCode
from rocket.gateway.remoting.signature import DENIED_CODE, sign_remoting
from rocket.model import Message
from rocket.serde import batch as batch_codec
from tests.conftest import ServerProcess
from tests.remoting_client import RemotingClient

CLUSTER_SECRET = "the-cluster-secret-of-the-auth-tests"
ADMIN = Credentials("admin", "the-first-admins-secret-0001")
ALICE = Credentials("alice", "alices-secret-000000000001")
BOB = Credentials("bob", "bobs-secret-0000000000000001")
EVE = Credentials("eve", "eves-secret-0000000000000001")
MALLORY = Credentials("alice", "not-alices-secret-00000001")


async def call(server: ServerProcess, credentials: Credentials | None, method: str, request: dict,
               transport: str = "tcp") -> dict:
    port = server.tcp_port if transport == "tcp" else server.http2_port
    with mock.patch.dict(os.environ, {"ROCKET_CREDENTIALS": "/nonexistent"}):  # only the credentials given
        async with connect(f"127.0.0.1:{port}", transport, credentials=credentials) as channel:
            return await channel.call(method, request)


def code_of(server: ServerProcess, credentials: Credentials | None, method: str, request: dict,
            transport: str = "tcp") -> Code | None:
    try:
        trio.run(call, server, credentials, method, request, transport)
    except RocketError as error:
        return error.code
    return None


def batch(body: bytes = b"m") -> bytes:
    return batch_codec.encode([Message(body)], int(time.time() * 1000))


@pytest.fixture(scope="module")
def secured(tmp_path_factory):
    path = tmp_path_factory.mktemp("auth")
    server = ServerProcess(path / "data", path / "server.log")
    with mock.patch.dict(os.environ, {"ROCKET_CLUSTER_SECRET": CLUSTER_SECRET, "ROCKET_AUTH": "true",
                                      "ROCKET_AUTH_ADMIN_SECRET": ADMIN.secret}):
        server.start()

    async def setup() -> None:
        async with connect(server.server, credentials=ADMIN) as channel:
            admin = Admin(channel)
            for topic in ("orders-a", "orders-secret", "payments"):
                await admin.create_topic(topic, 2)
            await channel.call("KvCreateBucket", {"bucket": "cfg", "shards": 1, "history": 1, "ttl_ms": 0,
                                                  "storage_class": "raft"})
            for user in (ALICE, BOB, EVE):
                await admin.create_user(user.user, user.secret)
            await admin.grant("alice", "topic:orders-*", ["pub", "sub"])
            await admin.grant("alice", "topic:orders-secret", ["pub"], deny=True)
            await admin.grant("alice", "group:billing", ["sub"])
            await admin.grant("alice", "bucket:cfg", ["kv-read"])
            await admin.grant("eve", "topic:orders-*", ["pub"], cidrs=["10.0.0.0/8"])  # never from here
    trio.run(setup)
    time.sleep(1.5)  # policies reach the node's enforcement within a heartbeat (limits.node_heartbeat_s)
    yield server
    server.kill()


OK, DENIED, UNSIGNED = None, Code.PERMISSION_DENIED, Code.UNAUTHENTICATED
MATRIX = [  # who, method, request, expected
    (None, "ListTopics", {}, UNSIGNED),
    (None, "Produce", {"topic": "orders-a", "queue": -1}, UNSIGNED),
    (MALLORY, "ListTopics", {}, UNSIGNED),  # a wrong secret signs nothing in
    (ALICE, "ListTopics", {}, OK),
    (ALICE, "Produce", {"topic": "orders-a", "queue": -1}, OK),
    (ALICE, "Produce", {"topic": "orders-secret", "queue": -1}, DENIED),  # a deny beats orders-*'s allow
    (ALICE, "Produce", {"topic": "payments", "queue": -1}, DENIED),
    (ALICE, "Receive", {"topic": "orders-a", "group": "billing", "max_messages": 1, "invisible_ms": 30_000,
                        "wait_ms": 0, "max_attempts": 16, "filter_type": "tag", "filter": "*"}, OK),
    (ALICE, "Receive", {"topic": "orders-a", "group": "audit", "max_messages": 1, "invisible_ms": 30_000,
                        "wait_ms": 0, "max_attempts": 16, "filter_type": "tag", "filter": "*"}, DENIED),
    (ALICE, "CreateTopic", {"topic": "alices-own", "queues": 1, "message_type": "normal", "storage_class": "raft"},
     DENIED),
    (ALICE, "KvGet", {"bucket": "cfg", "key": "k", "revision": 0, "serializable": False}, Code.NOT_FOUND),  # read
    (ALICE, "KvPut", {"bucket": "cfg", "key": "k", "value": b"v", "ttl_ms": 0, "if_revision": -1, "if_absent": False},
     DENIED),
    (ALICE, "AclUsers", {}, DENIED),
    (ALICE, "StorageAppend", {"group": 1, "topic": "orders-a", "queue": 0}, UNSIGNED),  # for the cluster's nodes
    (BOB, "ListTopics", {}, OK),  # a signed-in user sees the cluster's shape
    (BOB, "Produce", {"topic": "orders-a", "queue": -1}, DENIED),
    (EVE, "Produce", {"topic": "orders-a", "queue": -1}, DENIED),  # allowed from 10.0.0.0/8 only
    (ADMIN, "CreateTopic", {"topic": "admins-own-{transport}", "queues": 1, "message_type": "normal",
                            "storage_class": "raft"}, OK),
    (ADMIN, "AclUsers", {}, OK),
]


@pytest.mark.parametrize("transport", ["tcp", "http2"])
def test_rockets_own_protocol_refuses_what_no_policy_allows(secured, transport):
    failures = []
    for who, method, request, expected in MATRIX:
        request = {field: value.format(transport=transport) if isinstance(value, str) else value
                   for field, value in request.items()}
        if method in ("Produce", "StorageAppend"):
            request["batch"] = batch(f"{who.user if who else 'nobody'} {transport}".encode())
        got = code_of(secured, who, method, request, transport)
        if got != expected:
            failures.append(f"{who.user if who else 'unsigned'} {method} {request.get('topic', '')}: "
                            f"{got} instead of {expected}")
    assert not failures, failures

    async def landed() -> list[bytes]:  # nothing refused was stored
        async with connect(secured.server, credentials=ADMIN) as channel:
            found = []
            for topic in ("orders-a", "orders-secret", "payments"):
                for queue in (0, 1):
                    pulled = await channel.call("Pull", {"topic": topic, "queues": [{"queue": queue, "offset": 0}],
                                                         "max_bytes": 1 << 20, "wait_ms": 0, "filter_type": "tag",
                                                         "filter": "*"})
                    for item in pulled["batches"]:
                        found += [(topic, message.body) for message in batch_codec.decode(bytes(item["batch"]))]
            return found
    stored = trio.run(landed)
    assert (("orders-a", f"alice {transport}".encode()) in stored
            and not [entry for entry in stored if entry[1].startswith((b"bob", b"eve", b"nobody"))]
            and ("orders-secret", f"alice {transport}".encode()) not in stored), stored
    assert code_of(secured, ADMIN, "DescribeTopic", {"topic": "alices-own"}) == Code.UNKNOWN_TOPIC


def test_refusals_and_users_are_in_the_nodes_metrics(secured):
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families
    assert code_of(secured, BOB, "Produce", {"topic": "payments", "queue": -1, "batch": batch()}) == DENIED
    assert code_of(secured, None, "ListTopics", {}) == UNSIGNED
    with urllib.request.urlopen(f"http://127.0.0.1:{secured.http_port}/metrics", timeout=10) as answer:
        families = {family.name: family for family in text_string_to_metric_families(answer.read().decode())}
    refusals = {sample.labels["code"]: sample.value for sample in families["rocket_auth_refusals"].samples
                if sample.name.endswith("_total")}
    assert refusals["PERMISSION_DENIED"] >= 1 and refusals["UNAUTHENTICATED"] >= 1, refusals
    assert families["rocket_auth_users"].samples[0].value >= 4  # admin, alice, bob, eve
    assert families["rocket_auth_policies"].samples[0].value >= 5


def test_a_revoke_or_a_deleted_user_applies_within_a_second_or_two(secured):
    produce = {"topic": "orders-a", "queue": -1, "batch": batch()}

    async def scenario() -> None:
        async with connect(secured.server, credentials=BOB) as bobs:  # a connection that stays open throughout
            async with connect(secured.server, credentials=ADMIN) as channel:
                await Admin(channel).grant("bob", "topic:orders-a", ["pub"])
                await wait_for(bobs, "Produce", produce, None)
                await Admin(channel).revoke("bob", "topic:orders-a")
                await wait_for(bobs, "Produce", produce, Code.PERMISSION_DENIED)
                await Admin(channel).grant("bob", "topic:orders-a", ["pub"])
                await wait_for(bobs, "Produce", produce, None)
                await Admin(channel).delete_user("bob")
                await wait_for(bobs, "Produce", produce, Code.UNAUTHENTICATED)
                assert "bob" not in [user["user"] for user in await Admin(channel).users()]
                await Admin(channel).create_user("bob", BOB.secret)  # as it was, for the other tests

    async def wait_for(channel, method: str, request: dict, expected: Code | None) -> None:
        got = "nothing"
        with trio.move_on_after(10):
            while True:
                try:
                    await channel.call(method, request)
                    got = None
                except RocketError as error:
                    got = error.code
                if got == expected:
                    return
                await trio.sleep(0.2)
        raise AssertionError(f"{method} got {got}, not {expected}, within 10 s")
    trio.run(scenario)


def test_the_cli_signs_in_with_flags_the_environment_or_the_credentials_file(secured, tmp_path):
    def rocket(*args: str, environment: dict | None = None) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "rocket", *args], capture_output=True, text=True, timeout=60,
                              env={**os.environ, "ROCKET_SERVER": secured.server,
                                   "ROCKET_CREDENTIALS": str(tmp_path / "none"), **(environment or {})})
    refused = rocket("topic", "list")
    assert refused.returncode == 1 and "UNAUTHENTICATED" in refused.stderr and "--user" in refused.stderr
    assert "alice" in rocket("--user", "alice", "--secret", ALICE.secret, "acl", "whoami").stdout
    assert "bob" in rocket("acl", "whoami", environment={"ROCKET_USER": "bob", "ROCKET_SECRET": BOB.secret}).stdout
    (tmp_path / "credentials").write_text(f'user = "admin"\nsecret = "{ADMIN.secret}"\n')
    listed = rocket("acl", "list", environment={"ROCKET_CREDENTIALS": str(tmp_path / "credentials")})
    assert listed.returncode == 0 and "topic:orders-*" in listed.stdout and "10.0.0.0/8" in listed.stdout
    denied = rocket("--user", "alice", "--secret", ALICE.secret, "send", "payments", "hello")
    assert denied.returncode == 1 and "PERMISSION_DENIED" in denied.stderr and "pub on topic:payments" in denied.stderr
    made = rocket("--user", "admin", "--secret", ADMIN.secret, "acl", "user", "create", "carol")
    assert made.returncode == 0 and "secret:" in made.stdout  # one the cluster made, shown once
    users = rocket("--user", "admin", "--secret", ADMIN.secret, "acl", "user", "list")
    assert "carol" in users.stdout and made.stdout.split("secret:")[1].strip() not in users.stdout
    assert "no user 'carol'" not in rocket("--user", "admin", "--secret", ADMIN.secret, "acl", "user", "delete",
                                           "carol").stderr


# ---- RocketMQ's protocols ---------------------------------------------------------------------------------------

def test_the_official_grpc_client_works_with_credentials_and_fails_without(secured):
    compat = pytest.importorskip("tests.integration.test_rocketmq_compat")
    script = """
        who = sys.argv[3]
        if who:
            user, secret = who.split(":")
            config = ClientConfiguration(endpoint, Credentials(user, secret), request_timeout=5)
        outcome = {}
        try:
            producer = Producer(config, (topic,))
            producer.startup()
            producer.send(message("from " + (who.split(":")[0] if who else "nobody")))
            producer.shutdown()
            outcome["sent"] = True
        except Exception as error:
            outcome["sent"] = type(error).__name__ + ": " + str(error)[:300]
        try:
            consumer = SimpleConsumer(config, sys.argv[4], {topic: FilterExpression()}, 5)
            consumer.startup()
            outcome["got"] = [entry["body"] for entry in receive_all(consumer, 1, limit_s=10)]
            consumer.shutdown()
        except Exception as error:
            outcome["got"] = type(error).__name__ + ": " + str(error)[:300]
        report(outcome)
    """
    allowed = compat.run_client(secured, "orders-a", script, f"alice:{ALICE.secret}", "billing")
    assert allowed["sent"] is True and "from alice" in allowed["got"], allowed
    unsigned = compat.run_client(secured, "orders-a", script, "", "billing")
    assert unsigned["sent"] is not True and not isinstance(unsigned["got"], list), unsigned
    wrong = compat.run_client(secured, "orders-a", script, f"alice:{MALLORY.secret}", "billing")
    assert wrong["sent"] is not True and not isinstance(wrong["got"], list), wrong
    bob = compat.run_client(secured, "orders-a", script, f"bob:{BOB.secret}", "billing")
    assert bob["sent"] is not True and "PERMISSION_DENIED" in bob["sent"] + str(bob["got"]), bob
    for header in ("Bearer abc", "MQv2-HMAC-SHA1 Credential=alice", "MQv2-HMAC-SHA1 Credential=alice, "
                   "SignedHeaders=x-mq-date-time, Signature=not-hex"):  # malformed, and unsigned, over raw gRPC
        answer = compat.grpc_exchange(secured.http2_port, compat.SERVICE_PATH + "Heartbeat", b"\0\0\0\0\x00",
                                      [("authorization", header)])
        assert answer["grpc-status"] == "16" and "authorization" in answer["grpc-message"], (header, answer)
    unsigned = compat.grpc_exchange(secured.http2_port, compat.SERVICE_PATH + "Heartbeat", b"\0\0\0\0\x00", [])
    assert unsigned["grpc-status"] == "16", unsigned


def remoting(client: RemotingClient, credentials: Credentials | None, code: int, ext: dict, body: bytes = b""):
    ext = {name: str(value) for name, value in ext.items()}
    if credentials is not None:
        ext["AccessKey"] = credentials.user
        ext["Signature"] = sign_remoting(ext, body, credentials.secret.encode(), 0)
    return client.request(code, ext, body)


def test_remoting_requests_are_signed_and_authorized(secured):
    client = RemotingClient(secured.tcp_port)
    send = {"a": "producers", "b": "orders-a", "e": 0, "f": 0, "g": int(time.time() * 1000), "i": ""}
    assert remoting(client, ALICE, R.SEND_MESSAGE_V2, send, b"remoting alice").code == ResponseCode.SUCCESS
    unsigned = remoting(client, None, R.SEND_MESSAGE_V2, send, b"remoting nobody")
    assert unsigned.code == DENIED_CODE and "UNAUTHENTICATED" in unsigned.remark
    forged = dict(send, AccessKey="alice", Signature="bm90IGEgc2lnbmF0dXJl")
    assert client.request(R.SEND_MESSAGE_V2, forged, b"remoting forged").code == DENIED_CODE
    tampered = remoting(client, ALICE, R.SEND_MESSAGE_V2, send, b"remoting alice")
    assert tampered.code == ResponseCode.SUCCESS  # the same signed request again: remoting signs no time (as apache)
    denied = remoting(client, ALICE, R.SEND_MESSAGE_V2, dict(send, b="orders-secret"), b"remoting secret")
    assert denied.code == ResponseCode.NO_PERMISSION and "pub on topic:orders-secret" in denied.remark
    pull = {"consumerGroup": "audit", "topic": "orders-a", "queueId": 0, "queueOffset": 0, "maxMsgNums": 32,
            "sysFlag": 0, "suspendTimeoutMillis": 0, "commitOffset": 0}
    assert remoting(client, ALICE, R.PULL_MESSAGE, pull).code == ResponseCode.NO_PERMISSION
    assert remoting(client, ALICE, R.PULL_MESSAGE, dict(pull, consumerGroup="billing")).code in (
        ResponseCode.SUCCESS, ResponseCode.PULL_NOT_FOUND, ResponseCode.PULL_RETRY_IMMEDIATELY)
    assert remoting(client, BOB, R.GET_ROUTEINFO_BY_TOPIC, {"topic": "orders-a"}).code == ResponseCode.SUCCESS
    assert remoting(client, None, R.GET_ROUTEINFO_BY_TOPIC, {"topic": "orders-a"}).code == DENIED_CODE
    client.close()


REMOTING_MATRIX = [  # what a remoting request needs is what the node's methods it makes (or stands in for) need
    (R.UPDATE_AND_CREATE_TOPIC, {"topic": "alices-remoting", "writeQueueNums": 1}, "admin on topic:alices-remoting"),
    (R.UPDATE_CONSUMER_OFFSET, {"consumerGroup": "audit", "topic": "orders-a", "queueId": 0, "commitOffset": 1},
     "sub on group:audit"),  # buffered by the gateway, written later as the node: asked first all the same
    (R.QUERY_CONSUMER_OFFSET, {"consumerGroup": "audit", "topic": "orders-a", "queueId": 0}, "sub on group:audit"),
    (R.PULL_MESSAGE, {"consumerGroup": "audit", "topic": "orders-a", "queueId": 0, "queueOffset": 0, "maxMsgNums": 1,
                      "sysFlag": 1, "suspendTimeoutMillis": 0, "commitOffset": 1}, "sub on group:audit"),
    (R.SEARCH_OFFSET_BY_TIMESTAMP, {"topic": "payments", "queueId": 0, "timestamp": 0}, "sub on topic:payments"),
    (R.QUERY_MESSAGE, {"topic": "payments", "key": "k", "maxNum": 1, "beginTimestamp": 0, "endTimestamp": 1},
     "sub on topic:payments"),
]


@pytest.mark.parametrize(("code", "ext", "why"), REMOTING_MATRIX, ids=[str(code) for code, _, _ in REMOTING_MATRIX])
def test_remoting_requests_need_what_the_node_methods_they_make_need(secured, code, ext, why):
    client = RemotingClient(secured.tcp_port)
    try:
        refused = remoting(client, ALICE, code, ext)
        assert refused.code == ResponseCode.NO_PERMISSION and why in refused.remark, refused
        assert remoting(client, ADMIN, code, ext).code != ResponseCode.NO_PERMISSION
    finally:
        client.close()


def test_ali_ons_with_an_access_key_produces_and_consumes_and_without_one_cannot(secured, tmp_path, monkeypatch):
    aons_tests = pytest.importorskip("tests.integration.test_remoting_aons")
    node = aons_tests.node_or_skip()
    aons = aons_tests.Aons(node, secured, tmp_path)
    try:
        monkeypatch.setenv("AONS_ACCESS_KEY", "alice")
        monkeypatch.setenv("AONS_SECRET_KEY", ALICE.secret)
        sent = aons.produce("orders-a", 3, "--body-prefix", "ons-")
        assert len(sent) == 3
        consumer = aons.consume("orders-a", "billing", "--from", "first")
        assert consumer.wait_for(lambda lines: {"ons-0", "ons-1", "ons-2"} <= {
            line.get("body") for line in lines}, 60), consumer.stderr()
        consumer.stop()
        monkeypatch.delenv("AONS_ACCESS_KEY")
        monkeypatch.delenv("AONS_SECRET_KEY")
        with pytest.raises(AssertionError):  # the unsigned producer's sends are all refused
            aons.produce("orders-a", 1, "--body-prefix", "unsigned-", timeout_s=15)
    finally:
        aons.kill_all()


def test_a_cluster_with_auth_enforces_the_same_users_on_every_node(tmp_path):
    """Three nameserver nodes and a broker without one: users made through the broker (it forwards to the
    nameservers' leader) sign in on every node, and a revoke reaches every node."""
    from rocket.transport.listen import free_ports
    from tests.integration.test_cluster import Node, running

    ports = free_ports(4)
    nameservers = ",".join(f"{node}@127.0.0.1:{port}" for node, port in zip((1, 2, 3), ports))
    environment = {"ROCKET_STORAGE_GROUPS": "2", "ROCKET_REPLICATION": "3", "ROCKET_CLUSTER_SECRET": CLUSTER_SECRET,
                   "ROCKET_AUTH": "true", "ROCKET_AUTH_ADMIN_SECRET": ADMIN.secret}
    nodes = {node: Node(node, port, nameservers, tmp_path, roles="all" if node < 4 else "broker",
                        environment=environment) for node, port in zip((1, 2, 3, 4), ports)}
    with running(nodes):
        async def scenario() -> None:
            async with connect(nodes[4].server, credentials=ADMIN) as channel:
                admin = Admin(channel)
                await admin.create_topic("ledger", 2)
                await admin.create_user("alice", ALICE.secret)
                await admin.grant("alice", "topic:ledger", ["pub", "sub"])
            for node in nodes.values():  # every node learns alice and her policy within a second or two
                with trio.fail_after(15):
                    while True:
                        try:
                            await call_on(node.server, "Produce", {"topic": "ledger", "queue": -1,
                                                                   "batch": batch(f"via {node.node_id}".encode())})
                            break
                        except RocketError as error:
                            assert error.code in (Code.UNAUTHENTICATED, Code.PERMISSION_DENIED), error
                            await trio.sleep(0.3)
            async with connect(nodes[2].server, credentials=ADMIN) as channel:
                await Admin(channel).revoke("alice", "topic:ledger")
            for node in nodes.values():
                with trio.fail_after(15):
                    while True:
                        try:
                            await call_on(node.server, "Produce", {"topic": "ledger", "queue": -1, "batch": batch()})
                        except RocketError as error:
                            assert error.code == Code.PERMISSION_DENIED, error
                            break
                        await trio.sleep(0.3)

        async def call_on(server: str, method: str, request: dict) -> dict:
            async with connect(server, credentials=ALICE) as channel:
                return await channel.call(method, request)
        trio.run(scenario)
