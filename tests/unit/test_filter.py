"""The filter core: tag and SQL92 expressions, their errors and limits, batch skipping, and a reference model."""

from __future__ import annotations

import dataclasses
import operator
import re
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rocket import limits
from rocket.errors import Code, RocketError
from rocket.filter import MATCH_ALL, batch_may_match, compile_filter
from rocket.model import Message
from rocket.model import tag_bit

FILTER_DIRECTORY = Path(__file__).resolve().parents[2] / "rocket" / "filter"


def message(properties: dict[str, str] | None = None, tag: str = "", key: str = "") -> Message:
    return Message(b"body", key=key, tag=tag, properties=properties or {})


def refused(kind: str, expression: object) -> RocketError:
    with pytest.raises(RocketError) as caught:
        compile_filter(kind, expression)
    assert caught.value.code == Code.BAD_FILTER
    return caught.value


# Purity.

def test_importing_the_filter_package_pulls_in_no_trio_or_socket():
    """Importing rocket.filter, with everything it imports in turn, loads neither trio nor socket."""
    code = "import sys, rocket.filter; print(sorted({'trio', 'socket'} & set(sys.modules)))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                            cwd=FILTER_DIRECTORY.parents[1])
    assert result.stdout.strip() == "[]"


# Tags.

@pytest.mark.parametrize("expression, tag, expected", [
    ("*", "a", True), ("*", "", True), ("", "a", True), ("   ", "", True), (" * ", "b", True),
    ("a", "a", True), ("a", "b", False), ("a", "", False), ("a", "A", False),
    ("a || b", "b", True), ("a||b||c", "c", True), ("  a  ||  b  ", "a", True), ("a || b", "a || b", False),
    ("a b || c", "a b", True), ("a | b", "a | b", True), ("a || *", "*", True), ("a || *", "z", False),
])
def test_tag_expressions(expression, tag, expected):
    """A tag filter matches "*" and blank to everything, otherwise exactly one of its trimmed tags."""
    assert compile_filter("tag", expression).matches(message(tag=tag)) is expected


@pytest.mark.parametrize("expression, position", [
    ("a || || b", 5), ("|| a", 0), ("a ||", 4), ("  ||  ", 2), ("a ||  || b", 6),
])
def test_tag_expression_with_an_empty_tag_is_refused_with_its_position(expression, position):
    """An empty tag between, before or after "||" is BAD_FILTER naming where the tag is missing."""
    error = refused("tag", expression)
    assert f"empty tag at position {position} in '{expression}'" in error.message


def test_tag_mask_is_the_or_of_the_tag_bits():
    """A tag filter's mask has the bit of every tag it names; match-all and SQL filters have none."""
    assert compile_filter("tag", "a || b || a").tag_mask == tag_bit("a") | tag_bit("b")
    assert MATCH_ALL.tag_mask is None and MATCH_ALL.expression == "*"
    assert compile_filter("tag", " ").tag_mask is None
    assert compile_filter("sql", "TAGS = 'a'").tag_mask is None


def test_batch_may_match_skips_only_batches_without_any_wanted_tag():
    """batch_may_match is False only when a tag filter's bits are all absent from the batch's summary."""
    wanted = compile_filter("tag", "a || b")
    other = next(tag for tag in (f"t{number}" for number in range(1000)) if not tag_bit(tag) & wanted.tag_mask)
    assert batch_may_match(wanted, tag_bit("a")) and batch_may_match(wanted, tag_bit("b") | tag_bit(other))
    assert not batch_may_match(wanted, tag_bit(other)) and not batch_may_match(wanted, 0)
    assert batch_may_match(wanted, 2**64 - 1)
    assert batch_may_match(MATCH_ALL, 0) and batch_may_match(compile_filter("sql", "a = 1"), 0)


# SQL.

SQL_CASES = [
    ("a = 1", {"a": "1"}, True), ("a = 1", {"a": "1.0"}, True), ("a = 1", {"a": "01"}, True),
    ("a = '1'", {"a": "01"}, False), ("a = 10", {"a": "1e1"}, True), ("a = -2.5", {"a": "-2.5"}, True),
    ("a < -2", {"a": "-2.5"}, True), ("a >= +4", {"a": "4"}, True), ("a <> 1", {"a": "2"}, True),
    ("a > 5", {"a": "10"}, True), ("a > '5'", {"a": "10"}, False), ("a < 'b'", {"a": "abc"}, True),
    ("5 < a", {"a": "6"}, True), ("'b' > a", {"a": "a"}, True),
    ("a > 5", {"a": "ten"}, False), ("NOT a > 5", {"a": "ten"}, False), ("a <> 1", {"a": "nan"}, False),
    ("a <> 1", {"a": "1_0"}, False), ("a <> 1", {"a": " 1"}, False), ("a <> 1", {"a": "inf"}, False),
    ("a > 5", {}, False), ("NOT a > 5", {}, False), ("a <> 'x'", {}, False),
    ("a IS NULL", {}, True), ("a IS NULL", {"a": ""}, False), ("a IS NOT NULL", {"a": ""}, True),
    ("a = ''", {"a": ""}, True), ("a = 'it''s'", {"a": "it's"}, True),
    ("a > 5 OR TRUE", {}, True), ("NOT (a > 5 AND FALSE)", {}, True), ("NOT (a > 5 OR FALSE)", {}, False),
    ("a BETWEEN 1 AND 10", {"a": "10"}, True), ("a BETWEEN 1 AND 10", {"a": "11"}, False),
    ("a BETWEEN 10 AND 1", {"a": "5"}, False), ("a NOT BETWEEN 1 AND 10", {"a": "11"}, True),
    ("a NOT BETWEEN 1 AND 10", {}, False), ("a NOT BETWEEN 1 AND 10", {"a": "x"}, False),
    ("a BETWEEN 'a' AND 'c'", {"a": "b"}, True), ("a BETWEEN 'a' AND 'c'", {"a": "d"}, False),
    ("a IN ('x', 'y')", {"a": "y"}, True), ("a IN ('x', 'y')", {"a": "z"}, False),
    ("a NOT IN ('x', 'y')", {"a": "z"}, True), ("a NOT IN ('x', 'y')", {}, False),
    ("a IN ('x', 2)", {"a": "2.0"}, True), ("a NOT IN ('x', 2)", {"a": "z"}, False),
    ("a NOT IN ('x', 2)", {"a": "3"}, True), ("a IN (1, 2.5)", {"a": "2.50"}, True),
    ("flag", {"flag": "TRUE"}, True), ("flag", {"flag": "yes"}, False), ("NOT flag", {"flag": "yes"}, False),
    ("NOT flag", {"flag": "false"}, True), ("flag", {}, False), ("flag = TRUE", {"flag": "true"}, True),
    ("flag <> false", {"flag": "True"}, True), ("flag = FALSE", {"flag": "0"}, False),
    ("TRUE", {}, True), ("FALSE", {}, False), ("FALSE OR NOT FALSE", {}, True), ("NOT NOT TRUE", {}, True),
    ("a = 1 and B = 2", {"a": "1", "B": "2"}, True), ("A = 1", {"a": "1"}, False),
    ("a = 1 OR b = 2 AND c = 3", {"a": "1"}, True), ("a = 1 OR b = 2 AND c = 3", {"b": "2"}, False),
    ("(a = 1 OR b = 2) AND c = 3", {"a": "1"}, False), ("((a = 1))", {"a": "1"}, True),
    ("x.y = 1 AND $z = 2 AND _w3 = 3", {"x.y": "1", "$z": "2", "_w3": "3"}, True),
    ('"my key" = \'v\'', {"my key": "v"}, True), ('"in" = 1', {"in": "1"}, True),
    ('"q""t" = 1', {'q"t': "1"}, True), ("a=1AND(b<>2)", {"a": "1", "b": "3"}, True),
    ("a\t=\n1", {"a": "1"}, True),
]


@pytest.mark.parametrize("expression, properties, expected", SQL_CASES)
def test_sql_expressions(expression, properties, expected):
    """SQL filters use numeric or string comparison by the literal's type, and match only on TRUE."""
    assert compile_filter("sql", expression).matches(message(properties)) is expected


@pytest.mark.parametrize("expression, properties, tag, key, expected", [
    ("TAGS = 'x'", {}, "x", "", True), ("TAGS IS NULL", {}, "", "", True), ("TAGS = 'p'", {"TAGS": "p"}, "x", "", True),
    ("KEYS = 'k1'", {}, "", "k1", True), ("KEYS IS NOT NULL", {}, "", "", False), ("tags = 'x'", {}, "x", "", False),
    ("TAGS IN ('a', 'x') AND KEYS = 7", {}, "x", "007", True),
])
def test_sql_pseudo_properties_tags_and_keys(expression, properties, tag, key, expected):
    """TAGS and KEYS name the message's tag and key (absent when empty) unless a real property has the name."""
    assert compile_filter("sql", expression).matches(message(properties, tag=tag, key=key)) is expected


@pytest.mark.parametrize("expression, what, position", [
    ("a = 1 AND (b > 2", "expected ')'", 16), ("", "empty expression", 0), ("   ", "empty expression", 3),
    ("a = 'abc", "unterminated string", 4), ("a = 'it''s", "unterminated string", 4),
    ('"unterminated = 1', "unterminated string", 0), ("a = 1 )", "expected AND, OR or the end", 6),
    ("a = 1 b", "expected AND, OR or the end of the expression, found 'b'", 6),
    ("a # 1", "unexpected character '#'", 2), ("a = ", "expected a property, a literal", 4),
    ("a AND", "expected a property", 5), ("a = 1 AND OR b = 2", "expected a property", 10),
    ("a BETWEEN 1 AND 'z'", "expected a number like the lower bound", 16),
    ("a BETWEEN 'a' AND 2", "expected a string like the lower bound", 18),
    ("a BETWEEN TRUE AND FALSE", "expected a string or number", 10), ("a BETWEEN 1 OR 2", "expected 'AND'", 12),
    ("a IN ()", "expected a string or number", 6), ("a IN ('x' 'y')", "expected ')'", 10),
    ("a IN 'x'", "expected '('", 5), ("a IS 1", "expected 'NULL'", 5),
    ("a NOT LIKE 'x'", "expected BETWEEN or IN after NOT", 6), ("a = b", "a comparison needs a property", 2),
    ("1 = 2", "a comparison needs a property", 2), ("a < TRUE", "TRUE and FALSE compare only with = or <>", 2),
    ("a = NULL", "NULL is only allowed in IS NULL", 4), ("'x'", "a string or number alone is not a condition", 0),
    ("a AND 3", "a string or number alone", 6), ("3 IS NULL", "IS needs a property on its left", 2),
    ("a = '\ud800'", "not valid UTF-8", 5), ("a = 1 AND (b > 2) OR )", "expected a property", 21),
])
def test_sql_errors_name_what_and_where(expression, what, position):
    """Every malformed SQL expression is BAD_FILTER saying what is wrong and at which 0-based position."""
    error = refused("sql", expression)
    assert error.message.startswith("sql filter: ")
    assert what in error.message
    assert f" at position {position} in " in error.message


def test_unknown_kinds_and_non_text_expressions_are_refused():
    """compile_filter accepts only the kinds "tag" and "sql", and only text expressions."""
    assert "'json'" in refused("json", "a = 1").message
    refused("TAG", "a")
    refused("sql", None)
    refused("tag", b"a")


# Limits.

@pytest.mark.parametrize("kind", ["tag", "sql"])
def test_expressions_over_the_byte_limit_are_refused_where_they_cross_it(kind):
    """An expression of more UTF-8 bytes than the limit is refused, at the first character past it."""
    prefix = "a = " if kind == "sql" else ""
    fits = prefix + "'" + "x" * (limits.filter_expression_bytes_max - len(prefix) - 2) + "'"
    if kind == "sql":
        assert compile_filter(kind, fits).matches(message({"a": fits[5:-1]}))
    else:
        assert compile_filter(kind, fits).matches(message(tag=fits))
    error = refused(kind, fits + "x")
    assert f"exceeds the limit of {limits.filter_expression_bytes_max} at position {len(fits)}" in error.message
    error = refused(kind, prefix + "é" * limits.filter_expression_bytes_max)
    assert f"at position {len(prefix) + (limits.filter_expression_bytes_max - len(prefix)) // 2}" in error.message


def test_nesting_up_to_the_limit_parses_and_deeper_is_refused():
    """Parentheses and NOT nest to filter_nesting_max; one level more is BAD_FILTER at that level."""
    depth = limits.filter_nesting_max
    assert compile_filter("sql", "(" * depth + "a = 1" + ")" * depth).matches(message({"a": "1"}))
    assert compile_filter("sql", "NOT " * depth + "a").matches(message({"a": "true"}))
    error = refused("sql", "(" * (depth + 1) + "a = 1" + ")" * (depth + 1))
    assert f"nesting deeper than {depth} at position {depth} " in error.message
    error = refused("sql", "NOT (" * (depth // 2) + "NOT a" + ")" * (depth // 2))
    assert f"nesting deeper than {depth} at position {depth // 2 * 5} " in error.message


def test_hostile_depth_and_length_never_reach_recursion_error(monkeypatch):
    """'(' * 10000 is BAD_FILTER even with the byte limit lifted, and a long AND chain evaluates flat."""
    refused("sql", "(" * 10000)
    monkeypatch.setattr(limits, "filter_expression_bytes_max", 1 << 20)
    assert "nesting deeper than" in refused("sql", "(" * 10000).message
    assert "nesting deeper than" in refused("sql", "NOT " * 10000 + "a").message
    chain = compile_filter("sql", " AND ".join(["a = 1"] * 5000) + " OR b")
    assert chain.matches(message({"a": "1"})) and not chain.matches(message({"a": "2"}))


# Bad input.

SQL_WORDS = ["a", "b", "TAGS", '"q"', "(", ")", ",", "AND", "or", "NOT", "=", "<>", "<", ">=", "'x'", "'", "1",
             "-2.5", "BETWEEN", "IN", "IS", "NULL", "TRUE", "false", "||", "*", "#"]


def compiled_or_refused(kind: str, expression: str) -> None:
    try:
        compiled = compile_filter(kind, expression)
    except RocketError as error:
        assert error.code == Code.BAD_FILTER
        assert "position" in error.message
        return
    for sample in (message(), message({"a": "1", "b": "x", "q": "true"}, tag="x", key="1")):
        assert compiled.matches(sample) in (True, False)


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(["tag", "sql"]), st.text(max_size=60))
def test_random_text_is_compiled_or_refused_with_bad_filter(kind, expression):
    """Random text either compiles to a filter whose matches() answers a bool, or is BAD_FILTER."""
    compiled_or_refused(kind, expression)


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(["tag", "sql"]), st.binary(max_size=80))
def test_random_bytes_decoded_are_compiled_or_refused_with_bad_filter(kind, data):
    """Random bytes, decoded with replacement characters, either compile or are BAD_FILTER."""
    compiled_or_refused(kind, data.decode("utf-8", errors="replace"))


@settings(max_examples=400, deadline=None)
@given(st.lists(st.sampled_from(SQL_WORDS), max_size=14), st.sampled_from([" ", ""]))
def test_random_token_soup_is_compiled_or_refused_with_bad_filter(words, separator):
    """Random sequences of SQL tokens reach deep into the parser and still only compile or give BAD_FILTER."""
    compiled_or_refused("sql", separator.join(words))


# Property test: random ASTs rendered to SQL against a reference evaluator written here.

NUMERIC_VALUES = {"10": 10, "-2.5": -2.5, "3": 3, "0": 0, "+4": 4, "1e1": 10.0, "007": 7, ".5": 0.5, "2.50": 2.5}
OTHER_VALUES = ["abc", "", "true", "FALSE", "nan", "inf", " 1", "1_0", "10a", "0x10", "B", "it's", "a b"]
NUMBER_LITERALS = {"0": 0, "3": 3, "-3": -3, "+4": 4, "2.5": 2.5, "-2.5": -2.5, "10": 10, "010": 10, "1e1": 10.0,
                   "0.0": 0.0, ".5": 0.5}
STRING_LITERALS = ["abc", "B", "10", "", "it's", "true", "a b", "0"]
NAMES = ["a", "b", "x.y", "$c", "TAGS", "KEYS", "my key", "Not", 'q"t']
KEYWORDS = {"AND", "OR", "NOT", "BETWEEN", "IN", "IS", "NULL", "TRUE", "FALSE"}
COMPARISONS = {"=": operator.eq, "<>": operator.ne, "<": operator.lt, "<=": operator.le, ">": operator.gt,
               ">=": operator.ge}
MIRRORED = {"=": "=", "<>": "<>", "<": ">", "<=": ">=", ">": "<", ">=": "<="}


@dataclasses.dataclass(frozen=True)
class Lit:
    kind: str  # num (value is the literal's text), str or bool
    value: object


@dataclasses.dataclass(frozen=True)
class Cmp:
    name: str
    op: str
    literal: Lit
    mirrored: bool  # rendered literal-first with the mirrored operator


@dataclasses.dataclass(frozen=True)
class Btw:
    name: str
    low: Lit
    high: Lit
    negated: bool


@dataclasses.dataclass(frozen=True)
class InList:
    name: str
    items: tuple[Lit, ...]
    negated: bool


@dataclasses.dataclass(frozen=True)
class Null:
    name: str
    negated: bool


@dataclasses.dataclass(frozen=True)
class Bare:
    name: str


@dataclasses.dataclass(frozen=True)
class Const:
    value: bool


@dataclasses.dataclass(frozen=True)
class Neg:
    operand: object


@dataclasses.dataclass(frozen=True)
class Conj:
    operands: tuple


@dataclasses.dataclass(frozen=True)
class Disj:
    operands: tuple


names = st.sampled_from(NAMES)
numbers = st.builds(Lit, st.just("num"), st.sampled_from(sorted(NUMBER_LITERALS)))
strings = st.builds(Lit, st.just("str"), st.sampled_from(STRING_LITERALS))
booleans = st.builds(Lit, st.just("bool"), st.booleans())
comparisons = st.one_of(
    st.builds(Cmp, names, st.sampled_from(sorted(COMPARISONS)), st.one_of(numbers, strings), st.booleans()),
    st.builds(Cmp, names, st.sampled_from(["=", "<>"]), booleans, st.booleans()),
)
leaves = st.one_of(
    comparisons,
    st.builds(Btw, names, numbers, numbers, st.booleans()),
    st.builds(Btw, names, strings, strings, st.booleans()),
    st.builds(InList, names, st.lists(st.one_of(numbers, strings), min_size=1, max_size=4).map(tuple), st.booleans()),
    st.builds(Null, names, st.booleans()),
    st.builds(Bare, names),
    st.builds(Const, st.booleans()),
)
trees = st.recursive(leaves, lambda children: st.one_of(
    st.builds(Neg, children),
    st.builds(Conj, st.lists(children, min_size=2, max_size=3).map(tuple)),
    st.builds(Disj, st.lists(children, min_size=2, max_size=3).map(tuple)),
), max_leaves=10)
messages = st.builds(
    Message, body=st.just(b""), key=st.sampled_from(["", "k", "10", "abc"]),
    tag=st.sampled_from(["", "t", "3", "abc", "true"]),
    properties=st.dictionaries(names, st.sampled_from(sorted(NUMERIC_VALUES) + OTHER_VALUES), min_size=2, max_size=8),
)


def kleene_not(value):
    return None if value is None else not value


def kleene_and(values):
    return False if False in values else None if None in values else True


def kleene_or(values):
    return True if True in values else None if None in values else False


def reference_lookup(sample: Message, name: str):
    if name in sample.properties:
        return sample.properties[name]
    return {"TAGS": sample.tag, "KEYS": sample.key}.get(name) or None


def reference_equal_or_compare(text, op: str, literal: Lit):
    """One comparison of a property's text with a literal; None is UNKNOWN."""
    if text is None:
        return None
    if literal.kind == "bool":
        left, right = {"true": True, "false": False}.get(text.lower()), literal.value
    elif literal.kind == "num":
        left, right = NUMERIC_VALUES.get(text), NUMBER_LITERALS[literal.value]
    else:
        left, right = text, literal.value
    return None if left is None else COMPARISONS[op](left, right)


def reference(node, sample: Message):
    if isinstance(node, Cmp):
        return reference_equal_or_compare(reference_lookup(sample, node.name), node.op, node.literal)
    if isinstance(node, Btw):
        text = reference_lookup(sample, node.name)
        inside = kleene_and([reference_equal_or_compare(text, ">=", node.low),
                             reference_equal_or_compare(text, "<=", node.high)])
        return kleene_not(inside) if node.negated else inside
    if isinstance(node, InList):
        text = reference_lookup(sample, node.name)
        inside = kleene_or([reference_equal_or_compare(text, "=", item) for item in node.items])
        return kleene_not(inside) if node.negated else inside
    if isinstance(node, Null):
        return (reference_lookup(sample, node.name) is None) != node.negated
    if isinstance(node, Bare):
        text = reference_lookup(sample, node.name)
        return None if text is None else {"true": True, "false": False}.get(text.lower())
    if isinstance(node, Const):
        return node.value
    if isinstance(node, Neg):
        return kleene_not(reference(node.operand, sample))
    values = [reference(operand, sample) for operand in node.operands]
    return kleene_and(values) if isinstance(node, Conj) else kleene_or(values)


class Renderer:
    """Renders a tree to SQL text with random keyword case, spacing, quoting and redundant parentheses."""

    def __init__(self, draw):
        self.draw = draw

    def space(self) -> str:
        return self.draw(st.sampled_from([" ", "  ", "\t", "\n "]))

    def optional_space(self) -> str:
        return self.draw(st.sampled_from(["", " ", "\t"]))

    def keyword(self, word: str) -> str:
        return self.draw(st.sampled_from([word.upper(), word.lower(), word.capitalize()]))

    def name(self, name: str) -> str:
        plain = re.fullmatch(r"[A-Za-z_.$][A-Za-z0-9_.$]*", name) and name.upper() not in KEYWORDS
        if plain and self.draw(st.integers(0, 4)) != 0:
            return name
        return '"' + name.replace('"', '""') + '"'

    def literal(self, literal: Lit) -> str:
        if literal.kind == "num":
            return literal.value
        if literal.kind == "str":
            return "'" + literal.value.replace("'", "''") + "'"
        return self.keyword("true" if literal.value else "false")

    def words(self, *parts: str) -> str:
        return self.space().join(parts)

    def operator(self, left: str, op: str, right: str) -> str:
        return left + self.optional_space() + op + self.optional_space() + right

    def render(self, node, precedence_min: int = 1) -> str:
        precedence = 1 if isinstance(node, Disj) else 2 if isinstance(node, Conj) else 3 if isinstance(node, Neg) else 4
        text = self.render_bare(node)
        if precedence < precedence_min or self.draw(st.integers(0, 5)) == 0:
            text = "(" + self.optional_space() + text + self.optional_space() + ")"
        return text

    def render_bare(self, node) -> str:
        k = self.keyword
        if isinstance(node, Cmp):
            if node.mirrored:
                return self.operator(self.literal(node.literal), MIRRORED[node.op], self.name(node.name))
            return self.operator(self.name(node.name), node.op, self.literal(node.literal))
        if isinstance(node, Btw):
            negation = [k("not")] if node.negated else []
            return self.words(self.name(node.name), *negation, k("between"), self.literal(node.low), k("and"),
                              self.literal(node.high))
        if isinstance(node, InList):
            negation = [k("not")] if node.negated else []
            items = ("," + self.optional_space()).join(self.literal(item) for item in node.items)
            return self.words(self.name(node.name), *negation, k("in"), "(" + items + ")")
        if isinstance(node, Null):
            return self.words(self.name(node.name), k("is"), *([k("not")] if node.negated else []), k("null"))
        if isinstance(node, Bare):
            return self.name(node.name)
        if isinstance(node, Const):
            return k("true" if node.value else "false")
        if isinstance(node, Neg):
            return self.words(k("not"), self.render(node.operand, 3))
        # AND binds tighter than OR; same-kind children need no parentheses since both are associative.
        word, precedence_min = ("and", 2) if isinstance(node, Conj) else ("or", 1)
        parts = [self.render(node.operands[0], precedence_min)]
        for operand in node.operands[1:]:
            parts += [k(word), self.render(operand, precedence_min)]
        return self.words(*parts)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(trees, st.lists(messages, min_size=1, max_size=6), st.data())
def test_sql_filter_agrees_with_a_reference_evaluator(tree, samples, data):
    """For random ASTs rendered to SQL in random styles, matches() is TRUE exactly when the reference is TRUE."""
    text = Renderer(data.draw).render(tree)
    compiled = compile_filter("sql", text)
    for sample in samples:
        assert compiled.matches(sample) is (reference(tree, sample) is True), (text, sample)


@settings(max_examples=300, deadline=None)
@given(st.one_of(comparisons, leaves), st.data())
def test_single_sql_predicates_agree_with_the_reference_evaluator(leaf, data):
    """Each predicate alone, where no AND or OR can mask a wrong answer, agrees with the reference on every
    value in the pool and on absence."""
    text = Renderer(data.draw).render(leaf)
    compiled = compile_filter("sql", text)
    name = getattr(leaf, "name", "a")
    for value in [None, *NUMERIC_VALUES, *OTHER_VALUES]:
        sample = message({} if value is None else {name: value})
        assert compiled.matches(sample) is (reference(leaf, sample) is True), (text, sample)
