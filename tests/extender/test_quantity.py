"""Quantities: the API's grammar in Phalanx units, rounded up, and bounded (bad text fails fast)."""

from __future__ import annotations

import re
import time
from decimal import Decimal

import pytest

from extender import quantity

UNITS = [
    # (value, milli, mib, count)
    ("500m", 500, 1, 1),
    ("8", 8000, 1, 8),
    (8, 8000, 1, 8),
    (0.5, 500, 1, 1),
    ("1Gi", 2**30 * 1000, 1024, 2**30),
    ("128Mi", 2**27 * 1000, 128, 2**27),
    ("1.5Gi", 3 * 2**29 * 1000, 1536, 3 * 2**29),
    ("1k", 1_000_000, 1, 1000),
    ("1E", 10**21, 10**18 // 2**20 + 1, 10**18),
    ("7Ei", 7 * 2**60 * 1000, 7 * 2**40, 7 * 2**60),
    ("1e3", 1_000_000, 1, 1000),
    ("2E-3", 2, 1, 1),
    ("0.1m", 1, 1, 1),
    ("3n", 1, 1, 1),
    (".5", 500, 1, 1),
    ("5.", 5000, 1, 5),
    (" 2 ", 2000, 1, 2),
    ("0", 0, 0, 0),
    ("-500m", -500, 0, 0),
]


@pytest.mark.parametrize(("value", "milli", "mib", "count"), UNITS, ids=[repr(u[0]) for u in UNITS])
def test_units_round_up(value: str | int | float, milli: int, mib: int, count: int) -> None:
    assert (quantity.milli(value), quantity.mib(value), quantity.count(value)) == (milli, mib, count)


def test_parse_is_exact_in_base_units() -> None:
    assert [quantity.parse(v) for v in ("500m", "1Gi", "0.1", "1e-9")] == [
        Decimal("0.5"),
        Decimal(2**30),
        Decimal("0.1"),
        Decimal("1e-9"),
    ]


REJECTED = [
    ("1e999999", "exponent out of range"),
    ("1e-999999", "exponent out of range"),
    ("Infinity", "malformed quantity"),
    ("-Infinity", "malformed quantity"),
    ("NaN", "malformed quantity"),
    (float("inf"), "malformed quantity"),
    (float("nan"), "malformed quantity"),
    ("1_000", "malformed quantity"),
    ("9" * 5000, "longer than 64 characters"),
    ("9Ei", "exceeds 2^63-1"),
    ("1e19", "exceeds 2^63-1"),
    ("-1e19", "exceeds 2^63-1"),
    ("1e999999Ki", "malformed quantity"),
    ("", "malformed quantity"),
    (".", "malformed quantity"),
    ("1.2.3", "malformed quantity"),
    ("1e", "malformed quantity"),
    ("1ki", "malformed quantity"),
    ("1 Gi", "malformed quantity"),
    ("0x10", "malformed quantity"),
    ("\u0661", "malformed quantity"),  # ARABIC-INDIC DIGIT ONE: Decimal and int take it, the API does not
]


@pytest.mark.parametrize(("value", "reason"), REJECTED, ids=[repr(v)[:24] for v, _ in REJECTED])
def test_bad_quantities_raise_a_clear_value_error_fast(value: str | float, reason: str) -> None:
    # The thread's own CPU, not the wall clock: on a busy machine the wall clock counts waits for
    # a core (one such run took 0.1 s wall for NaN). The bound still catches what it guards
    # against: count('1e999999') once ran for about 50 s.
    for convert in (quantity.parse, quantity.milli, quantity.mib, quantity.count):
        started = time.thread_time()
        with pytest.raises(ValueError, match=re.escape(reason)):
            convert(value)
        assert time.thread_time() - started < 0.25
