"""Collection filters: our own small grammar, checked and bounded before an engine sees it.

A search's ``filter`` is parsed here into a tree (:func:`parse`, or :func:`from_pairs`
for ``{"lang": "en"}``) and the tree is written out again for the engine
(:func:`to_milvus`); the text a user sent never reaches an engine. What the grammar
takes is the subset of Milvus's expressions people write over a row's metadata::

    metadata["lang"] == "en"            ==  !=  <  <=  >  >=  (a literal on either side)
    metadata["a"]["b"] in [1, 2]        in [...]  not in [...]
    metadata["title"] like "intro%"     like / not like, a bounded pattern
    json_contains(metadata["tags"], "x")   json_contains_any / _all(..., [...])
    id in ["doc-1", "doc-2"]            the row's id
    a and b, a or b, not a              also && || !, and parentheses

Literals are strings ("..." or '...', escapes \\" \\' \\\\ \\n \\r \\t \\uXXXX),
numbers, true and false. Everything else is refused with :class:`FilterError`: one
line that names the problem, where it is, and how to write it instead.

Why bounds: the embedded engine evaluates a filter row by row in Python where a key
holds values of mixed types, and turns ``like`` into a backtracking regular expression:
``%a%a%a%a%a%a%a%a%b`` took 40 s per search and held the engine's lock for everyone;
1,500 nested ``(`` overflowed its parser's stack. So a pattern may hold at most one
``%`` before its last character (the match is then linear in the value's length:
``prefix%``, ``%suffix``, ``%infix%``, ``a%b``), and the length, the nesting, the
conditions and the lists are capped.

Nothing here knows Milvus beyond :func:`to_milvus`: another engine takes the same tree
and writes its own query. The embedded engine gets the tree in this grammar's own
shortest form (:func:`to_text`), reads it with :func:`parse` again and evaluates it
over its rows (:mod:`.filter_match`).
"""

from __future__ import annotations

import contextlib
import decimal
import math
import re
from dataclasses import dataclass

#: Characters of a filter.
MAX_LENGTH = 4096
#: Nesting of parentheses and ``not``: the engine's parser recurses on each level.
MAX_DEPTH = 32
#: Conditions (comparisons, in, like, json_contains) in one filter.
MAX_CONDITIONS = 64
#: Values in one ``in [...]`` or json_contains list (all lists together).
MAX_VALUES = 1000
#: Characters of a ``like`` pattern, and its ``%`` wildcards before the last character.
MAX_PATTERN = 256
MAX_INNER_WILDCARDS = 1
#: Levels of a JSON path (``metadata["a"]["b"]`` is 2).
MAX_PATH = 8
INT64 = (-(2**63), 2**63 - 1)

COMPARISONS = ("==", "!=", "<", "<=", ">", ">=")
#: ``2020 <= x`` is ``x >= 2020``.
FLIPPED = {"==": "==", "!=": "!=", "<": ">", "<=": ">=", ">": "<", ">=": "<="}
CONTAINS = ("json_contains", "json_contains_any", "json_contains_all")
EXAMPLE = 'metadata["lang"] == "en"'


class FilterError(ValueError):
    """A filter this grammar does not take; the message is one line, fact and fix."""


# -- the tree ------------------------------------------------------------------------------
@dataclass(frozen=True)
class Field:
    """``id``, or a path into the row's metadata: ``("lang",)``, ``("tags", 0)``."""

    name: str  # "id" or "metadata"
    path: tuple[str | int, ...] = ()


Value = str | int | float | bool


@dataclass(frozen=True)
class Compare:
    field: Field
    op: str
    value: Value


@dataclass(frozen=True)
class In:
    field: Field
    values: tuple[Value, ...]
    negated: bool = False


@dataclass(frozen=True)
class Like:
    field: Field
    pattern: str
    negated: bool = False


@dataclass(frozen=True)
class Contains:
    function: str  # one of CONTAINS
    field: Field
    value: Value | tuple[Value, ...]


@dataclass(frozen=True)
class Not:
    operand: Expr


@dataclass(frozen=True)
class And:
    operands: tuple[Expr, ...]


@dataclass(frozen=True)
class Or:
    operands: tuple[Expr, ...]


Expr = Compare | In | Like | Contains | Not | And | Or


# -- reading -------------------------------------------------------------------------------
TOKEN = re.compile(
    r"""
    (?P<space>\s+)
  | (?P<number>\d+(?:\.\d+)?(?:[eE][+-]?\d+)?)
  | (?P<name>[A-Za-z_][A-Za-z0-9_]*)
  | (?P<string>["'])
  | (?P<op>==|!=|<=|>=|&&|\|\||[<>!()\[\],-]|=)
    """,
    re.VERBOSE,
)
KEYWORDS = {"and": "and", "or": "or", "not": "not", "in": "in", "like": "like"}
BOOLEANS = {
    word: word.lower() == "true" for word in ("true", "True", "TRUE", "false", "False", "FALSE")
}
ESCAPES = {'"': '"', "'": "'", "\\": "\\", "n": "\n", "r": "\r", "t": "\t", "/": "/"}


@dataclass(frozen=True)
class Token:
    kind: str  # number, name, keyword, string, op, end
    text: str
    pos: int
    value: object = None


def _tokens(text: str) -> list[Token]:
    out: list[Token] = []
    i, n = 0, len(text)
    while i < n:
        m = TOKEN.match(text, i)
        if m is None:
            raise FilterError(
                f"filter: unexpected {text[i]!r} at character {i}; write conditions such as "
                f"{EXAMPLE} joined with and, or, not"
            )
        kind = m.lastgroup
        if kind == "string":
            token, i = _string(text, i)
            out.append(token)
            continue
        word = m.group()
        if kind == "op" and word == "=":
            raise FilterError(f"filter: a single '=' at character {i}; compare with ==")
        if kind == "name" and word.lower() in KEYWORDS:
            out.append(Token("keyword", word.lower(), i))
        elif kind == "name" and word in BOOLEANS:
            out.append(Token("literal", word, i, BOOLEANS[word]))
        elif kind == "number":
            out.append(Token("literal", word, i, _number(word, i)))
        elif kind != "space":
            out.append(Token(kind, word, i))
        i = m.end()
    out.append(Token("end", "", n))
    return out


def _number(word: str, pos: int) -> int | float:
    if re.fullmatch(r"\d+", word):
        value = int(word)
        if value > INT64[1] + 1:  # -2**63 is written as -(2**63)
            raise FilterError(
                f"filter: the number {word[:20]} at character {pos} is out of range; "
                "use whole numbers of at most 19 digits (64 bits)"
            )
        return value
    value = float(word)
    if not math.isfinite(value):
        raise FilterError(f"filter: the number {word[:20]} at character {pos} is out of range")
    return value


def _string(text: str, start: int) -> tuple[Token, int]:
    quote = text[start]
    out: list[str] = []
    i = start + 1
    while i < len(text):
        ch = text[i]
        if ch == quote:
            value = "".join(out)
            return Token("literal", text[start : i + 1], start, value), i + 1
        if ch == "\\":
            esc = text[i + 1 : i + 2]
            if esc == "u":
                code, i = _unicode_escape(text, i)
                out.append(code)
                continue
            if esc not in ESCAPES:
                raise FilterError(
                    f"filter: unknown escape \\{esc} at character {i}; "
                    "use \\\" \\' \\\\ \\n \\r \\t or \\uXXXX"
                )
            out.append(ESCAPES[esc])
            i += 2
            continue
        if ch == "\x00":
            raise FilterError(f"filter: a NUL character at {i}; strings cannot hold one")
        _refuse_surrogate(ch, i)
        out.append(ch)
        i += 1
    raise FilterError(f"filter: the string at character {start} has no closing {quote}; close it")


def _unicode_escape(text: str, i: int) -> tuple[str, int]:
    """``\\uXXXX`` (a UTF-16 pair for characters past U+FFFF, as JSON writes them)."""
    digits = text[i + 2 : i + 6]
    if not re.fullmatch(r"[0-9a-fA-F]{4}", digits):
        raise FilterError(f"filter: \\u at character {i} needs 4 hex digits (\\u00e9)")
    code = int(digits, 16)
    if 0xD800 <= code < 0xDC00:
        low = text[i + 6 : i + 12]
        if re.fullmatch(r"\\u[dD][c-fC-F][0-9a-fA-F]{2}", low):
            pair = 0x10000 + ((code - 0xD800) << 10) + (int(low[2:], 16) - 0xDC00)
            return chr(pair), i + 12
    if 0xD800 <= code < 0xE000:
        _refuse_surrogate(chr(code), i)
    if code == 0:
        raise FilterError(f"filter: \\u0000 at character {i}; strings cannot hold a NUL")
    return chr(code), i + 6


def _refuse_surrogate(ch: str, pos: int) -> None:
    if 0xD800 <= ord(ch) < 0xE000:
        raise FilterError(
            f"filter: a lone UTF-16 surrogate (\\u{ord(ch):04x}) at character {pos} is not "
            "text; send valid Unicode (surrogates only come in pairs)"
        )


class _Parser:
    """Recursive descent, one level per precedence; ``depth`` counts the levels of
    parentheses and ``not`` so that a deep filter is refused before Python's stack is."""

    def __init__(self, text: str):
        self.text = text
        self.tokens = _tokens(text)
        self.i = 0
        self.depth = 0
        self.conditions = 0
        self.values = 0

    # -- tokens --------------------------------------------------------------------------
    def peek(self, offset: int = 0) -> Token:
        return self.tokens[min(self.i + offset, len(self.tokens) - 1)]

    def take(self) -> Token:
        token = self.peek()
        self.i += 1
        return token

    def at(self, *words: str) -> bool:
        token = self.peek()
        return token.kind in ("keyword", "op") and token.text in words

    def expect(self, word: str, what: str) -> Token:
        if not self.at(word):
            raise self.error(f"expected {word!r} {what}")
        return self.take()

    def error(self, problem: str, fix: str = "", token: Token | None = None) -> FilterError:
        """``filter: <problem> at character N (found 'x'); <fix>``."""
        token = token or self.peek()
        where = "at the end" if token.kind == "end" else f"at character {token.pos}"
        got = "" if token.kind == "end" else f" (found {token.text[:30]!r})"
        return FilterError(f"filter: {problem} {where}{got}; {fix or 'e.g. ' + EXAMPLE}")

    # -- the grammar ---------------------------------------------------------------------
    def parse(self) -> Expr:
        if self.peek().kind == "end":
            raise FilterError(f"filter: it is empty; leave it out or write e.g. {EXAMPLE}")
        expr = self.any_of()
        if self.peek().kind != "end":
            raise self.error("expected and, or or the end")
        return expr

    def any_of(self) -> Expr:
        operands = [self.all_of()]
        while self.at("or", "||"):
            self.take()
            operands.append(self.all_of())
        return operands[0] if len(operands) == 1 else Or(_flat(Or, operands))

    def all_of(self) -> Expr:
        operands = [self.negation()]
        while self.at("and", "&&"):
            self.take()
            operands.append(self.negation())
        return operands[0] if len(operands) == 1 else And(_flat(And, operands))

    def negation(self) -> Expr:
        if self.at("not", "!"):
            token = self.take()
            with self.deeper(token):
                return Not(self.negation())
        return self.primary()

    def primary(self) -> Expr:
        if self.at("("):
            token = self.take()
            with self.deeper(token):
                expr = self.any_of()
            self.expect(")", "to close the '(' at character " + str(token.pos))
            return expr
        self.conditions += 1
        if self.conditions > MAX_CONDITIONS:
            raise self.error(f"more than {MAX_CONDITIONS} conditions", "send a simpler filter")
        token = self.peek()
        if token.kind == "name" and token.text in CONTAINS:
            return self.contains()
        return self.condition()

    @contextlib.contextmanager
    def deeper(self, token: Token):
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise FilterError(
                f"filter: nested more than {MAX_DEPTH} levels deep (parentheses and not) "
                f"at character {token.pos}; flatten it: a and b and c"
            )
        yield
        self.depth -= 1

    def condition(self) -> Expr:
        left = self.operand()
        if isinstance(left, Field):
            if self.at("not") and self.peek(1).text in ("in", "like"):
                self.take()
                return self.tail(left, negated=True)
            if self.at("in", "like"):
                return self.tail(left, negated=False)
        if not self.at(*COMPARISONS):
            if isinstance(left, Field):
                raise self.error("expected == != < <= > >=, in or like")
            raise self.error("expected a field", 'a condition starts with metadata["key"] or id')
        op_token = self.take()
        op = op_token.text
        right = self.operand()
        if self.at(*COMPARISONS):
            raise self.error("a second comparison", "one at a time: a < x and x < b")
        if isinstance(left, Field) == isinstance(right, Field):
            both = "two fields" if isinstance(left, Field) else "two values"
            fix = 'compare a field with a value: metadata["n"] > 3'
            raise self.error(f"{both} compared", fix, op_token)
        if isinstance(right, Field):
            left, right, op = right, left, FLIPPED[op]
        if isinstance(right, bool) and op not in ("==", "!="):
            raise self.error(f"true or false with {op}", "compare them with == or !=", op_token)
        return Compare(left, op, right)

    def tail(self, field: Field, negated: bool) -> Expr:
        word = self.take()
        if word.text == "in":
            values = self.values_list()
            if not values:
                raise self.error("an empty list", "in [] matches nothing: give a value", word)
            return In(field, values, negated)
        token = self.peek()
        if token.kind != "literal" or not isinstance(token.value, str):
            raise self.error("expected a pattern", 'like takes a quoted one: like "intro%"')
        self.take()
        return Like(field, _pattern(token.value, token.pos), negated)

    def contains(self) -> Expr:
        function = self.take().text
        self.expect("(", f"after {function}")
        field = self.operand()
        if not isinstance(field, Field):
            raise self.error("expected a field", f'{function}(metadata["tags"], ...)')
        self.expect(",", f"after {function}'s field")
        if function == "json_contains":
            value = self.literal()
            self.values += 1
        else:
            value = self.values_list()
        self.expect(")", f"to close {function}(")
        return Contains(function, field, value)

    def operand(self) -> Field | Value:
        token = self.peek()
        if token.kind == "name":
            return self.field()
        return self.literal()

    def field(self) -> Field:
        token = self.take()
        if token.text == "id":
            return Field("id")
        if token.text != "metadata":
            raise FilterError(
                f"filter: unknown field {token.text!r} at character {token.pos}; rows have "
                f'id and metadata: write metadata["{token.text}"]'
            )
        path: list[str | int] = []
        while self.at("["):
            self.take()
            key = self.peek()
            if key.kind != "literal" or isinstance(key.value, bool | float):
                raise self.error("expected a key", 'quoted, or an index: metadata["k"][0]')
            if isinstance(key.value, int) and key.value > INT64[1]:
                raise self.error("an index out of range", "use a smaller one")
            self.take()
            path.append(key.value)
            self.expect("]", "after the key")
        if not path:
            raise FilterError(
                f"filter: metadata at character {token.pos} needs a key: "
                'metadata["lang"], metadata["a"]["b"]'
            )
        if len(path) > MAX_PATH:
            raise FilterError(
                f"filter: the path at character {token.pos} has {len(path)} levels; "
                f"at most {MAX_PATH}"
            )
        return Field("metadata", tuple(path))

    def literal(self) -> Value:
        negative = self.at("-")
        if negative:
            self.take()
        token = self.peek()
        if token.kind != "literal" or (negative and isinstance(token.value, str | bool)):
            raise self.error("expected a value", '"text", a number, true or false')
        self.take()
        value = token.value
        if negative:
            value = -value
        elif isinstance(value, int) and not isinstance(value, bool) and value > INT64[1]:
            raise FilterError(
                f"filter: the number at character {token.pos} is out of range; "
                "use whole numbers of at most 19 digits (64 bits)"
            )
        return value

    def values_list(self) -> tuple[Value, ...]:
        self.expect("[", "to start a list of values")
        values: list[Value] = []
        while not self.at("]"):
            if values:
                self.expect(",", "between the values")
            values.append(self.literal())
            self.values += 1
            if self.values > MAX_VALUES:
                raise self.error(f"more than {MAX_VALUES} values in lists", "send fewer")
        self.take()
        return tuple(values)


def _flat(kind, operands: list[Expr]) -> tuple[Expr, ...]:
    out: list[Expr] = []
    for operand in operands:
        out.extend(operand.operands if isinstance(operand, kind) else (operand,))
    return tuple(out)


def _pattern(pattern: str, pos: int) -> str:
    """A like pattern the engine matches in time linear in the value's length."""
    if len(pattern) > MAX_PATTERN:
        raise FilterError(
            f"filter: the like pattern at character {pos} has {len(pattern)} characters; "
            f"at most {MAX_PATTERN}"
        )
    if "\\" in pattern:
        raise FilterError(
            f"filter: the like pattern at character {pos} holds a backslash; the engine "
            "cannot escape % or _ in a pattern: match such a value with =="
        )
    pattern = re.sub("%+", "%", pattern)  # %% is %
    inner = pattern[:-1].count("%")
    if inner > MAX_INNER_WILDCARDS:
        raise FilterError(
            f"filter: the like pattern at character {pos} has {inner} % before its end; "
            f"at most {MAX_INNER_WILDCARDS} (prefix%, %suffix, %infix%, a%b): "
            "split it into several like conditions joined with and"
        )
    return pattern


# -- entry points --------------------------------------------------------------------------
def parse(text: str) -> Expr:
    """``text`` as a tree, or :class:`FilterError`."""
    if len(text) > MAX_LENGTH:
        raise FilterError(
            f"filter: {len(text)} characters, more than {MAX_LENGTH}; send a shorter one "
            "(a long list of ids: search fewer at a time)"
        )
    for i, ch in enumerate(text):
        if ch == "\x00":
            raise FilterError(f"filter: a NUL character at {i}; remove it")
        _refuse_surrogate(ch, i)
    return _Parser(text).parse()


def from_pairs(pairs: dict) -> Expr:
    """``{"lang": "en", "year": 2024}``: every key's value must be equal."""
    if not pairs or len(pairs) > MAX_CONDITIONS:
        raise FilterError(f'filter: give 1 to {MAX_CONDITIONS} keys, as {{"lang": "en"}}')
    conditions = []
    for key, value in pairs.items():
        if not isinstance(value, str | int | float):
            raise FilterError(
                f"filter: the value of {key!r} must be a string, number or bool, "
                f"not {type(value).__name__}"
            )
        for i, ch in enumerate(key + (value if isinstance(value, str) else "")):
            if ch == "\x00":
                raise FilterError(f"filter: the key {key!r} or its value holds a NUL")
            _refuse_surrogate(ch, i)
        if isinstance(value, float) and not math.isfinite(value):
            raise FilterError(f"filter: the value of {key!r} is not a finite number")
        if isinstance(value, int) and not INT64[0] <= value <= INT64[1]:
            raise FilterError(f"filter: the value of {key!r} is out of the 64-bit range")
        conditions.append(Compare(Field("metadata", (key,)), "==", value))
    expr = conditions[0] if len(conditions) == 1 else And(tuple(conditions))
    # The embedded engine parses the written filter with a text's limits.
    written = len(to_text(expr))
    if written > MAX_LENGTH:
        raise FilterError(
            f"filter: its keys and values come to {written} characters written out, "
            f"more than {MAX_LENGTH}; send shorter values"
        )
    return expr


# -- writing for Milvus --------------------------------------------------------------------
def to_milvus(expr: Expr) -> str:
    """The tree as a Milvus boolean expression, in a form Milvus Lite reads too
    (it takes ``in`` on plain fields only: on a JSON path it becomes ``==``s or'd)."""
    if isinstance(expr, And | Or):
        word = " and " if isinstance(expr, And) else " or "
        return word.join(_operand(e) for e in expr.operands)
    if isinstance(expr, Not):
        return f"not ({to_milvus(expr.operand)})"
    if isinstance(expr, Compare):
        return f"{_field(expr.field)} {expr.op} {_literal(expr.value)}"
    if isinstance(expr, In):
        if expr.field.name == "id":
            word = "not in" if expr.negated else "in"
            return f"id {word} [{', '.join(_literal(v) for v in expr.values)}]"
        field = _field(expr.field)
        text = " or ".join(f"{field} == {_literal(v)}" for v in expr.values)
        if len(expr.values) > 1 or expr.negated:
            text = f"({text})"
        return f"not {text}" if expr.negated else text
    if isinstance(expr, Like):
        text = f"{_field(expr.field)} like {_literal(expr.pattern)}"
        return f"not ({text})" if expr.negated else text
    if isinstance(expr, Contains):
        if isinstance(expr.value, tuple):
            value = f"[{', '.join(_literal(v) for v in expr.value)}]"
        else:
            value = _literal(expr.value)
        return f"{expr.function}({_field(expr.field)}, {value})"
    raise TypeError(f"not a filter: {expr!r}")


# -- writing for the embedded engine ---------------------------------------------------
def to_text(expr: Expr) -> str:
    """The tree in this grammar's shortest form, for the embedded engine, which parses
    it again with :func:`parse` and its limits: never longer, deeper, or of more
    conditions than the text it was parsed from, so a filter that passed the checks
    here passes them there (:func:`to_milvus`'s ``in`` as ``==``s or'd counted a
    condition per value: 65 values were refused at a place the user never wrote)."""
    if isinstance(expr, Or):  # its operands are not Or (flattened); and binds tighter
        return "||".join(to_text(e) for e in expr.operands)
    if isinstance(expr, And):
        return "&&".join(
            f"({to_text(e)})" if isinstance(e, Or) else to_text(e) for e in expr.operands
        )
    if isinstance(expr, Not):
        inner = to_text(expr.operand)
        return f"!({inner})" if isinstance(expr.operand, And | Or) else "!" + inner
    field = _short_field(expr.field)
    # A keyword after the field ``id`` needs a space between (as the user's text did).
    gap = " " if expr.field.name == "id" else ""
    if isinstance(expr, Compare):
        return f"{field}{expr.op}{_short(expr.value)}"
    if isinstance(expr, In):
        word = "not in" if expr.negated else "in"
        return f"{field}{gap}{word}[{','.join(_short(v) for v in expr.values)}]"
    if isinstance(expr, Like):
        word = "not like" if expr.negated else "like"
        return f"{field}{gap}{word}{_short(expr.pattern)}"
    if isinstance(expr, Contains):
        if isinstance(expr.value, tuple):
            value = f"[{','.join(_short(v) for v in expr.value)}]"
        else:
            value = _short(expr.value)
        return f"{expr.function}({field},{value})"
    raise TypeError(f"not a filter: {expr!r}")


def _short_field(field: Field) -> str:
    return field.name + "".join(f"[{_short(p)}]" for p in field.path)


def _short(value: Value) -> str:
    """A literal as few characters as the user could have written it in."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return _short_float(value)
    # Only the backslash and the quote need escaping (the parser reads any other
    # character as it is); the quote the value holds fewer of.
    quote = "'" if value.count('"') > value.count("'") else '"'
    return quote + value.replace("\\", "\\\\").replace(quote, "\\" + quote) + quote


def _short_float(value: float) -> str:
    """The shortest of repr (``100000.0``) and the exponent forms of its digits
    (``1e5``, ``123e5``, ``1.23e7``): each reads back as this very float."""
    if value < 0:
        return "-" + _short_float(-value)
    text = repr(value)
    _, places, exponent = decimal.Decimal(text).as_tuple()
    digits = "".join(map(str, places)).rstrip("0")
    if not digits:  # 0.0
        return text
    exponent += len(places) - len(digits)  # the zeros stripped off the digits
    forms = [text, f"{digits}e{exponent}"]
    if len(digits) > 1:
        forms.append(f"{digits[0]}.{digits[1:]}e{exponent + len(digits) - 1}")
    return min(forms, key=len)


def _operand(expr: Expr) -> str:
    text = to_milvus(expr)
    return f"({text})" if isinstance(expr, And | Or) else text


def _field(field: Field) -> str:
    return field.name + "".join(f"[{_literal(p)}]" for p in field.path)


def _literal(value: Value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return repr(value)
    escaped = (
        value.replace("\\", "\\\\")
        .replace('"', '\\"')
        .replace("\n", "\\n")
        .replace("\r", "\\r")
        .replace("\t", "\\t")
    )
    return f'"{escaped}"'
