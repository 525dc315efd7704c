"""Stable error codes: the only exceptions that cross the wire, plus invariant() for programmer errors.

Codes and their numbers never change meaning once released; add new ones at the end.
"""

from __future__ import annotations

import enum
from typing import Literal


class Code(enum.IntEnum):
    INTERNAL = 1  # a bug on the server; the request may be retried
    UNKNOWN_METHOD = 2
    BAD_REQUEST = 3  # fields missing, of the wrong type, or out of range
    UNDECODABLE = 4  # the body is not valid JSON or Avro for the method
    FRAME_TOO_LARGE = 5
    BAD_FRAME = 6  # the framing itself is broken; the connection is closed
    BAD_BATCH = 7  # the batch header or checksum is wrong
    UNKNOWN_TOPIC = 8
    TOPIC_EXISTS = 9
    BAD_QUEUE = 10
    OFFSET_OUT_OF_RANGE = 11
    CORRUPT_DATA = 12  # stored bytes failed their checksum
    TIMEOUT = 13
    UNAVAILABLE = 14  # the server is shutting down or a dependency is down
    OVERLOADED = 15  # a bound was reached; retry later
    UNSUPPORTED_SERDE = 16
    CONFIG_INVALID = 17
    CONNECTION_LOST = 18  # client side: the connection broke before an answer came
    BAD_FILTER = 19  # a tag or SQL92 filter expression does not parse; the message names the position
    WRONG_MESSAGE_TYPE = 20  # a send does not match the topic's message type (normal, fifo, delay, transaction)
    NOT_FOUND = 21  # a message, timer or receipt that does not exist (any more)
    GROUP_ACTIVE = 22  # a consumer group with live pull members cannot be reset: their commits would undo it
    CAS_FAILED = 23  # a KV compare did not hold; the message names the key's current revision
    COMPACTED = 24  # a KV revision older than the history kept; the message names the oldest one available
    UNKNOWN_BUCKET = 25
    BUCKET_EXISTS = 26
    CROSS_SHARD = 27  # a KV transaction whose keys lie in different shards (a hash tag {...} keeps them together)
    NOT_ENOUGH_REPLICAS = 28  # a controller-mode group has fewer replicas in sync than its class's min_in_sync_replicas
    FENCED = 29  # a request made under an epoch the controller has moved past (a deposed master, a stale change)
    GROUP_EXISTS = 30  # a consumer group's settings were created before: update them instead
    UNKNOWN_GROUP = 31  # a consumer group with no settings in the metadata (create them first)
    UNAUTHENTICATED = 32  # a call that needs credentials it did not bring (a node's, for the methods between nodes)
    PERMISSION_DENIED = 33  # the caller is known, and no policy allows the call (or one denies it)
    UNKNOWN_SEQUENCE = 34  # a batch sent again, older than the storage group remembers of its producer: outcome unknown
    DISK_FULL = 35  # the node's data disk has less free space than its reserve: new data is refused until space returns
    NOT_CONSUMED = 36  # a topic delete refused: consumer groups have messages of it left to consume (force deletes)


class RocketError(Exception):
    """An operating error with a stable code; the process that raises it keeps serving."""

    def __init__(self, code: Code, message: str):
        super().__init__(f"{code.name}: {message}")
        self.code = Code(code)
        self.message = message

    def to_wire(self) -> dict:
        return {"code": self.code.name, "message": self.message}

    @classmethod
    def from_wire(cls, payload: dict) -> "RocketError":
        name = str(payload.get("code", "INTERNAL"))
        code = Code.__members__.get(name, Code.INTERNAL)
        return cls(code, str(payload.get("message", "")))


class InvariantViolation(AssertionError):
    """A programmer error: something the code itself guarantees did not hold."""


def invariant(condition: object, message: str) -> None:
    """Like assert, but survives python -O."""
    if not condition:
        raise InvariantViolation(message)


def leaf_exceptions(error: BaseException):
    """The exceptions inside (possibly nested) exception groups, or the error itself."""
    if isinstance(error, BaseExceptionGroup):
        for inner in error.exceptions:
            yield from leaf_exceptions(inner)
    else:
        yield error


class collapse_single_error:
    """Context manager: a nursery's group holding exactly one exception is re-raised as that exception,
    so callers of our context managers catch RocketError rather than ExceptionGroup."""

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind, error, traceback) -> Literal[False]:  # never swallows an exception
        if isinstance(error, BaseExceptionGroup):
            leaves = list(leaf_exceptions(error))
            if len(leaves) == 1:
                raise leaves[0] from None
        return False
