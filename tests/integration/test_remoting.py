"""RocketMQ's remoting protocol against a real `rocket run`, at the protocol level, with rocket's own small remoting
client (tests/remoting_client.py): both header serializations, unknown codes, malformed and huge frames, message
ids, batches, compressed bodies, lookups, one message readable over every protocol, and a kill -9 during a long
pull. ali-ons, the real Node.js client, is in test_remoting_aons.py."""

from __future__ import annotations

import ipaddress
import re
import socket
import struct
import subprocess
import sys
import threading
import time
import zlib

import lz4.frame
import orjson
import pytest
import zstandard
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rocket.gateway.remoting import messages as layout
from rocket.gateway.remoting.codec import ROCKETMQ, Command, RequestCode as R, ResponseCode
from tests.remoting_client import RemotingClient, json_frame


def rocket(server, *args: str, timeout_s: float = 60) -> str:
    return subprocess.run([sys.executable, "-m", "rocket", *args, "--server", server.server], check=True,
                          capture_output=True, text=True, timeout=timeout_s).stdout


@pytest.fixture
def server(server_process):
    started = server_process().start()
    rocket(started, "topic", "create", "orders", "--queues", "4")
    return started


def send(client: RemotingClient, topic: str, body: bytes, queue: int = 0, properties: dict | None = None,
         group: str = "producers", **options) -> dict:
    response = client.request(R.SEND_MESSAGE_V2, {"a": group, "b": topic, "e": queue, "f": 0,
                                                  "g": int(time.time() * 1000),
                                                  "i": layout.properties_text(properties or {})}, body, **options)
    assert response.code == 0, response.remark
    return response.ext


def pull(client: RemotingClient, topic: str, queue: int, offset: int, wait_ms: int = 0, group: str = "readers",
         **extra) -> tuple[int, dict, list[dict]]:
    response = client.request(R.PULL_MESSAGE, {"consumerGroup": group, "topic": topic, "queueId": queue,
                                               "queueOffset": offset, "maxMsgNums": 32, "sysFlag": 2 if wait_ms else 0,
                                               "suspendTimeoutMillis": wait_ms, "commitOffset": 0, **extra})
    return response.code, response.ext, decode_stored(response.body) if response.code == 0 else []


def decode_stored(body: bytes) -> list[dict]:
    """MessageDecoder.decodes, written from its layout apart from the gateway's encoder."""
    found, position = [], 0
    while position < len(body):
        total, magic, crc, queue, _flag, queue_offset, commit_offset, sys_flag, born = struct.unpack_from(
            ">iiiiiqqiq", body, position)
        at = position + struct.calcsize(">iiiiiqqiq")
        born_length = 16 if sys_flag & 0x10 else 4  # MessageSysFlag.BORNHOST_V6_FLAG
        born_host, born_port, stored = struct.unpack_from(f">{born_length}siq", body, at)
        at += born_length + 12
        store_length = 16 if sys_flag & 0x20 else 4  # STOREHOSTADDRESS_V6_FLAG
        host, port, reconsume, _prepared, body_length = struct.unpack_from(f">{store_length}siiqi", body, at)
        at += store_length + 20
        message_body = body[at:at + body_length]
        at += body_length
        if magic == layout.MAGIC_V1:
            topic_length = body[at]
            at += 1
        else:
            (topic_length,) = struct.unpack_from(">h", body, at)
            at += 2
        topic = body[at:at + topic_length].decode()
        at += topic_length
        (properties_length,) = struct.unpack_from(">h", body, at)
        properties = layout.parse_properties(body[at + 2:at + 2 + properties_length].decode())
        assert at + 2 + properties_length == position + total
        assert crc == zlib.crc32(message_body) & 0x7FFFFFFF
        found.append({"topic": topic, "queue": queue, "offset": queue_offset, "body": message_body,
                      "properties": properties, "reconsume": reconsume, "born": born, "stored": stored,
                      "born_host": (ipaddress.ip_address(born_host), born_port),
                      "store_host": (ipaddress.ip_address(host), port),
                      "msg_id": layout.message_id(host, port, commit_offset)})
        position += total
    return found


def test_routes_name_the_broker_and_unknown_topics_are_answered(server):
    client = RemotingClient(server.tcp_port)
    route = client.json(R.GET_ROUTEINFO_BY_TOPIC, {"topic": "orders"})
    assert route["queueDatas"] == [{"brokerName": "rocket", "readQueueNums": 4, "writeQueueNums": 4, "perm": 6,
                                    "topicSysFlag": 0}]
    assert route["brokerDatas"][0]["brokerAddrs"] == {"0": server.server}
    missing = client.request(R.GET_ROUTEINFO_BY_TOPIC, {"topic": "nope"})
    assert missing.code == ResponseCode.TOPIC_NOT_EXIST and "nope" in missing.remark
    cluster = client.json(R.GET_BROKER_CLUSTER_INFO)
    assert cluster["clusterAddrTable"] == {"rocket": ["rocket"]}
    assert "orders" in client.json(R.GET_ALL_TOPIC_LIST_FROM_NAMESERVER)["topicList"]


def test_a_message_round_trips_with_its_id_keys_tags_and_properties(server):
    client = RemotingClient(server.tcp_port)
    sent = send(client, "orders", b"hello", queue=2,
                properties={"TAGS": "red", "KEYS": "k1 k2", "UNIQ_KEY": "C0A80001000018B4AAC2", "color": "blue"})
    assert sent["queueId"] == "2" and sent["queueOffset"] == "0"
    code, header, found = pull(client, "orders", 2, 0)
    assert code == 0 and header["nextBeginOffset"] == "1"
    [message] = found
    assert message["body"] == b"hello" and message["topic"] == "orders" and message["offset"] == 0
    assert message["properties"]["TAGS"] == "red" and message["properties"]["KEYS"] == "k1 k2"
    assert message["properties"]["UNIQ_KEY"] == "C0A80001000018B4AAC2" and message["properties"]["color"] == "blue"
    assert message["msg_id"] == sent["msgId"]  # the offsetMsgId the send answered is the one the pull shows
    _, offset = layout.parse_message_id(sent["msgId"])
    viewed = client.request(R.VIEW_MESSAGE_BY_ID, {"offset": offset})
    assert viewed.code == 0 and decode_stored(viewed.body)[0]["body"] == b"hello"
    by_key = client.request(R.QUERY_MESSAGE, {"topic": "orders", "key": "k2", "maxNum": 8, "beginTimestamp": 0,
                                              "endTimestamp": int(time.time() * 1000) + 60_000})
    assert by_key.code == 0 and [each["body"] for each in decode_stored(by_key.body)] == [b"hello"]
    by_id = client.request(R.QUERY_MESSAGE, {"topic": "orders", "key": "C0A80001000018B4AAC2", "maxNum": 8,
                                             "beginTimestamp": 0, "endTimestamp": int(time.time() * 1000) + 60_000,
                                             "_UNIQUE_KEY_QUERY": "true"})
    assert by_id.code == 0 and decode_stored(by_id.body)[0]["body"] == b"hello"


def test_batches_compressed_bodies_and_tag_and_sql_subscriptions(server):
    client = RemotingClient(server.tcp_port)
    batch = b""
    for index in range(6):
        properties = layout.properties_text({"TAGS": ("a", "b", "c")[index % 3], "n": str(index)}).encode()
        body = f"m{index}".encode()
        size = 4 + 4 + 4 + 4 + 4 + len(body) + 2 + len(properties)
        batch += struct.pack(">iiiii", size, 0, zlib.crc32(body) & 0x7FFFFFFF, 0, len(body)) + body
        batch += struct.pack(">h", len(properties)) + properties
    response = client.request(R.SEND_BATCH_MESSAGE, {"a": "producers", "b": "orders", "e": 1, "f": 0, "g": 0,
                                                     "i": "", "m": "true"}, batch)
    assert response.code == 0, response.remark
    assert len(response.ext["msgId"].split(",")) == 6
    # zlib (4.x, and 5.x's type 0), then RocketMQ 5's LZ4 and Zstandard frames (compression type in sysFlag bits 8-10)
    for kind, compress in ((0, zlib.compress), (1, lz4.frame.compress), (2, zstandard.ZstdCompressor().compress)):
        compressed = client.request(R.SEND_MESSAGE, {"producerGroup": "producers", "topic": "orders", "queueId": 1,
                                                     "sysFlag": 1 | kind << 8, "bornTimestamp": 0, "flag": 0,
                                                     "properties": ""}, compress(b"squeezed %d " % kind * 100))
        assert compressed.code == 0, compressed.remark
    code, _, found = pull(client, "orders", 1, 0, subscription="a||c", sysFlag=4, expressionType="TAG")
    assert code == 0 and [each["body"] for each in found] == [b"m0", b"m2", b"m3", b"m5"]
    code, _, found = pull(client, "orders", 1, 0, subscription="n >= 4", sysFlag=4, expressionType="SQL92")
    assert [each["body"] for each in found] == [b"m4", b"m5"]
    code, _, found = pull(client, "orders", 1, 6)
    assert [each["body"] for each in found] == [b"squeezed %d " % kind * 100 for kind in range(3)]  # stored plain
    bad = client.request(R.PULL_MESSAGE, {"consumerGroup": "g", "topic": "orders", "queueId": 1, "queueOffset": 0,
                                          "sysFlag": 4, "subscription": "n >>> 4", "expressionType": "SQL92"})
    assert bad.code == ResponseCode.SUBSCRIPTION_PARSE_FAILED


def test_offsets_and_their_queries(server):
    client = RemotingClient(server.tcp_port)
    for index in range(3):
        send(client, "orders", f"o{index}".encode(), queue=3)
    assert client.request(R.GET_MAX_OFFSET, {"topic": "orders", "queueId": 3}).ext["offset"] == "3"
    assert client.request(R.GET_MIN_OFFSET, {"topic": "orders", "queueId": 3}).ext["offset"] == "0"
    assert client.request(R.SEARCH_OFFSET_BY_TIMESTAMP, {"topic": "orders", "queueId": 3,
                                                         "timestamp": 0}).ext["offset"] == "0"
    assert int(client.request(R.GET_EARLIEST_MSG_STORETIME, {"topic": "orders", "queueId": 3}).ext["timestamp"]) > 0
    query = {"consumerGroup": "billing", "topic": "orders", "queueId": 3}
    new_group = client.request(R.QUERY_CONSUMER_OFFSET, query)  # a young queue: 0, as RocketMQ answers
    assert new_group.code == 0 and new_group.ext["offset"] == "0"
    client.request(R.UPDATE_CONSUMER_OFFSET, {**query, "commitOffset": -1}, oneway=True)  # "nothing consumed"
    client.request(R.UPDATE_CONSUMER_OFFSET, {**query, "commitOffset": 2}, oneway=True)
    assert client.request(R.QUERY_CONSUMER_OFFSET, query).ext["offset"] == "2"
    pull(client, "orders", 3, 2, group="billing", sysFlag=1, commitOffset=3)  # the commit-offset flag
    assert client.request(R.QUERY_CONSUMER_OFFSET, query).ext["offset"] == "3"
    row = re.compile(r"│ 3\s+│ 3\s+│ 3\s+│")  # queue 3: next offset 3, pull position 3
    deadline = time.time() + 30  # written to storage within the flush interval: rocket's own CLI sees it
    while not row.search(rocket(server, "group", "describe", "orders", "--group", "billing")):
        assert time.time() < deadline
        time.sleep(0.5)


def test_unknown_codes_and_malformed_frames_get_answers_and_the_server_keeps_serving(server):
    client = RemotingClient(server.tcp_port)
    unknown = client.request(9999)
    assert unknown.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED and "9999" in unknown.remark
    binary = client.request(R.GET_ROUTEINFO_BY_TOPIC, {"topic": "orders"}, serialize=ROCKETMQ)
    assert binary.code == 0 and binary.serialize == ROCKETMQ  # answered in the request's serialization
    missing = client.request(R.PULL_MESSAGE, {"topic": "orders"})
    assert missing.code == ResponseCode.SYSTEM_ERROR and "consumerGroup" in missing.remark
    bad_number = client.request(R.PULL_MESSAGE, {"consumerGroup": "g", "topic": "orders", "queueId": "x",
                                                 "queueOffset": 0})
    assert bad_number.code == ResponseCode.SYSTEM_ERROR and "queueId" in bad_number.remark
    client.send_raw(json_frame(b'{"code": "ten", "opaque": 77}'))  # a whole frame, a bad header: answered
    answer = client.response(77)
    assert answer.code == ResponseCode.SYSTEM_ERROR and "BAD_FRAME" in answer.remark
    assert client.request(R.GET_ROUTEINFO_BY_TOPIC, {"topic": "orders"}).code == 0  # still open
    for hostile in (struct.pack(">I", 1 << 30) + b"\x00" * 8,  # a length past the limit
                    struct.pack(">II", 8, 0x1000) + b"\x00" * 4,  # a header length past the frame
                    json_frame(b"[1, 2]"),  # a header that is not an object, and no opaque to answer
                    json_frame(b"\x00" * 8, serialize=ROCKETMQ)):  # a binary header cut short
        raw = socket.create_connection(("127.0.0.1", server.tcp_port), timeout=10)
        raw.sendall(hostile)
        reply = b""
        while chunk := raw.recv(65536):
            reply += chunk
        raw.close()
        assert b"BAD_FRAME" in reply  # one answer saying why, then closed
    assert "created" in rocket(server, "topic", "create", "after", "--queues", "1")  # rocket's own protocol too
    send(client, "orders", b"still here")


def test_a_message_is_readable_over_every_protocol(server):
    """rocket's own CLI, the remoting protocol and RocketMQ 5's gRPC (the official client) each read what the
    others sent."""
    pytest.importorskip("rocketmq.grpc_protocol")
    from tests.integration.test_rocketmq_compat import run_client
    client = RemotingClient(server.tcp_port)
    rocket(server, "send", "orders", "from-rocket")
    run_client(server, "orders", """
        producer = Producer(config, (topic,))
        producer.startup()
        producer.send(message("from-grpc", tag="g", properties={"p": "1"}))
        producer.shutdown()
        report({})
    """)
    send(client, "orders", b"from-remoting", queue=0, properties={"TAGS": "r", "KEYS": "rk"})
    bodies = []
    for queue in range(4):
        bodies += [each["body"] for each in pull(client, "orders", queue, 0)[2]]
    assert sorted(bodies) == [b"from-grpc", b"from-remoting", b"from-rocket"]
    consumed = rocket(server, "consume", "orders", "--group", "cli-readers", "--from", "earliest", "--count", "3",
                      "--format", "json")
    assert all(body in consumed for body in ("from-rocket", "from-grpc", "from-remoting"))
    received = run_client(server, "orders", """
        consumer = SimpleConsumer(config, "grpc-readers", {topic: FilterExpression()}, 25)
        consumer.startup()
        got = receive_all(consumer, 3)
        consumer.shutdown()
        report(sorted((entry["body"], entry["tag"] or "") for entry in got))
    """)
    assert ["from-remoting", "r"] in received and ["from-rocket", ""] in received


def test_kill_9_during_a_long_pull_loses_nothing_acknowledged(server):
    client = RemotingClient(server.tcp_port)
    acknowledged = [send(client, "orders", f"before-{index}".encode(), queue=0)["queueOffset"] for index in range(5)]
    assert acknowledged == ["0", "1", "2", "3", "4"]
    waiting = RemotingClient(server.tcp_port)
    outcome = {}

    def long_pull() -> None:
        try:
            outcome["pull"] = pull(waiting, "orders", 0, 5, wait_ms=20_000)
        except (ConnectionError, OSError) as error:
            outcome["error"] = error

    reader = threading.Thread(target=long_pull)
    reader.start()
    time.sleep(1.0)
    server.kill()
    reader.join(10)
    assert "error" in outcome  # the connection broke: the client reconnects
    server.start(extra=("--listen", server.server))
    again = RemotingClient(server.tcp_port)
    code, _, found = pull(again, "orders", 0, 0)
    assert [each["body"] for each in found] == [f"before-{index}".encode() for index in range(5)]
    send(again, "orders", b"after", queue=0)
    assert pull(again, "orders", 0, 5, wait_ms=5000)[2][0]["body"] == b"after"


def test_transactions_end_by_the_producer_and_by_its_answer_to_a_check_back(monkeypatch, server_process):
    """A half message is invisible until END_TRANSACTION commits it; one left open is checked back with
    CHECK_TRANSACTION_STATE on a connection of its producer group, and the producer's END_TRANSACTION answer
    (from the check) commits it; a rolled-back one is never delivered."""
    monkeypatch.setenv("ROCKET_TRANSACTION_TIMEOUT_S", "1")
    monkeypatch.setenv("ROCKET_TRANSACTION_CHECK_S", "1")
    server = server_process().start()
    rocket(server, "topic", "create", "payments", "--queues", "1", "--type", "transaction")
    producer = RemotingClient(server.tcp_port)
    producer.request(R.HEART_BEAT, body=orjson.dumps({"clientID": "10.0.0.1@1", "producerDataSet": [
        {"groupName": "payers"}], "consumerDataSet": []}))

    def half(body: bytes) -> dict:
        return send(producer, "payments", body, properties={"TRAN_MSG": "true", "PGROUP": "payers",
                                                            "UNIQ_KEY": body.decode().upper()}, group="payers")

    committed, rolled_back, checked = half(b"commit-me"), half(b"roll-me-back"), half(b"check-me")
    assert pull(producer, "payments", 0, 0)[0] == ResponseCode.PULL_NOT_FOUND  # nothing visible yet
    for sent, resolution in ((committed, 8), (rolled_back, 12)):
        producer.request(R.END_TRANSACTION, {"producerGroup": "payers", "transactionId": sent["transactionId"],
                                             "commitLogOffset": layout.parse_message_id(sent["msgId"])[1],
                                             "tranStateTableOffset": sent["queueOffset"], "commitOrRollback": resolution,
                                             "fromTransactionCheck": "false"}, oneway=True)
    check = producer.next_command()  # the open one is checked back on the producer's connection
    while check.code != R.CHECK_TRANSACTION_STATE:
        check = producer.next_command()
    assert check.ext["transactionId"] == checked["transactionId"] and check.ext["msgId"] == "CHECK-ME"
    assert decode_stored(check.body)[0]["body"] == b"check-me"
    producer.request(R.END_TRANSACTION, {"producerGroup": "payers", "transactionId": check.ext["transactionId"],
                                         "commitLogOffset": check.ext["commitLogOffset"],
                                         "tranStateTableOffset": check.ext["tranStateTableOffset"],
                                         "commitOrRollback": 8, "fromTransactionCheck": "true"}, oneway=True)
    reader = RemotingClient(server.tcp_port)
    got, offset, deadline = [], 0, time.time() + 30
    while len(got) < 2 and time.time() < deadline:
        code, header, found = pull(reader, "payments", 0, offset, wait_ms=1000)
        got += [each["body"] for each in found]
        offset = int(header.get("nextBeginOffset", offset))
    assert sorted(got) == [b"check-me", b"commit-me"]


KNOWN_CODES = [value for name, value in vars(R).items() if name.isupper()]
FIELDS = ["topic", "consumerGroup", "queueId", "queueOffset", "sysFlag", "commitOffset", "suspendTimeoutMillis",
          "subscription", "expressionType", "maxMsgNums", "offset", "group", "delayLevel", "originTopic", "key",
          "maxNum", "beginTimestamp", "endTimestamp", "transactionId", "commitOrRollback", "tranStateTableOffset",
          "commitLogOffset", "clientID", "producerGroup", "writeQueueNums", "attributes", "timestamp", "a", "b", "e",
          "f", "g", "i", "m", "namespace", "value", "kv_opType", "expectValue", "prefix"]
VALUES = st.one_of(st.sampled_from(["orders", "0", "1", "-1", "4", "%RETRY%g", "SQL92", "TAG", "a||b", "n > 1", "true",
                                    "9223372036854775807", "99999999999999999999", "", "null", "\x01\x02", "CAS", "PUT"]),
                   st.text(max_size=30))
BODIES = st.one_of(st.just(b""), st.binary(max_size=200),
                   st.builds(lambda value: orjson.dumps(value), st.recursive(
                       st.none() | st.booleans() | st.integers(-2**63, 2**63 - 1) | st.text(max_size=10),
                       lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from(
                           ["clientID", "consumerDataSet", "producerDataSet", "groupName", "subscriptionDataSet",
                            "topic", "subString", "mqSet", "consumerGroup", "clientId", "queueId"]), inner, max_size=4),
                       max_leaves=12)))


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(code=st.sampled_from(KNOWN_CODES), ext=st.dictionaries(st.sampled_from(FIELDS), VALUES, max_size=8),
       body=BODIES, serialize=st.sampled_from([0, ROCKETMQ]))
def test_hostile_requests_of_every_code_get_one_line_answers(server, code, ext, body, serialize):
    """Any header fields and body, on any served request code, over a real socket: an answer comes (no hang, no
    crash), as a stable response code with a one-line remark, never an internal error; the connection stays open."""
    client = hostile_client(server)
    response = client.request(code, {**ext, "suspendTimeoutMillis": "0"} if code == R.PULL_MESSAGE else ext,
                              body, serialize=serialize, oneway=False)
    assert response.code in vars(ResponseCode).values(), response
    assert "INTERNAL" not in (response.remark or ""), response.remark
    assert "\n" not in (response.remark or "")


_hostile: dict = {}


def hostile_client(server) -> RemotingClient:
    """One connection per server, reused by the examples (each example is a request on it)."""
    if _hostile.get("port") != server.tcp_port:
        _hostile.update(port=server.tcp_port, client=RemotingClient(server.tcp_port, timeout_s=60))
    return _hostile["client"]


def test_consumers_are_told_when_their_group_changes(server):
    """A consumer that joins, or leaves by closing its connection, makes the broker push
    NOTIFY_CONSUMER_IDS_CHANGED to the group's other consumers; the member list follows."""

    def heartbeat(client: RemotingClient, client_id: str) -> None:
        client.request(R.HEART_BEAT, body=orjson.dumps({"clientID": client_id, "producerDataSet": [],
            "consumerDataSet": [{"groupName": "watchers", "messageModel": "CLUSTERING",
                                 "subscriptionDataSet": [{"topic": "orders", "subString": "*"}]}]}))

    def next_notice(client: RemotingClient) -> Command:
        while not client.pushed:
            client.pushed.append(client.next_command())
        return client.pushed.pop(0)

    first, second = RemotingClient(server.tcp_port), RemotingClient(server.tcp_port)
    heartbeat(first, "10.0.0.1@first")
    heartbeat(second, "10.0.0.2@second")
    notice = next_notice(first)
    assert notice.code == R.NOTIFY_CONSUMER_IDS_CHANGED and notice.ext == {"consumerGroup": "watchers"}
    assert notice.is_oneway
    members = first.json(R.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": "watchers"})["consumerIdList"]
    assert members == ["10.0.0.1@first", "10.0.0.2@second"]
    second.close()
    assert next_notice(first).code == R.NOTIFY_CONSUMER_IDS_CHANGED
    assert first.json(R.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": "watchers"})["consumerIdList"] == ["10.0.0.1@first"]


def test_send_back_retries_after_the_groups_backoff_then_dead_letters(server):
    """CONSUMER_SEND_MSG_BACK under the group's settings (rocket group create --max-attempts 2 --retry-backoff 1s):
    the message comes back on %RETRY%group after 1 s with its reconsume times, and the next send-back buries it in
    the group's dead letters of its topic, beside its queue."""
    rocket(server, "group", "create", "payers", "--max-attempts", "2", "--retry-backoff", "1s")
    client = RemotingClient(server.tcp_port)
    client.request(R.HEART_BEAT, body=orjson.dumps({"clientID": "10.0.0.1@1", "producerDataSet": [],
        "consumerDataSet": [{"groupName": "payers", "messageModel": "CLUSTERING",
                             "subscriptionDataSet": [{"topic": "orders", "subString": "*"}]}]}))
    sent = send(client, "orders", b"flaky", queue=3, properties={"KEYS": "k", "UNIQ_KEY": "FLAKY1"})
    [original] = pull(client, "orders", 3, 0, group="payers")[2]
    _, offset = layout.parse_message_id(original["msg_id"])
    failed_at = time.time()
    back = client.request(R.CONSUMER_SEND_MSG_BACK, {"offset": offset, "group": "payers", "delayLevel": 0,
                                                     "originMsgId": "FLAKY1", "originTopic": "orders",
                                                     "maxReconsumeTimes": 16})
    assert back.code == 0, back.remark
    retried: list[dict] = []
    while not retried:
        assert time.time() - failed_at < 30
        retried = pull(client, "%RETRY%payers", 0, 0, wait_ms=2000, group="payers")[2]
    assert time.time() - failed_at >= 0.9  # the group's backoff, not RocketMQ's 10 s level
    [again] = retried
    assert again["body"] == b"flaky" and again["reconsume"] == 1 and again["topic"] == "%RETRY%payers"
    assert again["properties"]["RETRY_TOPIC"] == "orders" and again["properties"]["UNIQ_KEY"] == "FLAKY1"
    _, retry_offset = layout.parse_message_id(again["msg_id"])
    buried = client.request(R.CONSUMER_SEND_MSG_BACK, {"offset": retry_offset, "group": "payers", "delayLevel": 0,
                                                       "originMsgId": "FLAKY1", "originTopic": "orders",
                                                       "maxReconsumeTimes": 16})
    assert buried.code == 0, buried.remark
    dead = rocket(server, "dlq", "list", "orders", "--group", "payers")
    assert "flaky" in dead and "3:0" in dead  # beside queue 3, where it was sent
    assert sent["queueId"] == "3"


def test_mqadmin_basics(server):
    """What mqadmin's updateTopic, topicList, topicStatus, consumerConnection, brokerStatus and deleteTopic call."""
    client = RemotingClient(server.tcp_port)
    created = client.request(R.UPDATE_AND_CREATE_TOPIC, {"topic": "audits", "readQueueNums": 2, "writeQueueNums": 2,
                                                         "perm": 6, "attributes": "+message.type=FIFO"})
    assert created.code == 0, created.remark
    config = client.json(R.GET_ALL_TOPIC_CONFIG)["topicConfigTable"]
    assert config["audits"]["writeQueueNums"] == 2 and config["audits"]["order"] is True
    bad = client.request(R.UPDATE_AND_CREATE_TOPIC, {"topic": "odd", "writeQueueNums": 1,
                                                     "attributes": "+message.type=PIGEON"})
    assert bad.code == ResponseCode.MESSAGE_ILLEGAL and "PIGEON" in bad.remark
    send(client, "orders", b"one", queue=1)
    stats = client.json(R.GET_TOPIC_STATS_INFO, {"topic": "orders"})["offsetTable"]
    by_queue = {orjson.loads(key)["queueId"]: value for key, value in stats.items()}
    assert by_queue[1] == {"minOffset": 0, "maxOffset": 1, "lastUpdateTimestamp": 0} and len(by_queue) == 4
    assert client.request(R.GET_CONSUMER_CONNECTION_LIST, {"consumerGroup": "nobody"}).code == \
        ResponseCode.CONSUMER_NOT_ONLINE
    client.request(R.HEART_BEAT, body=orjson.dumps({"clientID": "10.0.0.9@9", "producerDataSet": [],
        "consumerDataSet": [{"groupName": "auditors", "messageModel": "CLUSTERING",
                             "subscriptionDataSet": [{"topic": "orders", "subString": "a||b"}]}]}))
    connections = client.json(R.GET_CONSUMER_CONNECTION_LIST, {"consumerGroup": "auditors"})
    assert [each["clientId"] for each in connections["connectionSet"]] == ["10.0.0.9@9"]
    assert connections["subscriptionTable"]["orders"]["subString"] == "a||b"
    assert client.json(R.GET_BROKER_RUNTIME_INFO)["table"]["brokerVersionDesc"].startswith("rocket ")
    # mqadmin deleteTopic: the brokers first, then the nameservers, which find it gone.
    send(client, "audits", b"old")
    for request in (R.DELETE_TOPIC_IN_BROKER, R.DELETE_TOPIC_IN_NAMESRV):
        deleted = client.request(request, {"topic": "audits", "clusterName": "DefaultCluster"})
        assert deleted.code == 0, deleted.remark
    assert "audits" not in client.json(R.GET_ALL_TOPIC_CONFIG)["topicConfigTable"]
    assert client.request(R.UPDATE_AND_CREATE_TOPIC, {"topic": "audits", "writeQueueNums": 2}).code == 0
    stats = client.json(R.GET_TOPIC_STATS_INFO, {"topic": "audits"})["offsetTable"]
    assert all(value["maxOffset"] == 0 for value in stats.values())  # made again: empty


def test_delay_levels_and_timer_properties_deliver_later(server):
    """DELAY=1 (level 1: 1 s) and 5.x's TIMER_DELAY_SEC on a delay topic arrive no earlier than asked; a normal
    topic refuses a delayed message with a remark that says why (RocketMQ 5's message type check)."""
    rocket(server, "topic", "create", "reminders", "--queues", "1", "--type", "delay")
    client = RemotingClient(server.tcp_port)
    sent_at = time.time()
    send(client, "reminders", b"level-1", properties={"DELAY": "1"})
    send(client, "reminders", b"in-2s", properties={"TIMER_DELAY_SEC": "2"})
    got: dict[bytes, float] = {}
    offset, deadline = 0, time.time() + 30
    while len(got) < 2 and time.time() < deadline:
        code, header, found = pull(client, "reminders", 0, offset, wait_ms=1000)
        got.update((each["body"], time.time()) for each in found)
        offset = int(header.get("nextBeginOffset", offset))
    assert got[b"level-1"] - sent_at >= 0.9 and got[b"in-2s"] - sent_at >= 1.9
    refused = client.request(R.SEND_MESSAGE_V2, {"a": "p", "b": "orders", "e": 0, "f": 0, "g": 0,
                                                 "i": layout.properties_text({"DELAY": "3"})}, b"late")
    assert refused.code == ResponseCode.MESSAGE_ILLEGAL and "delay topic" in refused.remark


def test_a_client_over_ipv6_gets_16_byte_hosts_and_ids(server_process):
    """Over IPv6 (the node listening on ::1), a message's born host (the producer's address) and store host (the
    broker's) are 16 bytes, flagged in sysFlag as MessageDecoder reads them, and its offsetMsgId is 56 hex digits that
    VIEW_MESSAGE_BY_ID finds; a client over IPv4 reads IPv4 hosts as before."""
    started = server_process().start(extra=("--listen", "[::1]:0"))
    subprocess.run([sys.executable, "-m", "rocket", "topic", "create", "orders", "--queues", "1", "--server",
                    f"[::1]:{started.tcp_port}"], check=True, capture_output=True, timeout=60)
    client = RemotingClient(started.tcp_port, host="::1")
    sent = send(client, "orders", b"over six")
    assert len(sent["msgId"]) == 56 and layout.parse_message_id(sent["msgId"])[0] == f"[::1]:{started.tcp_port}"
    code, _, found = pull(client, "orders", 0, 0)
    assert code == 0 and [each["body"] for each in found] == [b"over six"]
    assert found[0]["born_host"][0] == ipaddress.ip_address("::1") and found[0]["born_host"][1] > 0
    assert found[0]["store_host"] == (ipaddress.ip_address("::1"), started.tcp_port)
    assert found[0]["msg_id"] == sent["msgId"]
    viewed = client.request(R.VIEW_MESSAGE_BY_ID, {"offset": layout.parse_message_id(sent["msgId"])[1],
                                                   "topic": "orders"})
    assert viewed.code == 0 and decode_stored(viewed.body)[0]["body"] == b"over six"


def test_a_pull_answers_the_queues_true_bounds(server):
    """minOffset and maxOffset are the queue's (what a client's lag figures read), not where the pull ended."""
    client = RemotingClient(server.tcp_port)
    for index in range(5):
        send(client, "orders", b"bound %d" % index, queue=2)
    code, ext, found = pull(client, "orders", 2, 0, maxMsgNums=1)
    assert code == 0 and len(found) == 1 and int(ext["nextBeginOffset"]) == 1
    assert (int(ext["minOffset"]), int(ext["maxOffset"])) == (0, 5)
    code, ext, found = pull(client, "orders", 2, 5)
    assert code == ResponseCode.PULL_NOT_FOUND and (int(ext["minOffset"]), int(ext["maxOffset"])) == (0, 5)


def test_kv_config_requests_are_rockets_kv_buckets_and_back(server):
    """RIP-22 through the RocketMQ protocol: mqadmin's updateKvConfig, getKVConfig, deleteKvConfig and
    getKVListByNamespace on rocket's KV (a namespace is a bucket), read and written by rocket's own KV API too."""
    client = RemotingClient(server.tcp_port)
    missing = client.request(R.GET_KV_CONFIG, {"namespace": "ORDER_TOPIC_CONFIG", "key": "orders"})
    assert missing.code == ResponseCode.QUERY_NOT_FOUND and "ORDER_TOPIC_CONFIG" in missing.remark
    put = client.request(R.PUT_KV_CONFIG, {"namespace": "settings", "key": "colour", "value": "blue"})
    assert put.code == 0, put.remark  # the namespace's bucket is made by its first put
    assert rocket(server, "kv", "get", "settings", "colour").strip().endswith("blue")
    rocket(server, "kv", "put", "settings", "size", "9")
    got = client.request(R.GET_KV_CONFIG, {"namespace": "settings", "key": "size"})
    assert (got.code, got.ext["value"]) == (0, "9")
    assert client.request(R.GET_KV_CONFIG_BY_VALUE, {"namespace": "settings", "key": "size"}).ext["value"] == "9"
    assert client.json(R.GET_KVLIST_BY_NAMESPACE, {"namespace": "settings"}) == {
        "table": {"colour": "blue", "size": "9"}}
    assert client.json(R.GET_KVLIST_BY_NAMESPACE, {"namespace": "settings", "prefix": "co"}) == {
        "table": {"colour": "blue"}}
    # RIP-22's compare-and-set: kv_opType CAS puts only over the expected value (or none).
    refused = client.request(R.PUT_KV_CONFIG, {"namespace": "settings", "key": "colour", "value": "green",
                                               "kv_opType": "CAS", "expectValue": "red"})
    assert refused.code == ResponseCode.SYSTEM_ERROR and refused.remark.startswith("CAS_FAILED: ")
    assert client.request(R.PUT_KV_CONFIG, {"namespace": "settings", "key": "colour", "value": "green",
                                            "kv_opType": "CAS"}).remark.startswith("CAS_FAILED: ")
    for key, expected in (("colour", {"expectValue": "blue"}), ("shape", {})):
        done = client.request(R.PUT_KV_CONFIG, {"namespace": "settings", "key": key, "value": "green",
                                                "kv_opType": "CAS", **expected})
        assert done.code == 0, done.remark
    assert rocket(server, "kv", "get", "settings", "colour").strip().endswith("green")
    bad = client.request(R.PUT_KV_CONFIG, {"namespace": "settings", "key": "k", "value": "v", "kv_opType": "SWAP"})
    assert bad.code == ResponseCode.MESSAGE_ILLEGAL and bad.remark.startswith("BAD_REQUEST: kv_opType")
    for namespace in ("settings", "never-made"):  # deleting what is not there succeeds, as in RocketMQ
        assert client.request(R.DELETE_KV_CONFIG, {"namespace": namespace, "key": "colour"}).code == 0
    assert client.request(R.GET_KV_CONFIG, {"namespace": "settings", "key": "colour"}).code == \
        ResponseCode.QUERY_NOT_FOUND
    assert client.request(R.GET_KVLIST_BY_NAMESPACE, {"namespace": "never-made"}).code == ResponseCode.QUERY_NOT_FOUND
    assert "colour" not in rocket(server, "kv", "ls", "settings")
