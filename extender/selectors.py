"""Label selectors in kubectl's text syntax (`-l`), parsed strictly, matched against labels.

The grammar is apimachinery's `labels.Parse`: requirements separated by commas, all of which
must hold (AND):

    key=value  key==value  key!=value        exact match / mismatch (a missing label mismatches)
    key in (v1,v2)  key notin (v1,v2)        set membership (notin: a missing label is not in)
    key  !key                                the label exists / does not exist
    key>N  key<N                             integer comparison (a non-integer label fails)

Spaces and tabs may stand between tokens. Keys are qualified names (an optional DNS-subdomain
prefix and `/`, then 63 characters at most of `[A-Za-z0-9._-]`, alphanumeric at both ends);
values are empty or 63 such characters. Anything else is a `SelectorError` naming the
problem: selectors come from pod annotations that anyone may write, so the parser is a loop
over tokens with bounded sizes, never a recursion or a regular expression over the whole text.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Mapping
from dataclasses import dataclass

MAX_LENGTH = 1024  # characters of one selector: far above any real one
MAX_REQUIREMENTS = 32
MAX_VALUES = 64  # values of one `in` / `notin` set

_NAME = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?")
_PREFIX = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_INTEGER = re.compile(r"-?[0-9]{1,18}")
_SPACE = " \t\r\n"
_SPECIAL = "!=(),<>"


class SelectorError(ValueError):
    """A selector that does not parse (the message names the problem)."""


class Op(enum.Enum):
    IN = "in"
    NOT_IN = "notin"
    EXISTS = "exists"
    NOT_EXISTS = "!"
    GT = ">"
    LT = "<"


@dataclass(frozen=True, slots=True)
class Requirement:
    key: str
    op: Op
    values: tuple[str, ...] = ()  # sorted, without duplicates

    def matches(self, labels: Mapping[str, str]) -> bool:
        value = labels.get(self.key)
        op = self.op
        if op is Op.IN:
            return value is not None and value in self.values
        if op is Op.NOT_IN:
            return value is None or value not in self.values
        if op is Op.EXISTS:
            return value is not None
        if op is Op.NOT_EXISTS:
            return value is None
        if value is None or not _INTEGER.fullmatch(value):
            return False
        bound = int(self.values[0])
        return int(value) > bound if op is Op.GT else int(value) < bound

    def __str__(self) -> str:
        key, op, values = self.key, self.op, self.values
        if op is Op.EXISTS:
            return key
        if op is Op.NOT_EXISTS:
            return f"!{key}"
        if op in (Op.GT, Op.LT):
            return f"{key}{op.value}{values[0]}"
        if len(values) == 1:
            return f"{key}={values[0]}" if op is Op.IN else f"{key}!={values[0]}"
        return f"{key} {op.value} ({','.join(values)})"


@dataclass(frozen=True, slots=True)
class Selector:
    """Requirements that must all hold, in a canonical order (`str` gives the canonical text)."""

    requirements: tuple[Requirement, ...]

    def matches(self, labels: Mapping[str, str]) -> bool:
        return all(r.matches(labels) for r in self.requirements)

    def __str__(self) -> str:
        return ",".join(str(r) for r in self.requirements)


def parse(text: str) -> Selector:
    """The selector `text` states; raises `SelectorError`. An empty selector is refused (it
    would match every node, which no caller here means)."""
    if not isinstance(text, str):
        raise SelectorError(f"must be a string, not {type(text).__name__}")
    if len(text) > MAX_LENGTH:
        raise SelectorError(f"longer than {MAX_LENGTH} characters")
    tokens = _tokens(text)
    if not tokens:
        raise SelectorError("empty")
    out: list[Requirement] = []
    i = 0
    while True:
        requirement, i = _requirement(tokens, i)
        out.append(requirement)
        if len(out) > MAX_REQUIREMENTS:
            raise SelectorError(f"more than {MAX_REQUIREMENTS} requirements")
        if i == len(tokens):
            break
        if tokens[i] != ",":
            raise SelectorError(f"expected ',' after {requirement}, found {tokens[i]!r}")
        i += 1
    unique = sorted(set(out), key=lambda r: (r.key, r.op.value, r.values))
    return Selector(tuple(unique))


def is_value(text: str) -> bool:
    """Whether `text` is a valid label value (the empty one included)."""
    return not text or bool(_NAME.fullmatch(text))


def _tokens(text: str) -> list[str]:
    """Identifiers and operators; two-character operators (`!=`, `==`) are one token."""
    out: list[str] = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c in _SPACE:
            i += 1
        elif c in _SPECIAL:
            pair = text[i : i + 2]
            if pair in ("!=", "=="):
                out.append(pair)
                i += 2
            else:
                out.append(c)
                i += 1
        else:
            start = i
            while i < n and text[i] not in _SPACE and text[i] not in _SPECIAL:
                i += 1
            out.append(text[start:i])
    return out


def _requirement(tokens: list[str], i: int) -> tuple[Requirement, int]:
    negated = i < len(tokens) and tokens[i] == "!"
    if negated:
        i += 1
    key = _key(tokens[i] if i < len(tokens) else "")
    i += 1
    op = tokens[i] if i < len(tokens) else ","
    if negated or op == ",":
        if negated and op != ",":
            raise SelectorError(f"'!{key}' takes no operator, found {op!r}")
        return Requirement(key, Op.NOT_EXISTS if negated else Op.EXISTS), i
    if op in ("=", "==", "!="):
        # An empty value (`key=` at the end or before a comma) is valid, as in apimachinery.
        token = tokens[i + 1] if i + 1 < len(tokens) else ","
        value = "" if token == "," else _value(token)
        return Requirement(key, Op.IN if op != "!=" else Op.NOT_IN, (value,)), i + (1 if token == "," else 2)
    if op in (">", "<"):
        bound = tokens[i + 1] if i + 1 < len(tokens) else ""
        if not _INTEGER.fullmatch(bound):
            raise SelectorError(f"{key}{op} needs an integer, found {bound!r}")
        return Requirement(key, Op.GT if op == ">" else Op.LT, (str(int(bound)),)), i + 2
    if op in ("in", "notin"):
        values, i = _set(tokens, i + 1, f"{key} {op}")
        return Requirement(key, Op.IN if op == "in" else Op.NOT_IN, values), i
    raise SelectorError(f"unexpected {op!r} after key {key}")


def _set(tokens: list[str], i: int, what: str) -> tuple[tuple[str, ...], int]:
    """`( v1, v2 )` from tokens[i]; the values and the index past `)`."""
    if i >= len(tokens) or tokens[i] != "(":
        raise SelectorError(f"{what} needs '(' and a set of values")
    values: list[str] = []
    i += 1
    while True:
        token = tokens[i] if i < len(tokens) else ""
        if token in (",", ")"):
            values.append("")  # an empty value, as apimachinery reads `in (a,,b)`
        else:
            values.append(_value(token))
            i += 1
            token = tokens[i] if i < len(tokens) else ""
        if len(values) > MAX_VALUES:
            raise SelectorError(f"{what}: more than {MAX_VALUES} values")
        if token == ")":
            break
        if token != ",":
            found = repr(token) if token else "the end"
            raise SelectorError(f"{what}: expected ',' or ')', found {found}")
        i += 1
    if values == [""]:
        raise SelectorError(f"{what}: the set of values is empty")
    return tuple(sorted(set(values))), i + 1


def _key(token: str) -> str:
    prefix, slash, name = token.rpartition("/")
    ok = bool(_NAME.fullmatch(name)) and (not slash or (len(prefix) <= 253 and bool(_PREFIX.fullmatch(prefix))))
    if not ok:
        raise SelectorError(f"{token[:64]!r} is not a label key" if token else "expected a label key")
    return token


def _value(token: str) -> str:
    if not is_value(token):
        raise SelectorError(f"{token[:64]!r} is not a label value")
    return token
