"""The web console (issue 34), Console: read-only pages on the node's HTTP/1.1 listener, like RocketMQ's dashboard,
read through the node's own methods (dispatcher.local). No page writes anything; with auth on, each shows only what
its reader may read."""

from __future__ import annotations

import base64
import binascii
import contextvars
import dataclasses
import logging
import math
from importlib import resources

import trio

from rocket import __version__
from rocket.access import Access, needs_of
from rocket.clock import Clock
from rocket.errors import Code, RocketError
from rocket.gateway.console import pages
from rocket.gateway.console.history import RateHistory, Totals
from rocket.model import SYSTEM_PREFIX, Message, dead_letter_topic, parse_iso_ms, queue_for_key, timer_topic
from rocket.serde import batch as batch_codec
from rocket.transport.http1 import Asked, Response
from rocket.transport.guard import Caller
from rocket.transport.rpc import Dispatcher

log = logging.getLogger("rocket.console")

HTML = "text/html; charset=utf-8"
CALL_S = 10.0  # a method that has not answered by then is a notice ("no answer"), not a hung page
SAMPLE_EVERY_S = 10.0  # a rate point every 10 s ...
POINTS_MAX = 360  # ... for the last hour
RETRY_S = 1.0  # until the first sample succeeds (the roles start after the listener)
TOPICS_MAX = 500  # topics listed on a page; the rest are counted
DESCRIBES_MAX = 200  # DescribeGroup calls one page makes (a group on each topic)
MESSAGES_MAX = 50  # messages one search shows
SCAN_MESSAGES_MAX = 20_000  # messages one search reads at most (there is no key index)
PULL_BYTES = 1 << 20
DLQ_PREFIX = dead_letter_topic("", "")[:-2]  # "%DLQ"
OPEN_PATHS = frozenset({"/static/console.css"})  # what needs no sign-in with auth on: the stylesheet, the same for all
SIGN_IN = [("www-authenticate", 'Basic realm="rocket"')]
HIDDEN_NAMED_MAX = 5  # what a page left out for its reader: named up to this many, the rest counted


# The reader of the page being served, with auth on: the user its Basic credentials proved, from the client's address
# (None with auth off). Each HTTP/1.1 connection is one task, serving its requests one at a time, so the page's reads
# all see their own reader.
_viewer: contextvars.ContextVar[Caller | None] = contextvars.ContextVar("console_viewer", default=None)


class Refused(Exception):
    """A page its reader may not read at all: a 403 whose notice says what is missing."""


class Console:
    """The console's pages: the cluster, topics, consumer groups, storage groups, messages (looked up by id, by key
    and by time), and charts of the last hour's rates. It reads through the node's own methods (dispatcher.local), as
    the other gateways do, and keeps its own rate history, sampled by a task in the node's nursery (run). A method
    this node's roles do not serve, or that fails, is a notice on the page.

    It is read-only: no page writes anything (no admin actions). With auth on (rocket/access.py), every page but the
    stylesheet asks for HTTP Basic credentials (the user's access key and secret; 401 and `WWW-Authenticate` without
    them; a failed sign-in goes through `Access.failed`, as any other), and shows what that user may read, as the
    node decides it (Guard.authorize): the cluster's lists to any signed-in user, as the methods behind them
    (access.SIGNED_IN); a topic's page and its messages only to a user who may Pull from it, a group's to one who may
    describe it (403 otherwise, naming what is missing). Within a page, every method it calls is checked as that
    user, and what the user may not read (another group's position on a topic) is left out with a notice naming it.
    /metrics and the probes are not the console's: they stay open."""

    def __init__(self, dispatcher: Dispatcher, clock: Clock, node_id: int = 0, roles: tuple[str, ...] = (),
                 sample_every_s: float = SAMPLE_EVERY_S, points_max: int = POINTS_MAX):
        self.dispatcher = dispatcher
        self.clock = clock
        self._node = pages.Node(node_id, tuple(roles), __version__)
        self.sample_every_s = sample_every_s
        self.history = RateHistory(points_max)

    @property
    def node(self) -> pages.Node:
        """This node, for the header, with the page's reader when auth is on."""
        viewer = _viewer.get()
        return self._node if viewer is None else dataclasses.replace(self._node, user=viewer.user)

    def routes(self) -> dict:
        """For serve_http1: "/" and every path under it (the node's exact paths, /metrics and the probes, win)."""
        return {"/*": self.page}

    async def run(self, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Sample the topics' totals every sample_every_s, for the charts (retried every second until one works)."""
        task_status.started()
        while True:
            worked = await self.sample()
            await trio.sleep(self.sample_every_s if worked else RETRY_S)

    async def sample(self) -> bool:
        if not self.dispatcher.serves("TierStatus"):
            return False
        try:
            with trio.fail_after(CALL_S):
                topics = (await self.dispatcher.local("TierStatus", {"topic": ""}))["topics"]
            totals = {entry["topic"]["name"]: Totals(sum(queue["next_offset"] for queue in entry["queues"]),
                                                     sum(queue["local_bytes"] + queue["tiered_bytes"]
                                                         for queue in entry["queues"]),
                                                     entry["topic"].get("created_ms", 0))
                      for entry in topics if not entry["topic"]["name"].startswith(SYSTEM_PREFIX)}
        except (RocketError, trio.TooSlowError) as error:
            log.debug("console sample: %s", error)
            return False
        except Exception:  # the charts must not take the node down with them
            log.exception("console sample failed")
            return False
        self.history.add(self.clock.wall_ms(), totals)
        return True

    # Who reads: with auth on, a user signed in with HTTP Basic credentials, and what the policies let them read.

    @property
    def _access(self) -> Access:
        """The node's users, whom readers sign in as, only with auth on."""
        assert self.dispatcher.guard.access is not None, "auth is off"
        return self.dispatcher.guard.access

    def sign_in(self, asked: Asked | None) -> Caller:
        """The user a request's Basic credentials prove (access key, secret), or UNAUTHENTICATED. Wrong credentials
        are counted against the client's address as any failed sign-in (access.failed); none at all, a browser's
        first request, are not."""
        source = asked.source if asked is not None else ""
        self._access.refuse_if_guessing(source)
        header = asked.headers.get("authorization", "") if asked is not None else ""
        if not header:
            raise RocketError(Code.UNAUTHENTICATED, "the console needs a user: sign in with an access key and its "
                              "secret")
        scheme, _, encoded = header.partition(" ")
        try:
            user, colon, password = base64.b64decode(encoded.strip(), validate=True).decode().partition(":")
        except (binascii.Error, UnicodeDecodeError):
            colon = ""
        if scheme.lower() != "basic" or not colon:
            raise self._access.failed(source, RocketError(Code.UNAUTHENTICATED, "console: the Authorization header "
                                                         "holds no HTTP Basic credentials"))
        return Caller(source=source, user=self._access.check_secret(user, password.encode(), source, "console"))

    def require(self, method: str, request: dict) -> None:
        """A page's own check, as the node's method it shows the reads of: raise Refused (counted against the
        reader's address) unless its reader may make that call."""
        viewer = _viewer.get()
        try:
            self.dispatcher.guard.authorize(viewer, method, request)
        except RocketError as error:
            if viewer is None or "no policy allows" not in error.message:  # denied outright, or the user is gone
                raise Refused(error.message) from None
            grants = "; ".join(f"rocket acl grant {viewer.user} --resource {resource} --actions {action}"
                               for action, resource in needs_of(method, request))
            raise Refused(f"{error.message}. An admin grants it with: {grants}") from None

    def denied(self, method: str, request: dict) -> str | None:
        """Why the page's reader may not make the call (None if they may). Not counted as a failure: the page, not
        its reader, chose to look (a topic's page looks at every known group's position on it)."""
        viewer = _viewer.get()
        try:
            self.dispatcher.guard.authorize(viewer, method, request, counted=False)
        except RocketError as error:
            return error.message.removeprefix(f"user {viewer.user!r}: ") if viewer is not None else error.message
        return None

    def hidden_note(self, hidden: list[str]) -> list[str]:
        """The notice for what a page left out for its reader, naming what is missing."""
        hidden = list(dict.fromkeys(hidden))
        if not hidden:
            return []
        viewer = _viewer.get()
        more = f"; and {len(hidden) - HIDDEN_NAMED_MAX} more" if len(hidden) > HIDDEN_NAMED_MAX else ""
        return [f"Left out, as {viewer.user if viewer else 'you'} may not read it: "
                + "; ".join(hidden[:HIDDEN_NAMED_MAX]) + more + "."]

    # Reading the node's methods.

    async def call(self, name: str, request: dict) -> tuple[dict | None, str]:
        """(the answer, "") or (None, why not): not served by this node's roles, not the reader's to read (auth on),
        failed, or no answer in CALL_S."""
        if not self.dispatcher.serves(name):
            return None, (f"This node's roles ({', '.join(self.node.roles) or 'none'}) do not serve {name}: "
                          "open the console of a node with a broker role.")
        why = self.denied(name, request)
        if why is not None:
            return None, f"{name} is not shown: {why}."
        try:
            with trio.fail_after(CALL_S):
                return await self.dispatcher.local(name, request), ""
        except trio.TooSlowError:
            return None, f"{name} did not answer in {CALL_S:g} s."
        except RocketError as error:
            return None, f"{name} failed: {error.code.name}: {error.message}"

    async def known_groups(self) -> tuple[dict[str, dict | None], list[str], str]:
        """The consumer groups this console can name: those with settings, and those with dead letters of a topic
        (their %DLQ% topics); the user topics; and why a list could not be read."""
        settings, why = await self.call("ConsumerGroups", {"group": ""})
        listed, why_topics = await self.call("ListTopics", {})
        groups: dict[str, dict | None] = {entry["group"]: entry for entry in (settings or {}).get("groups", [])}
        names = [topic["name"] for topic in (listed or {}).get("topics", [])]
        user = [name for name in names if not name.startswith(SYSTEM_PREFIX)]
        for name in names:
            if name.startswith(DLQ_PREFIX + "%"):  # %DLQ%group%topic: the topic is one of the user's
                rest = name[len(DLQ_PREFIX) + 1:]
                for topic in user:
                    if rest.endswith("%" + topic):
                        groups.setdefault(rest[:-len(topic) - 1], None)
                        break
        return dict(sorted(groups.items())), user, why or why_topics

    async def positions(self, group: str, topics: list[str], budget: list[int],
                        hidden: list[str]) -> tuple[list[tuple[str, list[dict]]], list[str]]:
        """The topics on which the group has a position (committed, popped, in flight, dead letters or a member),
        with its GroupQueue per queue; budget[0] DescribeGroup calls at most (spent from it). A (group, topic) the
        page's reader may not read is skipped, and why added to hidden."""
        found, notes = [], []
        for topic in topics:
            why = self.denied("DescribeGroup", {"topic": topic, "group": group})
            if why is not None:
                hidden.append(why)
                continue
            if budget[0] <= 0:
                notes.append(f"not every topic was read for {group}: at most {DESCRIBES_MAX} lookups a page")
                break
            budget[0] -= 1
            described, why = await self.call("DescribeGroup", {"topic": topic, "group": group})
            if described is None:
                notes.append(why)
                continue
            queues = described["queues"]
            if any(queue["committed"] >= 0 or queue["pop_done_before"] > queue["min_offset"] or queue["in_flight"]
                   or queue["dead_letters"] or queue["member"] for queue in queues):
                found.append((topic, queues))
        return found, notes

    # The pages.

    async def page(self, path: str, query: dict[str, str], asked: Asked | None = None) -> Response:
        path = path.rstrip("/") or "/"
        viewer = None
        if self.dispatcher.guard.access is not None and path not in OPEN_PATHS:
            try:
                viewer = self.sign_in(asked)
            except RocketError as error:
                return 401, "text/plain; charset=utf-8", f"{error.message}\n".encode(), SIGN_IN
        token = _viewer.set(viewer)
        try:
            return await self._page(path, query)
        except Refused as refused:
            return 403, HTML, pages.refused_page(self.node, str(refused)).encode()
        except Exception as error:  # a page must not take the listener down: say what failed
            log.exception("console page %s failed", path)
            return 500, HTML, pages.error_page(self.node, f"this page failed: {type(error).__name__}: {error}").encode()
        finally:
            _viewer.reset(token)

    async def _page(self, path: str, query: dict[str, str]) -> Response:
        if path == "/":
            return await self.cluster()
        if path == "/topics":
            return await self.topics(query.get("system") == "1")
        if path.startswith("/topics/"):
            return await self.topic(path[len("/topics/"):])
        if path == "/groups":
            return await (self.group(query["group"], query.get("topic", "")) if query.get("group")
                          else self.groups())
        if path.startswith("/groups/"):
            return await self.group(path[len("/groups/"):], query.get("topic", ""))
        if path == "/storage":
            return await self.storage()
        if path == "/messages":
            return await self.messages(query)
        if path == "/static/console.css":
            css = resources.files("rocket.gateway.console").joinpath("static/console.css").read_bytes()
            return 200, "text/css; charset=utf-8", css
        return 404, HTML, pages.not_found_page(self.node, path).encode()

    def now(self) -> int:
        return self.clock.wall_ms()

    async def cluster(self) -> Response:
        status, why = await self.call("ClusterStatus", {})
        health, why_health = await self.call("NodeHealth", {"node": 0})
        return 200, HTML, pages.cluster_page(self.node, status, why, health, why_health, self.history.rates(),
                                             self.now(), self.sample_every_s).encode()

    async def topics(self, system: bool) -> Response:
        tier, why = await self.call("TierStatus", {"topic": ""})
        topics = None
        cut = 0
        if tier is not None:
            topics = [entry for entry in tier["topics"] if system or not entry["topic"]["name"].startswith(SYSTEM_PREFIX)]
            cut, topics = max(0, len(topics) - TOPICS_MAX), topics[:TOPICS_MAX]
        latest = {entry["topic"]["name"]: self.history.latest(entry["topic"]["name"]) for entry in topics or []}
        return 200, HTML, pages.topics_page(self.node, topics, why, latest, self.history.rates(), self.now(),
                                            self.sample_every_s, cut).encode()

    async def topic(self, name: str) -> Response:
        self.require("Pull", {"topic": name})  # its queues, rates and readers: as much as reading it tells
        described, why = await self.call("DescribeTopic", {"topic": name})
        if described is None:
            return 404 if "UNKNOWN_TOPIC" in why else 200, HTML, pages.topic_page(
                self.node, name, None, why, None, [], "", [], self.now(), self.sample_every_s).encode()
        tier, _ = await self.call("TierStatus", {"topic": name})
        groups, _, why_groups = await self.known_groups()
        budget, found, notes, hidden = [DESCRIBES_MAX], [], [why_groups] if why_groups else [], []
        for group in groups:
            positions, group_notes = await self.positions(group, [name], budget, hidden)
            found.extend((group, queues) for _, queues in positions)
            notes.extend(group_notes)
        notes.extend(self.hidden_note(hidden))
        tier_queues = tier["topics"][0]["queues"] if tier and tier["topics"] else None
        return 200, HTML, pages.topic_page(self.node, name, described, why, tier_queues, found,
                                           " ".join(dict.fromkeys(notes)), self.history.rates(name), self.now(),
                                           self.sample_every_s).encode()

    async def groups(self) -> Response:
        groups, topics, why = await self.known_groups()
        if not groups and why:
            return 200, HTML, pages.groups_page(self.node, None, why, []).encode()
        budget, rows, notes, hidden = [DESCRIBES_MAX], [], [why] if why else [], []
        for group, settings in groups.items():
            positions, group_notes = await self.positions(group, topics, budget, hidden)
            rows.append(pages.GroupRow(group, settings, positions))
            notes.extend(group_notes)
        notes.extend(self.hidden_note(hidden))
        notes.append("Listed: the groups with settings (rocket group create) or with dead letters. "
                     "Look any other group up by name.")
        return 200, HTML, pages.groups_page(self.node, rows, "", list(dict.fromkeys(notes))).encode()

    async def group(self, name: str, topic: str) -> Response:
        self.require("DescribeGroup", {"group": name})
        settings, why = await self.call("ConsumerGroups", {"group": name})
        notes = []
        if settings is None and "NOT_FOUND" not in why and "BAD_REQUEST" not in why:
            notes.append(why)
        if topic:
            topics = [topic]
        else:
            _, topics, why_topics = await self.known_groups()
            if why_topics:
                notes.append(why_topics)
        hidden: list[str] = []
        positions, more = await self.positions(name, topics, [DESCRIBES_MAX], hidden)
        found_settings = (settings or {}).get("groups") or [None]
        return 200, HTML, pages.group_page(self.node, name, found_settings[0], positions,
                                           list(dict.fromkeys(notes + more)) + self.hidden_note(hidden)).encode()

    async def storage(self) -> Response:
        classes, why = await self.call("StorageClasses", {"name": ""})
        status, why_status = await self.call("ClusterStatus", {})
        return 200, HTML, pages.storage_page(self.node, None if classes is None else classes["classes"], why, status,
                                             why_status).encode()

    # Messages: by id, by key over a time range, from a time, or the latest.

    async def messages(self, query: dict[str, str]) -> Response:
        topic = query.get("topic", "").strip()
        if not topic:
            return 200, HTML, pages.messages_page(self.node, query, None, "Name a topic to browse its messages.",
                                                  "").encode()
        # Reading its messages needs what a Pull does. This one check covers the page's reads of the topic (its
        # SearchOffset and Pull calls below, and on a delay topic its timer topic's).
        self.require("Pull", {"topic": topic})
        try:
            found, what, note = await self.find(topic, query)
        except RocketError as error:
            found, what, note = None, "", f"{error.code.name}: {error.message}"
        return 200, HTML, pages.messages_page(self.node, query, found, note, what).encode()

    async def find(self, topic: str, query: dict[str, str]) -> tuple[list[Message], str, str]:
        described, why = await self.call("DescribeTopic", {"topic": topic})
        if described is None:
            raise RocketError(Code.UNAVAILABLE, why)
        spec = described["topic"]
        queues: dict[int, dict[str, int]] = {info["queue"]: info for info in described["queues"]}  # offsets, by queue
        start_ms, end_ms = parse_time(query.get("from", ""), "from"), parse_time(query.get("to", ""), "to")
        if query.get("id", "").strip():
            queue, offset = parse_id(query["id"])
            message = await self.message_at(topic, spec, queue, offset)
            return ([] if message is None else [message]), f"Message {queue}.{offset} of {topic}", ""
        key = query.get("key", "")
        if key:
            queue = queue_for_key(key, spec["queues"])
            begin = (await self.offsets_at(topic, start_ms or 0)).get(queue, queues[queue]["min_offset"])
            found, scanned, cut = await self.scan(topic, queue, begin, queues[queue]["next_offset"], end_ms,
                                                  lambda message: message.key == key)
            note = f"read {scanned:,} messages of queue {queue} (the key's queue; there is no key index)"
            if cut:
                note += f": stopped at {SCAN_MESSAGES_MAX:,}, narrow the time range"
            return found, f"Messages with key {key!r} on {topic}", note
        if start_ms is not None:
            starts = await self.offsets_at(topic, start_ms)
            per_queue = max(1, math.ceil(MESSAGES_MAX / max(1, len(queues))))
            found = []
            for queue, info in sorted(queues.items()):
                begin = starts.get(queue, info["min_offset"])
                found.extend((await self.scan(topic, queue, begin, min(info["next_offset"], begin + per_queue),
                                              end_ms, lambda message: True))[0])
            found.sort(key=lambda message: (message.timestamp_ms, message.queue, message.offset))
            return found[:MESSAGES_MAX], f"Messages of {topic} from {pages.when(start_ms)} UTC", ""
        per_queue = max(1, math.ceil(MESSAGES_MAX / max(1, len(queues))))
        found = []
        for queue, info in sorted(queues.items()):
            begin = max(info["min_offset"], info["next_offset"] - per_queue)
            found.extend((await self.scan(topic, queue, begin, info["next_offset"], None, lambda message: True))[0])
        found.sort(key=lambda message: (message.timestamp_ms, message.queue, message.offset), reverse=True)
        return found[:MESSAGES_MAX], f"The latest messages of {topic}", ""

    async def offsets_at(self, topic: str, timestamp_ms: int) -> dict[int, int]:
        found = await self.dispatcher.local("SearchOffset", {"topic": topic, "timestamp_ms": timestamp_ms})
        return {entry["queue"]: entry["offset"] for entry in found["offsets"]}

    async def scan(self, topic: str, queue: int, offset: int, end: int, end_ms: int | None,
                   wanted) -> tuple[list[Message], int, bool]:
        """The messages of a queue from offset to end (and stored by end_ms) that wanted takes, MESSAGES_MAX at most,
        reading SCAN_MESSAGES_MAX at most; also how many were read, and whether that cut it short."""
        found: list[Message] = []
        scanned = 0
        while offset < end and len(found) < MESSAGES_MAX:
            if scanned >= SCAN_MESSAGES_MAX:
                return found, scanned, True
            response = await self.dispatcher.local("Pull", {"topic": topic, "queues": [{"queue": queue, "offset": offset}],
                                                            "max_bytes": PULL_BYTES, "wait_ms": 0, "filter_type": "tag", "filter": "*"})
            if not response["batches"]:
                break
            for stored in response["batches"]:
                for message in batch_codec.readable(stored["batch"], stored["base_offset"], queue) or []:
                    if not offset <= message.offset < end:
                        continue
                    scanned += 1
                    if end_ms is not None and message.timestamp_ms > end_ms:
                        return found, scanned, False
                    if wanted(message) and len(found) < MESSAGES_MAX:
                        found.append(message)
            next_offset = next((entry["offset"] for entry in response["next_offsets"] if entry["queue"] == queue), end)
            if next_offset <= offset:
                break
            offset = next_offset
        return found, scanned, False

    async def message_at(self, topic: str, spec: dict, queue: int, offset: int) -> Message | None:
        """The message at queue and offset or, on a delay topic, the delayed message with that timer id."""
        names = [topic, timer_topic(topic)] if spec.get("message_type") == "delay" else [topic]
        for name in names:
            try:
                response = await self.dispatcher.local("Pull", {"topic": name, "queues": [{"queue": queue,
                                                                                            "offset": offset}],
                                                                "max_bytes": 1, "wait_ms": 0, "filter_type": "tag",
                                                                "filter": "*"})
            except RocketError as error:
                if error.code in (Code.NOT_FOUND, Code.OFFSET_OUT_OF_RANGE):
                    continue
                raise
            for stored in response["batches"]:
                for message in batch_codec.readable(stored["batch"], stored["base_offset"], queue) or []:
                    if message.offset == offset:
                        return message
        return None


def parse_id(text: str) -> tuple[int, int]:
    queue, dot, offset = text.strip().partition(".")
    if not dot or not queue.isdigit() or not offset.isdigit():
        raise RocketError(Code.BAD_REQUEST, f"a message id is QUEUE.OFFSET, as `rocket send` prints it, not {text!r}")
    return int(queue), int(offset)


def parse_time(text: str, name: str) -> int | None:
    """Epoch ms, or an ISO 8601 time (UTC unless it names its zone); None when empty."""
    text = text.strip()
    if not text:
        return None
    if text.isdigit():
        return int(text)
    return parse_iso_ms(text, f"{name}: {text!r} is neither epoch ms nor a time")
