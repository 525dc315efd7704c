"""RocketMQ 5's Telemetry stream: the client's settings answered, and transaction check-backs forwarded to the
producer that can answer them. A part of RocketMQProxy, over its Bridge.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

import trio

from rocket import limits
from rocket.errors import RocketError
from rocket.gateway.rocketmq.bridge import Bridge
from rocket.gateway.rocketmq.namespace import into_namespace, out_of_namespace
from rocket.serde import avro_codec
from rocket.serde import batch as batch_codec
from rocket.transport.h2_server import GrpcCall
from rocket.transport.methods import method_spec

log = logging.getLogger("rocket.rocketmq")


class Telemetry:
    def __init__(self, bridge: Bridge):
        self.bridge = bridge

    async def telemetry(self, call: GrpcCall) -> None:
        """Answer each settings command with the server's settings. While the stream is open, a producer's
        transaction topics (those its settings list) have their due check-backs forwarded to it as
        RecoverOrphanedTransactionCommands; it answers with EndTransaction calls."""
        sending = trio.Lock()  # commands from several tasks go out whole, one after another
        namespace = call.headers.get("x-mq-namespace", "")

        async def send(command) -> None:
            if namespace:
                out_of_namespace(command, namespace)
            async with sending:
                await call.send(command.SerializeToString())

        checked: set[str] = set()
        async with trio.open_nursery() as nursery:
            while (data := await call.receive()) is not None:
                command = self.bridge.parse(self.bridge.service.TelemetryCommand, data)
                if namespace:
                    into_namespace(command, namespace)
                if command.WhichOneof("command") != "settings":
                    continue  # the client's answers to checks come as EndTransaction calls, not here
                await send(self.bridge.service.TelemetryCommand(status=self.bridge.status(),
                                                         settings=await self._settings(command.settings)))
                for resource in command.settings.publishing.topics if command.settings.HasField("publishing") else ():
                    if resource.name in checked or len(checked) >= limits.rocketmq_telemetry_topics_max:
                        continue
                    try:
                        topic = await self.bridge.topic(resource.name)
                    except RocketError:
                        continue  # an unknown topic: its sends will say so
                    if topic["message_type"] == "transaction":
                        checked.add(resource.name)
                        nursery.start_soon(self._forward_checks, topic, send)
            nursery.cancel_scope.cancel()  # the client ended the stream: no one is left to answer checks

    async def _forward_checks(self, topic: dict, send: Callable[..., Awaitable[None]]) -> None:
        """The broker's TransactionChecks stream of the topic, each check as a RecoverOrphanedTransactionCommand
        (a transaction of the official client holds one message); listens again after a failure, until cancelled."""
        spec = method_spec("TransactionChecks")
        request = avro_codec.encode(spec.request_type, {"topic": topic["name"]})
        while True:
            try:
                async for item in self.bridge.dispatcher.stream("TransactionChecks", avro_codec, request):
                    for check in avro_codec.decode(spec.response_type, item)["checks"]:
                        messages = batch_codec.decode(check["batch"], check["offset"], check["queue"])
                        handle = {"queue": check["queue"], "offset": check["offset"], "attempt": 1}
                        command = self.bridge.service.RecoverOrphanedTransactionCommand(
                            message=self.bridge.to_rocketmq(topic, messages[0], handle, 0),
                            transaction_id=f"{check['queue']}.{check['offset']}.{check['count']}")
                        await send(self.bridge.service.TelemetryCommand(recover_orphaned_transaction_command=command))
            except RocketError as error:
                log.info("transaction checks of %s: %s; listening again", topic["name"], error)
            await trio.sleep(limits.transaction_check_poll_s)

    async def _settings(self, asked):
        settings = self.bridge.definition.Settings()
        settings.CopyFrom(asked)
        settings.request_timeout.seconds = int(limits.request_timeout_s_default)
        settings.backoff_policy.max_attempts = limits.rocketmq_send_attempts_max
        settings.backoff_policy.exponential_backoff.initial.FromNanoseconds(int(limits.rocketmq_send_backoff_s_min * 1e9))
        settings.backoff_policy.exponential_backoff.max.FromNanoseconds(int(limits.rocketmq_send_backoff_s_max * 1e9))
        settings.backoff_policy.exponential_backoff.multiplier = 2.0
        if asked.HasField("publishing"):
            settings.publishing.max_body_size = limits.message_bytes_max
            settings.publishing.validate_message_type = True
        elif asked.HasField("subscription"):
            # Consumers retry after the group's backoff (or rocket's: 1 s, 5 s, 10 s, 30 s ...) and give up where the
            # group's settings say (or the node's rocketmq_max_attempts), as the broker's receives do.
            group = await self.bridge.group_settings(asked.subscription.group.name)
            settings.backoff_policy.Clear()
            settings.backoff_policy.max_attempts = group["max_attempts"] or self.bridge.max_attempts
            for seconds in group["retry_backoff_s"] or limits.pop_retry_backoff_s:
                settings.backoff_policy.customized_backoff.next.add().FromNanoseconds(int(seconds * 1e9))
            fifo = group["fifo"]
            for entry in asked.subscription.subscriptions:
                try:
                    fifo = fifo or (await self.bridge.topic(entry.topic.name))["message_type"] == "fifo"
                except RocketError:
                    continue  # an unknown topic: its receives will say so
            settings.subscription.fifo = fifo
            settings.subscription.receive_batch_size = limits.rocketmq_receive_messages_default
            if not asked.subscription.HasField("long_polling_timeout"):
                settings.subscription.long_polling_timeout.seconds = int(limits.rocketmq_receive_wait_s_default)
        return settings
