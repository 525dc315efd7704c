"""What the remote object stores (S3, Azure Blob, GCS, HDFS) share: bounded, jittered retries of a call (tried up to
attempts_max times within retry_s_max, then UNAVAILABLE naming the operation and key), closing their client, and the
asyncio loop (trio-asyncio) the asyncio clients run on."""

from __future__ import annotations

import logging
import random
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager, nullcontext
from typing import Any, TypeVar

import trio
import trio_asyncio

from rocket.errors import Code, RocketError, collapse_single_error
from rocket.limits.tier import s3_attempts_max, s3_backoff_s_max, s3_backoff_s_min, s3_close_s_max, s3_retry_s_max

Result = TypeVar("Result")

log = logging.getLogger("rocket.tier")


class Retries:
    """The retry bounds of a store (the s3_* limits by default, for every backend). classify(error) says what to do
    with an exception a try raised: a description of a transient failure (tried again), or RocketError raised for a
    final one; an exception it returns None for leaves as it is."""

    def __init__(self, store: str, classify: Callable[[str, str, BaseException], str | None], *,
                 attempts_max: int = s3_attempts_max, retry_s_max: float = s3_retry_s_max,
                 backoff_s_min: float = s3_backoff_s_min, backoff_s_max: float = s3_backoff_s_max):
        if not (attempts_max >= 1 and retry_s_max > 0 and 0 < backoff_s_min <= backoff_s_max):
            raise RocketError(Code.CONFIG_INVALID, "retry bounds must be positive, and backoff_s_min <= "
                                                   "backoff_s_max")
        self.store = store  # "S3 bucket 'b'": how errors name it
        self.classify = classify
        self.attempts_max = attempts_max
        self.retry_s_max = retry_s_max
        self.backoff_s_min = backoff_s_min
        self.backoff_s_max = backoff_s_max
        self._random = random.Random()

    async def run(self, operation: str, key: str, call: Callable[[], Awaitable[Result]]) -> Result:
        """call() until it returns, a final error, or the bounds run out (UNAVAILABLE)."""
        started = trio.current_time()
        attempts = 0
        problem = "no attempt finished"
        with trio.move_on_at(started + self.retry_s_max) as deadline:
            while attempts < self.attempts_max:
                attempts += 1
                try:
                    return await call()
                except Exception as error:  # noqa: BLE001 - classify decides; what it does not know leaves
                    described = self.classify(operation, key, error)
                    if described is None:
                        raise
                    problem = described
                if attempts < self.attempts_max:
                    await trio.sleep(self.backoff_s(attempts))
        if deadline.cancelled_caught:
            problem = f"{problem}; out of time"
        elapsed_s = trio.current_time() - started
        raise RocketError(Code.UNAVAILABLE, f"{operation} {key!r} in {self.store} failed after {attempts} attempts "
                                            f"in {elapsed_s:.1f}s, the object store down or failing: {problem}")

    def backoff_s(self, attempts: int) -> float:
        """Full jitter: uniform in [0, min(cap, base * 2^(attempts-1))], never below a tenth of base."""
        ceiling = min(self.backoff_s_max, self.backoff_s_min * 2 ** (attempts - 1))
        return max(self.backoff_s_min / 10, self._random.uniform(0, ceiling))


class ClosingStore:
    """A remote store's client, closed once by aclose(): shielded and bounded (s3_close_s_max), so a cancelled caller
    still returns the client's connections. The store's opener sets _close; later calls see _closed."""

    _close: Callable[[], Awaitable[object]] | None = None
    _closed = False

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._close is not None:
            close, self._close = self._close, None
            with trio.CancelScope(shield=True), trio.move_on_after(s3_close_s_max):
                await close()


@asynccontextmanager
async def asyncio_loop() -> AsyncIterator[trio_asyncio.TrioEventLoop]:
    """The trio-asyncio loop the caller runs in, else one open for the context (a nursery: collapse_single_error lets
    RocketError leave as itself). Errors the asyncio libraries report from their own background tasks are logged, not
    raised into Trio as trio-asyncio does by default: aiohttp's write of a request whose connection the store reset
    killed a node that way (issue 54). Each call's own error reaches its caller (Retries)."""
    existing = trio_asyncio.current_loop.get()
    with collapse_single_error():
        async with (nullcontext(existing) if existing is not None else trio_asyncio.open_loop()) as loop:
            loop.set_exception_handler(_log_background_error)
            yield loop


def _log_background_error(loop: Any, context: dict[str, Any]) -> None:
    error = context.get("exception")
    log.warning("tier: the store's client reported, in the background: %s%s", context.get("message", "an error"),
                f" ({type(error).__name__}: {error})" if error is not None else "")
