"""The remoting protocol on a cluster of split roles (three nameservers, three storage nodes, two brokers): a
route asked of a nameserver lists both brokers, a message sent through one broker is pulled through the other, a
consumer group's members are the same seen from either broker, whichever broker each member talks to, and an orderly
consumer's queue lock taken through one broker is refused to another consumer through the other."""

from __future__ import annotations

import time

import orjson
import pytest
import trio

from rocket.gateway.remoting.codec import RequestCode as R
from rocket.gateway.remoting.messages import parse_message_id
from rocket.transport.listen import free_ports
from tests.integration.test_cluster import Node, running
from tests.integration.test_remoting import pull, rocket, send
from tests.integration.test_remoting_aons import Aons, consumed_or_fail, node_or_skip
from tests.remoting_client import RemotingClient

ROLES = {1: "nameserver", 2: "nameserver", 3: "nameserver", 11: "storage", 12: "storage", 13: "storage",
         21: "broker", 22: "broker"}


@pytest.fixture
def split_cluster(tmp_path):
    ports = dict(zip(ROLES, free_ports(len(ROLES))))
    nameservers = ",".join(f"{node}@127.0.0.1:{ports[node]}" for node in (1, 2, 3))
    nodes = {node: Node(node, ports[node], nameservers, tmp_path, roles=roles,
                        environment={"ROCKET_STORAGE_GROUPS": "4", "ROCKET_REPLICATION": "3"})
             for node, roles in ROLES.items()}
    with running(nodes):
        yield nodes


def test_routes_list_every_broker_and_groups_span_brokers(split_cluster):
    nameserver, first, second = split_cluster[1], split_cluster[21], split_cluster[22]
    rocket(first, "topic", "create", "orders", "--queues", "4")
    client = RemotingClient(nameserver.port)
    deadline = time.time() + 30
    while True:  # brokers are listed once the nameservers heard their heartbeats
        route = client.json(R.GET_ROUTEINFO_BY_TOPIC, {"topic": "orders"})
        addresses = route["brokerDatas"][0]["brokerAddrs"]
        if set(addresses.values()) == {first.server, second.server} or time.time() > deadline:
            break
        time.sleep(0.5)
    assert set(addresses.values()) == {first.server, second.server}
    assert route["queueDatas"][0]["brokerName"] == "rocket" and route["queueDatas"][0]["writeQueueNums"] == 4

    through_first, through_second = RemotingClient(first.port), RemotingClient(second.port)
    sent = send(through_first, "orders", b"across", queue=2, properties={"KEYS": "k"})
    code, _, found = pull(through_second, "orders", 2, int(sent["queueOffset"]))
    assert code == 0 and found[0]["body"] == b"across"
    # the id's address is the broker that answered; its 8 bytes name the message wherever it is read
    assert parse_message_id(found[0]["msg_id"])[1] == parse_message_id(sent["msgId"])[1]

    for client_id, connection in (("10.0.0.1@a", through_first), ("10.0.0.2@b", through_second)):
        connection.request(R.HEART_BEAT, body=orjson.dumps({"clientID": client_id, "producerDataSet": [],
            "consumerDataSet": [{"groupName": "billing", "messageModel": "CLUSTERING", "consumeType": "CONSUME_PASSIVELY",
                                 "subscriptionDataSet": [{"topic": "orders", "subString": "*"}]}]}))
    for connection in (through_first, through_second):
        members = connection.json(R.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": "billing"})["consumerIdList"]
        assert members == ["10.0.0.1@a", "10.0.0.2@b"]
    through_first.close()  # a closed connection leaves the group on every broker
    deadline = time.time() + 15
    while through_second.json(R.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": "billing"})["consumerIdList"] != ["10.0.0.2@b"]:
        assert time.time() < deadline
        time.sleep(0.5)


def lock_batch(connection: RemotingClient, client_id: str, queues: list[int], code: int = R.LOCK_BATCH_MQ) -> list[int]:
    body = orjson.dumps({"consumerGroup": "sorted", "clientId": client_id, "mqSet": [
        {"topic": "orders", "brokerName": "rocket", "queueId": queue} for queue in queues]})
    response = connection.request(code, body=body)
    assert response.code == 0, response.remark
    return sorted(queue["queueId"] for queue in orjson.loads(response.body)["lockOKMQSet"]) if response.body else []


def test_two_brokers_never_grant_one_queue_to_two_orderly_consumers(split_cluster):
    """LOCK_BATCH_MQ through either broker asks the queue's storage group: a queue one consumer holds is refused to
    another through the other broker until the holder unlocks it, and it is the holder's again after a broker is
    killed with -9 (the lock lives in the storage group, not in the broker)."""
    first, second = split_cluster[21], split_cluster[22]
    rocket(first, "topic", "create", "orders", "--queues", "4")
    one, other = RemotingClient(first.port), RemotingClient(second.port)
    assert lock_batch(one, "10.0.0.1@one", [0, 1]) == [0, 1]
    assert lock_batch(other, "10.0.0.2@other", [0, 1, 2, 3]) == [2, 3]
    assert lock_batch(one, "10.0.0.1@one", [0, 1, 2]) == [0, 1]  # renewed; 2 is the other's
    lock_batch(one, "10.0.0.1@one", [1], R.UNLOCK_BATCH_MQ)
    assert lock_batch(other, "10.0.0.2@other", [0, 1]) == [1]
    first.kill()
    first.start()
    trio.run(first.wait_ready)
    first_again = RemotingClient(first.port)
    assert lock_batch(first_again, "10.0.0.2@other", [1, 2, 3]) == [1, 2, 3]
    assert lock_batch(first_again, "10.0.0.1@one", [0, 1, 2, 3]) == [0]


def test_ali_ons_sends_and_consumes_through_the_cluster(split_cluster, tmp_path):
    """ali-ons, given a nameserver's address only, sends through the brokers the route names and a push consumer
    gets every message back."""
    node = node_or_skip()
    rocket(split_cluster[21], "topic", "create", "cluster-orders", "--queues", "4")
    runner = Aons(node, split_cluster[1], tmp_path)
    try:
        sent = runner.produce("cluster-orders", 40, "--body-prefix", "c-")
        assert len({line["msgId"] for line in sent}) == 40
        consumer = runner.consume("cluster-orders", "cluster-readers", "--from", "first")
        consumed_or_fail(runner, consumer, {f"c-{i}" for i in range(40)}, "through the cluster", timeout_s=90)
        consumer.stop()
    finally:
        runner.kill_all()

