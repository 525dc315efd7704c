"""Remoting sends (SEND_MESSAGE, SEND_MESSAGE_V2, SEND_BATCH_MESSAGE) and END_TRANSACTION: messages converted to
rocket's and produced as one batch through the broker. A part of RemotingGateway.
"""

from __future__ import annotations

import logging

import trio

from rocket import limits
from rocket.errors import RocketError
from rocket.gateway.remoting import messages as layout
from rocket.gateway.remoting.bridge import Bridge, as_stored
from rocket.gateway.remoting.clients import Clients
from rocket.gateway.remoting.codec import Command, RequestCode
from rocket.serde import avro_codec
from rocket.serde import batch as batch_codec
from rocket.transport.guard import Caller
from rocket.transport.methods import method_spec

log = logging.getLogger("rocket.remoting")

# SEND_MESSAGE_V2's one-letter header fields (SendMessageRequestHeaderV2) -> SendMessageRequestHeader's names
V2_FIELDS = {"a": "producerGroup", "b": "topic", "c": "defaultTopic", "d": "defaultTopicQueueNums", "e": "queueId",
             "f": "sysFlag", "g": "bornTimestamp", "h": "flag", "i": "properties", "j": "reconsumeTimes",
             "k": "unitMode", "l": "maxReconsumeTimes", "m": "batch", "n": "brokerName"}
COMMIT, ROLLBACK = 8, 12  # END_TRANSACTION's commitOrRollback (MessageSysFlag's transaction types); 0: unknown


def send_header(command: Command) -> dict[str, str]:
    if command.code == RequestCode.SEND_MESSAGE_V2 or (command.code == RequestCode.SEND_BATCH_MESSAGE and "b" in command.ext):
        return {V2_FIELDS.get(name, name): value for name, value in command.ext.items()}
    return command.ext


class Producing:
    def __init__(self, bridge: Bridge, clients: Clients):
        self.bridge, self.clients = bridge, clients
        self.dispatcher, self.clock = bridge.dispatcher, bridge.clock
        # transaction topics whose checks are forwarded: at most limits.remoting_transaction_topics_max
        self._checked: set[str] = set()

    async def send_message(self, command: Command, connection, caller: Caller) -> Command:
        header = send_header(command)
        name = header["topic"]
        topic = await self.bridge.topic(name)
        sys_flag = int(header.get("sysFlag", "0") or 0)
        now_ms = self.clock.wall_ms()
        born_ms = int(header.get("bornTimestamp", "0") or 0)
        if command.code == RequestCode.SEND_BATCH_MESSAGE or header.get("batch") == "true":
            sent = [(body, properties) for body, _, properties in layout.decode_batch(command.body)]
            if not sent:
                raise layout.BadMessage("the batch holds no message")
        else:
            sent = [(layout.uncompress(command.body, sys_flag),
                     layout.parse_properties(header.get("properties", "")))]
        transaction = bool(sys_flag & layout.SYSFLAG_TRANSACTION_PREPARED) or \
            sent[0][1].get(layout.TRANSACTION_PREPARED) == "true"
        converted = [layout.to_rocket(body, properties, born_ms, now_ms, connection.peer) for body, properties in sent]
        if transaction:
            group = header.get("producerGroup", "")
            for message in converted:
                message.properties[layout.PRODUCER_GROUP] = group
        queue = int(header.get("queueId", "-1") or -1)
        if not 0 <= queue < topic["queues"]:
            queue = -1
        batch = batch_codec.encode(converted, now_ms, transaction=transaction)
        reply = await self.dispatcher.local("Produce", {"topic": name, "queue": queue, "batch": batch,
                                                        "records": batch_codec.WRITTEN_HERE}, caller)
        if transaction:  # sent: its checks may go to the producer (who may publish to the topic)
            self.producing_transactions(name, header.get("producerGroup", ""))
        host = layout.host_bytes(connection.local)
        ids = [layout.message_id(host[0], host[1], layout.commit_log_offset(name, reply["queue"], offset))
               for offset in range(reply["base_offset"], reply["base_offset"] + reply["count"])]
        fields = {"msgId": ",".join(ids), "queueId": reply["queue"], "queueOffset": reply["base_offset"]}
        if transaction:
            fields["transactionId"] = f"{reply['queue']}.{reply['base_offset']}.{reply['count']}"
        return command.reply(ext=fields)

    async def end_transaction(self, command: Command, connection, caller: Caller) -> Command:
        """Commit or roll back a half message (or a batch of them). The transaction id is the one the send
        answered, QUEUE.OFFSET.COUNT; a client that sends another finds the message by its commitLogOffset."""
        header = command.ext
        resolution = int(header.get("commitOrRollback", "0") or 0)
        if resolution not in (COMMIT, ROLLBACK):
            return command.reply()  # unknown: the broker checks back later
        parts = header.get("transactionId", "").split(".")
        topic_hash, queue, low = layout.split_commit_log_offset(int(header.get("commitLogOffset", "0") or 0))
        topic = await self.bridge.topic_by_hash(topic_hash, header.get("topic", ""))
        if len(parts) == 3 and all(part.isdigit() for part in parts):
            queue, offset, count = map(int, parts)
        else:
            offset, count = int(header.get("tranStateTableOffset", low)), 1
        await self.dispatcher.local("EndTransaction", {"topic": topic, "queue": queue, "offset": offset,
                                                       "count": count, "commit": resolution == COMMIT}, caller)
        return command.reply()

    # ---- transaction check-backs ---------------------------------------------------------------------------

    def producing_transactions(self, topic: str, group: str) -> None:
        """A remoting producer sent half messages to the topic: the topic's due checks are forwarded from now on
        (one follower per topic, at most limits.remoting_transaction_topics_max)."""
        if topic in self._checked or len(self._checked) >= limits.remoting_transaction_topics_max:
            return
        self._checked.add(topic)
        if self.bridge.nursery is not None:  # the gateway runs
            self.bridge.nursery.start_soon(self._forward_checks, topic)

    async def _forward_checks(self, topic: str) -> None:
        """The broker's TransactionChecks stream of the topic, each check sent as CHECK_TRANSACTION_STATE to a
        connected producer of the message's group; its END_TRANSACTION answer ends the transaction. A check with no
        producer connected here is left to the next round."""
        spec = method_spec("TransactionChecks")
        request = avro_codec.encode(spec.request_type, {"topic": topic})
        while True:
            try:
                async for item in self.dispatcher.stream("TransactionChecks", avro_codec, request):
                    for check in avro_codec.decode(spec.response_type, item)["checks"]:
                        await self._check_back(topic, check)
            except RocketError as error:
                log.info("transaction checks of %s: %s; listening again", topic, error)
            await trio.sleep(limits.transaction_check_poll_s)

    async def _check_back(self, topic: str, check: dict) -> None:
        first = batch_codec.decode(check["batch"], check["offset"], check["queue"])[0]
        connections = self.clients.producer_connections(first.properties.get(layout.PRODUCER_GROUP, ""))
        if not connections:
            return
        connection = connections[check["offset"] % len(connections)]
        host = layout.host_bytes(connection.local)
        offset_id = layout.commit_log_offset(topic, check["queue"], check["offset"])
        header = {"tranStateTableOffset": str(check["offset"]), "commitLogOffset": str(offset_id),
                  "msgId": layout.remoting_properties(first).get(layout.UNIQ_KEY, ""),
                  "transactionId": f"{check['queue']}.{check['offset']}.{check['count']}",
                  "offsetMsgId": layout.message_id(host[0], host[1], offset_id)}
        await connection.notify(Command(RequestCode.CHECK_TRANSACTION_STATE, ext=header,
                                        body=as_stored(first, topic, host)))

