"""Administration over a channel: topics, storage classes, groups, messages, nodes, and the workflows built of them (a
group's dead letters listed or sent again, a node drained until it holds no replica)."""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator, Callable, Sequence

import trio

from rocket import limits
from rocket.client.consumer import open_consumer
from rocket.client.producer import open_producer
from rocket.errors import Code, RocketError
from rocket.model import DEFAULT_STORAGE_CLASS, Message, TopicSpec, dead_letter_topic, timer_topic
from rocket.serde import batch as batch_codec
from rocket.transport.channel import Channel


class Admin:
    def __init__(self, channel: Channel):
        self.channel = channel

    async def create_topic(self, name: str, queues: int, message_type: str = "normal",
                           storage_class: str = DEFAULT_STORAGE_CLASS, retention_s: float | None = None,
                           local_retention_s: float | None = None, read_replicas: int = 0) -> TopicSpec:
        """message_type: normal, fifo, delay or transaction; a topic accepts only sends of its type. Its queues go to
        the groups of storage_class (see create_storage_class). retention_s, local_retention_s, read_replicas: as
        update_topic's (None: the node's default). The call carries a request id: sent again after its answer was lost, it gets
        the first answer, not TOPIC_EXISTS."""
        return TopicSpec.from_wire(await self.channel.call(
            "CreateTopic", {"topic": name, "queues": queues, "message_type": message_type,
                            "storage_class": storage_class, "retention_s": _retention_wire(retention_s, -1),
                            "local_retention_s": _retention_wire(local_retention_s, -1),
                            "request_id": secrets.token_hex(16), "read_replicas": read_replicas}))

    async def delete_topic(self, name: str, force: bool = False) -> None:
        """Delete a topic: its messages (local and in the tier), timers, dead letters, and every consumer group's
        offsets and pop states on it. Refused (NOT_CONSUMED) while a consumer group has messages of it left to
        consume, unless forced. Returns once the storage groups dropped it; made again, the topic starts empty."""
        await self.channel.call("DeleteTopic", {"topic": name, "force": force})

    async def delete_group(self, topic: str, group: str) -> None:
        """Forget a consumer group on a topic: its offsets, pop states and dead letters, and its settings. Refused
        (GROUP_ACTIVE) while the group has live pull consumers."""
        await self.channel.call("DeleteGroup", {"topic": topic, "group": group})

    async def create_storage_class(self, name: str, mode: str = "controller", replicas: int = 2, groups: int = 0,
                                   min_in_sync_replicas: int = 1, unclean_election: bool = False,
                                   ha_max_lag_s: float = limits.ha_lag_s_default) -> dict:
        """A named pool of new storage groups of `replicas` each (groups 0: the nameservers' storage_groups), in raft
        or controller mode (RIP-44: a master and slaves; a write is acknowledged once every replica in sync holds it,
        and refused while fewer than min_in_sync_replicas are; a slave more than ha_max_lag_s behind leaves the sync
        state set; unclean_election lets a replica out of it become master, losing what it lacks). The class as
        StorageClasses describes it."""
        return await self.channel.call("CreateStorageClass", {
            "name": name, "mode": mode, "replicas": replicas, "groups": groups,
            "min_in_sync_replicas": min_in_sync_replicas, "unclean_election": unclean_election,
            "ha_max_lag_s": ha_max_lag_s, "request_id": secrets.token_hex(16)})

    async def storage_classes(self, name: str = "") -> list[dict]:
        """Every storage class, the default (raft) first, each with its groups (master, epochs, sync state set); or
        only the one named, with its groups' recent elections."""
        return (await self.channel.call("StorageClasses", {"name": name}))["classes"]

    async def create_consumer_group(self, group: str, max_attempts: int = 0, retry_backoff_s: tuple[float, ...] = (),
                                    consume_mode: str = "clustering", fifo: bool = False) -> dict:
        """Keep a consumer group's settings in the metadata (GROUP_EXISTS if it has some): deliveries before the
        dead letters (0: none set, each consumer's own), the invisible time after each failed delivery (empty:
        rocket's 1 s, 5 s, 10 s, 30 s ...), clustering or broadcasting, and whether it consumes in order. Every
        broker applies them to the group's receives within limits.group_settings_cache_s."""
        return await self.channel.call("CreateConsumerGroup", {
            "group": group, "max_attempts": max_attempts, "retry_backoff_s": [float(s) for s in retry_backoff_s],
            "consume_mode": consume_mode, "fifo": fifo})

    async def update_consumer_group(self, group: str, *, max_attempts: int | None = None,
                                    retry_backoff_s: tuple[float, ...] | None = None, consume_mode: str | None = None,
                                    fifo: bool | None = None) -> dict:
        """Change the settings given (None leaves one as it is; max_attempts 0 and an empty backoff go back to the
        defaults); UNKNOWN_GROUP if the group has none yet. The group's settings after the change."""
        given = {"max_attempts": max_attempts, "consume_mode": consume_mode, "fifo": fifo,
                 "retry_backoff_s": None if retry_backoff_s is None else [float(s) for s in retry_backoff_s]}
        given = {field: value for field, value in given.items() if value is not None}
        return await self.channel.call("UpdateConsumerGroup", {"group": group, **given, "fields": sorted(given)})

    async def consumer_groups(self, group: str = "") -> list[dict]:
        """Every consumer group with settings, by name, or the one named (UNKNOWN_GROUP if it has none)."""
        return (await self.channel.call("ConsumerGroups", {"group": group}))["groups"]

    async def create_user(self, user: str, secret: str = "", super_user: bool = False) -> dict:
        """A user (an access key); the cluster makes the secret when none is given. The answer alone holds it."""
        return await self.channel.call("AclCreateUser", {"user": user, "secret": secret, "super": super_user})

    async def delete_user(self, user: str) -> None:
        """A user and its policies; its connections are refused from the next call on."""
        await self.channel.call("AclDeleteUser", {"user": user})

    async def users(self) -> list[dict]:
        return (await self.channel.call("AclUsers", {}))["users"]

    async def grant(self, user: str, resource: str, actions: list[str], deny: bool = False,
                    cidrs: Sequence[str] = ()) -> dict:
        """Allow (or deny) a user actions on resources matching a pattern (topic:orders, topic:orders-*, group:g,
        bucket:b, cluster), from the networks given (none: from anywhere). Replaces the user's policy of that
        effect on that resource."""
        return await self.channel.call("AclGrant", {"user": user, "resource": resource, "actions": list(actions),
                                                    "effect": "deny" if deny else "allow", "cidrs": list(cidrs)})

    async def revoke(self, user: str, resource: str, effect: str = "") -> None:
        """Drop the user's policies on the resource: the one of the effect (allow, deny), or both."""
        await self.channel.call("AclRevoke", {"user": user, "resource": resource, "actions": [], "effect": effect,
                                              "cidrs": []})

    async def policies(self, user: str = "") -> list[dict]:
        return (await self.channel.call("AclPolicies", {"user": user}))["policies"]

    async def set_quota(self, entity: str, produce_bytes_per_s: int = 0, consume_bytes_per_s: int = 0,
                        requests_per_s: float = 0.0) -> dict:
        """Set an entity's client quota (user:NAME, user:*, topic:NAME; per broker; 0: unlimited)."""
        return await self.channel.call("AclSetQuota", {
            "entity": entity, "produce_bytes_per_s": produce_bytes_per_s, "consume_bytes_per_s": consume_bytes_per_s,
            "requests_per_s": float(requests_per_s)})

    async def delete_quota(self, entity: str) -> None:
        await self.channel.call("AclSetQuota", {"entity": entity, "delete": True})

    async def quotas(self, entity: str = "") -> list[dict]:
        return (await self.channel.call("AclQuotas", {"entity": entity}))["quotas"]

    async def whoami(self) -> dict:
        """The user this connection signed in as ("" when none), and whether it is a super user."""
        return await self.channel.call("AclWhoAmI", {})

    async def update_topic(self, name: str, retention_s: float | None = None,
                           local_retention_s: float | None = None, queues: int | None = None,
                           storage_class: str = "", read_replicas: int | None = None) -> TopicSpec:
        """Set a topic's total and local retention in whole seconds (0 keeps data for ever, -1 takes the
        node's default; None leaves a setting as it is), or raise its queues to `queues`: the new queues go to the
        groups with the lowest predicted load, and the existing ones stay where they are. Keys map onto queues by
        their count, so a key's later messages may go to another queue than its earlier ones.

        storage_class starts the topic's move to that class, with its offsets, while it is produced to and consumed
        (a normal or FIFO topic); the answer names the class it is in until it moved (wait_moved).

        read_replicas: the learners each of the topic's storage groups keeps, on other nodes, beside its voters. They
        replicate the log without voting, and serve its reads and long polls, as the voters in sync do. The
        nameservers add and remove them within a few heartbeats of the answer (rocket cluster status shows them)."""
        return TopicSpec.from_wire(await self.channel.call(
            "UpdateTopic", {"topic": name, "retention_s": _retention_wire(retention_s, -2),
                            "local_retention_s": _retention_wire(local_retention_s, -2),
                            "queues": -2 if queues is None else queues, "storage_class": storage_class,
                            "read_replicas": -2 if read_replicas is None else read_replicas}))

    async def wait_moved(self, name: str, storage_class: str, poll_s: float = 0.2) -> TopicSpec:
        """Wait until the topic is in storage_class (a move update_topic started). A group that has no leader for
        a moment (a node killed mid-move) answers UNAVAILABLE or TIMEOUT: the wait goes on; the caller bounds it."""
        while True:
            try:
                spec, _ = await self.describe_topic(name)
            except RocketError as error:
                if error.code not in (Code.UNAVAILABLE, Code.TIMEOUT):
                    raise
            else:
                if spec.storage_class == storage_class:
                    return spec
            await trio.sleep(poll_s)

    async def placement_explain(self, topic: str) -> dict:
        """Per queue of the topic: the group and node placement chose, the predicted load, and the runner-up."""
        return await self.channel.call("PlacementExplain", {"topic": topic})

    async def tier_status(self, topic: str = "") -> list[tuple[TopicSpec, list[dict]]]:
        """Per topic (one, or every one): per queue its first, local, tiered and next offsets, its local,
        tiered and pending bytes, and its pieces in the tier."""
        response = await self.channel.call("TierStatus", {"topic": topic})
        return [(TopicSpec.from_wire(entry["topic"]), entry["queues"]) for entry in response["topics"]]

    async def list_topics(self) -> list[TopicSpec]:
        response = await self.channel.call("ListTopics", {})
        return [TopicSpec.from_wire(entry) for entry in response["topics"]]

    async def describe_topic(self, name: str) -> tuple[TopicSpec, list[dict]]:
        response = await self.channel.call("DescribeTopic", {"topic": name})
        return TopicSpec.from_wire(response["topic"]), response["queues"]

    async def cluster_status(self) -> dict:
        """Nodes (roles, liveness, load), storage groups (voters, leader) and the nameserver leader."""
        return await self.channel.call("ClusterStatus", {})

    async def node_health(self, node: int = 0) -> dict:
        """Per storage node (one, or every one with 0): its last health window's features, the verdict, the runs of
        unhealthy and healthy windows, its state and pin."""
        return await self.channel.call("NodeHealth", {"node": node})

    async def pin_node_health(self, node: int, pin: str) -> None:
        """Pin a storage node healthy or degraded, or hand it back to the judge with "auto"."""
        await self.channel.call("PinNodeHealth", {"node": node, "pin": pin})

    async def drain_node(self, node: int, draining: bool = True) -> None:
        """Move every replica off a storage node (or, with draining False, let it take replicas again)."""
        await self.channel.call("DrainNode", {"node": node, "draining": draining})

    async def handover(self, group: int, node: int) -> dict:
        """Make node the master of a controller-mode group, once it is in the group's SyncStateSet (UNAVAILABLE if
        it is not within limits.handover_wait_s): elected at the next epoch, which fences the old master. The
        group's control state after it (master, master_epoch, sync_state_set, sync_state_set_epoch)."""
        return await self.channel.call("Handover", {"group": group, "to": node})

    async def drain_node_and_wait(self, node: int, timeout_s: float, poll_s: float = 1.0,
                                  on_progress: Callable[[int], None] | None = None) -> None:
        """Drain a storage node and wait until it holds no replica (TIMEOUT if some are left after timeout_s);
        on_progress gets the count of replicas left at each look."""
        await self.drain_node(node)
        with trio.move_on_after(timeout_s):
            while True:
                status = await self.cluster_status()
                left = sum(node in group["voters"] + group["learners"] for group in status["groups"])
                if on_progress is not None:
                    on_progress(left)
                if not left:
                    return
                await trio.sleep(poll_s)
        raise RocketError(Code.TIMEOUT, f"node {node} still holds {left:,} replicas after {timeout_s:g} s; "
                                        "it keeps draining")

    async def dead_letters(self, topic: str, group: str) -> AsyncIterator[list[Message]]:
        """A group's dead letters of a topic, batch by batch, from the first; reading them moves nothing."""
        async with open_consumer(self.channel, dead_letter_topic(group, topic), group + "%list", start="earliest",
                                 wait_ms=0) as consumer:
            while messages := await consumer.poll():
                yield messages

    async def resend_dead_letters(self, topic: str, group: str,
                                  on_progress: Callable[[int], None] | None = None) -> int:
        """Send a group's dead letters to their topic again, without their DLQ_ properties; the count resent.
        Each is resent once: the resender's own position on the dead letters is committed after every batch."""
        resent = 0
        async with open_producer(self.channel, topic) as producer, open_consumer(
                self.channel, dead_letter_topic(group, topic), group + "%resend", start="earliest",
                wait_ms=0) as consumer:
            while messages := await consumer.poll():
                for message in messages:
                    message.properties = {name: value for name, value in message.properties.items()
                                          if not name.startswith("DLQ_")}
                await producer.send_many(messages)
                await consumer.commit()
                resent += len(messages)
                if on_progress is not None:
                    on_progress(len(messages))
        return resent

    async def describe_group(self, topic: str, group: str) -> list[dict]:
        """Per queue: the group's pull position, the live pull consumer reading it (member), pop consumption, lag
        and dead letters."""
        return (await self.channel.call("DescribeGroup", {"topic": topic, "group": group}))["queues"]

    async def reset_group(self, topic: str, group: str, to: str | int, queue: int = -1) -> list[dict]:
        """Move the group's positions (on every queue, or on queue) to 'earliest', 'latest', or a time (epoch ms)."""
        request = {"topic": topic, "group": group, "to": to if isinstance(to, str) else "time",
                   "timestamp_ms": to if isinstance(to, int) else 0, "queue": queue}
        return (await self.channel.call("ResetGroup", request))["queues"]

    async def seek_group(self, topic: str, group: str, queue: int, offset: int) -> list[dict]:
        """Move the group's positions on one queue to offset: past a batch its consumers cannot read, say."""
        request = {"topic": topic, "group": group, "to": "offset", "queue": queue, "offset": offset}
        return (await self.channel.call("ResetGroup", request))["queues"]

    async def get_message(self, topic: str, queue: int, offset: int) -> Message:
        """The message at queue and offset (NOT_FOUND if it was never stored)."""
        response = await self.channel.call("Pull", {"topic": topic, "queues": [{"queue": queue, "offset": offset}],
                                                    "max_bytes": 1, "wait_ms": 0})
        for stored in response["batches"]:
            for message in batch_codec.decode(stored["batch"], stored["base_offset"], queue):
                if message.offset == offset:
                    return message
        raise RocketError(Code.NOT_FOUND, f"{topic} has no message {queue}.{offset}")

    async def get_message_or_scheduled(self, topic: str, queue: int, offset: int) -> Message:
        """The message at queue and offset or, on a delay topic, the delayed message whose timer id is
        QUEUE.OFFSET and that waits for its time (NOT_FOUND if neither is stored)."""
        try:
            return await self.get_message(topic, queue, offset)
        except RocketError as error:
            if error.code not in (Code.NOT_FOUND, Code.OFFSET_OUT_OF_RANGE):
                raise
            spec, _ = await self.describe_topic(topic)
            if spec.message_type != "delay":
                raise
        try:
            return await self.get_message(timer_topic(topic), queue, offset)
        except RocketError as error:
            if error.code not in (Code.NOT_FOUND, Code.OFFSET_OUT_OF_RANGE):
                raise
        raise RocketError(Code.NOT_FOUND, f"{topic} has no message {queue}.{offset}, and no delayed message waits "
                                          "with that timer id")

    async def find_messages(self, topic: str, key: str, start_ms: int = 0, end_ms: int | None = None,
                            limit: int = 64, *, message_id: bool = False, queues: Sequence[int] = ()) -> list[Message]:
        """Messages sent with this key (or, with message_id, this client message id) and stored from start_ms to
        end_ms, in queue order; every queue (or those named) is searched through the key index its storage group
        keeps, so a lookup reads only the batches that hold the key, however long the queue (once the indexer,
        which works in the node's idle time, reached them; it reads the others whole)."""
        response = await self.channel.call("FindMessages", {
            "topic": topic, "key": key, "message_id": message_id, "queues": list(queues), "start_ms": start_ms,
            "end_ms": 0 if end_ms is None else max(1, end_ms), "limit": limit})
        wanted = {(entry["queue"], entry["offset"]) for entry in response["offsets"]}
        return [message for stored in response["batches"]
                for message in batch_codec.readable(stored["batch"], stored["base_offset"], stored["queue"]) or ()
                if (message.queue, message.offset) in wanted]

    async def cancel_timer(self, topic: str, timer_id: str) -> None:
        """Drop a delayed message before its time; timer_id is 'QUEUE.OFFSET' from its send."""
        queue, offset = parse_message_id(timer_id)
        await self.channel.call("CancelTimer", {"topic": topic, "queue": queue, "offset": offset})


def _retention_wire(seconds: float | None, unset: int) -> int:
    """A retention as the wire has it: whole seconds (at least 1), 0 for ever, -1 the node's default, unset for None."""
    return unset if seconds is None else -1 if seconds < 0 else max(1, round(seconds)) if seconds else 0


def parse_message_id(message_id: str) -> tuple[int, int]:
    """A message's id on its topic is QUEUE.OFFSET; a delayed one's, until delivered, is its timer's."""
    queue, separator, offset = message_id.partition(".")
    if not separator or not queue.isdigit() or not offset.isdigit():
        raise RocketError(Code.BAD_REQUEST, f"message id {message_id!r}: expected QUEUE.OFFSET, as its send printed")
    return int(queue), int(offset)
