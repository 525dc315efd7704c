"""Message filters for subscriptions: RocketMQ tag expressions and SQL92 over properties, compiled once,
matched per message, and checked against a batch's tag summary so whole batches are skipped unread.
Pure cores: no I/O. Bad expressions raise RocketError(BAD_FILTER) naming the 0-based position.
"""

from __future__ import annotations

from typing import Protocol

from rocket.errors import Code, RocketError
from rocket.filter.sql import SqlFilter, compile_sql_filter
from rocket.filter.tags import TagFilter, compile_tag_filter
from rocket.model import Message

__all__ = ["Filter", "MATCH_ALL", "SqlFilter", "TagFilter", "batch_may_match", "compile_filter", "matches_all"]


class Filter(Protocol):
    # Read-only properties: the filters are frozen dataclasses, whose fields a protocol's plain attributes would
    # require to be writable.
    @property
    def expression(self) -> str: ...

    @property
    def tag_mask(self) -> int | None:
        """OR of tag_bit over the tags named; None: the tag summary cannot rule a batch out."""
        ...

    def matches(self, message: Message) -> bool: ...


def compile_filter(kind: str, expression: str) -> Filter:
    """kind is "tag" or "sql"; the expression is validated and parsed here, once per subscription."""
    if kind == "tag":
        return compile_tag_filter(expression)
    if kind == "sql":
        return compile_sql_filter(expression)
    raise RocketError(Code.BAD_FILTER, f"filter kind {kind!r} is not 'tag' or 'sql'")


MATCH_ALL: Filter = compile_tag_filter("*")


def matches_all(filter: Filter) -> bool:
    """Whether the filter lets every message through ("*" or a blank tag expression)."""
    return isinstance(filter, TagFilter) and filter.tags is None


def batch_may_match(filter: Filter, tag_summary: int) -> bool:
    """False only when the batch surely holds no match: none of the filter's tag bits is in its summary."""
    return filter.tag_mask is None or filter.tag_mask & tag_summary != 0
