"""Orderly consumers' queue locks on a group's leader, one Raft entry per call, so every broker and every later leader
sees the same holders (store/machine.py decides). A part of StorageRole."""

from __future__ import annotations

from rocket import limits
from rocket.clock import Clock
from rocket.errors import Code, RocketError
from rocket.model import check_group_name, check_topic_name
from rocket.replication import Engine
from rocket.roles.storage.gate import Gate
from rocket.store.commands import LOCK_SINCE_SCHEMA, encode_lock


class QueueLocks:
    """StorageLock: lock (take or renew) or unlock an orderly consumer's queues of the group, stamped with the leader's
    wall-clock time, by which a lock lapses limits.remoting_lock_expiry_s after its last renewal."""

    def __init__(self, host: Engine, gate: Gate, clock: Clock):
        self.host = host
        self.gate = gate
        self.clock = clock

    async def lock(self, request: dict) -> dict:
        group, op = request["group"], request["op"]
        self.gate.leads(group)
        if op not in ("lock", "unlock"):
            raise RocketError(Code.BAD_REQUEST, f"a lock's op is lock or unlock, not {op!r}")
        consumer_group, topic = check_group_name(request["consumer_group"]), check_topic_name(request["topic"])
        client = request["client"]
        if not client or len(client) > limits.group_name_bytes_max:
            raise RocketError(Code.BAD_REQUEST, f"a lock's client is 1..{limits.group_name_bytes_max} characters")
        queues = sorted(self.gate.positions([{"queue": queue, "offset": 0} for queue in request["queues"]], "offset"))
        if not self.host.replicas_speak(group, LOCK_SINCE_SCHEMA):
            raise RocketError(Code.UNAVAILABLE, f"group {group} has a replica of an older release, which cannot "
                              "apply a queue lock; retry once the upgrade is done")
        held = await self.host.propose(group, encode_lock(op, consumer_group, topic, client, queues,
                                                          self.clock.wall_ms()))
        return {"queues": held}
