"""The RocketMQ 5 proxy: apache.rocketmq.v2.MessagingService (gRPC) mapped onto the broker's methods through the
dispatcher, so RocketMQ 5 clients run unchanged. It wires the calls and answers routes (RocketMQProxy); the service is
off without rocketmq-python-client's generated *_pb2 modules (protocol.py)."""

from __future__ import annotations

import logging
import types
from collections.abc import Awaitable, Callable

import trio

from rocket import limits
from rocket.clock import Clock
from rocket.errors import RocketError
from rocket.gateway.rocketmq.bridge import Bridge
from rocket.gateway.rocketmq.namespace import into_namespace, out_of_namespace
from rocket.gateway.rocketmq.protocol import MESSAGE_TYPE_OF, SERVICE, load_protocol
from rocket.gateway.rocketmq.pulling import Pulling
from rocket.gateway.rocketmq.receiving import Receiving
from rocket.gateway.rocketmq.sending import Sending
from rocket.gateway.rocketmq.signature import verify_grpc
from rocket.gateway.rocketmq.telemetry import Telemetry
from rocket.transport.grpc_wire import GrpcError, GrpcStatus
from rocket.transport.h2_server import GrpcCall, GrpcHandler
from rocket.transport.rpc import Dispatcher

log = logging.getLogger("rocket.rocketmq")


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


class RocketMQProxy:
    """The service's calls framed (signatures, authorization, quotas) and routed to its parts, which share a Bridge;
    routes are answered here. The parts: telemetry.py, sending.py, receiving.py and pulling.py."""

    def __init__(self, dispatcher: Dispatcher, definition: types.ModuleType, service: types.ModuleType,
                 clock: Clock, max_attempts: int = limits.pop_attempts_default):
        assert max_attempts >= 1
        self.dispatcher = dispatcher
        self.clock = clock
        self.definition = definition
        self.service = service
        self.bridge = Bridge(dispatcher, definition, service, clock, max_attempts)
        self.telemetry = Telemetry(self.bridge)
        self.sending = Sending(self.bridge)
        self.receiving = Receiving(self.bridge)
        self.pulling = Pulling(self.bridge)

    def handlers(self) -> dict[str, GrpcHandler]:
        service = self.service
        sending, receiving, pulling = self.sending, self.receiving, self.pulling
        unary = {
            "QueryRoute": (service.QueryRouteRequest, self.query_route),
            "Heartbeat": (service.HeartbeatRequest, self.heartbeat),
            "SendMessage": (service.SendMessageRequest, sending.send_message),
            "QueryAssignment": (service.QueryAssignmentRequest, self.query_assignment),
            "AckMessage": (service.AckMessageRequest, receiving.ack_message),
            "ChangeInvisibleDuration": (service.ChangeInvisibleDurationRequest, receiving.change_invisible_duration),
            "ForwardMessageToDeadLetterQueue": (service.ForwardMessageToDeadLetterQueueRequest,
                                                receiving.forward_message_to_dead_letter_queue),
            "EndTransaction": (service.EndTransactionRequest, sending.end_transaction),
            "NotifyClientTermination": (service.NotifyClientTerminationRequest, self.notify_client_termination),
            "RecallMessage": (service.RecallMessageRequest, sending.recall_message),
            "UpdateOffset": (service.UpdateOffsetRequest, pulling.update_offset),
            "GetOffset": (service.GetOffsetRequest, pulling.get_offset),
            "QueryOffset": (service.QueryOffsetRequest, pulling.query_offset),
        }
        table = {f"/{SERVICE}/{name}": self._unary(name, request_type, method)
                 for name, (request_type, method) in unary.items()}
        table[f"/{SERVICE}/ReceiveMessage"] = self._server_stream("ReceiveMessage", service.ReceiveMessageRequest,
                                                                  receiving.receive_message)
        table[f"/{SERVICE}/PullMessage"] = self._server_stream("PullMessage", service.PullMessageRequest,
                                                               pulling.pull_message)
        table[f"/{SERVICE}/Telemetry"] = self._checked(self.telemetry.telemetry)
        return table

    # ---- framing of calls ------------------------------------------------------------------------------

    def _checked(self, handler: Callable[[GrpcCall], Awaitable[None]]) -> GrpcHandler:
        async def handle(call: GrpcCall) -> None:
            access = self.dispatcher.guard.access
            if access is not None:  # with auth on: a valid signature names the user (checked per call, as apache's)
                try:
                    call.user = verify_grpc(call.headers, access.secret_of, self.clock.wall_ms())
                except RocketError as error:
                    raise GrpcError(GrpcStatus.UNAUTHENTICATED, access.failed(call.source, error).message) from None
            await handler(call)
        return handle

    def _unary(self, name: str, request_type, method) -> GrpcHandler:
        async def handle(call: GrpcCall) -> None:
            data = await call.receive_one()
            request = self.bridge.parse(request_type, data)
            namespace = call.headers.get("x-mq-namespace", "")
            if namespace:
                into_namespace(request, namespace)
            metering = self.dispatcher.metering
            charged = metering.charged(call.caller)
            if charged:  # client quotas: held while throttled (RocketMQ's answers have no throttle time to tell)
                await metering.held(call.caller)
            response = await method(request, call)
            if namespace:
                out_of_namespace(response, namespace)
            encoded = response.SerializeToString()
            if charged:
                produced = len(data) if name == "SendMessage" else 0
                metering.charge(call.caller, _topic_of(name, request), produced=produced, user=call.user)
            await call.send(encoded)
        return self._checked(handle)

    def _server_stream(self, name: str, request_type, method) -> GrpcHandler:
        async def handle(call: GrpcCall) -> None:
            request = self.bridge.parse(request_type, await call.receive_one())
            namespace = call.headers.get("x-mq-namespace", "")
            if namespace:
                into_namespace(request, namespace)
            metering = self.dispatcher.metering
            charged = metering.charged(call.caller)
            if charged:
                await metering.held(call.caller)
                metering.charge(call.caller, _topic_of(name, request), user=call.user)
            async for response in method(request, call):
                if namespace:
                    out_of_namespace(response, namespace)
                encoded = response.SerializeToString()
                await call.send(encoded)
                if charged:  # ReceiveMessage, PullMessage: consumed bytes, held message by message
                    throttle_s = metering.charge(call.caller, _topic_of(name, request), consumed=len(encoded),
                                                 requests=0, user=call.user)
                    if throttle_s:
                        await trio.sleep(throttle_s)
        return self._checked(handle)

    # ---- topics and routes -----------------------------------------------------------------------------

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
                                        broker=broker,
                                        accept_message_types=[MESSAGE_TYPE_OF.get(topic["message_type"], 1)])
                for queue in range(topic["queues"])]

    async def query_route(self, request, call: GrpcCall):
        try:
            topic = await self.bridge.topic(request.topic.name)
        except RocketError as error:
            return self.service.QueryRouteResponse(status=self.bridge.error_status(error))
        queues = self._queues(topic, self._endpoints(request.endpoints, call))
        return self.service.QueryRouteResponse(status=self.bridge.status(), message_queues=queues)

    async def query_assignment(self, request, call: GrpcCall):
        """One assignment: a receive pops from every queue of the topic, so more would only repeat it."""
        try:
            topic = await self.bridge.topic(request.topic.name)
        except RocketError as error:
            return self.service.QueryAssignmentResponse(status=self.bridge.error_status(error))
        queue = self._queues(topic, self._endpoints(request.endpoints, call))[0]
        return self.service.QueryAssignmentResponse(status=self.bridge.status(),
                                                    assignments=[self.definition.Assignment(message_queue=queue)])

    async def heartbeat(self, request, call: GrpcCall):
        return self.service.HeartbeatResponse(status=self.bridge.status())

    async def notify_client_termination(self, request, call: GrpcCall):
        return self.service.NotifyClientTerminationResponse(status=self.bridge.status())


# The calls whose quota is charged to the topic they name; the others (routes, heartbeats, telemetry) to none.
CHARGED_TO_TOPIC = frozenset({"SendMessage", "EndTransaction", "RecallMessage", "ReceiveMessage", "AckMessage",
                              "ChangeInvisibleDuration", "ForwardMessageToDeadLetterQueue", "PullMessage",
                              "UpdateOffset", "GetOffset", "QueryOffset"})


def _topic_of(name: str, request) -> str:
    """The topic a call's quota is charged to (its messages' first, for a send), or ""."""
    if name not in CHARGED_TO_TOPIC:
        return ""
    present = {field.name for field, _ in request.ListFields()}
    if "topic" in present:
        return request.topic.name
    if "message_queue" in present:
        return request.message_queue.topic.name
    return request.messages[0].topic.name if "messages" in present else ""
