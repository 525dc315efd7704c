"""What the remote object stores (S3, Azure Blob, GCS, HDFS) share: bounded, jittered retries of a call (tried up to
attempts_max times within retry_s_max, then UNAVAILABLE naming the operation and key), and closing their client."""

from __future__ import annotations

import random
from collections.abc import Awaitable, Callable
from typing import TypeVar

import trio

from rocket.errors import Code, RocketError
from rocket.limits.tier import s3_attempts_max, s3_backoff_s_max, s3_backoff_s_min, s3_close_s_max, s3_retry_s_max

Result = TypeVar("Result")


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
                                            f"in {elapsed_s:.1f}s: {problem}")

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
