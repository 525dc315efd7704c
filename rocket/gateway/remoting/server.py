"""The remoting gateway's connections (RemotingGateway): frames in, one task per request (a pull may wait seconds),
responses out whole; a connection whose first bytes on rocket's TCP port look like a remoting frame comes here.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Awaitable, Callable

import orjson
import trio

from rocket import limits
from rocket.clock import Clock
from rocket.errors import Code, RocketError
from rocket.gateway.remoting import codec
from rocket.gateway.remoting.admin import Administration
from rocket.gateway.remoting.authorization import PRODUCING, QUOTA_TOPIC, signed_by
from rocket.gateway.remoting.bridge import Bridge
from rocket.gateway.remoting.clients import Clients
from rocket.gateway.remoting.codec import Command, RemotingError, RequestCode, ResponseCode
from rocket.gateway.remoting.consuming import Consuming
from rocket.gateway.remoting.kv import KvConfig
from rocket.gateway.remoting.messages import BadMessage
from rocket.gateway.remoting.naming import Naming
from rocket.gateway.remoting.producing import Producing
from rocket.gateway.remoting.signature import DENIED_CODE
from rocket.transport.listen import cancel_on
from rocket.transport.guard import Caller
from rocket.transport.lifecycle import Lifecycle
from rocket.transport.rpc import Dispatcher

log = logging.getLogger("rocket.remoting")

RESPONSE_OF_CODE = {  # rocket's error codes -> RocketMQ's response codes
    Code.UNKNOWN_TOPIC: ResponseCode.TOPIC_NOT_EXIST, Code.BAD_FILTER: ResponseCode.SUBSCRIPTION_PARSE_FAILED,
    Code.BAD_REQUEST: ResponseCode.MESSAGE_ILLEGAL, Code.BAD_BATCH: ResponseCode.MESSAGE_ILLEGAL,
    Code.WRONG_MESSAGE_TYPE: ResponseCode.MESSAGE_ILLEGAL, Code.FRAME_TOO_LARGE: ResponseCode.MESSAGE_ILLEGAL,
    Code.OVERLOADED: ResponseCode.SYSTEM_BUSY, Code.UNAVAILABLE: ResponseCode.SERVICE_NOT_AVAILABLE,
    Code.TIMEOUT: ResponseCode.SYSTEM_BUSY, Code.NOT_ENOUGH_REPLICAS: ResponseCode.FLUSH_SLAVE_TIMEOUT,
    Code.UNAUTHENTICATED: DENIED_CODE, Code.PERMISSION_DENIED: ResponseCode.NO_PERMISSION,
    Code.DISK_FULL: ResponseCode.SERVICE_NOT_AVAILABLE,  # what a RocketMQ broker answers when its disk is full
}


class Connection:
    """One client connection: whole frames written under a lock. The server's own requests to the client
    (NOTIFY_CONSUMER_IDS_CHANGED, CHECK_TRANSACTION_STATE) are oneway, as in RocketMQ."""

    def __init__(self, stream: trio.SocketStream, serialize: int):
        self.stream = stream
        self.serialize = serialize  # the client's header serialization: the server's requests use it too
        self.peer = _address(stream, "getpeername")
        self.local = _address(stream, "getsockname")
        self._send_lock = trio.Lock()
        self.caller = Caller(source=self.peer.rsplit(":", 1)[0])  # what client quotas hold (Metering.charge)
        self.in_flight = trio.Semaphore(limits.remoting_in_flight_per_connection_max)
        self.receiving: trio.CancelScope | None = None  # the receive under way, whose deadline a call's end moves
        self.partial = False  # whether that receive waits for the rest of a frame (else for a new one)

    @property
    def busy(self) -> bool:
        """Whether a request is being served (a pull that waits is)."""
        return self.in_flight.value < limits.remoting_in_flight_per_connection_max

    async def send(self, command: Command) -> None:
        async with self._send_lock:
            for part in codec.encode(command):
                if part:
                    await self.stream.send_all(part)

    async def notify(self, command: Command) -> None:
        """A oneway request to the client; a dead connection is not an error here."""
        command.flag |= codec.FLAG_ONEWAY
        command.serialize = self.serialize
        try:
            await self.send(command)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass


def _address(stream: trio.abc.Stream, which: str) -> str:
    try:  # over TLS, the socket is the SSLStream's transport stream's
        host, port = getattr(getattr(getattr(stream, "transport_stream", stream), "socket"), which)()[:2]
        return f"{host}:{port}"
    except (OSError, ValueError):
        return "0.0.0.0:0"


class RemotingGateway:
    """The connections, and the requests routed to the gateway's parts, which share one Bridge.

    Requests from the server to a client (NOTIFY_CONSUMER_IDS_CHANGED, CHECK_TRANSACTION_STATE) go out on the
    client's connection. The handlers are the methods of the gateway's parts (naming, producing, consuming, clients,
    administration, KV config), one table by request code. rocket's TCP port serves both protocols: a connection
    whose first bytes look like a remoting frame (codec.looks_like_remoting) comes here, so `namesrvAddr=HOST:9876`
    works unchanged."""

    def __init__(self, dispatcher: Dispatcher, clock: Clock, lifecycle: Lifecycle, *, cluster: str = "rocket",
                 frame_s: float = limits.tcp_frame_s_default, idle_s: float = limits.tcp_idle_s_default):
        self.dispatcher = dispatcher
        # a connection is closed when a request frame takes longer than frame_s to arrive (the server's waiting), or
        # when it has no request in flight for idle_s (the node's tcp_frame_s and tcp_idle_s)
        self.frame_s = frame_s
        self.idle_s = idle_s
        self.clock = clock
        self.lifecycle = lifecycle
        self.bridge = Bridge(dispatcher, clock, cluster)
        self.clients = Clients(self.bridge)
        self.naming = Naming(self.bridge, self.clients)
        self.producing = Producing(self.bridge, self.clients)
        self.consuming = Consuming(self.bridge, self.clients)
        self.admin = Administration(self.bridge, self.clients)
        self.kv = KvConfig(self.bridge)
        self._handlers: dict[int, Callable[[Command, Connection, Caller], Awaitable[Command]]] = self._table()

    def _table(self) -> dict[int, Callable[[Command, Connection, Caller], Awaitable[Command]]]:
        code = RequestCode
        naming, producing, consuming, clients, admin, kv = self.naming, self.producing, self.consuming, self.clients, \
            self.admin, self.kv
        return {
            code.GET_ROUTEINFO_BY_TOPIC: naming.get_route, code.GET_BROKER_CLUSTER_INFO: naming.cluster_info,
            code.GET_ALL_TOPIC_LIST_FROM_NAMESERVER: naming.topic_list,
            code.PUT_KV_CONFIG: kv.put, code.GET_KV_CONFIG: kv.get, code.GET_KV_CONFIG_BY_VALUE: kv.get,
            code.DELETE_KV_CONFIG: kv.delete, code.GET_KVLIST_BY_NAMESPACE: kv.list,
            code.SEND_MESSAGE: producing.send_message, code.SEND_MESSAGE_V2: producing.send_message,
            code.SEND_BATCH_MESSAGE: producing.send_message, code.END_TRANSACTION: producing.end_transaction,
            code.PULL_MESSAGE: consuming.pull_message, code.QUERY_CONSUMER_OFFSET: consuming.query_consumer_offset,
            code.UPDATE_CONSUMER_OFFSET: consuming.update_consumer_offset, code.GET_MAX_OFFSET: consuming.max_offset,
            code.GET_MIN_OFFSET: consuming.min_offset, code.SEARCH_OFFSET_BY_TIMESTAMP: consuming.search_offset,
            code.GET_EARLIEST_MSG_STORETIME: consuming.earliest_store_time,
            code.HEART_BEAT: clients.heart_beat, code.UNREGISTER_CLIENT: clients.unregister_client,
            code.GET_CONSUMER_LIST_BY_GROUP: clients.consumer_list, code.CONSUMER_SEND_MSG_BACK: consuming.send_back,
            code.LOCK_BATCH_MQ: consuming.lock_batch, code.UNLOCK_BATCH_MQ: consuming.unlock_batch,
            code.VIEW_MESSAGE_BY_ID: admin.view_message, code.QUERY_MESSAGE: admin.query_message,
            code.UPDATE_AND_CREATE_TOPIC: admin.create_topic, code.GET_ALL_TOPIC_CONFIG: admin.all_topic_config,
            code.GET_TOPIC_STATS_INFO: admin.topic_stats, code.GET_CONSUMER_CONNECTION_LIST: admin.consumer_connections,
            code.GET_BROKER_RUNTIME_INFO: admin.runtime_info, code.DELETE_TOPIC_IN_BROKER: admin.delete_topic,
            code.DELETE_TOPIC_IN_NAMESRV: admin.delete_topic,
        }

    async def run(self, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """The gateway's own tasks (group membership kept alive for connected consumers, transaction checks
        forwarded to producers), until cancelled."""
        async with trio.open_nursery() as nursery:
            self.bridge.nursery = nursery
            nursery.start_soon(self.clients.keep_members)
            task_status.started()

    async def serve(self, stream: trio.SocketStream, first: bytes) -> None:
        """Serve one connection whose first bytes (already read) are `first`."""
        reader = codec.FrameReader()
        reader.feed(first)
        connection = Connection(stream, codec.JSON)
        in_flight = connection.in_flight
        waited_s = 0.0  # how long the server waited for the rest of the frame begun (not while it did not read)
        try:
            async with trio.open_nursery() as calls:
                with trio.CancelScope() as reading:
                    calls.start_soon(cancel_on, self.lifecycle.draining, reading)
                    try:
                        while True:
                            while (frame := reader.next_frame()) is not None:
                                waited_s = 0.0
                                await self._received(frame, connection, calls, in_flight)
                            connection.partial = reader.buffered_bytes > 0
                            if not connection.partial:
                                waited_s = 0.0
                            with trio.CancelScope(deadline=self._deadline(connection, waited_s)) as receiving:
                                connection.receiving = receiving
                                started = trio.current_time()
                                try:
                                    data = await stream.receive_some(limits.tcp_receive_bytes)
                                finally:
                                    connection.receiving = None
                                    waited_s += trio.current_time() - started
                            if receiving.cancelled_caught:
                                log.debug("remoting client %s: %s; closing", connection.peer,
                                          f"a frame took over {self.frame_s:g} s" if connection.partial
                                          else f"idle for {self.idle_s:g} s")
                                break
                            if not data:
                                break
                            self.lifecycle.traffic.received_bytes += len(data)
                            reader.feed(data)
                    except RemotingError as error:  # the framing is broken: say why, and close
                        log.info("remoting client %s: %s; closing", connection.peer, error)
                        await _send_quietly(connection, Command(ResponseCode.SYSTEM_ERROR, 0, codec.FLAG_RESPONSE,
                                                                f"BAD_FRAME: {error}"))
                    except (trio.BrokenResourceError, trio.ClosedResourceError):
                        pass
                if reading.cancelled_caught:  # the node drains: calls in flight get a bounded time to answer
                    calls.cancel_scope.deadline = trio.current_time() + limits.shutdown_grace_s
                else:  # the client is gone: nobody reads the answers
                    calls.cancel_scope.cancel()
        finally:
            await self.clients.connection_closed(connection)
            with trio.CancelScope(shield=True):
                await stream.aclose()

    async def _received(self, frame: bytes, connection: Connection, calls: trio.Nursery,
                        in_flight: trio.Semaphore) -> None:
        try:
            command = codec.decode(frame)
        except RemotingError as error:
            opaque = _opaque_of(frame)
            if opaque is None:
                raise
            await connection.send(Command(ResponseCode.SYSTEM_ERROR, opaque, codec.FLAG_RESPONSE,
                                          f"BAD_FRAME: {error}"))
            return
        connection.serialize = command.serialize
        if command.is_response:  # the server's requests are oneway: nothing waits for an answer
            return
        await in_flight.acquire()
        self.lifecycle.call_started()
        calls.start_soon(self._call, command, connection, in_flight)

    async def _call(self, command: Command, connection: Connection, in_flight: trio.Semaphore) -> None:
        try:
            response = await self._answer(command, connection)
            if not command.is_oneway:
                await connection.send(response)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        finally:
            in_flight.release()
            self.lifecycle.call_finished()
            if connection.receiving is not None and not connection.partial:  # perhaps idle now: its clock starts
                connection.receiving.deadline = self._deadline(connection, 0.0)

    def _deadline(self, connection: Connection, waited_s: float) -> float:
        """When a connection's receive starting now gives up: a frame begun gets frame_s of the server's waiting in
        all; a connection with no request in flight gets idle_s; one with requests in flight, no limit."""
        if connection.partial:
            return trio.current_time() + self.frame_s - waited_s
        return math.inf if connection.busy else trio.current_time() + self.idle_s

    async def _answer(self, command: Command, connection: Connection) -> Command:
        handler = self._handlers.get(command.code)
        if handler is None:
            return command.reply(ResponseCode.REQUEST_CODE_NOT_SUPPORTED,
                                 f"REQUEST_CODE_NOT_SUPPORTED: request code {command.code} is not served by rocket")
        try:
            # Each request is signed: the handler calls the node's methods as its user, authorized there (Guard).
            source, access, metering = connection.caller.source, self.dispatcher.guard.access, self.dispatcher.metering
            user = None if access is None else signed_by(access, command, source)
            caller = Caller(source=source, user=user)
            if not metering.charged(connection.caller):
                return await handler(command, connection, caller)
            # client quotas: held while throttled (remoting's answers have no throttle time to tell), then charged
            await metering.held(connection.caller)
            reply = await handler(command, connection, caller)
            topic = command.ext.get(QUOTA_TOPIC.get(command.code, ""), "")
            producing = command.code in PRODUCING
            consuming = reply is not None and command.code == RequestCode.PULL_MESSAGE
            metering.charge(connection.caller, topic, user=user, produced=len(command.body) if producing else 0,
                            consumed=len(reply.body) if consuming else 0)
            return reply
        except RocketError as error:
            return command.reply(RESPONSE_OF_CODE.get(error.code, ResponseCode.SYSTEM_ERROR),
                                 f"{error.code.name}: {error.message}")
        except (BadMessage, KeyError, ValueError) as error:
            reason = f"missing header field {error}" if isinstance(error, KeyError) else str(error)
            return command.reply(ResponseCode.MESSAGE_ILLEGAL if isinstance(error, BadMessage)
                                 else ResponseCode.SYSTEM_ERROR, f"BAD_REQUEST: {reason}")
        except Exception as error:
            log.exception("remoting request code %d failed", command.code)
            return command.reply(ResponseCode.SYSTEM_ERROR, f"INTERNAL: {type(error).__name__}")


def _opaque_of(frame: bytes) -> int | None:
    """The opaque of a frame whose header is bad but whose framing is whole, when it can be found, so that the
    client's call fails at once rather than timing out."""
    try:
        header = orjson.loads(frame[4:4 + (int.from_bytes(frame[1:4], "big"))])
        opaque = header.get("opaque") if isinstance(header, dict) else None
        return opaque if isinstance(opaque, int) and not isinstance(opaque, bool) else None
    except Exception:
        return None


async def _send_quietly(connection: Connection, command: Command) -> None:
    with trio.move_on_after(limits.shutdown_grace_s):
        try:
            await connection.send(command)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
