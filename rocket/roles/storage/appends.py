"""Appends on a group's leader: produce batches (timed and transactional ones to their system queues), stamped with
the leader's append time, refused with DISK_FULL while the node's disk is full, and consumer offsets commits. A part of
StorageRole.
"""

from __future__ import annotations

from collections.abc import Callable

from rocket import limits
from rocket.config import NodeConfig
from rocket.errors import Code, RocketError
from rocket.model import check_group_name, check_topic_name
from rocket.parked import Slot, Unparked
from rocket.replication import Engine
from rocket.roles.storage.gate import Gate, NotHosted
from rocket.roles.storage.stamps import AppendStamps
from rocket.serde import batch as batch_codec
from rocket.serde.batch import FLAG_TIMED, FLAG_TRANSACTION, check_header
from rocket.store.commands import (IMPORT_SINCE_SCHEMA, SEQUENCED_SINCE_SCHEMA, encode_append, encode_half,
                                   encode_import, encode_offsets, encode_pop, encode_timers)


class Appends:
    def __init__(self, host: Engine, gate: Gate, stamps: AppendStamps, config: NodeConfig):
        self.host = host
        self.gate = gate
        self.stamps = stamps
        self.config = config

    async def append(self, request: dict) -> dict:
        """Stamp a batch, replicate it, answer with its offsets. The broker checked the batch's CRC; the
        header is checked again here, because the offsets given out depend on it. A batch with its producer's id
        and sequence is stored once, however often it comes (store/producers.py)."""
        entry, answer = self._append_entry(request)
        return answer(await self.host.propose(request["group"], entry, limits.storage_append_wait_s_max))

    def append_parked(self, request: dict, slot: Slot) -> None:
        """append on the data plane: the entry is proposed with a parked slot, which the round that applies it
        completes. Raises Unparked (nothing proposed) when the group is not hosted here yet: the call then waits
        for this node's assignment as a task."""
        try:
            entry, answer = self._append_entry(request)
        except NotHosted:
            raise Unparked from None
        self.host.propose_parked(request["group"], entry, slot.then(answer), limits.storage_append_wait_s_max)

    def _append_entry(self, request: dict) -> tuple[bytes, Callable[[tuple[int, int]], dict]]:
        """The checked, stamped entry of a StorageAppend, and what makes its answer from the applied result."""
        group, topic, queue, batch = request["group"], request["topic"], request["queue"], request["batch"]
        self.gate.hosted(group)
        self.gate.room_for_data()
        check_topic_name(topic)
        self.gate.positions([{"queue": queue, "offset": 0}], "offset")
        flags = check_header(batch, crc=False).flags
        append_ms = self.stamps.stamp(topic, queue)
        # Numbered only where every replica applies it: in a rolling upgrade, an older one could not.
        sequence = (request["producer_id"], request["sequence"]) if request.get("producer_id") and \
            self.host.replicas_speak(group, SEQUENCED_SINCE_SCHEMA) else None
        if sequence and min(sequence) < 0:
            raise RocketError(Code.BAD_REQUEST, f"producer_id and sequence are not negative: {sequence}")
        if flags & FLAG_TIMED:
            self._check_delivery_times(batch, append_ms)
            entry = encode_timers(topic, queue, append_ms, batch, sequence)
        elif flags & FLAG_TRANSACTION:
            batch_codec.decode(batch)  # its checks and its commit read the half messages: BAD_BATCH now, not then
            entry = encode_half(topic, queue, append_ms, append_ms + int(self.config.transaction_timeout_s * 1000), batch,
                                sequence)
        else:
            entry = encode_append(topic, queue, append_ms, batch, sequence)
        scheduled = bool(flags & FLAG_TIMED)
        return entry, lambda applied: {"queue": queue, "base_offset": applied[0], "count": applied[1],
                                       "scheduled": scheduled}

    @staticmethod
    def _check_delivery_times(batch, now_ms: int) -> None:
        """Delivery times must lie within limits.timer_delay_s_max; a time past is due at once."""
        latest_ms = now_ms + limits.timer_delay_s_max * 1000
        for message in batch_codec.decode(batch):
            if message.deliver_at_ms > latest_ms:
                raise RocketError(Code.BAD_REQUEST, f"message {message.offset} is due "
                                  f"{(message.deliver_at_ms - now_ms) / 86_400_000:,.0f} days from now; the most is "
                                  f"{limits.timer_delay_s_max // 86_400} days")

    async def import_batches(self, request: dict) -> dict:
        """StorageImport: batches copied from the queue's old group (its topic moves to another storage class), the
        first at base_offset, in one entry; those the queue holds already are skipped, so a copy sent again changes
        nothing. The answers its producers were given there come along. Answers the queue's next offset."""
        group, topic = request["group"], request["topic"]
        self.gate.leads(group)
        self.gate.room_for_data()
        check_topic_name(topic)
        (queue,) = self.gate.positions([{"queue": request["queue"], "offset": request["base_offset"]}], "offset")
        for batch in request["batches"]:
            check_header(batch)
        if not self.host.replicas_speak(group, IMPORT_SINCE_SCHEMA):
            raise RocketError(Code.UNAVAILABLE, f"group {group} has a replica of an older release, which cannot "
                              "apply a copied batch; retry once the upgrade is done")
        producers = [(answer["producer"], answer["sequence"], answer["base_offset"], answer["count"])
                     for answer in request.get("producers", ()) if answer["queue"] == queue]
        entry = encode_import(topic, queue, self.stamps.stamp(topic, queue), request["base_offset"], request["batches"],
                              producers)
        return {"queue": queue, "offset": await self.host.propose(group, entry, limits.storage_append_wait_s_max)}

    async def commit_offsets(self, request: dict) -> dict:
        self.gate.hosted(request["group"])
        consumer_group = check_group_name(request["consumer_group"])
        check_topic_name(request["topic"])
        offsets = self.gate.positions(request["offsets"], "offset")
        await self.host.propose(request["group"], encode_offsets(consumer_group, request["topic"], offsets))
        for queue, offset in offsets.items() if request["reset_pop"] else ():
            await self.host.propose(request["group"], encode_pop({
                "op": "reset", "consumer_group": consumer_group, "topic": request["topic"], "queue": queue,
                "cursor": offset}))
        return {}
