"""Deletes on the storage role: a deleted topic's queues, or a consumer group's state on a topic, dropped from a group
this node leads (one Raft entry every replica applies), then the topic's objects in the tier. A part of StorageRole.
"""

from __future__ import annotations

import logging

from rocket import limits
from rocket.errors import Code, RocketError
from rocket.model import check_group_name, check_topic_name
from rocket.replication import Engine
from rocket.roles.storage.gate import Gate
from rocket.roles.storage.offload import Offloader
from rocket.store.commands import DROP_OPS, DROP_SINCE_SCHEMA, IMPORT_SINCE_SCHEMA, encode_drop

log = logging.getLogger("rocket.storage")


class Drops:
    """The nameservers drive a topic's delete, group by group (roles/nameserver/deletes.py), and brokers a consumer
    group's; each call is safe to repeat, and the nameservers repeat a topic's until it answers."""

    def __init__(self, host: Engine, gate: Gate, offloader: Offloader):
        self.host = host
        self.gate = gate
        self.offloader = offloader

    async def drop(self, request: dict) -> dict:
        """StorageDrop: op topic (the topic's queues in the group go, with their objects in the tier, and its name is
        refused for appends), group (a consumer group's offsets, pop states and dead letters on the topic) or reopen
        (the deleted topic's name takes appends again: it was made anew); for a topic moving to another storage class,
        seal (appends, commits and pops refused, the data kept for reads) then moved (as topic, but its objects in
        the tier stay: the queues' new groups own them)."""
        group, op, topic, incarnation = request["group"], request["op"], request["topic"], request.get("incarnation", 0)
        self.gate.leads(group)
        check_topic_name(topic)
        if op not in DROP_OPS:
            raise RocketError(Code.BAD_REQUEST, f"a drop is one of {', '.join(DROP_OPS)}, not {op!r}")
        consumer_group = check_group_name(request["consumer_group"]) if op == "group" else ""
        queues = sorted(self.gate.positions([{"queue": queue, "offset": 0} for queue in request["queues"]], "offset"))
        if not self.host.replicas_speak(group, IMPORT_SINCE_SCHEMA if op in ("seal", "moved") else DROP_SINCE_SCHEMA):
            raise RocketError(Code.UNAVAILABLE, f"group {group} has a replica of an older release, which cannot "
                              "apply a delete; retry once the upgrade is done")
        applied = await self.host.propose(group, encode_drop(op, topic, queues, consumer_group, incarnation),
                                          limits.storage_append_wait_s_max)
        if not applied:
            log.info("group %d: a drop of topic %s as made at %d came after the name was made anew: ignored", group,
                     topic, incarnation)
        elif op == "topic":
            deleted = 0
            for queue in queues:
                deleted += await self.offloader.delete_objects(topic, queue)
            log.info("group %d: topic %s dropped (queues %s, %d objects in the tier deleted)", group, topic,
                     queues, deleted)
        return {}
