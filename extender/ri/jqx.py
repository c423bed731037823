"""Every RI path is jq, run through the `jq` binding (libjq); this module keeps it cheap and null-safe.

- Programs are compiled once (an LRU cache keyed by the expression text): compiling costs ~1 ms,
  running a compiled program on a small document a few µs.
- `Slots` folds many expressions into one program, `[([(e1)?][0]), ([(e2)?][0]), ...]`, so a
  pod is serialized and parsed by libjq once however many selectors, filters and keys the RI
  has. Each slot yields the expression's first output, or null when it has none or fails: a
  missing label is null, not an error (the spec asks for null-safe expressions; this makes
  unsafe ones behave too).
- libjq's JSON parser dominates the cost, so pods are cut down before serialization: pod-side
  expressions see `apiVersion`, `kind`, `metadata` without `managedFields`, and `spec` /
  `status` / `managedFields` only if some expression names them (any `..` gets the whole pod).
- Grouping keys may be bare words (`gpu`, `no-gpu` in the spec's filter example): a key that
  does not compile as jq but looks like a word is taken as that literal string.
- Budget: every program runs after `PRELUDE`, which caps `range` over a bound read from the
  document (`jqlint` rejects the rest of what could loop); each run can be timed by a `Meter`
  (`budget.Breaker`), told the CPU seconds it took on its thread (not wall time: waiting for the
  GIL or a core on a loaded node is not the program's cost) and the size of its input.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterable, Mapping
from functools import lru_cache
from typing import Any, Protocol

import jq  # type: ignore[import-not-found, unused-ignore]
import orjson

from extender.ri.jqlint import LITERAL_CAP
from extender.ri.model import JSON

_BAREWORD = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")
_OPTIONAL_FIELDS = ("spec", "status")


# On one line, so jq's line numbers in run-time errors stay the user's. User expressions cannot
# define functions (jqlint), so these shadow the builtins; range/3 (rejected in user text) does
# the counting. A bound read from a hostile CR (`.spec.replicas: 2e9`) is an error, not a stall.
PRELUDE = (
    f"def range($from; $upto): if ($upto - $from) > {LITERAL_CAP} "
    f'then error("range over more than {LITERAL_CAP} values") else range($from; $upto; 1) end; '
    "def range($upto): range(0; $upto); "
)


class JqRuntimeError(ValueError):
    """A compiled expression failed on a document (e.g. iterating over null)."""


class Meter(Protocol):
    """Told about every jq run: its CPU time on the calling thread and the size of its input (bytes of JSON)."""

    def record(self, seconds: float, size: int) -> None: ...


@lru_cache(maxsize=4096)
def program(text: str) -> Any:
    """The compiled program for `text` (after `PRELUDE`); raises ValueError with jq's message when
    it does not compile."""
    return jq.compile(PRELUDE + text)


def compile_error(text: str) -> str | None:
    """jq's complaint about `text` alone (columns as the user wrote them), or None when it compiles."""
    try:
        jq.compile(text)
        program(text)
    except ValueError as error:
        return str(error).splitlines()[0]
    return None


def key_expression(text: str) -> str:
    """A grouping key as jq: itself, or a string literal when it is a bare word that is not jq."""
    if compile_error(text) is None or not _BAREWORD.match(text.strip()):
        return text
    return orjson.dumps(text.strip()).decode()


def is_absolute(text: str) -> bool:
    return text.strip().startswith(".")


class Doc:
    """A document serialized once for all the expressions evaluated on it."""

    __slots__ = ("meter", "text")

    def __init__(self, value: JSON, meter: Meter | None = None) -> None:
        self.text = orjson.dumps(value).decode()
        self.meter = meter

    def all(self, expression: str) -> list[JSON]:
        start = time.thread_time()
        try:
            return list(program(expression).input_text(self.text).all())
        except ValueError as error:
            raise JqRuntimeError(f"{expression}: {error}") from error
        finally:
            self._record(start)

    def first(self, expression: str) -> JSON:
        """First output, or None when there is none or the expression fails."""
        start = time.thread_time()
        try:
            return program(f"[({expression}\n)?][0]").input_text(self.text).first()
        finally:
            self._record(start)

    def _record(self, start: float) -> None:
        if self.meter is not None:
            self.meter.record(time.thread_time() - start, len(self.text))


class Slots:
    """Many expressions evaluated as one program over one pod; `run` returns their first outputs."""

    __slots__ = ("_fields", "_program", "expressions")

    def __init__(self, expressions: Iterable[str]) -> None:
        self.expressions = tuple(expressions)
        # The newline ends a `# comment` the expression may close with.
        body = ", ".join(f"([({e}\n)?][0])" for e in self.expressions)
        self._program = program(f"[{body}]")
        self._fields = _needed_fields(self.expressions)

    def run(self, pod: Mapping[str, JSON], meter: Meter | None = None) -> list[JSON]:
        if not self.expressions:
            return []
        start = time.thread_time()
        text = orjson.dumps(_project(pod, self._fields)).decode()
        try:
            values: list[JSON] = self._program.input_text(text).first()
        finally:
            if meter is not None:
                meter.record(time.thread_time() - start, len(text))
        return values


def _needed_fields(expressions: tuple[str, ...]) -> frozenset[str] | None:
    """Top-level pod fields the expressions may read; None means the whole pod."""
    text = "\n".join(expressions)
    if ".." in text:
        return None
    named = {f for f in (*_OPTIONAL_FIELDS, "managedFields") if re.search(rf"\b{f}\b", text)}
    return frozenset({"apiVersion", "kind", "metadata", *named})


def _project(pod: Mapping[str, JSON], fields: frozenset[str] | None) -> Mapping[str, JSON]:
    if fields is None:
        return pod
    cut = {k: v for k, v in pod.items() if k in fields}
    meta = cut.get("metadata")
    if isinstance(meta, Mapping) and "managedFields" in meta and "managedFields" not in fields:
        cut["metadata"] = {k: v for k, v in meta.items() if k != "managedFields"}
    return cut


def as_text(value: JSON) -> str:
    """A jq value as a key part / selector value: strings as they are, anything else as JSON."""
    return value if isinstance(value, str) else orjson.dumps(value).decode()


def as_count(value: JSON) -> int | None:
    """A replica count from jq output: ints, integral floats and numeric strings; else None."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int):
        return max(value, 0)
    if isinstance(value, float) and value.is_integer():
        return max(int(value), 0)
    if isinstance(value, str) and value.strip().isdigit():
        return int(value.strip())
    return None


def truthy(value: JSON) -> bool:
    """jq truthiness: everything but null and false."""
    return value is not None and value is not False
