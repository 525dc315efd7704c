"""The RocketMQ 5 proxy: apache.rocketmq.v2.MessagingService (gRPC) mapped onto the broker's methods through the
dispatcher, so RocketMQ 5 clients run unchanged. Protobuf classes come from rocketmq-python-client's generated
*_pb2 modules, loaded alone (never the client, grpcio or OpenTelemetry); without that package the service is off."""

from __future__ import annotations

import gzip
import importlib.util
import logging
import math
import re
import sys
import types
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import trio

from rocket import limits
from rocket.clock import Clock
from rocket.errors import Code, RocketError
from rocket.model import Message, queue_for_key
from rocket.serde import avro_codec
from rocket.serde import batch as batch_codec
from rocket.serde.receive import parse_receipt, received
from rocket.transport.grpc_wire import GrpcError, GrpcStatus
from rocket.transport.h2_server import GrpcCall, GrpcHandler
from rocket.transport.rpc import Dispatcher, method_spec

log = logging.getLogger("rocket.rocketmq")

SERVICE = "apache.rocketmq.v2.MessagingService"
KEYS_PROPERTY = "__rmq.keys"  # a message's RocketMQ keys, space-separated, when rocket's one key cannot hold them
ID_PROPERTY = "__rmq.id"  # the message id the client gave, handed back on receive
BORN_HOST_PROPERTY = "__rmq.born_host"

MESSAGE_TYPE_OF = {"normal": 1, "fifo": 2, "delay": 3, "transaction": 4}  # rocket's -> apache.rocketmq.v2.MessageType
STATUS_OF_CODE = {  # rocket's error codes -> apache.rocketmq.v2.Code
    Code.UNKNOWN_TOPIC: 40402, Code.WRONG_MESSAGE_TYPE: 40014, Code.BAD_FILTER: 40010, Code.NOT_FOUND: 40400,
    Code.BAD_REQUEST: 40000, Code.BAD_BATCH: 40000, Code.BAD_QUEUE: 40000, Code.UNDECODABLE: 40000,
    Code.FRAME_TOO_LARGE: 41300, Code.TIMEOUT: 50400, Code.OVERLOADED: 42900, Code.UNAVAILABLE: 50001,
}
AUTHORIZATION = re.compile(r"MQv2-HMAC-SHA1 Credential=[^,\s]*, ?SignedHeaders=[a-z0-9-]+(;[a-z0-9-]+)*, ?"
                           r"Signature=[0-9A-Fa-f]+")  # RocketMQ 5's HMAC signature of the x-mq-date-time header
OK = 20000
MESSAGE_NOT_FOUND = 40401
INVALID_RECEIPT_HANDLE = 40013
INVALID_TRANSACTION_ID = 40008
ILLEGAL_MESSAGE_ID = 40009
MESSAGE_CORRUPTED = 40016
UNSUPPORTED = 50500


def load_protocol() -> tuple[types.ModuleType, types.ModuleType] | None:
    """definition_pb2 and service_pb2 from the installed rocketmq-python-client, without importing the client:
    service_pb2's import of rocketmq.grpc_protocol.definition_pb2 is answered by stand-in packages that are
    removed again once it has loaded."""
    loaded = sys.modules.get("rocketmq.grpc_protocol.service_pb2")
    if loaded is not None:  # the client runs in this process (a test, say): share its classes
        return sys.modules["rocketmq.grpc_protocol.definition_pb2"], loaded
    try:
        spec = importlib.util.find_spec("rocketmq")  # finds the package without running its __init__
        import google.protobuf  # noqa: F401  (the generated modules need it)
    except ImportError:
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    directory = Path(next(iter(spec.submodule_search_locations))) / "grpc_protocol"
    if not (directory / "service_pb2.py").is_file():
        return None
    definition = _load_module("rocket._rocketmq_protocol.definition_pb2", directory / "definition_pb2.py")
    stand_ins = {"rocketmq": types.ModuleType("rocketmq"), "rocketmq.grpc_protocol": types.ModuleType("grpc_protocol")}
    stand_ins["rocketmq.grpc_protocol"].definition_pb2 = definition
    stand_ins["rocketmq"].grpc_protocol = stand_ins["rocketmq.grpc_protocol"]
    if any(name in sys.modules for name in stand_ins):
        return None  # a partly imported client: do not shadow it
    sys.modules.update(stand_ins)
    try:
        service = _load_module("rocket._rocketmq_protocol.service_pb2", directory / "service_pb2.py")
    finally:
        for name in stand_ins:
            sys.modules.pop(name, None)
    return definition, service


def _load_module(name: str, path: Path) -> types.ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    sys.modules[name] = module
    return module


def rocketmq_services(dispatcher: Dispatcher, clock: Clock, max_attempts: int = limits.pop_attempts_default
                      ) -> dict[str, GrpcHandler]:
    """The gRPC handler table for serve_http2; empty (and logged) when the protobuf modules are missing.
    max_attempts: deliveries before a message goes to the dead-letter queue (RocketMQ sets it per consumer
    group on the server; here one value for the node, the setting rocketmq_max_attempts)."""
    protocol = load_protocol()
    if protocol is None:
        log.info("RocketMQ 5 gRPC API off: install rocket[rocketmq] (rocketmq-python-client, protobuf) to serve it")
        return {}
    return RocketMQProxy(dispatcher, *protocol, clock=clock, max_attempts=max_attempts).handlers()


def _status_of(error: RocketError) -> int:
    return STATUS_OF_CODE.get(error.code, 50000)


def _ms_of(duration, default_s: float) -> int:
    if duration.seconds == 0 and duration.nanos == 0:
        return int(default_s * 1000)
    return duration.seconds * 1000 + duration.nanos // 1_000_000


class RocketMQProxy:
    def __init__(self, dispatcher: Dispatcher, definition: types.ModuleType, service: types.ModuleType,
                 clock: Clock, max_attempts: int = limits.pop_attempts_default):
        assert max_attempts >= 1
        self.dispatcher = dispatcher
        self.clock = clock
        self.max_attempts = max_attempts
        self.definition = definition
        self.service = service
        self._topics: dict[str, tuple[float, dict]] = {}  # name -> (fetched at, TopicInfo)

    def handlers(self) -> dict[str, GrpcHandler]:
        service = self.service
        unary = {
            "QueryRoute": (service.QueryRouteRequest, self.query_route),
            "Heartbeat": (service.HeartbeatRequest, self.heartbeat),
            "SendMessage": (service.SendMessageRequest, self.send_message),
            "QueryAssignment": (service.QueryAssignmentRequest, self.query_assignment),
            "AckMessage": (service.AckMessageRequest, self.ack_message),
            "ChangeInvisibleDuration": (service.ChangeInvisibleDurationRequest, self.change_invisible_duration),
            "ForwardMessageToDeadLetterQueue": (service.ForwardMessageToDeadLetterQueueRequest,
                                                self.forward_message_to_dead_letter_queue),
            "EndTransaction": (service.EndTransactionRequest, self.end_transaction),
            "NotifyClientTermination": (service.NotifyClientTerminationRequest, self.notify_client_termination),
            "RecallMessage": (service.RecallMessageRequest, self.recall_message),
        }
        table = {f"/{SERVICE}/{name}": self._unary(request_type, method) for name, (request_type, method) in unary.items()}
        table[f"/{SERVICE}/ReceiveMessage"] = self._server_stream(service.ReceiveMessageRequest, self.receive_message)
        table[f"/{SERVICE}/Telemetry"] = self._checked(self.telemetry)
        return table

    # ---- framing of calls ------------------------------------------------------------------------------

    def _checked(self, handler: Callable[[GrpcCall], Awaitable[None]]) -> GrpcHandler:
        async def handle(call: GrpcCall) -> None:
            if call.headers.get("x-mq-namespace"):
                raise GrpcError(GrpcStatus.UNIMPLEMENTED, "namespaces are not supported by rocket yet: "
                                "leave the client's namespace empty")
            authorization = call.headers.get("authorization")
            if authorization is not None and not AUTHORIZATION.fullmatch(authorization):
                # No ACLs yet, so any well-formed signature passes; a malformed header is not ignored.
                raise GrpcError(GrpcStatus.UNAUTHENTICATED, "malformed authorization header: expected "
                                "'MQv2-HMAC-SHA1 Credential=AK, SignedHeaders=x-mq-date-time, Signature=HEX'")
            await handler(call)
        return handle

    def _parse(self, request_type, data: bytes):
        try:
            return request_type.FromString(data)
        except Exception:  # protobuf's DecodeError, whatever module it comes from
            raise GrpcError(GrpcStatus.INTERNAL, f"malformed {request_type.DESCRIPTOR.name}") from None

    def _unary(self, request_type, method) -> GrpcHandler:
        async def handle(call: GrpcCall) -> None:
            request = self._parse(request_type, await call.receive_one())
            response = await method(request, call)
            await call.send(response.SerializeToString())
        return self._checked(handle)

    def _server_stream(self, request_type, method) -> GrpcHandler:
        async def handle(call: GrpcCall) -> None:
            request = self._parse(request_type, await call.receive_one())
            async for response in method(request, call):
                await call.send(response.SerializeToString())
        return self._checked(handle)

    def _status(self, code: int = OK, message: str = "OK"):
        return self.definition.Status(code=code, message=message)

    def _error_status(self, error: RocketError):
        return self._status(_status_of(error), f"{error.code.name}: {error.message}")

    # ---- topics and routes -----------------------------------------------------------------------------

    async def _topic(self, name: str) -> dict:
        """The topic's TopicInfo (type, queues), cached for limits.rocketmq_topic_cache_s."""
        now = self.clock.now_s()
        found = self._topics.get(name)
        if found is not None and now - found[0] < limits.rocketmq_topic_cache_s:
            return found[1]
        topic = (await self.dispatcher.local("DescribeTopic", {"topic": name}))["topic"]
        self._topics.pop(name, None)
        if len(self._topics) >= limits.rocketmq_topic_cache_entries_max:
            del self._topics[next(iter(self._topics))]
        self._topics[name] = (now, topic)
        return topic

    def _endpoints(self, requested, call: GrpcCall):
        """Routes point the client back at the endpoint it reached: rocket's brokers are all alike."""
        if requested is not None and requested.addresses:
            return requested
        host, _, port = call.headers.get(":authority", "127.0.0.1:9877").rpartition(":")
        return self.definition.Endpoints(scheme=1, addresses=[self.definition.Address(host=host, port=int(port or 0))])

    def _queues(self, topic: dict, endpoints) -> list:
        definition = self.definition
        broker = definition.Broker(name="rocket", id=0, endpoints=endpoints)
        return [definition.MessageQueue(topic=definition.Resource(name=topic["name"]), id=queue, permission=4,
                                        broker=broker, accept_message_types=[MESSAGE_TYPE_OF.get(topic["message_type"], 1)])
                for queue in range(topic["queues"])]

    async def query_route(self, request, call: GrpcCall):
        try:
            topic = await self._topic(request.topic.name)
        except RocketError as error:
            return self.service.QueryRouteResponse(status=self._error_status(error))
        queues = self._queues(topic, self._endpoints(request.endpoints, call))
        return self.service.QueryRouteResponse(status=self._status(), message_queues=queues)

    async def query_assignment(self, request, call: GrpcCall):
        """One assignment: a receive pops from every queue of the topic, so more would only repeat it."""
        try:
            topic = await self._topic(request.topic.name)
        except RocketError as error:
            return self.service.QueryAssignmentResponse(status=self._error_status(error))
        queue = self._queues(topic, self._endpoints(request.endpoints, call))[0]
        return self.service.QueryAssignmentResponse(status=self._status(),
                                                    assignments=[self.definition.Assignment(message_queue=queue)])

    async def heartbeat(self, request, call: GrpcCall):
        return self.service.HeartbeatResponse(status=self._status())

    async def notify_client_termination(self, request, call: GrpcCall):
        return self.service.NotifyClientTerminationResponse(status=self._status())

    # ---- telemetry ---------------------------------------------------------------------------------------

    async def telemetry(self, call: GrpcCall) -> None:
        """Answer each settings command with the server's settings. While the stream is open, a producer's
        transaction topics (those its settings list) have their due check-backs forwarded to it as
        RecoverOrphanedTransactionCommands; it answers with EndTransaction calls."""
        sending = trio.Lock()  # commands from several tasks go out whole, one after another

        async def send(command) -> None:
            async with sending:
                await call.send(command.SerializeToString())

        checked: set[str] = set()
        async with trio.open_nursery() as nursery:
            while (data := await call.receive()) is not None:
                command = self._parse(self.service.TelemetryCommand, data)
                if command.WhichOneof("command") != "settings":
                    continue  # the client's answers to checks come as EndTransaction calls, not here
                await send(self.service.TelemetryCommand(status=self._status(),
                                                         settings=await self._settings(command.settings)))
                for resource in command.settings.publishing.topics if command.settings.HasField("publishing") else ():
                    if resource.name in checked or len(checked) >= limits.rocketmq_telemetry_topics_max:
                        continue
                    try:
                        topic = await self._topic(resource.name)
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
                async for item in self.dispatcher.stream("TransactionChecks", avro_codec, request):
                    for check in avro_codec.decode(spec.response_type, item)["checks"]:
                        messages = batch_codec.decode(check["batch"], check["offset"], check["queue"])
                        handle = {"queue": check["queue"], "offset": check["offset"], "attempt": 1}
                        command = self.service.RecoverOrphanedTransactionCommand(
                            message=self._to_rocketmq(topic, messages[0], handle, 0),
                            transaction_id=f"{check['queue']}.{check['offset']}.{check['count']}")
                        await send(self.service.TelemetryCommand(recover_orphaned_transaction_command=command))
            except RocketError as error:
                log.info("transaction checks of %s: %s; listening again", topic["name"], error)
            await trio.sleep(limits.transaction_check_poll_s)

    async def _settings(self, asked):
        settings = self.definition.Settings()
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
            # Consumers retry after rocket's backoff (1 s, 5 s, 10 s, 30 s ...) and give up where rocket does.
            settings.backoff_policy.Clear()
            settings.backoff_policy.max_attempts = self.max_attempts
            for seconds in limits.pop_retry_backoff_s:
                settings.backoff_policy.customized_backoff.next.add(seconds=seconds)
            fifo = False
            for entry in asked.subscription.subscriptions:
                try:
                    fifo = fifo or (await self._topic(entry.topic.name))["message_type"] == "fifo"
                except RocketError:
                    continue  # an unknown topic: its receives will say so
            settings.subscription.fifo = fifo
            settings.subscription.receive_batch_size = limits.rocketmq_receive_messages_default
            if not asked.subscription.HasField("long_polling_timeout"):
                settings.subscription.long_polling_timeout.seconds = int(limits.rocketmq_receive_wait_s_default)
        return settings

    # ---- sending -----------------------------------------------------------------------------------------

    def _to_rocket(self, message, fifo: bool) -> Message:
        system = message.system_properties
        body = message.body
        if system.body_encoding == 2:  # GZIP: rocket stores plain bodies, which every client can read
            body = gzip.decompress(body)
        properties = dict(message.user_properties)
        if any(name.startswith("__rmq.") for name in properties):
            raise RocketError(Code.BAD_REQUEST, "user properties starting with '__rmq.' are reserved")
        keys = [key for key in system.keys if key]
        key = system.message_group if system.HasField("message_group") else (keys[0] if keys else "")
        if keys and keys != [key]:
            properties[KEYS_PROPERTY] = " ".join(keys)
        if system.message_id:
            properties[ID_PROPERTY] = system.message_id
        if system.born_host:
            properties[BORN_HOST_PROPERTY] = system.born_host
        born_ms = system.born_timestamp.seconds * 1000 + system.born_timestamp.nanos // 1_000_000
        deliver_at_ms = 0
        if system.HasField("delivery_timestamp"):
            deliver_at_ms = max(1, system.delivery_timestamp.seconds * 1000 + system.delivery_timestamp.nanos // 1_000_000)
        return Message(body, key=key, tag=system.tag if system.HasField("tag") else "", properties=properties,
                       timestamp_ms=born_ms, deliver_at_ms=deliver_at_ms)

    async def send_message(self, request, call: GrpcCall):
        """The request's messages as one batch (they share a topic; the first picks the queue)."""
        service = self.service
        messages = list(request.messages)
        if not messages:
            return service.SendMessageResponse(status=self._status(40000, "no messages"))
        try:
            name = messages[0].topic.name
            if any(message.topic.name != name for message in messages):
                raise RocketError(Code.BAD_REQUEST, "the messages of one SendMessage go to one topic")
            topic = await self._topic(name)
            fifo = topic["message_type"] == "fifo"
            converted = [self._to_rocket(message, fifo) for message in messages]
            first = messages[0].system_properties
            if fifo and converted[0].key:
                queue = queue_for_key(converted[0].key, topic["queues"])  # the message group picks the queue
            else:
                queue = first.queue_id if 0 <= first.queue_id < topic["queues"] else -1
            transaction = first.message_type == 4
            batch = batch_codec.encode(converted, self.clock.wall_ms(), transaction=transaction)
            reply = await self.dispatcher.local("Produce", {"topic": name, "queue": queue, "batch": batch})
        except (RocketError, OSError, EOFError) as error:
            error = error if isinstance(error, RocketError) else RocketError(Code.BAD_REQUEST, f"body: {error}")
            status = self._error_status(error)
            return service.SendMessageResponse(status=status, entries=[service.SendResultEntry(status=status)])
        entries = []
        for index, message in enumerate(messages):
            offset = reply["base_offset"] + index
            entry = service.SendResultEntry(status=self._status(), offset=offset,
                                            message_id=message.system_properties.message_id or f"{reply['queue']}.{offset}")
            if transaction:
                entry.transaction_id = f"{reply['queue']}.{reply['base_offset']}.{reply['count']}"
            if reply.get("scheduled"):
                entry.recall_handle = f"{reply['queue']}.{offset}"
            entries.append(entry)
        return service.SendMessageResponse(status=self._status(), entries=entries)

    async def end_transaction(self, request, call: GrpcCall):
        parts = request.transaction_id.split(".")
        if len(parts) != 3 or not all(part.isdigit() for part in parts):
            return self.service.EndTransactionResponse(
                status=self._status(INVALID_TRANSACTION_ID, f"transaction id {request.transaction_id!r}: not rocket's"))
        if request.resolution == 0 and request.source == 2:  # a check's UNKNOWN: the broker checks again later
            return self.service.EndTransactionResponse(status=self._status())
        if request.resolution not in (1, 2):
            return self.service.EndTransactionResponse(status=self._status(40000, "resolution is COMMIT or ROLLBACK"))
        queue, offset, count = map(int, parts)
        try:
            await self.dispatcher.local("EndTransaction", {"topic": request.topic.name, "queue": queue, "offset": offset,
                                                           "count": count, "commit": request.resolution == 1})
        except RocketError as error:
            return self.service.EndTransactionResponse(status=self._error_status(error))
        return self.service.EndTransactionResponse(status=self._status())

    async def recall_message(self, request, call: GrpcCall):
        """Cancel a delayed message before its time: the recall handle is its timer id."""
        parts = request.recall_handle.split(".")
        if len(parts) != 2 or not all(part.isdigit() for part in parts):
            return self.service.RecallMessageResponse(status=self._status(40000, "malformed recall handle"))
        try:
            await self.dispatcher.local("CancelTimer", {"topic": request.topic.name, "queue": int(parts[0]),
                                                        "offset": int(parts[1])})
        except RocketError as error:
            return self.service.RecallMessageResponse(status=self._error_status(error))
        return self.service.RecallMessageResponse(status=self._status(), message_id=request.recall_handle)

    # ---- receiving ---------------------------------------------------------------------------------------

    async def receive_message(self, request, call: GrpcCall) -> AsyncIterator:
        """A long poll: a status, then the messages; "message not found" shortly before the client's deadline."""
        service = self.service
        topic_name = request.message_queue.topic.name
        wait_s = _ms_of(request.long_polling_timeout, limits.rocketmq_receive_wait_s_default) / 1000
        if math.isfinite(call.deadline):
            wait_s = min(wait_s, call.deadline - trio.current_time() - limits.rocketmq_receive_answer_margin_s)
        expression = request.filter_expression
        filter_type = "sql" if expression.type == 2 else "tag"
        deadline = trio.current_time() + max(0.0, wait_s)
        try:
            topic = await self._topic(topic_name)
            while True:
                slice_s = min(limits.rocketmq_receive_slice_s, max(0.0, deadline - trio.current_time()))
                response = await self.dispatcher.local("Receive", {
                    "topic": topic_name, "group": request.group.name, "max_messages": max(1, request.batch_size),
                    "invisible_ms": _ms_of(request.invisible_duration, limits.rocketmq_invisible_s_default),
                    "wait_ms": int(slice_s * 1000), "max_attempts": self.max_attempts,
                    "filter_type": filter_type, "filter": expression.expression or ("*" if filter_type == "tag" else "")})
                if response["handles"] or trio.current_time() >= deadline:
                    break
        except RocketError as error:
            yield service.ReceiveMessageResponse(status=self._error_status(error))
            return
        if not response["handles"]:
            yield service.ReceiveMessageResponse(status=self._status(MESSAGE_NOT_FOUND, "no new message"))
            return
        yield service.ReceiveMessageResponse(status=self._status())
        messages, unreadable = received(response, topic_name)
        if unreadable:
            try:
                await self.dispatcher.local("DeadLetter", {"topic": topic_name, "group": request.group.name,
                                                           "receipts": unreadable, "invisible_ms": -1})
            except RocketError as error:  # they come back after their invisible time, and go then
                log.warning("dead-lettering unreadable messages of %s: %s", topic_name, error)
        invisible_ms = _ms_of(request.invisible_duration, limits.rocketmq_invisible_s_default)
        for message in messages:
            handle = {"queue": message.queue, "offset": message.offset, "attempt": message.attempt}
            yield service.ReceiveMessageResponse(message=self._to_rocketmq(topic, message, handle, invisible_ms))
        answered = service.ReceiveMessageResponse()  # when the messages left: push consumers measure latency from it
        answered.delivery_timestamp.FromMilliseconds(self.clock.wall_ms())
        yield answered

    def _to_rocketmq(self, topic: dict, message: Message, handle: dict, invisible_ms: int):
        definition = self.definition
        properties = dict(message.properties)
        fifo = topic["message_type"] == "fifo"
        keys_text = properties.pop(KEYS_PROPERTY, None)
        keys = keys_text.split(" ") if keys_text else ([message.key] if message.key and not fifo else [])
        message_id = properties.pop(ID_PROPERTY, "") or f"{message.queue}.{message.offset}"
        born_host = properties.pop(BORN_HOST_PROPERTY, "")
        system = definition.SystemProperties(
            keys=keys, message_id=message_id, born_host=born_host, store_host="rocket",
            body_digest=definition.Digest(type=1, checksum=format(zlib.crc32(message.body) & 0xFFFFFFFF, "08X")),
            body_encoding=1, message_type=MESSAGE_TYPE_OF.get(topic["message_type"], 1), queue_id=message.queue,
            queue_offset=message.offset, delivery_attempt=handle["attempt"],
            receipt_handle=f"{handle['queue']}.{handle['offset']}.{handle['attempt']}")
        if message.tag:
            system.tag = message.tag
        if fifo and message.key:
            system.message_group = message.key
        system.born_timestamp.FromMilliseconds(message.timestamp_ms)
        system.store_timestamp.FromMilliseconds(message.timestamp_ms)
        if message.deliver_at_ms or topic["message_type"] == "delay":  # a delivered one's timestamp is its time
            system.delivery_timestamp.FromMilliseconds(message.deliver_at_ms or message.timestamp_ms)
        system.invisible_duration.FromMilliseconds(invisible_ms)
        return definition.Message(topic=definition.Resource(name=topic["name"]), user_properties=properties,
                                  system_properties=system, body=message.body)

    async def ack_message(self, request, call: GrpcCall):
        service = self.service
        entries = list(request.entries)
        results = []
        try:
            receipts = [_receipt(entry.receipt_handle) for entry in entries]
            response = await self.dispatcher.local("Ack", {"topic": request.topic.name, "group": request.group.name,
                                                           "receipts": receipts, "invisible_ms": -1})
        except RocketError as error:
            return service.AckMessageResponse(status=self._error_status(error))
        stale = {(entry["queue"], entry["offset"], entry["attempt"]) for entry in response["stale"]}
        for entry, receipt in zip(entries, receipts):
            expired = (receipt["queue"], receipt["offset"], receipt["attempt"]) in stale
            status = self._status(INVALID_RECEIPT_HANDLE, "the receipt is stale") if expired else self._status()
            results.append(service.AckMessageResultEntry(message_id=entry.message_id,
                                                         receipt_handle=entry.receipt_handle, status=status))
        overall = self._status() if not stale else (results[0].status if len(results) == 1 else self._status(30000, "some failed"))
        return service.AckMessageResponse(status=overall, entries=results)

    async def change_invisible_duration(self, request, call: GrpcCall):
        service = self.service
        try:
            receipt = _receipt(request.receipt_handle)
            invisible_ms = _ms_of(request.invisible_duration, 0)
            if receipt["attempt"] >= self.max_attempts:
                invisible_ms = 0  # a failure of the last attempt: the next receive moves it to the dead-letter queue
            response = await self.dispatcher.local("ChangeInvisible", {
                "topic": request.topic.name, "group": request.group.name, "receipts": [receipt],
                "invisible_ms": invisible_ms})
        except RocketError as error:
            return service.ChangeInvisibleDurationResponse(status=self._error_status(error))
        if response["stale"]:
            return service.ChangeInvisibleDurationResponse(status=self._status(INVALID_RECEIPT_HANDLE, "the receipt is stale"))
        return service.ChangeInvisibleDurationResponse(status=self._status(), receipt_handle=request.receipt_handle)

    async def forward_message_to_dead_letter_queue(self, request, call: GrpcCall):
        """The received message goes to the group's dead-letter queue now and is not delivered again (the
        client calls this for a message it cannot consume, such as a FIFO one past its attempts)."""
        service = self.service
        try:
            receipt = _receipt(request.receipt_handle)
            response = await self.dispatcher.local("DeadLetter", {
                "topic": request.topic.name, "group": request.group.name, "receipts": [receipt], "invisible_ms": -1})
        except RocketError as error:
            return service.ForwardMessageToDeadLetterQueueResponse(status=self._error_status(error))
        if response["stale"]:
            return service.ForwardMessageToDeadLetterQueueResponse(
                status=self._status(INVALID_RECEIPT_HANDLE, "the receipt is stale"))
        return service.ForwardMessageToDeadLetterQueueResponse(status=self._status())


def _receipt(text: str) -> dict:
    queue, offset, attempt = parse_receipt(text)
    return {"queue": queue, "offset": offset, "attempt": attempt}
