"""The RPC dispatcher for both transports: a call passes a short chain (guard.py admits and authorizes it,
metering.py holds and charges it against the client quotas, on_call observes it), then its handler; methods.py
declares each method once. TCP and HTTP/2 only move bytes.
"""

from __future__ import annotations

import logging
import math
from collections.abc import AsyncGenerator, Awaitable, Callable
from types import ModuleType
from typing import Any, cast

import trio

from rocket import __version__
from rocket.errors import Code, RocketError, leaf_exceptions
from rocket.parked import Awaited, Slot, Unparked
from rocket.serde import typed
from rocket.serde.schema import SCHEMA_VERSION
from rocket.transport.guard import ABOUT_CONNECTION, Caller, Guard
from rocket.transport.metering import Metering
from rocket.transport.methods import CONSUMING, PRODUCING, TELLS_THROTTLE, MethodSpec, detach, method_spec

log = logging.getLogger("rocket.rpc")


def as_rocket_error(error: BaseException, method: str) -> RocketError:
    """Operating errors pass through, and so does the first of a group of them (a handler's concurrent parts that
    each failed so: every queue's proposal refused by a node that lost its leadership); anything else is a bug,
    logged and answered as INTERNAL."""
    if isinstance(error, RocketError):
        return error
    if isinstance(error, BaseExceptionGroup):
        leaves = list(leaf_exceptions(error))
        if all(isinstance(leaf, RocketError) for leaf in leaves):
            return cast(RocketError, leaves[0])
    log.exception("method %s failed", method, exc_info=error)
    return RocketError(Code.INTERNAL, f"{method} failed: {type(error).__name__}")


class Dispatcher:
    """Maps method names to handlers and turns request bytes into response bytes.

    A call from the wire passes guard.admit (before it is decoded) and guard.authorize, the node's one authorization
    point, which local calls made as a user pass too; on brokers metering holds a throttled caller and charges what
    the call used after it is served; on_call observes it. The dispatcher answers Hello (schema versions) itself. A
    method may have a parked handler besides its task handler (handle, park): Produce, KvPut and KvGet on brokers,
    StorageAppend, StorageKvTxn and StorageKvRead on storage nodes.

    To add a client RPC method: define it once in methods.METHODS, write its handler in the broker part of its concern
    (rocket/roles/broker/) and route it in Broker.register, and add its Avro schemas under rocket/serde/schemas/. It
    is then served over TCP and HTTP/2 alike.
    """

    def __init__(self) -> None:
        self._handlers: dict[str, Callable] = {}
        self._parked: dict[str, Callable[[dict, Slot], None]] = {}  # the data plane's handlers (park)
        # Told of every call served from the wire: method, seconds, error code name or None (the node's metrics).
        self.on_call: Callable[[str, float, str | None], None] | None = None
        self.guard = Guard()  # who calls, and whether they may
        self.metering = Metering(self.guard)  # on brokers: the client quotas
        self._handlers["Hello"] = self._hello

    @staticmethod
    async def _hello(request: dict) -> dict:
        return {"schema_version": SCHEMA_VERSION, "version": __version__}

    def handle(self, name: str, handler: Callable, parked: Callable[[dict, Slot], None] | None = None) -> None:
        """handler serves the method as a task; parked, if given, serves it on the data plane (park)."""
        method_spec(name)
        self._handlers[name] = handler
        if parked is not None:
            self._parked[name] = parked

    def handle_typed(self, name: str, handler: Callable[[Any], Awaitable[Any]]) -> None:
        """handler takes and returns the typed messages (rocket/serde/typed.py) of the method's request and response
        types; the dispatcher converts from and to the plain form its serdes speak."""
        spec = method_spec(name)
        request_type, _ = typed.STRUCTS[spec.request_type], typed.STRUCTS[spec.response_type]  # both typed

        async def plain_handler(request: dict) -> dict:
            return typed.plain(await handler(typed.convert(request, request_type)))
        self.handle(name, plain_handler)

    def parks(self, name: str) -> bool:
        """Whether the method has a data-plane handler here (park)."""
        return name in self._parked

    def park(self, name: str, serde: ModuleType, body: bytes | memoryview,
             attachment: memoryview | list[memoryview] | None, caller: Caller, slot: Slot) -> None:
        """Serve a call from the wire on the data plane, in the caller's read loop: decoded, checked and authorized
        as call() does, then handed to the method's parked handler, which parks it. slot completes once with the
        encoded response and its attachments (call()'s result), or with a RocketError. Raises Unparked, having done
        nothing, when the call must be served by call() as a task instead (a throttled caller, or the handler's
        say: no cached route, no open channel to the leader); RocketError when it is refused at once. Over TCP the
        Raft round that applies the call's entry (or, for a get, the leader's lease) completes its slot, and the
        connection's writer sends that round's answers in one write."""
        if self.metering.charged(caller):  # quotas hold a call as it waits: the task path's
            raise Unparked
        spec, handler = self._resolve(name, caller)
        request = serde.decode(spec.request_type, body)
        self.guard.authorize(caller, name, request)
        if attachment is not None:
            if spec.attachment_field is None or isinstance(attachment, list):
                raise RocketError(Code.BAD_REQUEST, f"{name} takes no attachments" if spec.attachment_field is None
                                  else f"{name} takes one attachment")
            request[spec.attachment_field] = attachment
        started = trio.current_time()

        def answer(outcome: object) -> None:
            if isinstance(outcome, RocketError):
                self._observe(name, started, outcome.code.name)
                slot.complete(outcome)
                return
            self._observe(name, started, None)
            response, attachments = detach(spec, cast(dict, outcome))  # not an error: the handler's response
            slot.complete((serde.encode(spec.response_type, response), attachments))
        try:
            self._parked[name](request, Slot(answer))
        except Unparked as unparked:
            unparked.request = request  # decoded: call() takes it as it is
            raise
        except RocketError:
            raise
        except Exception as error:
            raise as_rocket_error(error, name) from None

    def park_local(self, name: str, request: dict, slot: Slot) -> None:
        """Hand a call from this process (one role to another) to the method's parked handler: no serde, no
        checks, as local() does. Raises Unparked or RocketError as park() does."""
        self._parked[name](request, slot)

    def _resolve(self, name: str, caller: Caller | None = None) -> tuple[MethodSpec, Callable[..., Any] | None]:
        """The method's spec and handler; no handler for the methods about the connection, answered here."""
        spec = method_spec(name)
        self.guard.admit(spec, caller)
        if name in ABOUT_CONNECTION:  # the guard answers them
            return spec, None
        handler = self._handlers.get(name)
        if handler is None:
            raise RocketError(Code.UNKNOWN_METHOD, f"method {name!r} is not served by this node's roles")
        return spec, handler

    async def local(self, name: str, request: dict, caller: Caller | None = None) -> dict:
        """Call this node's own handler directly, without serde or socket: one role to another in the same process,
        or a gateway or the console on a user's behalf (caller: the user, authorized as a call from the wire is;
        None: the node itself, trusted). Raises RocketError like a remote call. A method with a parked handler is
        served by it, this task waiting for the slot (which completes exactly once: rocket/parked.py), unless it
        cannot park the call."""
        self.guard.authorize(caller, name, request)
        parked = self._parked.get(name)
        if parked is not None:
            slot = Awaited()
            try:
                parked(request, slot)
            except Unparked:
                pass
            except Exception as error:
                raise as_rocket_error(error, name) from None
            else:
                await slot.event.wait()
                return cast(dict, slot.value())  # a method's response
        _, handler = self._resolve(name)
        try:
            return await cast(Callable, handler)(request)  # roles call roles' methods, never those without handler
        except Exception as error:
            raise as_rocket_error(error, name) from None

    def serves(self, name: str) -> bool:
        """Whether this node's roles serve the method."""
        return name in self._handlers

    def is_streaming(self, name: str) -> bool:
        return method_spec(name).streaming

    async def call(self, name: str, serde: ModuleType, body: bytes | memoryview,
                   attachment: memoryview | list[memoryview] | None = None, detached: bool = False,
                   caller: Caller | None = None, decoded: dict | None = None,
                   answered: bool = True) -> tuple[bytes, list | None]:
        """Run a unary method: the encoded response and, if detached, its attachable bytes apart from it
        (see MethodSpec.response_attachments). caller: who called from the wire (None: this process, trusted).
        decoded: the request as park() decoded it, if it went there first. A call nobody hears the answer of (a POST
        frame's) is not answered: (b"", None), the response not encoded. Raises RocketError for every failure."""
        spec, handler = self._resolve(name, caller)
        if spec.streaming:
            raise RocketError(Code.BAD_REQUEST, f"{name} is a streaming method")
        charged = self.metering.charged(caller)
        if charged:
            await self.metering.held(caller)
        request = decoded if decoded is not None else serde.decode(spec.request_type, body)
        self.guard.authorize(caller, name, request)
        if handler is None:
            answer = self.guard.about_connection(name, request, caller or Caller())
            return serde.encode(spec.response_type, answer), None
        if attachment is not None:
            if spec.attachment_field is None:
                raise RocketError(Code.BAD_REQUEST, f"{name} takes no attachments")
            if isinstance(attachment, list):
                raise RocketError(Code.BAD_REQUEST, f"{name} takes one attachment")
            request[spec.attachment_field] = attachment
        started = trio.current_time()
        try:
            response = await handler(request)
        except Exception as error:
            failure = as_rocket_error(error, name)
            self._observe(name, started, failure.code.name)
            if charged:
                self.metering.charge(caller, request.get("topic") or "")
            raise failure from None
        self._observe(name, started, None)
        if not answered:
            return b"", None
        attachments = None
        if detached:
            response, attachments = detach(spec, response)
        encoded = serde.encode(spec.response_type, response)
        if charged:  # Kafka's way: served first, then the debt decides the throttle of the answer and what follows
            produced = len(body) + (len(attachment) if attachment is not None else 0) if name in PRODUCING else 0
            consumed = len(encoded) + sum(map(len, attachments or ())) if name in CONSUMING else 0
            throttle_s = self.metering.charge(caller, request.get("topic") or "", produced, consumed)
            if throttle_s and name in TELLS_THROTTLE:
                encoded = serde.encode(spec.response_type, {**response, "throttle_ms": math.ceil(throttle_s * 1000)})
        return encoded, attachments

    async def stream(self, name: str, serde: ModuleType, body: bytes | memoryview,
                     caller: Caller | None = None) -> AsyncGenerator[bytes, None]:
        """Run a streaming method, yielding encoded items; raises RocketError for every failure."""
        spec, handler = self._resolve(name, caller)
        if not spec.streaming:
            raise RocketError(Code.BAD_REQUEST, f"{name} is not a streaming method")
        request = serde.decode(spec.request_type, body)
        self.guard.authorize(caller, name, request)
        charged = self.metering.charged(caller)
        if charged:
            await self.metering.held(caller)
            self.metering.charge(caller, request.get("topic") or "")
        started = trio.current_time()
        try:
            async for item in cast(Callable, handler)(request):  # streaming: none of the methods without handler
                encoded = serde.encode(spec.response_type, item)
                yield encoded
                if charged and name in CONSUMING:  # a stream is held item by item
                    throttle_s = self.metering.charge(caller, request.get("topic") or "", consumed=len(encoded),
                                                      requests=0)
                    if throttle_s:
                        await trio.sleep(throttle_s)
        except Exception as error:
            failure = as_rocket_error(error, name)
            self._observe(name, started, failure.code.name)
            raise failure from None
        self._observe(name, started, None)

    def _observe(self, name: str, started: float, error: str | None) -> None:
        if self.on_call is not None:
            self.on_call(name, trio.current_time() - started, error)
