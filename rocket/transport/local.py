"""Channels that never leave the process: LocalChannel runs each call through a Dispatcher as the TCP transport
would, serde both ways and no socket; MockChannel answers from a handler per method and records the calls."""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Callable
from contextlib import aclosing

import trio

from rocket import limits
from rocket.errors import Code, RocketError
from rocket.serde import serde_named
from rocket.transport.channel import Channel
from rocket.transport.methods import attach, encode_error, method_spec
from rocket.transport.rpc import Dispatcher


class LocalChannel(Channel):
    """A client of a Dispatcher in this process. Requests and responses go through the serde and attachments
    are detached as over TCP, so a handler sees what a remote call would give it, and the caller gets the same
    response or RocketError a TCP client would."""

    def __init__(self, dispatcher: Dispatcher, serde_name: str = "json"):
        self._dispatcher = dispatcher
        self._serde = serde_named(serde_name)

    async def call(self, method: str, message: dict, timeout_s: float = limits.request_timeout_s_default,
                   sent: trio.Event | None = None) -> dict:
        spec = method_spec(method)
        attachment = None
        if spec.attachment_field is not None:
            attachment = memoryview(message[spec.attachment_field])
            message = {**message, spec.attachment_field: b""}
        body = self._serde.encode(spec.request_type, message)
        if sent is not None:
            sent.set()
        try:
            with trio.fail_after(timeout_s):
                reply, attachments = await self._dispatcher.call(method, self._serde, body, attachment, detached=True)
        except trio.TooSlowError:
            raise RocketError(Code.TIMEOUT, f"{method} got no answer within {timeout_s} s") from None
        except RocketError as error:
            raise self._as_received(error) from None
        response = self._serde.decode(spec.response_type, reply)
        if isinstance(attachments, list):
            attach(spec, response, [memoryview(attachment) for attachment in attachments])
        return response

    async def stream(self, method: str, message: dict) -> AsyncIterator[dict]:
        spec = method_spec(method)
        body = self._serde.encode(spec.request_type, message)
        async with aclosing(self._dispatcher.stream(method, self._serde, body)) as items:
            while True:
                try:
                    item = await anext(items)
                except StopAsyncIteration:
                    return
                except RocketError as error:
                    raise self._as_received(error) from None
                yield self._serde.decode(spec.response_type, item)

    def _as_received(self, error: RocketError) -> RocketError:
        """The error as a TCP client decodes it from an ERROR frame: its code and message, nothing more."""
        return RocketError.from_wire(self._serde.decode("Error", encode_error(self._serde, error)))


class MockChannel(Channel):
    """A channel for tests: handlers[method](message) answers a call with a dict, or a stream with an iterable
    (or async iterable) of dicts; a handler may be async and may raise RocketError. calls records every
    (method, message) in order."""

    def __init__(self, handlers: dict[str, Callable] | None = None):
        self.handlers = dict(handlers or {})
        self.calls: list[tuple[str, dict]] = []

    def messages(self, method: str) -> list[dict]:
        """The messages sent to method, in order."""
        return [message for called, message in self.calls if called == method]

    def _handler(self, method: str, message: dict) -> Callable:
        method_spec(method)  # a method no server knows is the caller's bug, as on every channel
        self.calls.append((method, message))
        handler = self.handlers.get(method)
        if handler is None:
            raise RocketError(Code.UNKNOWN_METHOD, f"method {method!r} has no handler in this MockChannel")
        return handler

    async def call(self, method: str, message: dict, timeout_s: float = limits.request_timeout_s_default,
                   sent: trio.Event | None = None) -> dict:
        handler = self._handler(method, message)
        if sent is not None:
            sent.set()
        try:
            with trio.fail_after(timeout_s):
                response = handler(message)
                return await response if inspect.isawaitable(response) else response
        except trio.TooSlowError:
            raise RocketError(Code.TIMEOUT, f"{method} got no answer within {timeout_s} s") from None

    async def stream(self, method: str, message: dict) -> AsyncIterator[dict]:
        items = self._handler(method, message)(message)
        if inspect.isawaitable(items):
            items = await items
        if hasattr(items, "__aiter__"):
            async for item in items:
                yield item
        else:
            for item in items:
                yield item
