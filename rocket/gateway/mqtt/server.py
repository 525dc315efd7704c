"""The MQTT gateway (MqttGateway): devices' connections on the broker's MQTT port, their CONNECT (sign-in, session),
and the sessions on this broker; each connection's packets are served by a Connection (connection.py)."""

from __future__ import annotations

import logging
import secrets
import select
import ssl
from collections.abc import Callable

import trio

from rocket import limits
from rocket.clock import Clock
from rocket.errors import RocketError
from rocket.gateway.buckets import Buckets
from rocket.gateway.mqtt.batcher import Batcher
from rocket.gateway.mqtt.codec import Decoder, encode
from rocket.gateway.mqtt.connection import Connection
from rocket.gateway.mqtt.mapping import reason_of
from rocket.gateway.mqtt.packets import (V5, ConnAck, Connect, Disconnect, MqttError, Packet, Publish, Reason,
                                         shutting_down)
from rocket.gateway.mqtt.parking import Parking
from rocket.gateway.mqtt.session import NEVER_EXPIRES, Retained, Session, Sessions
from rocket.gateway.reads import Tails, TopicCache
from rocket.transport.guard import Caller
from rocket.transport.lifecycle import Lifecycle
from rocket.transport.listen import serve_connections, source_of
from rocket.transport.rpc import Dispatcher
from rocket.transport.tls import handshake

log = logging.getLogger("rocket.mqtt")

V311_RETURN_CODES = {  # MQTT 3.1.1's CONNACK return codes for MQTT 5's reasons
    Reason.UNSUPPORTED_PROTOCOL_VERSION: 1, Reason.CLIENT_IDENTIFIER_NOT_VALID: 2, Reason.SERVER_UNAVAILABLE: 3,
    Reason.SERVER_BUSY: 3, Reason.BAD_USER_NAME_OR_PASSWORD: 4, Reason.NOT_AUTHORIZED: 5}


class MqttGateway:
    """MQTT 3.1.1 and 5.0 onto the broker's methods. A session is one per client id on this broker: a second CONNECT
    with the id takes it over (the first connection gets Session Taken Over). A persistent session's state lies in
    the storage groups (session.py), so it resumes on any broker."""

    def __init__(self, dispatcher: Dispatcher, clock: Clock, lifecycle: Lifecycle, namespace: str = "",
                 one_topic: str = ""):
        self.dispatcher = dispatcher
        self.clock = clock
        self.lifecycle = lifecycle
        self.namespace = namespace  # the rocket namespace MQTT's topics, groups and buckets lie in (mqtt_namespace)
        self.one_topic = one_topic  # the rocket topic all MQTT topics lie in (mqtt_topic); "": their first levels
        self.topics = TopicCache(dispatcher, clock)
        self.tails = Tails(dispatcher)  # idle subscriptions wait here for their topics' new data
        self.batcher = Batcher(dispatcher, clock)
        buckets = Buckets(dispatcher)
        self.sessions = Sessions(buckets, namespace, one_topic)
        self.retained = Retained(buckets, namespace)
        self.connected: dict[str, Connection] = {}  # client id -> its connection here
        self.open_connections = 0  # accepted and not yet closed, parked ones too
        self._closing: trio.Event | None = None  # set once none is open, after close()
        self.parking = Parking(self.wake) if hasattr(select, "epoll") else None  # Linux's: elsewhere none park
        self.nursery: trio.Nursery | None = None  # woken connections and wills that wait (their delay) run here

    async def run(self, task_status=trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            self.nursery = nursery
            await nursery.start(self.tails.run)
            if self.parking is not None:
                nursery.start_soon(self.parking.run)
            task_status.started()
            await trio.sleep_forever()

    async def listen(self, host: str, port: int, tls: Callable[[], ssl.SSLContext | None],
                     task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Serve MQTT on host:port (TLS when tls gives a context) until the lifecycle drains."""
        async def run_connection(socket_stream: trio.SocketStream) -> None:
            if self.open_connections >= limits.mqtt_connections_max:  # parked ones have no task to count
                async with socket_stream:
                    return await refuse_connection(socket_stream)
            stream: trio.abc.Stream = socket_stream
            context = tls()
            if context is not None:
                stream = trio.SSLStream(socket_stream, context, server_side=True)
                try:
                    await handshake(stream)
                except (trio.BrokenResourceError, trio.TooSlowError) as error:
                    log.info("MQTT TLS handshake with %s failed: %s", source_of(socket_stream), error)
                    await trio.aclose_forcefully(stream)
                    return
            await self.serve(stream)

        async def refuse_connection(stream: trio.SocketStream) -> None:
            await _send_quietly(stream, encode(ConnAck(3), 4))  # 3.1.1's "server unavailable", which 5.0 clients read

        await serve_connections(self.lifecycle, host, port, run_connection, refuse_connection,
                                connections_max=limits.mqtt_connections_max, task_status=task_status)

    async def serve(self, stream: trio.abc.Stream) -> None:
        """One connection: its CONNECT within limits.mqtt_connect_s, then its packets until it ends or parks. Input
        that breaks the protocol gets the reason code (CONNACK or DISCONNECT in MQTT 5) and the connection is
        closed."""
        source = source_of(stream)
        decoder = Decoder()
        connection: Connection | None = None
        rest: list[Packet] = []
        self.open_connections += 1
        try:
            with trio.move_on_after(limits.mqtt_connect_s):
                connect, rest = await self._first_packet(stream, decoder)
                if connect is not None:
                    connection = await self._connect(stream, decoder, connect, source)
        except MqttError as error:
            log.info("MQTT client %s: %s", source, error)
            if decoder.version == V5 or decoder.version is None:
                await _send_quietly(stream, encode(ConnAck(error.reason,
                                                           properties={"reason_string": error.message[:200]}), V5))
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        except Exception:  # one device's bytes must not take the listener with them
            log.exception("MQTT connection from %s failed", source)
        finally:
            if connection is None:
                self._closed()
                await stream.aclose()
        if connection is not None:
            await self._serve_connection(connection, rest)

    async def _serve_connection(self, connection: Connection, first: list[Packet] | bytes | MqttError | None
                                ) -> None:
        """A connection served until it ends, or parks (the parking wakes it into this again: Connection.serve).
        At its end the session is kept or dropped, the will goes out, and a client that broke the protocol hears
        why (MQTT 5)."""
        stream = connection.stream
        parked = False
        try:
            try:
                parked = await connection.serve(first)
            finally:
                if not parked:
                    try:
                        await self._ended(connection)
                    finally:
                        connection.end()
        except MqttError as error:
            log.info("MQTT client %s (%s): %s", connection.session.client_id, connection.caller.source, error)
            if connection.version == V5:
                await _send_quietly(stream, encode(Disconnect(error.reason, {"reason_string": error.message[:200]}),
                                                   V5))
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        except Exception:  # one device's bytes must not take the listener with them
            log.exception("MQTT connection of %s failed", connection.session.client_id)
        finally:
            if not parked:
                self._closed()
                await stream.aclose()
        if parked:
            assert self.parking is not None
            if connection.sleep(lambda: self._wake_sleeper(connection)):
                self.parking.park(connection)
            else:  # a subscribed topic's new data came while it parked: served again at once
                self.wake(connection, None)

    def _closed(self) -> None:
        self.open_connections -= 1
        if self._closing is not None and not self.open_connections:
            self._closing.set()

    def wake(self, connection: Connection, data: bytes | MqttError | None) -> None:
        """A parked connection served by a task again, from the bytes that woke it or to end it (Parking), or for a
        subscribed topic's new data (None)."""
        connection.unparked()
        assert self.nursery is not None
        self.nursery.start_soon(self._serve_connection, connection, data)

    def _wake_sleeper(self, connection: Connection) -> None:
        """A Tail the parked connection's feeds waited on moved (Connection.sleep)."""
        if self.parking is not None and self.parking.unpark(connection):
            self.wake(connection, None)

    async def close(self) -> None:
        """End every connection, as the broker stops (DISCONNECT 0x8B in MQTT 5): wills go out and sessions are kept
        while the storage groups still answer. Returns once all are closed."""
        self._closing = trio.Event()
        if self.parking is not None:
            self.parking.wake_all(shutting_down)
        for connection in list(self.connected.values()):
            connection.fail(shutting_down())
        if self.open_connections:
            await self._closing.wait()

    async def _first_packet(self, stream: trio.abc.Stream, decoder: Decoder) -> tuple[Connect | None, list]:
        while True:
            data = await stream.receive_some(65536)
            if not data:
                return None, []
            packets = decoder.feed(data)
            if packets:
                first = packets[0]
                if not isinstance(first, Connect):
                    raise MqttError(Reason.PROTOCOL_ERROR, f"{type(first).__name__} before CONNECT")
                return first, packets[1:]

    async def _connect(self, stream: trio.abc.Stream, decoder: Decoder, connect: Connect,
                       source: str) -> Connection | None:
        """Sign the client in, find or start its session, take it over from another connection here, answer
        CONNACK; None when refused (the CONNACK said why)."""
        version = connect.protocol_level
        try:
            if self._closing is not None:
                raise MqttError(Reason.SERVER_UNAVAILABLE, "the broker is shutting down")
            caller = self._sign_in(connect, source)
            client_id, assigned = connect.client_id, ""
            if not client_id:
                if not connect.clean_start and version != V5:
                    raise MqttError(Reason.CLIENT_IDENTIFIER_NOT_VALID, "a persistent session needs a client id")
                client_id = assigned = "auto-" + secrets.token_hex(8)
            if len(client_id.encode()) > limits.mqtt_client_id_bytes_max:
                raise MqttError(Reason.CLIENT_IDENTIFIER_NOT_VALID, f"client ids are at most "
                                                                    f"{limits.mqtt_client_id_bytes_max} bytes")
            expiry_s = connect.properties.get("session_expiry_interval", 0) if version == V5 \
                else (0 if connect.clean_start else NEVER_EXPIRES)
            previous = self.connected.get(client_id)
            if previous is not None:
                await previous.taken_over()
            session = None if connect.clean_start else await self.sessions.load(client_id)
            present = session is not None
            if session is None:
                session = Session(client_id)
                await self.sessions.forget(client_id)
            session.expiry_s = expiry_s
            if session.persistent:
                await self.sessions.save(session)
        except MqttError as error:
            await self._refuse(stream, version, error.reason, error.message)
            return None
        except RocketError as error:
            await self._refuse(stream, version, reason_of(error, connecting=True),
                               f"{error.code.name}: {error.message}")
            return None
        connection = Connection(self, stream, decoder, connect, session, caller)
        self.connected[client_id] = connection
        try:
            await connection.send(ConnAck(Reason.SUCCESS, present, self._connack_properties(version, assigned)))
        except BaseException:  # never served: nothing to end but its place
            if self.connected.get(client_id) is connection:
                del self.connected[client_id]
            connection.end()
            raise
        return connection

    @staticmethod
    def _connack_properties(version: int, assigned: str) -> dict:
        properties: dict = {}
        if version == V5:
            properties = {"topic_alias_maximum": limits.mqtt_topic_aliases_max,
                          "receive_maximum": limits.mqtt_in_flight_max,
                          "maximum_packet_size": limits.mqtt_packet_bytes_max,
                          "subscription_identifier_available": 0, "retain_available": 1,
                          "wildcard_subscription_available": 1, "shared_subscription_available": 1}
            if assigned:
                properties["assigned_client_identifier"] = assigned
        return properties

    def _sign_in(self, connect: Connect, source: str) -> Caller:
        """With auth on, the user the CONNECT's user name and password (the user's secret) prove."""
        access = self.dispatcher.guard.access
        if access is None:
            return Caller(source=source)
        if connect.username is None or connect.password is None:
            raise MqttError(Reason.BAD_USER_NAME_OR_PASSWORD, "sign in with a rocket user name and its secret")
        try:
            return Caller(source=source, user=access.check_secret(connect.username, connect.password, source, "MQTT"))
        except RocketError as error:
            raise MqttError(Reason.BAD_USER_NAME_OR_PASSWORD, error.message) from None

    async def _refuse(self, stream: trio.abc.Stream, version: int, reason: int, message: str) -> None:
        log.info("MQTT CONNECT refused: %s", message)
        if version == V5:
            answer = ConnAck(reason, properties={"reason_string": message[:200]})
        else:
            answer = ConnAck(V311_RETURN_CODES.get(Reason(reason), 3))
        await _send_quietly(stream, encode(answer, version))

    async def _ended(self, connection: Connection) -> None:
        """After a connection: its session kept (expiring from now) or dropped, and its will published unless it
        said DISCONNECT normally or was taken over."""
        session = connection.session
        if self.connected.get(session.client_id) is connection:
            del self.connected[session.client_id]
        with trio.CancelScope(shield=True), trio.move_on_after(limits.mqtt_connect_s):
            try:
                await connection.deliveries.release_in_flight()
                if session.persistent:
                    await self.sessions.save(session, ended=True)
                elif not connection.taken:
                    await connection.deliveries.drop_groups()
                    if session.stored:  # else its CONNECT's forget left nothing: a device's every end costs no write
                        await self.sessions.forget(session.client_id)
            except RocketError as error:
                log.warning("MQTT session %s: not kept: %s", session.client_id, error)
        will = connection.will
        if will is None:
            return
        delay_s = min(will.properties.get("will_delay_interval", 0), session.expiry_s, limits.mqtt_will_delay_s_max)
        publish = Publish(will.topic, will.payload, will.qos, will.retain,
                          properties={name: value for name, value in will.properties.items()
                                      if name != "will_delay_interval"})
        if delay_s and self.nursery is not None:
            self.nursery.start_soon(self._will_later, connection, publish, delay_s)
        else:
            await self._publish_will(connection, publish)

    async def _will_later(self, connection: Connection, publish: Publish, delay_s: float) -> None:
        """A will with a delay: published then, unless the session was resumed in the meantime."""
        await trio.sleep(delay_s)
        if connection.session.client_id not in self.connected:
            await self._publish_will(connection, publish)

    async def _publish_will(self, connection: Connection, publish: Publish) -> None:
        with trio.CancelScope(shield=True), trio.move_on_after(limits.mqtt_connect_s):
            try:
                await connection.produce([publish])
            except (RocketError, MqttError) as error:
                log.info("MQTT will of %s not published: %s", connection.session.client_id, error)


async def _send_quietly(stream: trio.abc.Stream, data: bytes) -> None:
    try:
        with trio.move_on_after(1):
            await stream.send_all(data)
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass
