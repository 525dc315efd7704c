"""One MQTT connection on the broker (Connection): PUBLISH produced per read (one batch per rocket topic and queue),
SUBSCRIBE as a pop consumer group per topic whose messages the gateway matches and delivers, and the acks of both."""

from __future__ import annotations

import logging
import math
from collections import defaultdict
from typing import TYPE_CHECKING

import trio

from rocket import limits
from rocket.errors import Code, RocketError
from rocket.gateway.mqtt.codec import encode, matches, valid_topic_filter, valid_topic_name
from rocket.gateway.mqtt.mapping import (MQTT_CLIENT, Filter, parse_filter, published_qos, queue_of, rocket_topic,
                                         to_message, to_publish)
from rocket.gateway.mqtt.packets import (V5, Ack, Connect, Disconnect, MqttError, Packet, PacketType, PingReq,
                                         PingResp, Publish, Reason, SubAck, Subscribe, Subscription, UnsubAck,
                                         Unsubscribe, Will)
from rocket.gateway.mqtt.session import Session
from rocket.model import Message
from rocket.serde.receive import parse_receipt, received
from rocket.transport.guard import Caller

if TYPE_CHECKING:
    from rocket.gateway.mqtt.codec import Decoder
    from rocket.gateway.mqtt.server import MqttGateway

log = logging.getLogger("rocket.mqtt")

REASON_OF_CODE = {  # rocket's error codes -> MQTT 5's reason codes (PUBACK, SUBACK and CONNACK take these)
    Code.UNKNOWN_TOPIC: Reason.TOPIC_NAME_INVALID, Code.PERMISSION_DENIED: Reason.NOT_AUTHORIZED,
    Code.UNAUTHENTICATED: Reason.NOT_AUTHORIZED, Code.OVERLOADED: Reason.QUOTA_EXCEEDED,
    Code.BAD_REQUEST: Reason.IMPLEMENTATION_SPECIFIC_ERROR, Code.BAD_FILTER: Reason.TOPIC_FILTER_INVALID,
    Code.WRONG_MESSAGE_TYPE: Reason.IMPLEMENTATION_SPECIFIC_ERROR,
}


_ACK_HEADS = {kind: bytes([kind << 4, 2]) for kind in (PacketType.PUBACK, PacketType.PUBREC)}  # success, no properties


SUBACK_FAILURES = {Reason.UNSPECIFIED_ERROR, Reason.IMPLEMENTATION_SPECIFIC_ERROR, Reason.NOT_AUTHORIZED,
                   Reason.TOPIC_FILTER_INVALID, Reason.PACKET_IDENTIFIER_IN_USE, Reason.QUOTA_EXCEEDED,
                   Reason.SHARED_SUBSCRIPTIONS_NOT_SUPPORTED, Reason.SUBSCRIPTION_IDENTIFIERS_NOT_SUPPORTED,
                   Reason.WILDCARD_SUBSCRIPTIONS_NOT_SUPPORTED}  # what a SUBACK may say of a filter (MQTT 3.9.3)


def _suback_reason(reason: int) -> int:
    """A refusal as SUBACK says it: a topic that is not one (no rocket topic of that name) is a filter that is not."""
    if reason == Reason.TOPIC_NAME_INVALID:
        return Reason.TOPIC_FILTER_INVALID
    return reason if reason in SUBACK_FAILURES else Reason.UNSPECIFIED_ERROR


def reason_of(error: RocketError, connecting: bool = False) -> Reason:
    if connecting and error.code in (Code.UNAVAILABLE, Code.TIMEOUT, Code.OVERLOADED, Code.DISK_FULL):
        return Reason.SERVER_UNAVAILABLE
    return REASON_OF_CODE.get(error.code, Reason.UNSPECIFIED_ERROR)


class Delivery:
    """A QoS 1 or 2 message out, until the client acknowledged it (PUBACK, or PUBREC at QoS 2)."""
    __slots__ = ("topic", "group", "receipt", "qos")

    def __init__(self, topic: str, group: str, receipt: dict, qos: int):
        self.topic, self.group, self.receipt, self.qos = topic, group, receipt, qos


class Connection:
    """Kept small: a broker holds one per connected device, most of them idle. What only deliveries or publishes use
    is made at their first."""

    __slots__ = ("gateway", "dispatcher", "stream", "decoder", "version", "keep_alive_s", "session", "caller", "will",
                 "packet_bytes_max", "_window_size", "_window", "in_flight", "releasing", "_next_id", "aliases",
                 "feeds", "taken", "ended", "_finished", "_send_lock", "_acks", "_releases", "_publishes", "_waiting",
                 "_idle",
                 "_broke", "_scope", "nursery")

    def __init__(self, gateway: MqttGateway, stream: trio.abc.Stream, decoder: Decoder, connect: Connect,
                 session: Session, caller: Caller):
        self.gateway = gateway
        self.dispatcher = gateway.dispatcher
        self.stream = stream
        self.decoder = decoder
        self.version = connect.protocol_level
        self.keep_alive_s = connect.keep_alive * 1.5  # 0: none (MQTT 3.1.2.10)
        self.session = session
        self.caller = caller
        self.will: Will | None = connect.will
        self.packet_bytes_max = connect.properties.get("maximum_packet_size", limits.mqtt_packet_bytes_max)
        # QoS 1 and 2 deliveries the client may hold unacknowledged (its Receive Maximum, at most ours)
        self._window_size = min(connect.properties.get("receive_maximum", 65535), limits.mqtt_in_flight_max)
        self._window: trio.Semaphore | None = None
        self.in_flight: dict[int, Delivery] = {}  # packet id -> a delivery awaiting its PUBACK or PUBREC
        self.releasing: set[int] = set()  # QoS 2 deliveries of this connection past PUBREC: each holds a window slot
        self._next_id = 0
        self.aliases: dict[int, str] = {}  # MQTT 5 topic aliases the client set
        self.feeds: dict[tuple[str, str], trio.CancelScope] = {}  # (rocket topic, group) -> its delivery task
        self.taken = False  # another connection took the session over
        self.ended = False  # the gateway is done with it (MqttGateway.serve); _finished is set then, if made
        self._finished: trio.Event | None = None
        self._send_lock = trio.Lock()
        self._acks: defaultdict[tuple[str, str], list[dict]] = defaultdict(list)  # acknowledged, not yet acked
        self._releases: list[tuple[int, Delivery]] = []  # QoS 2 deliveries received (PUBREC), their acks not stored
        self._publishes: list[Publish] = []  # received, not yet produced, in order
        self._waiting: trio.Event | None = None  # set when publishes or acks wait for the worker; None: no worker
        self._idle: trio.Event | None = None  # set while none wait, nor are being produced or acked
        self._broke: MqttError | None = None  # what ended the connection, from whichever task
        # Cancelled when the connection ends, from whichever task; its deadline is the keep-alive's.
        self._scope = trio.CancelScope()
        self.nursery: trio.Nursery  # the connection's tasks, while it is served

    @property
    def window(self) -> trio.Semaphore:
        if self._window is None:
            self._window = trio.Semaphore(self._window_size)
        return self._window

    # ---- the connection's life ---------------------------------------------------------------------------------

    async def serve(self, first: list[Packet]) -> None:
        """Packets until the client disconnects, goes silent past its keep-alive, or breaks the protocol (raised
        here as MqttError once the connection's tasks are done)."""
        with self._scope:
            async with trio.open_nursery() as nursery:
                self.nursery = nursery
                try:
                    for released in sorted(self.session.released):  # QoS 2 deliveries left at PUBREL
                        await self.send(Ack(PacketType.PUBREL, released))
                    for filter_, _ in self.session.subscriptions.values():
                        self._feed(filter_)
                    await self._read(first)
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
        if self._scope.cancelled_caught and trio.current_time() >= self._scope.deadline:
            self._broke = self._broke or MqttError(Reason.KEEP_ALIVE_TIMEOUT, "no packet within 1.5 times the "
                                                                              "keep-alive")
        if self._broke is not None:
            raise self._broke

    async def _read(self, first: list[Packet]) -> None:
        """Packets until DISCONNECT or the end of the stream; the connection's deadline moves with each read."""
        if not await self._handle(first):
            return
        while True:
            if len(self._publishes) >= limits.mqtt_publishes_waiting_max:
                self._scope.deadline = math.inf
                await self._drained()  # the client sends faster than its publishes are stored: it waits
            if self.keep_alive_s:
                self._scope.deadline = trio.current_time() + self.keep_alive_s
            data = await self.stream.receive_some(65536)
            if not data or not await self._handle(self.decoder.feed(data)):
                self._scope.deadline = math.inf
                return

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
        if self._finished is not None:
            self._finished.set()

    def _spawn(self, function, *args) -> None:
        """A task of the connection's: a broken connection, or a failure, ends the connection, not the gateway."""
        async def guarded() -> None:
            try:
                await function(*args)
            except MqttError as error:
                self._broke = self._broke or error
                self._scope.cancel()
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                self._scope.cancel()
            except Exception:
                log.exception("MQTT client %s: a task failed", self.session.client_id)
                self._scope.cancel()

        self.nursery.start_soon(guarded)

    def _wake_worker(self) -> None:
        """Publishes or acks wait: the worker (started at the first) takes them all at its next turn."""
        if self._waiting is None:
            self._waiting, self._idle = trio.Event(), trio.Event()
            self._spawn(self._work)
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
            while self._publishes or self._acks:
                publishes, self._publishes = self._publishes, []
                if publishes:
                    await self._published(publishes)
                if self._acks:
                    await self._flush_acks()
            self._idle.set()

    async def taken_over(self) -> None:
        """Another connection with this client id: this one ends (Session Taken Over) once the session is kept."""
        self.taken = True
        if self.version == V5:
            try:
                with trio.move_on_after(1):
                    await self.send(Disconnect(Reason.SESSION_TAKEN_OVER))
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                pass
        self._scope.cancel()
        await self.stream.aclose()
        await self.finished()

    async def send(self, *packets: Packet) -> None:
        """The packets in one write."""
        await self.send_bytes(b"".join(encode(packet, self.version) for packet in packets))

    async def send_bytes(self, data: bytes) -> None:
        async with self._send_lock:
            await self.stream.send_all(data)

    # ---- packets in ---------------------------------------------------------------------------------------------

    async def _handle(self, packets: list[Packet]) -> bool:
        """Serve what one read brought: PUBLISHes go to the worker, in order; False once the client said
        DISCONNECT."""
        for packet in packets:
            if isinstance(packet, Publish):
                self._publishes.append(self._resolved(packet))
                self._wake_worker()
            elif isinstance(packet, Ack):
                await self._acknowledged(packet)
            elif isinstance(packet, Subscribe):
                await self._subscribe(packet)
            elif isinstance(packet, Unsubscribe):
                await self._unsubscribe(packet)
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
        return True

    def _resolved(self, publish: Publish) -> Publish:
        """The PUBLISH with its topic alias resolved and its topic checked."""
        alias = publish.properties.pop("topic_alias", None)
        if alias is not None:
            if not 1 <= alias <= limits.mqtt_topic_aliases_max:
                raise MqttError(Reason.TOPIC_ALIAS_INVALID, f"topic alias {alias} is not 1-"
                                                            f"{limits.mqtt_topic_aliases_max}")
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
        new = [publish for publish in publishes if publish.qos < 2 or publish.packet_id not in self.session.received]
        failures = await self.produce(new)
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
                self.session.received.add(publish.packet_id)
            answers += _ACK_HEADS[kind] + publish.packet_id.to_bytes(2, "big")  # encode()'s bytes, without its cost
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
        for publish in publishes:
            first = publish.topic.partition("/")[0]
            route = routes.get(first)
            if route is None:
                route = routes[first] = await self._route(first, batches)
            if isinstance(route, tuple):
                failures[id(publish)] = route
                continue
            try:
                route.append((publish, to_message(publish, client, now_ms)))
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
            name = rocket_topic(first)
            topic = await self.gateway.topics.get(name)
            self.dispatcher.guard.authorize(self.caller, "Produce", {"topic": name})
        except MqttError as error:
            return error.reason, error.message
        except RocketError as error:
            return reason_of(error), f"{error.code.name}: {error.message}"
        return batches.setdefault((name, queue_of(self.session.client_id, topic["queues"])), [])

    async def _acknowledged(self, ack: Ack) -> None:
        if ack.kind == PacketType.PUBREL:  # QoS 2 in: the client releases it
            self.session.received.discard(ack.packet_id)
            await self.send(Ack(PacketType.PUBCOMP, ack.packet_id))
            return
        if ack.kind == PacketType.PUBCOMP:
            self.session.released.discard(ack.packet_id)
            if ack.packet_id in self.releasing:
                self.releasing.discard(ack.packet_id)
                self.window.release()
            return
        delivery = self.in_flight.pop(ack.packet_id, None)
        if delivery is None or (ack.kind == PacketType.PUBREC) != (delivery.qos == 2):
            return  # not ours (a duplicate, or from an earlier connection): nothing to do
        if ack.kind == PacketType.PUBREC:
            self.releasing.add(ack.packet_id)
        else:
            self.window.release()
        if not delivery.group:  # a retained message: no receipt to ack
            if ack.kind == PacketType.PUBREC:
                self.session.released.add(ack.packet_id)
                await self.send(Ack(PacketType.PUBREL, ack.packet_id))
            return
        self._acks[(delivery.topic, delivery.group)].append(delivery.receipt)
        if ack.kind == PacketType.PUBREC:  # PUBREL once the ack is stored: the client may forget the id then
            self._releases.append((ack.packet_id, delivery))
        self._wake_worker()

    async def _flush_acks(self, connected: bool = True) -> None:
        """Ack what the client acknowledged; then release its QoS 2 deliveries whose ack was stored: PUBREL, or at
        the connection's end a note in the session, whose next connection sends it."""
        acks, self._acks = self._acks, defaultdict(list)
        releases, self._releases = self._releases, []
        failed = {key for key, receipts in acks.items() if not await self._receipts("Ack", *key, receipts)}
        packets: list[Packet] = []
        for packet_id, delivery in releases:
            if (delivery.topic, delivery.group) in failed:  # it comes again after its invisible time, with its id
                self.releasing.discard(packet_id)
                self.window.release()
                continue
            self.session.unreleased.pop(f"{delivery.topic} {delivery.group} {delivery.receipt['queue']} "
                                        f"{delivery.receipt['offset']}", None)
            self.session.released.add(packet_id)
            packets.append(Ack(PacketType.PUBREL, packet_id))
        if packets and connected:
            await self.send(*packets)

    async def _receipts(self, method: str, topic: str, group: str, receipts: list[dict]) -> bool:
        """Whether the receipts' method was done; else it is logged (they come back after their invisible time)."""
        try:
            await self.dispatcher.local(method, {"topic": topic, "group": group, "receipts": receipts,
                                                 "invisible_ms": 0 if method == "ChangeInvisible" else -1})
        except RocketError as error:
            log.info("MQTT client %s: %s of %d messages of %s: %s", self.session.client_id, method, len(receipts),
                     topic, error)
            return False
        return True

    # ---- subscriptions ------------------------------------------------------------------------------------------

    async def _subscribe(self, subscribe: Subscribe) -> None:
        """Each filter checked and allowed (ACL sub on its rocket topic and group), the session's group moved to
        the topic's end for a new one, kept (persistent sessions), then SUBACK and the retained messages."""
        reasons: list[int] = []
        retained: list[tuple[Filter, Subscription]] = []
        for subscription in subscribe.subscriptions:
            try:
                reasons.append(await self._add(subscription, subscribe, retained))
            except MqttError as error:
                log.info("MQTT client %s: SUBSCRIBE %s: %s", self.session.client_id, subscription.topic_filter[:64],
                         error.message)
                reasons.append(_suback_reason(error.reason) if self.version == V5 else 0x80)
            except RocketError as error:
                log.info("MQTT client %s: SUBSCRIBE %s: %s", self.session.client_id, subscription.topic_filter[:64],
                         error)
                reasons.append(_suback_reason(reason_of(error)) if self.version == V5 else 0x80)
        if self.session.persistent:
            await self.gateway.sessions.save(self.session)
        await self.send(SubAck(subscribe.packet_id, reasons))
        for filter_, subscription in retained:
            await self._send_retained(filter_, subscription)

    async def _add(self, subscription: Subscription, subscribe: Subscribe,
                   retained: list[tuple[Filter, Subscription]]) -> int:
        if "subscription_identifier" in subscribe.properties:
            raise MqttError(Reason.SUBSCRIPTION_IDENTIFIERS_NOT_SUPPORTED, "subscription identifiers are not kept")
        text = subscription.topic_filter
        filter_ = parse_filter(text)
        if not valid_topic_filter(filter_.topic_filter):
            raise MqttError(Reason.TOPIC_FILTER_INVALID, f"filter {text[:64]!r}: '#' only last, '+' a whole level")
        if filter_.share and subscription.no_local:
            raise MqttError(Reason.PROTOCOL_ERROR, "a shared subscription cannot be No Local")
        existing = self.session.subscriptions.get(text)
        if existing is None and len(self.session.subscriptions) >= limits.mqtt_subscriptions_max:
            raise MqttError(Reason.QUOTA_EXCEEDED, f"a session holds {limits.mqtt_subscriptions_max} filters")
        group = filter_.group(self.session.client_id)
        await self.gateway.topics.get(filter_.topic)
        self.dispatcher.guard.authorize(self.caller, "Receive", {"topic": filter_.topic, "group": group})
        if (filter_.topic, group) not in self.feeds:
            await self._start_at_end(filter_.topic, group, shared=bool(filter_.share))
        self.session.subscriptions[text] = (filter_, subscription)
        self._feed(filter_)  # a feed that runs reads the session's filters anew each round
        if subscription.retain_handling == 0 or (subscription.retain_handling == 1 and existing is None):
            if not filter_.share:  # a shared subscription gets no retained messages (MQTT 4.8.2)
                retained.append((filter_, subscription))
        return subscription.qos

    async def _start_at_end(self, topic: str, group: str, shared: bool) -> None:
        """A subscription gets what is published from now on: its group starts at the topic's end; a shared one
        only when the group is new (its members may be reading)."""
        if shared:
            described = await self.dispatcher.local("DescribeGroup", {"topic": topic, "group": group})
            if any(queue["pop_cursor"] or queue["in_flight"] or queue["committed"] >= 0
                   for queue in described["queues"]):
                return
        await self.dispatcher.local("ResetGroup", {"topic": topic, "group": group, "to": "latest",
                                                   "timestamp_ms": 0, "queue": -1, "offset": 0})

    async def _unsubscribe(self, unsubscribe: Unsubscribe) -> None:
        reasons = []
        for text in unsubscribe.topic_filters:
            found = self.session.subscriptions.pop(text, None)
            reasons.append(Reason.SUCCESS if found is not None else Reason.NO_SUBSCRIPTION_EXISTED)
            if found is not None:
                filter_ = found[0]
                key = (filter_.topic, filter_.group(self.session.client_id))
                if key in self.feeds and not self._filters(*key):
                    self.feeds.pop(key).cancel()
        if self.session.persistent:
            await self.gateway.sessions.save(self.session)
        await self.send(UnsubAck(unsubscribe.packet_id, reasons if self.version == V5 else []))

    def _filters(self, topic: str, group: str) -> list[tuple[Filter, Subscription]]:
        client = self.session.client_id
        return [(filter_, subscription) for filter_, subscription in self.session.subscriptions.values()
                if filter_.topic == topic and filter_.group(client) == group]

    async def _send_retained(self, filter_: Filter, subscription: Subscription) -> None:
        try:
            messages = await self.gateway.retained.under(filter_.topic, limits.mqtt_retained_per_subscribe_max)
        except RocketError as error:
            log.info("MQTT client %s: retained messages of %s: %s", self.session.client_id, filter_.topic, error)
            return
        now_ms = self.gateway.clock.wall_ms()
        for message in messages:
            publish = to_publish(message, filter_.topic, min(subscription.qos, published_qos(message)), self.version,
                                 now_ms)
            if publish is None or not matches(filter_.topic_filter, publish.topic):
                continue
            publish.retain = True
            if publish.qos:  # no receipt: the client's acknowledgement ends it
                await self.window.acquire()
                publish.packet_id = self._packet_id()
                self.in_flight[publish.packet_id] = Delivery(filter_.topic, "", {}, publish.qos)
            await self.send(publish)

    # ---- deliveries ---------------------------------------------------------------------------------------------

    def _feed(self, filter_: Filter) -> None:
        key = (filter_.topic, filter_.group(self.session.client_id))
        if key in self.feeds:
            return
        scope = self.feeds[key] = trio.CancelScope()
        self._spawn(self._deliver, key[0], key[1], scope)

    async def _deliver(self, topic: str, group: str, scope: trio.CancelScope) -> None:
        """Receive the group's messages on the topic, match each against the session's filters as they are then,
        and send it at the highest QoS of those it matches (and at most its own). Those no filter matches, expired
        ones and QoS 0 ones are acked at once, a round's together. (The broker cannot filter: a receive that asked
        for the tags of the filters before a SUBSCRIBE would skip, for good, what matches only the new one.)"""
        with scope:
            client = self.session.client_id
            while True:
                await self.window.acquire()  # room for one at least
                self.window.release()
                try:
                    response = await self.dispatcher.local("Receive", {
                        "topic": topic, "group": group, "max_attempts": limits.mqtt_attempts_max, "filter_type": "tag",
                        "filter": "*",
                        "max_messages": max(1, min(self.window.value, limits.mqtt_receive_messages_max)),
                        "invisible_ms": int(limits.mqtt_invisible_s * 1000),
                        "wait_ms": int(limits.mqtt_receive_wait_s * 1000)}, self.caller)
                except RocketError as error:
                    log.info("MQTT client %s: receive of %s: %s", client, topic, error)
                    await trio.sleep(limits.mqtt_receive_wait_s)
                    continue
                messages, unreadable = received(response, topic)
                if unreadable:
                    await self._receipts("DeadLetter", topic, group, unreadable)
                done = []
                now_ms = self.gateway.clock.wall_ms()
                filters = self._filters(topic, group)
                for message in messages:
                    queue, offset, attempt = parse_receipt(message.receipt)
                    receipt = {"queue": queue, "offset": offset, "attempt": attempt}
                    publish = self._publish_of(message, topic, filters, now_ms)
                    if publish is None:
                        done.append(receipt)
                        continue
                    if publish.qos:
                        await self.window.acquire()
                        publish.packet_id = await self._packet_id_of(publish, topic, group, queue, offset)
                        self.in_flight[publish.packet_id] = Delivery(topic, group, receipt, publish.qos)
                    else:
                        done.append(receipt)
                    await self.send(publish)
                if done:
                    await self._receipts("Ack", topic, group, done)

    def _publish_of(self, message: Message, topic: str, filters: list[tuple[Filter, Subscription]],
                    now_ms: int) -> Publish | None:
        """The PUBLISH for the client, or None: no filter matches, it expired, or it is too large for the client."""
        publish = to_publish(message, topic, 0, self.version, now_ms)
        if publish is None:
            return None
        granted, as_published = -1, False
        client = self.session.client_id
        for filter_, subscription in filters:
            if matches(filter_.topic_filter, publish.topic) and not (
                    subscription.no_local and message.properties.get(MQTT_CLIENT) == client):
                granted = max(granted, subscription.qos)
                as_published = as_published or subscription.retain_as_published
        if granted < 0:
            return None
        publish.qos = min(granted, published_qos(message))
        if publish.qos == 0:
            publish.dup = False
        if len(publish.payload) + len(publish.topic) > self.packet_bytes_max:
            log.info("MQTT client %s: a message of %s is larger than its maximum packet size", client, topic)
            return None
        return publish

    async def _packet_id_of(self, publish: Publish, topic: str, group: str, queue: int, offset: int) -> int:
        """A delivery's packet id. A persistent session's QoS 2 delivery keeps the one it first went out with, in
        the session's record before it goes: sent again (a broken connection, a broker killed), it comes with that
        id and DUP, which is how the client knows it has it (MQTT 4.3.3)."""
        if publish.qos < 2 or not self.session.persistent:
            return self._packet_id()
        key = f"{topic} {group} {queue} {offset}"
        packet_id = self.session.unreleased.get(key)
        if packet_id is not None:
            publish.dup = True
            return packet_id
        packet_id = self.session.unreleased[key] = self._packet_id()
        await self.gateway.sessions.save(self.session)
        return packet_id

    def _packet_id(self) -> int:
        """A packet id no delivery in flight holds (the window keeps far fewer than 65535 out)."""
        held = set(self.session.unreleased.values()) if self.session.unreleased else ()
        while True:
            self._next_id = self._next_id % 65535 + 1
            if self._next_id not in self.in_flight and self._next_id not in self.session.released and \
                    self._next_id not in held:
                return self._next_id

    async def release_in_flight(self) -> None:
        """At the connection's end: what the client acknowledged is acked, and what it did not is made visible
        again at once, for the session's next connection (or another member of its shared group)."""
        await self._flush_acks(connected=False)
        unacked: defaultdict[tuple[str, str], list[dict]] = defaultdict(list)
        for delivery in self.in_flight.values():
            if delivery.group:
                unacked[(delivery.topic, delivery.group)].append(delivery.receipt)
        self.in_flight.clear()
        for (topic, group), receipts in unacked.items():
            await self._receipts("ChangeInvisible", topic, group, receipts)

    async def drop_groups(self) -> None:
        """A session that ended: its own consumer groups go (a shared group stays for its other members)."""
        client = self.session.client_id
        for filter_, _ in list(self.session.subscriptions.values()):
            if not filter_.share:
                try:
                    await self.dispatcher.local("DeleteGroup", {"topic": filter_.topic,
                                                                "group": filter_.group(client)})
                except RocketError as error:
                    log.info("MQTT client %s: group of %s not deleted: %s", client, filter_.topic, error)
