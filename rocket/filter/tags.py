"""Tag filters with RocketMQ's SubscriptionData semantics ("*", or "tagA || tagB"), and the checks and
error format that every filter kind shares. Pure: no I/O.
"""

from __future__ import annotations

import dataclasses

from rocket import limits
from rocket.errors import Code, RocketError
from rocket.model import Message, tag_bit


def bad_filter(kind: str, what: str, position: int, expression: str) -> RocketError:
    """The one error every filter kind raises: what is wrong, where (0-based character), in what."""
    excerpt_chars_max = limits.error_excerpt_chars_max
    shown = expression if len(expression) <= excerpt_chars_max else expression[:excerpt_chars_max] + "..."
    return RocketError(Code.BAD_FILTER, f"{kind} filter: {what} at position {position} in '{shown}'")


def check_expression(kind: str, expression: object) -> str:
    """Refuse what no parser should see: non-text, text that is not UTF-8, or more bytes than the limit."""
    if not isinstance(expression, str):
        raise RocketError(Code.BAD_FILTER, f"{kind} filter: expression must be text, not {type(expression).__name__}")
    try:
        encoded = expression.encode()
    except UnicodeEncodeError as error:  # lone surrogates: no tag or property could ever hold them
        raise bad_filter(kind, "character is not valid UTF-8", error.start, expression) from None
    bytes_max = limits.filter_expression_bytes_max
    if len(encoded) > bytes_max:
        position = len(encoded[:bytes_max].decode(errors="ignore"))  # the first character past the limit
        raise bad_filter(kind, f"expression of {len(encoded)} bytes exceeds the limit of {bytes_max}", position,
                         expression)
    return expression


@dataclasses.dataclass(frozen=True, slots=True)
class TagFilter:
    """tags is None for match-all; otherwise a message matches when its tag is one of them exactly."""

    expression: str
    tags: frozenset[str] | None
    tag_mask: int | None

    def matches(self, message: Message) -> bool:
        return self.tags is None or message.tag in self.tags


def compile_tag_filter(expression: str) -> TagFilter:
    """"*" or blank matches everything; otherwise tags split on "||" and trimmed. An empty tag is an error
    (RocketMQ skips it silently, which hides typos). A "*" among other tags is the literal tag "*"."""
    check_expression("tag", expression)
    if expression.strip() in ("", "*"):
        return TagFilter(expression, None, None)
    tags: set[str] = set()
    start = 0
    for part in expression.split("||"):
        tag = part.strip()
        if not tag:
            raise bad_filter("tag", "empty tag", start + len(part) - len(part.lstrip()), expression)
        tags.add(tag)
        start += len(part) + 2
    mask = 0
    for tag in tags:
        mask |= tag_bit(tag)
    return TagFilter(expression, frozenset(tags), mask)
