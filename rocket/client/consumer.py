"""The consumer: pulls a topic's queues for a group with long polling, decodes batches client-side,
cuts them at the requested offsets, and commits the group's positions in storage (Consumer).
"""

from __future__ import annotations

import os
import secrets
import socket
import time
from contextlib import asynccontextmanager

import trio

from rocket import limits
from rocket.errors import Code, RocketError
from rocket.filter import compile_filter, matches_all
from rocket.model import Message, check_group_name, parse_iso_ms, read_charge
from rocket.client.throttle import Throttle
from rocket.serde import batch as batch_codec
from rocket.transport.channel import Channel


def parse_start(text: str) -> str | int:
    """'earliest', 'latest', or an ISO-8601 time (UTC unless it names a zone) as epoch ms."""
    if text in ("earliest", "latest"):
        return text
    return parse_iso_ms(text, f"--from {text!r}: earliest, latest or a time")


MODES = ("clustering", "broadcasting")


class Consumer:
    """In clustering mode the group's live members split the queues (rebalanced as members come and go); in
    broadcasting mode each member reads every queue, with positions of its own. Where there is no committed position
    for a queue, `start` decides: earliest, latest, or a time."""

    def __init__(self, channel: Channel, topic: str, group: str, *, start: str | int = "latest",
                 max_bytes: int = limits.consumer_pull_bytes_default, wait_ms: int = limits.consumer_wait_ms_default, filter_type: str = "tag", filter: str = "*",
                 mode: str = "clustering", member: str | None = None):
        """filter_type "tag" takes a tag expression ('a || b', '*'), "sql" an SQL92 expression over
        properties (and TAGS, KEYS); a malformed one fails open() with BAD_FILTER and its position.
        member names this consumer in its group (by default one made up per consumer; broadcasting
        members give a lasting one to resume where they left off)."""
        if mode not in MODES:
            raise RocketError(Code.BAD_REQUEST, f"mode {mode!r} is not one of {', '.join(MODES)}")
        self.channel = channel
        self.filter_type = filter_type
        self.filter = compile_filter(filter_type, filter)
        self.topic = topic
        self.group = check_group_name(group)
        self.mode = mode
        self.member = member or f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(4)}"
        # Broadcasting members keep positions of their own, as a group of their own.
        self._positions_group = check_group_name(f"{group}%{self.member}" if mode == "broadcasting" else group)
        self.start = start
        self.max_bytes = max_bytes
        self.wait_ms = wait_ms
        self.positions: dict[int, int] = {}
        self._committed: dict[int, int] = {}
        self._queues = 0
        self._heartbeat_at = 0.0
        # A pull sent while the previous response was decoded: (the positions it asked for, its response).
        self._ahead: tuple[dict[int, int], dict] | None = None
        self.throttle = Throttle()  # client quotas: what the broker told to wait (client/throttle.py)
        # (queue, offset, BAD_BATCH) of a batch that cannot be read: poll raises it while the queue is there.
        self._malformed: tuple[int, int, RocketError] | None = None

    async def open(self) -> None:
        described = await self.channel.call("DescribeTopic", {"topic": self.topic})
        self._queues = described["topic"]["queues"]
        if self.mode == "broadcasting":
            await self._take(set(range(self._queues)))
        else:
            await self._heartbeat()

    async def _take(self, queues: set[int]) -> None:
        """Read these queues from now on: from the group's committed positions, else from start."""
        committed = await self.channel.call("FetchOffsets", {"group": self._positions_group, "topic": self.topic})
        self._committed = {entry["queue"]: entry["offset"] for entry in committed["offsets"]}
        if self.start in ("earliest", "latest"):
            described = await self.channel.call("DescribeTopic", {"topic": self.topic})
            field = "min_offset" if self.start == "earliest" else "next_offset"
            fallback: dict[int, int] = {entry["queue"]: entry[field] for entry in described["queues"]}
        else:
            found = await self.channel.call("SearchOffset", {"topic": self.topic, "timestamp_ms": self.start})
            fallback = {entry["queue"]: entry["offset"] for entry in found["offsets"]}
        self.positions.update({queue: self._committed.get(queue, fallback[queue]) for queue in sorted(queues)})

    async def _heartbeat(self, leave: bool = False) -> None:
        """Clustering: tell the group this member is alive and read the queues it is given. Queues that
        go to another member are committed first, so it starts where this one stopped."""
        response = await self.channel.call("GroupHeartbeat", {"topic": self.topic, "group": self.group,
                                                              "member": self.member, "leave": leave})
        self._heartbeat_at = time.monotonic()
        assigned = set(response["queues"])
        if assigned == set(self.positions):
            return
        await self.commit()
        for queue in set(self.positions) - assigned:
            del self.positions[queue]
        if assigned - set(self.positions):
            await self._take(assigned - set(self.positions))

    async def close(self) -> None:
        """Commit, and leave the group so that the others take this member's queues at once."""
        await self.commit()
        if self.mode == "clustering":
            await self._heartbeat(leave=True)

    async def poll(self, wait_ms: int | None = None, limit: int | None = None) -> list[Message]:
        """One long-polling pull over this member's queues; returns at most limit messages in per-queue order."""
        return await self._poll(wait_ms, limit, self._decode)

    async def poll_bodies(self, wait_ms: int | None = None, limit: int | None = None) -> list[bytes]:
        """As poll(), but only the messages' bodies: no Message, key, tag or properties is made for each, which
        is most of a consumer's cost per small message. For a consumer without a filter."""
        if not matches_all(self.filter):
            raise RocketError(Code.BAD_REQUEST, "a consumer with a filter reads messages: poll(), not poll_bodies()")
        return await self._poll(wait_ms, limit, self._bodies)

    def seek(self, queue: int, offset: int) -> None:
        """Read queue from offset on (commit() stores it): to step past a batch that poll() refused with
        BAD_BATCH, whose message names the offset after it, or to read a queue again from an earlier offset."""
        if queue not in self.positions:
            raise RocketError(Code.BAD_REQUEST, f"queue {queue} of {self.topic!r} is not read by this consumer "
                              f"(it reads {sorted(self.positions)})")
        if not isinstance(offset, int) or not 0 <= offset < 2**63:
            raise RocketError(Code.BAD_REQUEST, f"offset {offset!r} is out of range")
        self.positions[queue] = offset
        self._ahead = None

    async def _poll(self, wait_ms: int | None, limit: int | None, decode) -> list:
        if self.mode == "clustering" and time.monotonic() - self._heartbeat_at >= limits.group_heartbeat_s:
            await self._heartbeat()
        self._raise_malformed()
        self._malformed = None  # a limit stopped before it, or seek() moved on: the pull below meets it again
        if not self.positions:  # more members than queues: this one waits its turn
            await trio.sleep((self.wait_ms if wait_ms is None else wait_ms) / 1000)
            return []
        ahead, self._ahead = self._ahead, None
        if ahead is not None and ahead[0] == self.positions:
            response = ahead[1]
        else:
            response = await self._pull(self.wait_ms if wait_ms is None else wait_ms)
        following = dict(self.positions)
        for entry in response["next_offsets"]:
            following[entry["queue"]] = max(following[entry["queue"]], entry["offset"])
        async with trio.open_nursery() as nursery:
            charged = sum(read_charge(len(stored["batch"])) for stored in response["batches"])
            if limit is None and charged * 2 >= self.max_bytes:  # as the server counts a pull's bytes
                # A backlog: ask for the next pull now, so that the server reads and sends it while this one is
                # decoded. It does not wait for new data (that is for the next poll's own pull).
                sent = trio.Event()
                nursery.start_soon(self._pull_ahead, dict(following), sent)  # a copy: positions change
                await sent.wait()  # decoding holds the thread: the request must be out before it starts
            items, resume = decode(response, self.positions, limit)
        # Each queue cut by the limit, or by a malformed batch, resumes at its first message not handed out.
        self.positions = following | resume
        if not items:
            self._raise_malformed()
        return items

    def _raise_malformed(self) -> None:
        """BAD_BATCH while a queue stands at a batch that cannot be read."""
        if self._malformed is not None:
            queue, offset, error = self._malformed
            if self.positions.get(queue) == offset:
                raise error

    async def _pull(self, wait_ms: int, positions: dict[int, int] | None = None, sent: trio.Event | None = None) -> dict:
        request = {
            "topic": self.topic,
            "queues": [{"queue": queue, "offset": offset}
                       for queue, offset in (self.positions if positions is None else positions).items()],
            "max_bytes": self.max_bytes,
            "wait_ms": wait_ms,
            "filter_type": self.filter_type,
            "filter": self.filter.expression,
        }
        await self.throttle.wait()
        response = await self.channel.call("Pull", request, timeout_s=limits.request_timeout_s_default + wait_ms / 1000,
                                           sent=sent)
        self.throttle.told(response)
        return response

    async def _pull_ahead(self, positions: dict[int, int], sent: trio.Event) -> None:
        """Fetch what follows positions for the next poll (sent is set once the request is out, or it failed);
        a failure is left for that poll's own pull to meet."""
        try:
            response = await self._pull(0, positions, sent)
        except RocketError:
            return
        finally:
            sent.set()
        if response["batches"]:
            self._ahead = (positions, response)

    def _decode(self, response: dict, wanted: dict[int, int], limit: int | None) -> tuple[list[Message], dict[int, int]]:
        """The messages of a pull response from the positions asked for, that the filter matches, at most limit
        of them; and where each queue cut by the limit or by a malformed batch resumes."""
        messages: list[Message] = []
        resume: dict[int, int] = {}
        for stored in response["batches"]:
            queue, base = stored["queue"], stored["base_offset"]
            first = base + max(0, wanted[queue] - base)
            decoded = self._read(stored, first, resume, response,
                                 lambda: batch_codec.decode(stored["batch"], base, queue))
            messages.extend(decoded[first - base:])
        if not matches_all(self.filter):  # batches may hold messages the filter does not match
            messages = [message for message in messages if self.filter.matches(message)]
        if limit is not None and len(messages) > limit:
            for message in reversed(messages[limit:]):  # ends at each queue's first message cut
                resume[message.queue] = message.offset
            del messages[limit:]
        return messages, resume

    def _bodies(self, response: dict, wanted: dict[int, int], limit: int | None) -> tuple[list[bytes], dict[int, int]]:
        """_decode's bodies only, for a consumer without a filter."""
        bodies: list[bytes] = []
        resume: dict[int, int] = {}
        for stored in response["batches"]:
            queue, base = stored["queue"], stored["base_offset"]
            first = base + max(0, wanted[queue] - base)
            if limit is not None and len(bodies) >= limit:
                resume.setdefault(queue, first)
                continue
            found = self._read(stored, first, resume, response, lambda: batch_codec.bodies(stored["batch"]))
            found = found[first - base:]
            if limit is not None and len(bodies) + len(found) > limit:
                resume.setdefault(queue, first + limit - len(bodies))
                del found[limit - len(bodies):]
            bodies.extend(found)
        return bodies, resume

    def _read(self, stored: dict, first: int, resume: dict[int, int], response: dict, read) -> list:
        """read() of a stored batch; nothing if its queue stopped at a batch before it. A malformed batch stops its
        queue: the queue resumes at it, and poll raises BAD_BATCH, naming its offsets, until seek() moves the queue
        (a consumer cannot read past a batch that it cannot read, but it must not be stuck at it either)."""
        queue = stored["queue"]
        if queue in resume:
            return []
        try:
            return read()
        except RocketError as error:
            if error.code != Code.BAD_BATCH:
                raise
            problem = error.message
        resume[queue] = first
        try:
            end = stored["base_offset"] + batch_codec.peek_count(stored["batch"])
        except RocketError:  # not even a header: where the response ends for the queue
            end = max([first + 1] + [entry["offset"] for entry in response["next_offsets"] if entry["queue"] == queue])
        if self._malformed is None:
            self._malformed = (queue, first, RocketError(Code.BAD_BATCH, (
                f"{self.topic!r} queue {queue}, offsets {first}-{end - 1}: {problem}; seek({queue}, {end}) steps past "
                f"them (or, with the group's consumers closed: rocket group reset {self.topic} --group {self._positions_group} --queue {queue} "
                f"--to {end})")))
        return []

    async def commit(self) -> None:
        """Store the group's position for every queue that moved since the last commit."""
        moved = [{"queue": queue, "offset": offset} for queue, offset in self.positions.items()
                 if self._committed.get(queue) != offset]
        if moved:
            await self.channel.call("CommitOffsets", {"group": self._positions_group, "topic": self.topic,
                                                      "offsets": moved})
            self._committed.update({entry["queue"]: entry["offset"] for entry in moved})


@asynccontextmanager
async def open_consumer(channel: Channel, topic: str, group: str, **options):
    consumer = Consumer(channel, topic, group, **options)
    await consumer.open()
    try:
        yield consumer
    finally:
        with trio.CancelScope(shield=True), trio.move_on_after(5):
            try:
                await consumer.close()
            except RocketError:  # the server is gone: the group lets this member expire
                pass
