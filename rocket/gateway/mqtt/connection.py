"""One MQTT connection on the broker (Connection): its packets read and served, its PUBLISHes produced by a worker
while the reader reads on (each queue's with other connections': Batcher), its subscriptions and deliveries in its
Deliveries (delivery.py)."""

from __future__ import annotations

import logging
import math
import struct
from collections.abc import Callable
from typing import TYPE_CHECKING

import trio

from rocket import limits
from rocket.errors import Code, RocketError
from rocket.gateway.mqtt.codec import Decoder, encode, valid_topic_name
from rocket.gateway.mqtt.delivery import Deliveries
from rocket.gateway.mqtt.mapping import MQTT_CLIENT, queue_of, reason_of, rocket_topic, to_message
from rocket.gateway.mqtt.packets import (V5, Ack, Connect, Disconnect, MqttError, Packet, PacketType, PingReq,
                                         PingResp, Publish, Reason, Subscribe, Unsubscribe, Will, keep_alive_ran_out)
from rocket.gateway.mqtt.session import Session
from rocket.gateway.reads import Tail
from rocket.model import Message
from rocket.transport.guard import Caller

if TYPE_CHECKING:
    from rocket.gateway.mqtt.server import MqttGateway

log = logging.getLogger("rocket.mqtt")

# A successful PUBACK (QoS 1) or PUBREC (QoS 2), no properties, by QoS (none at 0): encode()'s bytes, without its
# cost, as a big-endian u32 with the packet id in its low 16 bits
_ACK_WORDS = (0, PacketType.PUBACK << 28 | 2 << 16, PacketType.PUBREC << 28 | 2 << 16)
_u32 = struct.Struct(">I")


class Connection:
    """Kept small: a broker holds one per connected device, most of them idle. What only deliveries or publishes use
    is made at their first. An idle connection with nothing in flight, and no subscription or only ones waiting for
    their topics' new data, is parked (parking.py): at once after its CONNECT, and after limits.mqtt_park_after_s
    once woken. Its task ends, and what it holds then is all an idle device costs; a subscribed one sleeps on its
    topics' Tails (sleep), which wake it."""

    __slots__ = ("gateway", "dispatcher", "_stream", "fd", "decoder", "version", "keep_alive_s", "session", "caller",
                 "will", "packet_bytes_max", "window_size", "aliases", "taken", "ended", "parked_until", "_finished",
                 "_send_lock", "_publishes", "_waiting", "_idle", "_broke", "_scope", "nursery", "_deliveries",
                 "_held")

    def __init__(self, gateway: MqttGateway, stream: trio.abc.Stream, decoder: Decoder, connect: Connect,
                 session: Session, caller: Caller):
        self.gateway = gateway
        self.dispatcher = gateway.dispatcher
        self._stream: trio.abc.Stream | None = stream  # None while parked
        self.fd = -1  # while parked: its socket's
        self.decoder: Decoder | None = decoder  # None while parked
        self.version = connect.protocol_level
        self.keep_alive_s = connect.keep_alive * 1.5  # 0: none (MQTT 3.1.2.10)
        self.session = session
        self.caller = caller
        self.will: Will | None = connect.will
        self.packet_bytes_max = connect.properties.get("maximum_packet_size", limits.mqtt_packet_bytes_max)
        self.window_size = min(connect.properties.get("receive_maximum", 65535), limits.mqtt_in_flight_max)
        self.aliases: dict[int, str] | None = None  # MQTT 5 topic aliases the client set
        self.taken = False  # another connection took the session over
        self.ended = False  # the gateway is done with it (MqttGateway.serve); _finished is set then, if made
        self.parked_until = math.inf  # while parked: when its keep-alive ends (trio's clock)
        self._finished: trio.Event | None = None
        self._send_lock: trio.Lock | None = None
        self._publishes: list[Publish] = []  # received, not yet produced, in order
        self._waiting: trio.Event | None = None  # set when publishes or acks wait for the worker; None: no worker
        self._idle: trio.Event | None = None  # set while none wait, nor are being produced or acked
        self._broke: MqttError | None = None  # what ended the connection, from whichever task
        # Cancelled when the connection ends, from whichever task; its deadline is the keep-alive's. A new one for
        # each time the connection is served (None while parked).
        self._scope: trio.CancelScope | None = trio.CancelScope()
        self.nursery: trio.Nursery | None = None  # the connection's tasks, while it is served
        self._deliveries: Deliveries | None = None
        # Parked with subscriptions: the Tails its feeds waited on, held (their watches go on) with the generation
        # each feed saw; a new bump of one wakes it (sleep)
        self._held: list[tuple[str, Tail, int]] = []

    @property
    def deliveries(self) -> Deliveries:
        """Its subscriptions and deliveries, made at the first use."""
        if self._deliveries is None:
            self._deliveries = Deliveries(self, self.window_size)
        return self._deliveries

    @property
    def stream(self) -> trio.abc.Stream:
        assert self._stream is not None, "a parked connection has no stream: unparked() makes it again"
        return self._stream

    # ---- the connection's life ---------------------------------------------------------------------------------

    async def serve(self, first: list[Packet] | bytes | MqttError | None) -> bool:
        """Packets until the client disconnects, goes silent past its keep-alive, or breaks the protocol (raised
        here as MqttError once the connection's tasks are done); True if the connection parked instead. first: the
        packets that came with its CONNECT, or the bytes that woke it from the parking (b"": the client closed), or
        why it ends there (its keep-alive ran out, the broker stops), or None: a subscribed topic's new data woke it.
        A subscribed connection woken from the parking starts its feeds again, unless it was woken only to end."""
        scope = self._scope
        assert scope is not None
        parked = False
        with scope:
            async with trio.open_nursery() as nursery:
                self.nursery = nursery
                try:
                    if isinstance(first, list):
                        await self.deliveries.start(resumed=True)
                    elif self.session.subscriptions and (first is None or isinstance(first, bytes) and first):
                        await self.deliveries.start(resumed=False)  # not for a connection that only ends now
                    parked = await self._read(first)
                    if not parked:
                        await self._drained()  # what came before the end is stored and answered
                except MqttError as error:
                    self._broke = self._broke or error
                except RocketError as error:  # a session that cannot be kept now (its storage group is down)
                    self._broke = self._broke or MqttError(Reason.UNSPECIFIED_ERROR,
                                                           f"{error.code.name}: {error.message}")
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    pass
                finally:
                    nursery.cancel_scope.cancel()
        self.nursery = None
        if scope.cancelled_caught and trio.current_time() >= scope.deadline:
            self._broke = self._broke or keep_alive_ran_out()
        if self._broke is not None:
            raise self._broke
        if parked and not scope.cancel_called:
            self._park(scope.deadline)
            return True
        return False

    async def _read(self, first: list[Packet] | bytes | MqttError | None) -> bool:
        """Packets until DISCONNECT or the end of the stream (False), or until the connection may park (True); the
        connection's deadline moves with each read."""
        scope = self._scope
        assert scope is not None
        if isinstance(first, MqttError):
            raise first
        # Idle after its CONNECT, a connection parks at once; woken, it waits a while first: a device that sends
        # often keeps its task rather than waking it for each packet.
        park_now = isinstance(first, list)
        if self.decoder is None:  # woken from the parking
            self.decoder = Decoder(version=self.version)
        if first is None:
            first = []
        elif isinstance(first, bytes):
            if not first:
                return False
            first = self.decoder.feed(first)
        if not await self._handle(first):
            return False
        may_park = self.gateway.parking is not None and isinstance(self._stream, trio.SocketStream)
        while True:
            if len(self._publishes) >= limits.mqtt_publishes_waiting_max:
                scope.deadline = math.inf
                await self._drained()  # the client sends faster than its publishes are stored: it waits
            if self.keep_alive_s:
                scope.deadline = trio.current_time() + self.keep_alive_s
            data = await (self._receive_or_park(park_now) if may_park else self.stream.receive_some(65536))
            if data is None:
                held, self._held = self._held, self.deliveries.hold_tails() if self.session.subscriptions else []
                self._release(held)  # after the new holds: a watch still needed goes on
                return True
            assert self.decoder is not None
            if not data or not await self._handle(self.decoder.feed(data)):
                scope.deadline = math.inf
                return False

    async def _receive_or_park(self, park_now: bool) -> bytes | bytearray | None:
        """The next bytes, or None once the connection may park: at once if park_now, else after
        limits.mqtt_park_after_s without a packet (what it waits for may end meanwhile: a publish being stored, a
        delivery acknowledged)."""
        while not (park_now and self._parkable()):
            with trio.move_on_after(limits.mqtt_park_after_s):
                return await self.stream.receive_some(65536)
            park_now = True
        return None  # bytes already here wake it at once

    def _parkable(self) -> bool:
        """Nothing in flight, nothing half read, and no subscription, or each waiting for its topic's new data."""
        deliveries = self._deliveries
        return (not self._publishes and (self._idle is None or self._idle.is_set())
                and (deliveries is None or deliveries.idle if not self.session.subscriptions
                     else deliveries is not None and deliveries.sleeping)
                and self.decoder is not None and not self.decoder.buffered_bytes)

    def sleep(self, wake: Callable[[], None]) -> bool:
        """Parked with subscriptions: wake is called at the next bump of a Tail its feeds waited on; False (it is
        woken at once) if one moved since its feed saw it. Without subscriptions, True."""
        if any(tail.generation != seen for _, tail, seen in self._held):
            return False
        for _, tail, _ in self._held:
            tail.sleepers[self] = wake
        return True

    def _release(self, held: list[tuple[str, Tail, int]]) -> None:
        for topic, tail, _ in held:
            tail.sleepers.pop(self, None)
            self.gateway.tails.release(topic)

    def _park(self, until: float) -> None:
        """Let go of what a task held, and keep the socket's descriptor alone: made again when the connection wakes
        (unparked)."""
        assert isinstance(self._stream, trio.SocketStream)
        self.fd = self._stream.socket.detach()  # closing the stream (the listener does) leaves the connection open
        self._stream = None
        self.parked_until = until
        self._scope = None
        self._waiting = self._idle = None  # its worker ended with its task
        self._send_lock = None
        self._deliveries = None  # idle (_parkable)
        self.decoder = None

    def unparked(self) -> None:
        """Out of the parking, before it is served again: cancellable from then on (taken_over)."""
        self._stream = trio.SocketStream(trio.socket.socket(fileno=self.fd))
        self.fd = -1
        for _, tail, _ in self._held:  # still held: its feeds, starting again, hold them too before they are let go
            tail.sleepers.pop(self, None)
        self._scope = trio.CancelScope()
        self.parked_until = math.inf

    async def _drained(self) -> None:
        if self._idle is not None:
            await self._idle.wait()

    async def finished(self) -> None:
        """Until the gateway is done with the connection."""
        if not self.ended:
            if self._finished is None:
                self._finished = trio.Event()
            await self._finished.wait()

    def end(self) -> None:
        self.ended = True
        held, self._held = self._held, []
        self._release(held)
        if self._finished is not None:
            self._finished.set()

    def spawn(self, function, *args) -> None:
        """A task of the connection's: a broken connection, or a failure, ends the connection, not the gateway."""
        async def guarded() -> None:
            try:
                await function(*args)
            except MqttError as error:
                self.fail(error)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                self.cancel()
            except Exception:
                log.exception("MQTT client %s: a task failed", self.session.client_id)
                self.cancel()

        assert self.nursery is not None
        self.nursery.start_soon(guarded)

    def cancel(self) -> None:
        if self._scope is not None:
            self._scope.cancel()

    def fail(self, error: MqttError) -> None:
        """End a served connection, from any task, for the reason error gives."""
        self._broke = self._broke or error
        self.cancel()

    def wake_worker(self) -> None:
        """Publishes or acks wait: the worker (started at the first) takes them all at its next turn."""
        if self._waiting is None:
            self._waiting, self._idle = trio.Event(), trio.Event()
            self.spawn(self._work)
        elif self._idle is not None and self._idle.is_set():
            self._idle = trio.Event()
        self._waiting.set()

    async def _work(self) -> None:
        """Produce what was published and ack what was acknowledged, everything that came since the last turn at
        once: while one produce is stored, the reader goes on reading, and the next turn takes what it read."""
        while True:
            assert self._waiting is not None and self._idle is not None
            await self._waiting.wait()
            self._waiting = trio.Event()
            while self._publishes or (self._deliveries is not None and self._deliveries.acks_waiting):
                publishes, self._publishes = self._publishes, []
                if publishes:
                    await self._published(publishes)
                if self._deliveries is not None and self._deliveries.acks_waiting:
                    await self._deliveries.flush_acks()
            self._idle.set()

    async def taken_over(self) -> None:
        """Another connection with this client id: this one ends (Session Taken Over) once the session is kept."""
        self.taken = True
        if self.gateway.parking is not None and self.gateway.parking.unpark(self):
            self.gateway.wake(self, b"")  # no task serves it: one ends it, as closed
        if self.version == V5:
            try:
                with trio.move_on_after(1):
                    await self.send(Disconnect(Reason.SESSION_TAKEN_OVER))
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                pass
        self.cancel()
        await self.stream.aclose()
        await self.finished()

    async def send(self, *packets: Packet) -> None:
        """The packets in one write."""
        await self.send_bytes(b"".join(encode(packet, self.version) for packet in packets))

    async def send_bytes(self, data: bytes) -> None:
        if self._send_lock is None:
            self._send_lock = trio.Lock()
        async with self._send_lock:
            await self.stream.send_all(data)

    # ---- packets in ---------------------------------------------------------------------------------------------

    async def _handle(self, packets: list[Packet]) -> bool:
        """Serve what one read brought: PUBLISHes go to the worker, in order; False once the client said
        DISCONNECT."""
        waking = False  # the worker is woken once for a run of PUBLISHes, before anything that waits
        for packet in packets:
            if isinstance(packet, Publish):
                self._publishes.append(self._resolved(packet))
                waking = True
                continue
            if waking:
                self.wake_worker()
                waking = False
            if isinstance(packet, Ack):
                await self._acknowledged(packet)
            elif isinstance(packet, Subscribe):
                await self.deliveries.subscribe(packet)
            elif isinstance(packet, Unsubscribe):
                await self.deliveries.unsubscribe(packet)
            elif isinstance(packet, PingReq):
                await self.send(PingResp())
            elif isinstance(packet, Disconnect):
                if packet.reason == Reason.SUCCESS:
                    self.will = None
                if self.version == V5 and "session_expiry_interval" in packet.properties:
                    self.session.expiry_s = packet.properties["session_expiry_interval"]
                return False
            else:
                raise MqttError(Reason.PROTOCOL_ERROR, f"{type(packet).__name__} is not a client's packet")
        if waking:
            self.wake_worker()
        return True

    def _resolved(self, publish: Publish) -> Publish:
        """The PUBLISH with its topic alias resolved and its topic checked."""
        alias = publish.properties.pop("topic_alias", None) if publish.properties else None
        if alias is not None:
            if not 1 <= alias <= limits.mqtt_topic_aliases_max:
                raise MqttError(Reason.TOPIC_ALIAS_INVALID, f"topic alias {alias} is not 1-"
                                                            f"{limits.mqtt_topic_aliases_max}")
            if self.aliases is None:
                self.aliases = {}
            if publish.topic:
                self.aliases[alias] = publish.topic
            elif alias in self.aliases:
                publish.topic = self.aliases[alias]
            else:
                raise MqttError(Reason.PROTOCOL_ERROR, f"topic alias {alias} was never set")
        if not valid_topic_name(publish.topic):
            raise MqttError(Reason.TOPIC_NAME_INVALID, f"PUBLISH's topic {publish.topic[:64]!r} is empty or has a "
                                                       "wildcard")
        return publish

    async def _published(self, publishes: list[Publish]) -> None:
        """Produce what came, then acknowledge each in order: PUBACK (QoS 1) or PUBREC (QoS 2) with its reason. A
        QoS 2 PUBLISH again before its PUBREL is not produced twice. MQTT 3.1.1 has no failure to answer a PUBLISH
        with: the connection is closed."""
        received = self.session.received
        new = [publish for publish in publishes if publish.qos < 2 or publish.packet_id not in received] \
            if received else publishes
        failures = await self.produce(new)
        if not failures:  # most turns: a PUBACK or PUBREC each, in one write
            heads = [_ACK_WORDS[publish.qos] | publish.packet_id for publish in publishes if publish.qos]
            for publish in publishes:
                if publish.qos == 2:
                    received[publish.packet_id] = None
            if heads:
                await self.send_bytes(struct.pack(f">{len(heads)}I", *heads))
            return
        answers = bytearray()
        for publish in publishes:
            if publish.qos == 0:
                continue
            error = failures.get(id(publish))
            if error is not None and self.version != V5:
                raise MqttError(Reason.UNSPECIFIED_ERROR, f"PUBLISH to {publish.topic[:64]!r} failed: {error}")
            kind = PacketType.PUBACK if publish.qos == 1 else PacketType.PUBREC
            if error is not None:
                answers += encode(Ack(kind, publish.packet_id, error[0], {"reason_string": error[1][:200]}), V5)
                continue
            if publish.qos == 2:
                self.session.received[publish.packet_id] = None
            answers += _u32.pack(_ACK_WORDS[publish.qos] | publish.packet_id)
        if answers:
            await self.send_bytes(bytes(answers))

    async def produce(self, publishes: list[Publish]) -> dict[int, tuple[Reason, str]]:
        """Store the publishes as the client: the topics checked against its user, each queue's at once (with other
        connections' publishes to it: Batcher), retained ones kept. Returns the failures by id(publish): the reason
        code and its message."""
        batches: dict[tuple[str, int], list[tuple[Publish, Message]]] = {}
        failures: dict[int, tuple[Reason, str]] = {}
        # first level -> its topic's batch, once found and allowed (the batches go as the node), or why not
        routes: dict[str, list[tuple[Publish, Message]] | tuple[Reason, str]] = {}
        client, now_ms = self.session.client_id, self.gateway.clock.wall_ms()
        shared, whole = {MQTT_CLIENT: client}, bool(self.gateway.one_topic)
        for publish in publishes:
            first = publish.topic.partition("/")[0]
            route = routes.get(first)
            if route is None:
                route = routes[first] = await self._route(first, batches)
            if isinstance(route, tuple):
                failures[id(publish)] = route
                continue
            try:
                route.append((publish, to_message(publish, client, now_ms, shared, whole)))
            except MqttError as error:
                failures[id(publish)] = (error.reason, error.message)

        async def store(name: str, queue: int, items: list[tuple[Publish, Message]]) -> None:
            try:
                await self.gateway.batcher.produce(name, queue, [message for _, message in items])
                for publish, message in items:
                    if publish.retain:
                        await self.gateway.retained.keep(publish.topic, message)
            except RocketError as error:
                if error.code == Code.UNKNOWN_TOPIC:
                    self.gateway.topics.forget(name)
                log.info("MQTT client %s: PUBLISH to %s: %s", self.session.client_id, name, error)
                for publish, _ in items:
                    failures[id(publish)] = (reason_of(error), f"{error.code.name}: {error.message}")

        async with trio.open_nursery() as nursery:  # the queues' batches at once: each waits for its group's round
            for (name, queue), items in batches.items():
                if items:
                    nursery.start_soon(store, name, queue, items)
        return failures

    async def _route(self, first: str, batches: dict[tuple[str, int], list[tuple[Publish, Message]]]
                     ) -> list[tuple[Publish, Message]] | tuple[Reason, str]:
        """The batch of the rocket topic a first level names, in the client's queue, once the client may publish to
        it; else the reason and message each of its publishes is answered with."""
        try:
            name = rocket_topic(first, self.gateway.namespace, self.gateway.one_topic)
            topic = await self.gateway.topics.get(name)
            self.dispatcher.guard.authorize(self.caller, "Produce", {"topic": name})
        except MqttError as error:
            return error.reason, error.message
        except RocketError as error:
            return reason_of(error), f"{error.code.name}: {error.message}"
        return batches.setdefault((name, queue_of(self.session.client_id, topic["queues"])), [])

    async def _acknowledged(self, ack: Ack) -> None:
        if ack.kind == PacketType.PUBREL:  # QoS 2 in: the client releases it
            self.session.received.pop(ack.packet_id, None)
            await self.send(Ack(PacketType.PUBCOMP, ack.packet_id))
        else:
            await self.deliveries.acknowledged(ack)
