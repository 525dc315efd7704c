"""SQL92 filters over message properties (RocketMQ's subset): a recursive-descent parser with a depth limit builds an
immutable AST, compiled once to closures that evaluate with three-valued logic. Pure; user text is only ever
tokenised, never eval'd. The tokenizer, parser and compiler of one small language stay one module, read together.
"""

from __future__ import annotations

import dataclasses
import operator
import re
from typing import Any, Callable, NamedTuple, Union, cast

from rocket import limits
from rocket.errors import InvariantViolation, RocketError
from rocket.filter.tags import bad_filter, check_expression
from rocket.model import Message

Literal = Union[str, int, float, bool]  # bool is tested first everywhere: True is also an int

_KEYWORDS = frozenset({"AND", "OR", "NOT", "BETWEEN", "IN", "IS", "NULL", "TRUE", "FALSE"})
_OPERATORS: dict[str, Callable[[Any, Any], bool]] = {
    "=": operator.eq, "<>": operator.ne, "<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge,
}
_MIRRORED = {"=": "=", "<>": "<>", "<": ">", "<=": ">=", ">": "<", ">=": "<="}  # 5 < a is a > 5
_PSEUDO_PROPERTIES = {"TAGS": "tag", "KEYS": "key"}  # used only when no real property has the name

# Possessive quantifiers: an unterminated string fails at its opening quote instead of backtracking.
_TOKEN = re.compile(r"""
    (?P<space>[ \t\r\n\f\v]+)
  | (?P<number>[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?)
  | (?P<name>[A-Za-z_.$][A-Za-z0-9_.$]*)
  | (?P<string>'(?:[^']|'')*+')
  | (?P<quoted>"(?:[^"]|"")*+")
  | (?P<operator><>|<=|>=|[=<>(),])
""", re.VERBOSE)
# ASCII digits only, and no "nan", "inf", "1_000" or padding, all of which Python's float() would accept.
_NUMBER = re.compile(
    r"[+-]?(?:[0-9]+(?P<fraction>\.[0-9]*)?|(?P<bare_fraction>\.[0-9]+))(?P<exponent>[eE][+-]?[0-9]+)?")


class Token(NamedTuple):
    kind: str  # number, name, string, keyword, operator, end
    value: object  # the parsed literal, the name, the upper-cased keyword or the operator
    position: int
    text: str


@dataclasses.dataclass(frozen=True, slots=True)
class Compare:
    name: str
    operator: str
    value: Literal


@dataclasses.dataclass(frozen=True, slots=True)
class Between:
    name: str
    low: str | int | float
    high: str | int | float


@dataclasses.dataclass(frozen=True, slots=True)
class In:
    name: str
    values: tuple[str | int | float, ...]


@dataclasses.dataclass(frozen=True, slots=True)
class IsNull:
    name: str


@dataclasses.dataclass(frozen=True, slots=True)
class Truth:
    """A bare property used as a condition: 'true' or 'false' in any case, else UNKNOWN."""

    name: str


@dataclasses.dataclass(frozen=True, slots=True)
class Constant:
    value: bool


@dataclasses.dataclass(frozen=True, slots=True)
class Not:
    operand: Node


@dataclasses.dataclass(frozen=True, slots=True)
class And:
    operands: tuple[Node, ...]  # flat, so a long chain costs no recursion depth


@dataclasses.dataclass(frozen=True, slots=True)
class Or:
    operands: tuple[Node, ...]


Node = Union[Compare, Between, In, IsNull, Truth, Constant, Not, And, Or]


def to_number(text: str | None) -> int | float | None:
    """A property's value as a number, or None when it is absent or not a plain decimal number."""
    if text is None:
        return None
    match = _NUMBER.fullmatch(text)
    if match is None:
        return None
    if match.group("fraction", "bare_fraction", "exponent") == (None, None, None):
        try:
            return int(text)
        except ValueError:  # more digits than int() accepts: still a (huge) number
            return float(text)
    return float(text)


def to_bool(text: str | None) -> bool | None:
    if text is None:
        return None
    lowered = text.lower()
    return True if lowered == "true" else False if lowered == "false" else None


def _tokenize(expression: str) -> list[Token]:
    tokens = []
    position = 0
    while position < len(expression):
        match = _TOKEN.match(expression, position)
        if match is None:
            character = expression[position]
            what = "unterminated string" if character in "'\"" else f"unexpected character {character!r}"
            raise bad_filter("sql", what, position, expression)
        kind, text = cast(str, match.lastgroup), match.group()  # every alternative of _TOKEN is a named group
        if kind == "number":
            value = to_number(text)
        elif kind == "string":
            value = text[1:-1].replace("''", "'")
        elif kind == "quoted":
            kind, value = "name", text[1:-1].replace('""', '"')
        elif kind == "name" and text.upper() in _KEYWORDS:
            kind, value = "keyword", text.upper()
        else:
            value = text
        if kind != "space":
            tokens.append(Token(kind, value, position, text))
        position = match.end()
    tokens.append(Token("end", None, len(expression), ""))
    return tokens


class _Parser:
    """or := and (OR and)*; and := not (AND not)*; not := NOT not | '(' or ')' | predicate."""

    def __init__(self, expression: str):
        self.expression = expression
        self.tokens = _tokenize(expression)
        self.index = 0
        self.depth = 0

    def fail(self, what: str, token: Token) -> RocketError:
        return bad_filter("sql", what, token.position, self.expression)

    def expected(self, what: str, token: Token) -> RocketError:
        found = "" if token.kind == "end" else f", found {token.text!r}"
        return self.fail(f"expected {what}{found}", token)

    def peek(self) -> Token:
        return self.tokens[self.index]

    def take(self) -> Token:
        token = self.tokens[self.index]
        self.index += 1
        return token

    def accept(self, kind: str, value: str) -> Token | None:
        token = self.tokens[self.index]
        if token.kind == kind and token.value == value:
            self.index += 1
            return token
        return None

    def expect(self, kind: str, value: str) -> Token:
        token = self.accept(kind, value)
        if token is None:
            raise self.expected(f"'{value}'", self.peek())
        return token

    def enter(self, token: Token) -> None:
        """Parentheses and NOT recurse: the explicit depth keeps hostile input far from RecursionError."""
        self.depth += 1
        if self.depth > limits.filter_nesting_max:
            raise bad_filter("sql", f"nesting deeper than {limits.filter_nesting_max}", token.position,
                             self.expression)

    def parse(self) -> Node:
        if self.peek().kind == "end":
            raise self.fail("empty expression", self.peek())
        node = self.parse_or()
        if self.peek().kind != "end":
            raise self.expected("AND, OR or the end of the expression", self.peek())
        return node

    def parse_or(self) -> Node:
        operands = [self.parse_and()]
        while self.accept("keyword", "OR"):
            operands.append(self.parse_and())
        return operands[0] if len(operands) == 1 else Or(tuple(operands))

    def parse_and(self) -> Node:
        operands = [self.parse_not()]
        while self.accept("keyword", "AND"):
            operands.append(self.parse_not())
        return operands[0] if len(operands) == 1 else And(tuple(operands))

    def parse_not(self) -> Node:
        token = self.peek()
        if self.accept("keyword", "NOT"):
            self.enter(token)
            node = Not(self.parse_not())
        elif self.accept("operator", "("):
            self.enter(token)
            node = self.parse_or()
            self.expect("operator", ")")
        else:
            return self.parse_predicate()
        self.depth -= 1
        return node

    def parse_operand(self) -> tuple[Token, Literal | None]:
        """A property (value None) or a literal."""
        token = self.take()
        if token.kind == "name":
            return token, None
        if token.kind in ("string", "number"):
            return token, cast(Literal, token.value)
        if token.kind == "keyword" and token.value in ("TRUE", "FALSE"):
            return token, token.value == "TRUE"
        if token.kind == "keyword" and token.value == "NULL":
            raise self.fail("NULL is only allowed in IS NULL or IS NOT NULL", token)
        raise self.expected("a property, a literal, NOT or '('", token)

    def parse_literal(self, allowed: tuple[str, ...], what: str) -> str | int | float:
        token = self.take()
        if token.kind not in allowed:
            raise self.expected(what, token)
        return cast("str | int | float", token.value)  # allowed are string and number kinds

    def parse_predicate(self) -> Node:
        left, literal = self.parse_operand()
        token = self.peek()
        if token.kind == "operator" and token.value in _OPERATORS:
            self.take()
            return self.parse_comparison(left, literal, token)
        if token.kind == "keyword" and token.value in ("IS", "NOT", "BETWEEN", "IN"):
            if literal is not None:
                raise self.fail(f"{token.value} needs a property on its left", token)
            return self.parse_property_test(cast(str, left.value))  # no literal: a name
        if literal is None:
            return Truth(cast(str, left.value))
        if isinstance(literal, bool):
            return Constant(literal)
        raise self.fail("a string or number alone is not a condition", left)

    def parse_comparison(self, left: Token, left_literal: Literal | None, operator_token: Token) -> Node:
        right, right_literal = self.parse_operand()
        if (left_literal is None) == (right_literal is None):
            raise self.fail("a comparison needs a property on one side and a literal on the other", operator_token)
        # One side is a name, the other a literal (checked above), and an operator token's value is the operator.
        symbol = cast(str, operator_token.value)
        if left_literal is None:
            name, comparison, literal = cast(str, left.value), symbol, cast(Literal, right_literal)
        else:
            name, comparison, literal = cast(str, right.value), _MIRRORED[symbol], left_literal
        if isinstance(literal, bool) and comparison not in ("=", "<>"):
            raise self.fail("TRUE and FALSE compare only with = or <>", operator_token)
        return Compare(name, comparison, literal)

    def parse_property_test(self, name: str) -> Node:
        if self.accept("keyword", "IS"):
            negated = self.accept("keyword", "NOT") is not None
            self.expect("keyword", "NULL")
            return Not(IsNull(name)) if negated else IsNull(name)
        negated = self.accept("keyword", "NOT") is not None
        if self.accept("keyword", "BETWEEN"):
            node = self.parse_between(name)
        elif self.accept("keyword", "IN"):
            node = self.parse_in(name)
        else:
            raise self.expected("BETWEEN or IN after NOT", self.peek())
        return Not(node) if negated else node  # NOT BETWEEN is exactly NOT (BETWEEN), UNKNOWN included

    def parse_between(self, name: str) -> Node:
        low_token = self.peek()
        low = self.parse_literal(("string", "number"), "a string or number")
        self.expect("keyword", "AND")
        high = self.parse_literal((low_token.kind,), f"a {low_token.kind} like the lower bound")
        return Between(name, low, high)

    def parse_in(self, name: str) -> Node:
        self.expect("operator", "(")
        values = [self.parse_literal(("string", "number"), "a string or number")]
        while self.accept("operator", ","):
            values.append(self.parse_literal(("string", "number"), "a string or number"))
        self.expect("operator", ")")
        return In(name, tuple(values))


Evaluate = Callable[[Message], Union[bool, None]]  # None is UNKNOWN


def _getter(name: str) -> Callable[[Message], str | None]:
    field = _PSEUDO_PROPERTIES.get(name)
    if field is None:
        return lambda message: message.properties.get(name)

    def get(message: Message) -> str | None:
        value = message.properties.get(name)
        return value if value is not None else getattr(message, field) or None

    return get


def _compile(node: Node) -> Evaluate:
    """Nested closures: the tree is walked once here, not per message."""
    match node:
        case Or(operands):
            parts = tuple(_compile(operand) for operand in operands)

            def evaluate(message: Message) -> bool | None:
                result = False
                for part in parts:
                    value = part(message)
                    if value is True:
                        return True
                    if value is None:
                        result = None
                return result
        case And(operands):
            parts = tuple(_compile(operand) for operand in operands)

            def evaluate(message: Message) -> bool | None:
                result = True
                for part in parts:
                    value = part(message)
                    if value is False:
                        return False
                    if value is None:
                        result = None
                return result
        case Not(operand):
            inner = _compile(operand)

            def evaluate(message: Message) -> bool | None:
                value = inner(message)
                return None if value is None else not value
        case Constant(value):
            return lambda message: value
        case IsNull(name):
            get = _getter(name)
            return lambda message: get(message) is None
        case Truth(name):
            get = _getter(name)
            return lambda message: to_bool(get(message))
        case Compare(name, comparison, literal):
            return _compile_compare(_getter(name), _OPERATORS[comparison], literal)
        case Between(name, low, high):
            get = _getter(name)
            convert = (lambda text: text) if isinstance(low, str) else to_number
            # A string's bounds are strings, a number's numbers (the parser checked), as convert's values are.
            low, high = cast(Any, low), cast(Any, high)

            def evaluate(message: Message) -> bool | None:
                value = convert(get(message))
                return None if value is None else low <= value <= high
        case In(name, values):
            return _compile_in(_getter(name), values)
        case _:
            raise InvariantViolation(f"unknown filter node {node!r}")
    return evaluate


def _compile_compare(get, test, literal: Literal) -> Evaluate:
    if isinstance(literal, bool):
        convert = to_bool
    elif isinstance(literal, str):
        convert = lambda text: text  # noqa: E731 - strings compare as strings, lexicographically
    else:
        convert = to_number

    def evaluate(message):
        value = convert(get(message))
        return None if value is None else test(value, literal)

    return evaluate


def _compile_in(get, values: tuple) -> Evaluate:
    """x IN (a, b) is x = a OR x = b: a non-numeric value against a numeric element makes that part UNKNOWN."""
    strings = frozenset(value for value in values if isinstance(value, str))
    numbers = frozenset(value for value in values if not isinstance(value, str))

    def evaluate(message):
        text = get(message)
        if text is None:
            return None
        if text in strings:
            return True
        if not numbers:
            return False
        number = to_number(text)
        return None if number is None else number in numbers

    return evaluate


@dataclasses.dataclass(frozen=True, slots=True)
class SqlFilter:
    expression: str
    tree: Node
    evaluate: Evaluate = dataclasses.field(repr=False, compare=False)
    tag_mask: None = dataclasses.field(default=None, init=False)  # any batch may hold a match

    def matches(self, message: Message) -> bool:
        """Only TRUE matches: FALSE and UNKNOWN (absent or unparsable properties) do not."""
        return self.evaluate(message) is True


def compile_sql_filter(expression: str) -> SqlFilter:
    check_expression("sql", expression)
    tree = _Parser(expression).parse()
    return SqlFilter(expression, tree, _compile(tree))
