"""Consumer-group settings against a real `rocket run`: `rocket group create --max-attempts 2` makes a pop consumer
that never acks get each message at most twice before it lands in the dead letters, whatever max attempts the
consumer asked for; `group update` changes only what it names, and `group list` shows it."""

from __future__ import annotations

import json

import trio

from rocket.client import Admin, SimpleConsumer, connect
from tests.e2e.test_cli import rocket
from tests.integration.test_pop import produce


async def test_a_groups_max_attempts_sends_unacked_messages_to_the_dead_letters(server_process):
    server = server_process().start()
    await produce(server.server, "orders", 3, queues=2)
    made = rocket("group", "create", "billing", "--max-attempts", "2", "--retry-backoff", "1s,2s", server=server)
    assert b"created consumer group billing" in made.stdout
    again = rocket("group", "create", "billing", server=server, check=False)
    assert again.returncode == 1 and b"GROUP_EXISTS" in again.stderr

    deliveries: dict[bytes, int] = {}
    async with connect(server.server) as channel:
        consumer = SimpleConsumer(channel, "orders", "billing", invisible_s=1, max_attempts=16)  # the group's win
        with trio.move_on_after(30):
            while True:
                for message in await consumer.receive(max_messages=10, wait_s=1.5):
                    deliveries[message.body] = deliveries.get(message.body, 0) + 1
                    assert message.attempt <= 2
                queues = await Admin(channel).describe_group("orders", "billing")
                if sum(queue["dead_letters"] for queue in queues) == 3:
                    break
        assert consumer.group_max_attempts == 2 and consumer.group_backoff_s == (1.0, 2.0)
    assert deliveries == {b"m0": 2, b"m1": 2, b"m2": 2}, deliveries
    dead = rocket("dlq", "list", "orders", "--group", "billing", "--format", "json", server=server)
    assert sorted(json.loads(line)["body"] for line in dead.stdout.splitlines()) == ["m0", "m1", "m2"]

    updated = rocket("group", "update", "billing", "--max-attempts", "5", "--mode", "broadcasting", "--serde", "avro",
                     server=server)
    assert b"updated consumer group billing" in updated.stdout
    [listed] = json.loads(rocket("group", "list", "--json", server=server).stdout)["groups"]
    assert listed == {"group": "billing", "max_attempts": 5, "retry_backoff_s": [1.0, 2.0],
                      "consume_mode": "broadcasting", "fifo": False}
    table = rocket("group", "list", server=server).stdout.decode()
    assert "billing" in table and "5" in table and "1s, 2s" in table and "broadcasting" in table
    shown = json.loads(rocket("group", "settings", "billing", "--json", server=server).stdout)
    assert shown == listed
    unknown = rocket("group", "update", "nope", "--fifo", server=server, check=False)
    assert unknown.returncode == 1 and b"UNKNOWN_GROUP" in unknown.stderr
    bad = rocket("group", "create", "other", "--max-attempts", "1001", server=server, check=False)
    assert bad.returncode == 1 and b"max_attempts must be 1..1000" in bad.stderr
