"""One MQTT connection's subscriptions and deliveries (Deliveries, a part of Connection): a pop consumer group per
rocket topic, its messages matched against the session's filters, sent within the client's window, and acked once
the client acknowledged them; idle, it waits on the topic's watch (the gateway's Tails)."""

from __future__ import annotations

import logging
from collections import defaultdict
from typing import TYPE_CHECKING

import trio

from rocket import limits
from rocket.errors import RocketError
from rocket.gateway.mqtt.codec import matches, valid_topic_filter
from rocket.gateway.mqtt.mapping import (MQTT_CLIENT, MQTT_RETAIN, Filter, parse_filter, published_qos, reason_of,
                                         to_publish)
from rocket.gateway.mqtt.packets import V5, Ack, MqttError, Packet, PacketType, Publish, Reason, SubAck, Subscribe, \
    Subscription, UnsubAck, Unsubscribe
from rocket.gateway.reads import Tail
from rocket.model import Message, outside_namespace
from rocket.serde.receive import parse_receipt, received

if TYPE_CHECKING:
    from rocket.gateway.mqtt.connection import Connection

log = logging.getLogger("rocket.mqtt")

SUBACK_FAILURES = {Reason.UNSPECIFIED_ERROR, Reason.IMPLEMENTATION_SPECIFIC_ERROR, Reason.NOT_AUTHORIZED,
                   Reason.TOPIC_FILTER_INVALID, Reason.PACKET_IDENTIFIER_IN_USE, Reason.QUOTA_EXCEEDED,
                   Reason.SHARED_SUBSCRIPTIONS_NOT_SUPPORTED, Reason.SUBSCRIPTION_IDENTIFIERS_NOT_SUPPORTED,
                   Reason.WILDCARD_SUBSCRIPTIONS_NOT_SUPPORTED}  # what a SUBACK may say of a filter (MQTT 3.9.3)


def _suback_reason(reason: int) -> int:
    """A refusal as SUBACK says it: a topic that is not one (no rocket topic of that name) is a filter that is not."""
    if reason == Reason.TOPIC_NAME_INVALID:
        return Reason.TOPIC_FILTER_INVALID
    return reason if reason in SUBACK_FAILURES else Reason.UNSPECIFIED_ERROR


class Delivery:
    """A QoS 1 or 2 message out, until the client acknowledged it (PUBACK, or PUBREC at QoS 2)."""
    __slots__ = ("topic", "group", "receipt", "qos")

    def __init__(self, topic: str, group: str, receipt: dict, qos: int):
        self.topic, self.group, self.receipt, self.qos = topic, group, receipt, qos


class Deliveries:
    def __init__(self, connection: Connection, window_size: int):
        self.connection = connection
        self.gateway = connection.gateway
        self.dispatcher = connection.dispatcher
        self.session = connection.session
        self.caller = connection.caller
        self.version = connection.version
        self._window_size = window_size  # the client's Receive Maximum, at most ours
        self._window: trio.Semaphore | None = None  # made at the first delivery
        self.in_flight: dict[int, Delivery] = {}  # packet id -> a delivery awaiting its PUBACK or PUBREC
        self.releasing: set[int] = set()  # QoS 2 deliveries of this connection past PUBREC: each holds a window slot
        self._next_id = 0
        self.feeds: dict[tuple[str, str], trio.CancelScope] = {}  # (rocket topic, group) -> its delivery task
        # of them, those idle (_idle): the wait's scope, the topic's Tail, its generation seen, and whether the wait
        # ends at a message's time to go out again
        self._waiting: dict[tuple[str, str], tuple[trio.CancelScope, Tail, int, bool]] = {}
        self._acks: defaultdict[tuple[str, str], list[dict]] = defaultdict(list)  # acknowledged, not yet acked
        self._releases: list[tuple[int, Delivery]] = []  # QoS 2 deliveries received (PUBREC), their acks not stored

    @property
    def window(self) -> trio.Semaphore:
        """QoS 1 and 2 deliveries the client may hold unacknowledged."""
        if self._window is None:
            self._window = trio.Semaphore(self._window_size)
        return self._window

    @property
    def idle(self) -> bool:
        """No subscription fed, and no delivery waiting for the client, or for its ack to be stored."""
        return not (self.feeds or self.in_flight or self.releasing or self._acks or self._releases)

    @property
    def sleeping(self) -> bool:
        """Every subscription's feed waits for its topic's new data alone (none for a message due again), and nothing
        is in flight: the connection may park, woken by its topics' watches (hold_tails)."""
        return (bool(self.feeds) and len(self._waiting) == len(self.feeds)
                and not any(timed for _, _, _, timed in self._waiting.values())
                and not (self.in_flight or self.releasing or self._acks or self._releases))

    def hold_tails(self) -> list[tuple[str, Tail, int]]:
        """The Tails the idle feeds wait on, each held (Tails.hold: its watch outlives the feeds' tasks), with the
        generation the feed saw: (topic, tail, generation)."""
        return [(topic, self.gateway.tails.hold(topic), seen) for (topic, _), (_, _, seen, _) in self._waiting.items()]

    @property
    def acks_waiting(self) -> bool:
        return bool(self._acks)

    async def start(self, resumed: bool) -> None:
        """The subscriptions' deliveries; for a session just resumed (not a connection woken from the parking), the
        PUBRELs its last connection left unanswered first."""
        for released in sorted(self.session.released) if resumed else ():
            await self.connection.send(Ack(PacketType.PUBREL, released))
        for filter_, _ in self.session.subscriptions.values():
            self._feed(filter_)

    async def acknowledged(self, ack: Ack) -> None:
        """PUBACK, PUBREC or PUBCOMP of a delivery."""
        if ack.kind == PacketType.PUBCOMP:
            self.session.released.pop(ack.packet_id, None)
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
                self.session.released[ack.packet_id] = None
                await self.connection.send(Ack(PacketType.PUBREL, ack.packet_id))
            return
        self._acks[(delivery.topic, delivery.group)].append(delivery.receipt)
        if ack.kind == PacketType.PUBREC:  # PUBREL once the ack is stored: the client may forget the id then
            self._releases.append((ack.packet_id, delivery))
        self.connection.wake_worker()

    async def flush_acks(self, connected: bool = True) -> None:
        """Ack what the client acknowledged; then release its QoS 2 deliveries whose ack was stored: PUBREL, or at
        the connection's end a note in the session, whose next connection sends it."""
        acks, self._acks = self._acks, defaultdict(list)
        releases, self._releases = self._releases, []
        failed = {key for key, receipts in acks.items() if not await self._receipts("Ack", *key, receipts)}
        for key in acks.keys() - failed:  # a FIFO queue's next message may be free now
            waiting = self._waiting.get(key)
            if waiting is not None:
                waiting[0].cancel()
        packets: list[Packet] = []
        for packet_id, delivery in releases:
            if (delivery.topic, delivery.group) in failed:  # it comes again after its invisible time, with its id
                self.releasing.discard(packet_id)
                self.window.release()
                continue
            self.session.unreleased.pop(f"{delivery.topic} {delivery.group} {delivery.receipt['queue']} "
                                        f"{delivery.receipt['offset']}", None)
            self.session.released[packet_id] = None
            packets.append(Ack(PacketType.PUBREL, packet_id))
        if packets and connected:
            await self.connection.send(*packets)

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

    async def subscribe(self, subscribe: Subscribe) -> None:
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
        await self.connection.send(SubAck(subscribe.packet_id, reasons))
        if retained:  # in a task of its own: past the client's window, only the reader's PUBACKs let more go
            self.connection.spawn(self._send_retained, retained)

    async def _add(self, subscription: Subscription, subscribe: Subscribe,
                   retained: list[tuple[Filter, Subscription]]) -> int:
        if "subscription_identifier" in subscribe.properties:
            raise MqttError(Reason.SUBSCRIPTION_IDENTIFIERS_NOT_SUPPORTED, "subscription identifiers are not kept")
        text = subscription.topic_filter
        filter_ = parse_filter(text, self.gateway.namespace, self.gateway.one_topic)
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

    async def unsubscribe(self, unsubscribe: Unsubscribe) -> None:
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
        await self.connection.send(UnsubAck(unsubscribe.packet_id, reasons if self.version == V5 else []))

    def _filters(self, topic: str, group: str) -> list[tuple[Filter, Subscription]]:
        client = self.session.client_id
        return [(filter_, subscription) for filter_, subscription in self.session.subscriptions.values()
                if filter_.topic == topic and filter_.group(client) == group]

    async def _send_retained(self, retained: list[tuple[Filter, Subscription]]) -> None:
        """The retained messages each new filter matches, flagged retained, within the client's window."""
        for filter_, subscription in retained:
            try:
                messages = await self.gateway.retained.under(filter_.literal, limits.mqtt_retained_per_subscribe_max)
            except RocketError as error:
                log.info("MQTT client %s: retained messages of %s: %s", self.session.client_id, filter_.topic, error)
                continue
            now_ms = self.gateway.clock.wall_ms()
            for message in messages:
                publish = to_publish(message, filter_.first, min(subscription.qos, published_qos(message)),
                                     self.version, now_ms, bool(self.gateway.one_topic))
                if publish is None or not matches(filter_.topic_filter, publish.topic):
                    continue
                publish.retain = True
                if publish.qos:  # no receipt: the client's acknowledgement ends it
                    await self.window.acquire()
                    publish.packet_id = self._packet_id()
                    self.in_flight[publish.packet_id] = Delivery(filter_.topic, "", {}, publish.qos)
                await self.connection.send(publish)

    # ---- deliveries ---------------------------------------------------------------------------------------------

    def _feed(self, filter_: Filter) -> None:
        key = (filter_.topic, filter_.group(self.session.client_id))
        if key in self.feeds:
            return
        scope = self.feeds[key] = trio.CancelScope()
        self.connection.spawn(self._deliver, key[0], key[1], scope)

    async def _deliver(self, topic: str, group: str, scope: trio.CancelScope) -> None:
        """Receive the group's messages on the topic, match each against the session's filters as they are then,
        and send it at the highest QoS of those it matches (and at most its own). Those no filter matches, expired
        ones and QoS 0 ones are acked at once, a round's together. (The broker cannot filter: a receive that asked
        for the tags of the filters before a SUBSCRIBE would skip, for good, what matches only the new one.)
        A receive does not wait: one that found nothing waits on the topic's watch (the gateway's Tails, one long
        poll per topic for all its subscriptions), until it sees new data, a message left unacknowledged is due
        again, or an ack of this group was stored (a FIFO queue's next message may be free)."""
        with scope, self.gateway.tails.watching(topic) as tail:
            client = self.session.client_id
            first = outside_namespace(self.gateway.namespace, topic) or topic  # as MQTT names it
            while True:
                await self.window.acquire()  # room for one at least
                self.window.release()
                seen = tail.generation
                try:
                    response = await self.dispatcher.local("Receive", {
                        "topic": topic, "group": group, "max_attempts": limits.mqtt_attempts_max, "filter_type": "tag",
                        "filter": "*",
                        "max_messages": max(1, min(self.window.value, limits.mqtt_receive_messages_max)),
                        "invisible_ms": int(limits.mqtt_invisible_s * 1000), "wait_ms": 0}, self.caller)
                except RocketError as error:
                    log.info("MQTT client %s: receive of %s: %s", client, topic, error)
                    await trio.sleep(limits.mqtt_receive_retry_s)
                    continue
                messages, unreadable = received(response, topic)
                if unreadable:
                    await self._receipts("DeadLetter", topic, group, unreadable)
                if not messages and not unreadable:
                    await self._idle(topic, group, tail, seen, response["next_visible_ms"])
                    continue
                done = []
                now_ms = self.gateway.clock.wall_ms()
                filters = self._filters(topic, group)
                for message in messages:
                    queue, offset, attempt = parse_receipt(message.receipt)
                    receipt = {"queue": queue, "offset": offset, "attempt": attempt}
                    publish = self._publish_of(message, first, filters, now_ms)
                    if publish is None:
                        done.append(receipt)
                        continue
                    if publish.qos:
                        await self.window.acquire()
                        publish.packet_id = await self._packet_id_of(publish, topic, group, queue, offset)
                        self.in_flight[publish.packet_id] = Delivery(topic, group, receipt, publish.qos)
                    else:
                        done.append(receipt)
                    await self.connection.send(publish)
                if done:
                    await self._receipts("Ack", topic, group, done)

    async def _idle(self, topic: str, group: str, tail: Tail, seen: int, next_visible_ms: int) -> None:
        """Wait for the topic's tail to move past seen, for the group's next message left unacknowledged to be due
        (next_visible_ms, 0 if none), or for an ack of the group to be stored (flush_acks ends the wait); at most
        limits.mqtt_idle_recheck_s."""
        wait_s = limits.mqtt_idle_recheck_s
        if next_visible_ms:
            wait_s = min(wait_s, max(limits.pop_wake_s_min, next_visible_ms / 1000 - self.gateway.clock.wall_s()))
        with trio.CancelScope() as waiting:
            self._waiting[(topic, group)] = (waiting, tail, seen, bool(next_visible_ms))
            try:
                await tail.wait(seen, wait_s)
            finally:
                del self._waiting[(topic, group)]

    def _publish_of(self, message: Message, first: str, filters: list[tuple[Filter, Subscription]],
                    now_ms: int) -> Publish | None:
        """The PUBLISH for the client, or None: no filter matches, it expired, or it is too large for the client."""
        publish = to_publish(message, first, 0, self.version, now_ms, bool(self.gateway.one_topic))
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
        publish.retain = as_published and message.properties.get(MQTT_RETAIN) == "1"
        if publish.qos == 0:
            publish.dup = False
        if len(publish.payload) + len(publish.topic) > self.connection.packet_bytes_max:
            log.info("MQTT client %s: a message of %s is larger than its maximum packet size", client, first)
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
        await self.flush_acks(connected=False)
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
