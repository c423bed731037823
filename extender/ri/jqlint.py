"""Static limits on user-supplied jq: what a Resource Interface expression may not contain.

libjq runs in C and cannot be interrupted from Python, so an expression that loops, recurses or
explodes would hold its thread (and whatever lock its caller holds) until it ends. These rules
make every accepted expression terminate after work bounded by its input: no user functions
(`def`, so no recursion), no unbounded loops (`repeat`, `while`, `until`, `recurse`, `..`),
no combinatorial builtins, no environment or extra input, no literal bound past `LITERAL_CAP`,
and regexes only as literals without nested quantifiers (catastrophic backtracking on a label
value a pod's author chooses). `range` over a bound read from the document is allowed (the
shipped LeaderWorkerSet definition counts instances with it): `jqx` caps it at run time.
What stays (nested iteration over a document's arrays) is polynomial in the input; the
registration probe (`probe`) and the run-time breaker (`budget`) bound it.

The scanner is a tokenizer, not a parser: string literals are kept as tokens (their `\\(...)`
interpolations are scanned as code), comments dropped, `.name` and `{name: ...}` are fields.
"""

from __future__ import annotations

import re
from collections.abc import Generator, Iterator
from dataclasses import dataclass

# The largest literal bound (range, limit, repetition) an expression may write: 10,000 values
# take ~10 ms in libjq, the scale of one evaluation's budget.
LITERAL_CAP = 10_000

FORBIDDEN = {
    "def": "user-defined functions (recursion)",
    "recurse": "unbounded recursion",
    "recurse_down": "unbounded recursion",
    "walk": "recursion over the whole document",
    "paths": "recursion over the whole document",
    "leaf_paths": "recursion over the whole document",
    "repeat": "an unbounded loop",
    "while": "an unbounded loop",
    "until": "an unbounded loop",
    "combinations": "a combinatorial explosion",
    "infinite": "an infinite bound",
    "input": "reading other inputs",
    "inputs": "reading other inputs",
    "input_filename": "reading other inputs",
    "input_line_number": "reading other inputs",
    "env": "the extender's environment",
    "$ENV": "the extender's environment",
    "$__loc__": "source locations",
    "$__prog_args": "program arguments",
    "debug": "writing to the extender's stderr",
    "stderr": "writing to the extender's stderr",
    "halt": "stopping the evaluator",
    "halt_error": "stopping the evaluator",
    "import": "modules",
    "include": "modules",
    "modulemeta": "modules",
    "get_search_list": "modules",
    "get_prog_origin": "modules",
    "get_jq_origin": "modules",
    "..": "unbounded recursion (recursive descent)",
}
REGEX_FUNCTIONS = frozenset({"test", "match", "capture", "scan", "splits", "sub", "gsub"})
BOUNDED_FUNCTIONS = frozenset({"range", "limit", "nth"})


@dataclass(frozen=True, slots=True)
class Token:
    kind: str  # "ident", "var", "num", "str", "field", "op"
    text: str


def problems(expression: str) -> list[str]:
    """Why `expression` may not run in the extender, one line per construct; empty when it may."""
    tokens = list(tokenize(expression))
    found: list[str] = []
    for i, token in enumerate(tokens):
        if token.kind in ("ident", "var", "op") and token.text in FORBIDDEN:
            found.append(f"{token.text!r} is not allowed: {FORBIDDEN[token.text]}")
        elif token.kind == "ident" and _is_call(tokens, i) and token.text in REGEX_FUNCTIONS | {"split"}:
            found += _regex_problems(token.text, _arguments(tokens, i + 1))
        elif token.kind == "ident" and _is_call(tokens, i) and token.text in BOUNDED_FUNCTIONS:
            found += _bound_problems(token.text, _arguments(tokens, i + 1))
        elif token.kind == "op" and token.text == "*":
            found += _repeat_problems(tokens, i)
    return list(dict.fromkeys(found))


def _is_call(tokens: list[Token], i: int) -> bool:
    return i + 1 < len(tokens) and tokens[i + 1].text == "("


def _arguments(tokens: list[Token], open_index: int) -> list[list[Token]]:
    """The `;`-separated arguments of the call whose `(` is at `open_index`."""
    args: list[list[Token]] = [[]]
    depth = 0
    for token in tokens[open_index + 1 :]:
        if token.text in ("(", "[", "{"):
            depth += 1
        elif token.text in (")", "]", "}"):
            if depth == 0:
                break
            depth -= 1
        elif token.text == ";" and depth == 0:
            args.append([])
            continue
        args[-1].append(token)
    return args


def _regex_problems(name: str, args: list[list[Token]]) -> list[str]:
    if name == "split" and len(args) < 2:
        return []  # split/1 splits on a plain string
    first = args[0]
    if len(first) != 1 or first[0].kind != "str" or "\0" in first[0].text:
        return [f"{name}: the regular expression must be a plain string literal (a pod's author chooses the input)"]
    if (why := risky_regex(first[0].text)) is not None:
        return [f"{name}: regular expression {first[0].text!r} {why}"]
    return []


def _bound_problems(name: str, args: list[list[Token]]) -> list[str]:
    for arg in args:
        if len(arg) == 1 and arg[0].kind == "num" and abs(float(arg[0].text)) > LITERAL_CAP:
            return [f"{name}: literal bound {arg[0].text} is above {LITERAL_CAP}"]
    if name == "range" and len(args) == 3:
        return ["range/3 is not allowed (its step can make any span huge); use range/1 or range/2"]
    return []


def _repeat_problems(tokens: list[Token], i: int) -> list[str]:
    """`*` next to a string literal repeats it; next to a huge literal it multiplies a string or
    an array's worth of work."""
    near = [t for t in (tokens[i - 1] if i else None, tokens[i + 1] if i + 1 < len(tokens) else None) if t]
    if any(t.kind == "str" for t in near):
        return ["'*' with a string literal repeats a string: not allowed"]
    if any(t.kind == "num" and abs(float(t.text)) > LITERAL_CAP for t in near):
        return [f"'*' with a literal above {LITERAL_CAP} (string repetition) is not allowed"]
    return []


_GROUP_QUANTIFIER = re.compile(r"^(\*|\+|\{\d*,\d*\}|\{\d{2,}\})")


def risky_regex(pattern: str) -> str | None:
    """Why `pattern` can backtrack catastrophically (a quantified group holding a quantifier or an
    alternation, or a backreference), or None."""
    if re.search(r"\\[1-9]|\\k<", pattern):
        return "uses a backreference"
    starts: list[int] = []
    i = 0
    while i < len(pattern):
        c = pattern[i]
        if c == "\\":
            i += 2
            continue
        if c == "(":
            starts.append(i)
        elif c == ")" and starts:
            body = pattern[starts.pop() + 1 : i]
            quantified = _GROUP_QUANTIFIER.match(pattern[i + 1 :])
            if quantified and re.search(r"(?<!\\)[*+|]|(?<!\\)\{\d*,", body):
                return "nests a quantifier or alternation inside a repeated group (catastrophic backtracking)"
        i += 1
    return None


def tokenize(text: str) -> Iterator[Token]:
    """jq tokens of `text`; string literals as one token each, interpolations scanned as code."""
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c.isspace():
            i += 1
        elif c == "#":
            while i < n and text[i] != "\n":
                i += 1
        elif c == '"':
            literal, i, inner = _string(text, i + 1)
            yield Token("str", literal)
            for code in inner:
                yield from tokenize(code)
        elif c == "$" or c.isalpha() or c == "_":
            j = i + 1
            while j < n and (text[j].isalnum() or text[j] == "_" or text[j : j + 2] == "::"):
                j += 2 if text[j : j + 2] == "::" else 1
            word = text[i:j]
            key = _next_char(text, j) == ":" and text[j : j + 2] != "::"
            yield Token("field" if key and c != "$" else ("var" if c == "$" else "ident"), word)
            i = j
        elif c.isdigit() or (c == "." and i + 1 < n and text[i + 1].isdigit()):
            m = re.match(r"\d*\.?\d*(?:[eE][-+]?\d+)?", text[i:])
            assert m is not None
            yield Token("num", m.group(0))
            i += len(m.group(0))
        elif c == ".":
            i = yield from _dot(text, i)
        else:
            two = text[i : i + 2]
            op = two if two in ("//", "?/", "==", "!=", "<=", ">=", "|=", "+=", "-=", "*=", "/=", "%=") else c
            yield Token("op", op)
            i += len(op)


def _dot(text: str, i: int) -> Generator[Token, None, int]:
    """`..`, `.name` (a field, never a call), `."name"`, or a bare `.`; returns the next index."""
    n = len(text)
    if text[i : i + 2] == "..":
        yield Token("op", "..")
        return i + 2
    j = i + 1
    if j < n and (text[j].isalpha() or text[j] == "_"):
        while j < n and (text[j].isalnum() or text[j] == "_"):
            j += 1
        yield Token("field", text[i + 1 : j])
        return j
    yield Token("op", ".")
    return j


def _string(text: str, i: int) -> tuple[str, int, list[str]]:
    """The literal from just after its opening quote: (content, index after it, interpolated code)."""
    out: list[str] = []
    inner: list[str] = []
    n = len(text)
    while i < n and text[i] != '"':
        if text[i : i + 2] == "\\(":
            depth, j = 1, i + 2
            while j < n and depth:
                if text[j] == '"':
                    _, j, nested = _string(text, j + 1)
                    inner += nested
                    continue
                depth += {"(": 1, ")": -1}.get(text[j], 0)
                j += 1
            inner.append(text[i + 2 : j - 1])
            out.append("\0")  # an interpolation: the literal is not a plain string
            i = j
        elif text[i] == "\\" and i + 1 < n:
            out.append(text[i : i + 2])
            i += 2
        else:
            out.append(text[i])
            i += 1
    return "".join(out), i + 1, inner


def _next_char(text: str, j: int) -> str:
    while j < len(text) and text[j].isspace():
        j += 1
    return text[j] if j < len(text) else ""
